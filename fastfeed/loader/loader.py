"""`fastfeed.Loader`: a drop-in for a torch `DataLoader` loop over a packed dataset.

    loader = fastfeed.Loader("out/", batch_size=256, train=True, image_size=224)
    for epoch in range(epochs):
        loader.set_epoch(epoch)            # optional: iterating again advances the epoch by itself
        for images, labels in loader:      # images [B,3,S,S] on the device, labels int64 [B] on the same device
            ...

It composes four pieces, each usable on its own: `sampling` (which sample ids this rank reads, in which order),
`formats` (where each sample's bytes sit), the native `ring` (reads them ahead into pinned slots, off the GIL)
and `decode` (DALI on the GPU, or the CPU decoders). `settings` resolves and validates every argument once;
`epoch.EpochRun` runs one iteration from explicit parts; `compat` holds what frameworks read from a DataLoader.

The decode workers, their hand-offs, the consumer's wait, shutdown, lazy iteration and fork: NOTE [Loader pipeline
and shutdown] in fastfeed/loader/epoch.py, beside the code that implements it.

NOTE [Reading on into the next epoch]
A Loader does not stop at the end of an epoch. Once the ring's read-ahead (its slots) reaches the end of epoch e, the
run plans epoch e + 1 (as iterating again would: the same seed, no resume state) and queues its order in the ring
behind e's (`PrefetchRing.extend`: batch numbers, and so slots, count on), so the ring reads e + 1's first batches
into the slots e's batches free and the workers decode them as they would e's next batch. Positions count on across
epochs. When the loop has taken all of e, the run is parked; the next iteration continues it if it runs exactly epoch
e + 1 with no loaded state (a plain `for` again, or set_epoch(e + 1)), else the parked run is stopped and a new one
starts (set_epoch to another epoch, load_state_dict, close). So an epoch boundary costs the loop nothing: the next
epoch's first batches neither wait for the loop to ask nor for the workers to drain e (what a boundary cost before:
docs/design/epochs.md#reading-on-into-the-next-epoch).
An evaluation Loader reads on into its next pass the same way, as DALI's iterators and ultralytics' evaluation loader
do: between passes it holds the decoded window (`prefetch` + `pipelines` batches), and its next pass starts with no
pipeline to fill. A loop that breaks out of an epoch stops the run as before. Datasets at a URL do not read on (their
shard cache follows one epoch). Workers still reading when the interpreter exits are stopped by an exit hook that runs
before DALI's own (`lifecycle`).

NOTE [Reading before the first iteration]
A Loader starts its ring on epoch 0's order in the constructor, before it builds the decoders, so the first
batches are read (and the arena faulted in) while the first GPU pipeline is built. The first iteration runs on from
that read if it runs epoch 0 with no loaded state (a plain `for`, or set_epoch(0)); otherwise (set_epoch to another
epoch, load_state_dict) the ring is started again on the right order and the early read, at most one ring's worth of
batches, is simply dropped. Large photos, whose first batch is the most bytes to read, gain the most. Datasets at a
URL do not, for the reason they do not read on.
With decoders on the GPU ("dali", "hybrid") the constructor also starts epoch 0's run once they are built, and parks it
as an epoch read on into is (NOTE [Reading on into the next epoch]): the first batches are decoded, within the usual
window, while the script builds its model, and the first iteration continues that run under the same rule (another
epoch or a loaded state stops it; a batch inside a decoder finishes first). Not with CPU decoders: their threads would
compete with the script's model build for the cores and, on fastfeed's own path, the GIL, and the first batch would
come no sooner. The first-batch and first-step times behind both rules:
docs/design/epochs.md#reading-before-the-first-iteration.
"""
from __future__ import annotations

import ctypes
import logging
import threading

import numpy as np
import torch

from fastfeed.datasets import open_dataset
from fastfeed.decode import GPU_DECODERS
from fastfeed.detect.instances import missing_masks_note
from fastfeed.detect.masks import DEFAULT_IGNORE_INDEX
from fastfeed.loader import lifecycle
from fastfeed.loader.assemble import BatchAssembler, LoaderError
from fastfeed.loader.compat import AccelerateState, EpochSampler, seeded_call
from fastfeed.loader.epoch import EpochRun
from fastfeed.loader.parts import decoder_factory, epoch_planner, sample_table, shard_fetcher
from fastfeed.loader.fields import pick_mask, plan_fields
from fastfeed.loader.ring import PrefetchRing, auto_slot_bytes
from fastfeed.loader.settings import LoaderSettings, ring_budget_bytes, resolve_settings
from fastfeed.loader.stats import StageStats
from fastfeed.tuning.climber import ShareClimber
from fastfeed.tuning.pace import ConsumerPace
from fastfeed.tuning.pipelines import PipelineTuner
from fastfeed.targets import BOX_TASKS, GEOMETRY_TASKS
from fastfeed.world import World

__all__ = ["Loader", "LoaderError"]

log = logging.getLogger("fastfeed")

STATE_VERSION = 1


class Loader:
    """Iterate a packed dataset as decoded, augmented, normalised batches on the device.

    Args:
        path: a folder written by `fastfeed pack` (WebDataset shards or LMDB), or its fsspec URL (s3://, gs://,
            https://): shards are fetched ahead into a local cache as the epoch needs them (docs/remote.md).
        batch_size: samples per batch on this rank.
        train: RandomResizedCrop(0.08-1, 3/4-4/3) + horizontal flip, shuffled, full batches if True; resize to
            S/0.875 + centre crop, in dataset order, every sample once (last batch short) if False. Either way
            normalised with `mean`/`std` (given in 0-1 units; default ImageNet's, for task "detect" none: [0, 1]).
        image_size: output side S.
        device: "cuda", "cuda:N" or "cpu"; default: this rank's local GPU when CUDA is available, else "cpu".
        decoder: "dali", "cpu" (= "cpu-pil", the fastest CPU decoder for photos), "cpu-pil", "cpu-dali", "hybrid"
            (each batch split between DALI's CPU backend and the GPU, the split following the training loop's pace)
            or "auto" (DALI when importable; fastfeed/decode/__init__.py says which).
        dtype: torch.float32 (default: what ToTensor + Normalize give), float16 or bfloat16 (half the bytes: use
            with autocast / half models), or uint8 (0-255, no normalisation).
        channels_last: return NCHW tensors with NHWC memory (what channels_last models want), written directly.
        shuffle, drop_last: default to `train`. seed, order: the epoch order, see `fastfeed.sampling`; every rank
            gets the same number of batches.
        rank, world_size, local_rank: default from torch.distributed, else torchrun's environment, else 0/1/0.
        num_threads: decoder threads per pipeline, or "auto": with DALI 2 (the hardware decoder does the work),
            with a CPU decoder this rank's share of the cores (at most 8), with hybrid its CPU part's share of the
            rank's cores. fastfeed/loader/settings.py says why.
        reader_threads: native ring reader threads (default 4; more helps cold or network storage).
        prefetch: decoded batches queued ahead of the consumer (default 2).
        hw_decoder_load: share of JPEGs sent to the GPU's hardware decoder (DALI; default 1.0).
        pipelines: decoders working side by side on consecutive batches. Default on a GPU: 1 to start (2 for
            "cpu-dali", and never fewer), more while the training loop waits for data and one more makes it faster
            (up to 4, one per 4 cores of the rank, at least 2; "cpu-dali" chosen by "auto" then one more, on the GPU),
            fewer again while it barely waits and fewer are not slower (fastfeed/tuning/pipelines.py); on the CPU 1
            (2 for "cpu-dali"). Given, it is fixed.
        on_error: "skip" replaces a bad record by another sample (counted in `stats()`, logged once per sample);
            "raise" raises naming the sample.
        orientation: "ignore" (torchvision's ImageFolder; the default) or "exif"; see docs/decode-contract.md. A
            detection dataset's is the frame its boxes were packed in (`fastfeed pack --orientation`), left out or
            equal to it.
        verify_checksums: check each sample's bytes against the checksum `pack` stored (datasets that have one);
            the ring's reader threads hash them without the GIL, the check compares (docs/design/ring.md#checksums).
            Bytes left unchecked get the header check that keeps broken JPEGs and PNGs from DALI (assemble.py
            `_untrusted`).
        batch_transform: fn(images, labels) -> (images, labels), applied to every batch on the device (MixUp,
            CutMix, ...), with torch's, numpy's and `random`'s generators seeded from (seed, epoch, batch) so it is
            deterministic and resume-exact.
        log_every: log a one-line stats summary every N batches (and at the end of each epoch).
        storage_options: for a dataset at a URL: passed to fsspec (endpoint, credentials); the environment
            (AWS_ENDPOINT_URL, ...) is read as s3fs does. cache_dir, cache_size: the local shard cache
            (default $FASTFEED_CACHE or ~/.cache/fastfeed, $FASTFEED_CACHE_SIZE; see fastfeed/remote/cache.py).
        fields: members to return with each image, e.g. ["txt", "json"] (`Loader(path).dataset.fields` lists
            what the samples carry; docs/fields.md). Batches are then dicts: "images", "labels", and each field
            collated as DataLoader's default_collate would (numbers and same-shaped arrays as tensors, text and JSON
            as lists); a sample without one of them is a bad record. batch_transform then gets the dict.
        task: "classify", "detect" (boxes: docs/detection.md), "segment" (boxes and instance masks from the
            objects' polygons) or "semantic" (a class-id mask per image: docs/segmentation.md); default: what the
            dataset holds. augment, epochs: the detection geometry's training augmentation
            (fastfeed.detect.DetectAugment) and the run's length (for close_mosaic).
        mask, ignore_index: task "semantic": the member holding each image's mask (default: the samples' one PNG
            member besides the image) and the id of mask pixels no image pixel is under (default 255).
        **dataloader_kwargs: DataLoader arguments given out of habit: num_workers (-> decode threads),
            prefetch_factor (-> prefetch), pin_memory and persistent_workers (always on here); the others are
            ignored with one warning.

    In evaluation (train=False) a batch position that holds no sample of its own — the padding that evens out
    ranks, or a bad sample replaced by another — has the label `fastfeed.IGNORE_INDEX` (-100): CrossEntropyLoss
    skips it and `labels != IGNORE_INDEX` is the mask of samples to score, so every sample counts exactly once.
    """

    def __init__(self, path, batch_size: int = 256, *, train: bool = True, image_size: int = 224,
                 device: str | torch.device | None = None, decoder: str = "auto",
                 dtype: torch.dtype = torch.float32, channels_last: bool = False,
                 mean=None, std=None, shuffle: bool | None = None, seed: int = 0,
                 drop_last: bool | None = None, order: str = "global", rank: int | None = None,
                 world_size: int | None = None, local_rank: int | None = None,
                 num_threads: int | str | None = "auto", reader_threads: int | None = None,
                 prefetch: int | None = None, hw_decoder_load: float | None = None, pipelines: int | None = None,
                 on_error: str = "skip", orientation: str | None = None, verify_checksums: bool = True,
                 batch_transform=None, log_every: int | None = None, storage_options: dict | None = None,
                 cache_dir: str | None = None, cache_size: int | None = None, task: str | None = None,
                 augment=None, epochs: int | None = None, fields=None, mask: str | None = None,
                 ignore_index: int = DEFAULT_IGNORE_INDEX, **dataloader_kwargs):
        self._closed = True  # until fully built: close() and __del__ then have nothing to undo
        self.world = World.resolve(rank=rank, world_size=world_size, local_rank=local_rank)
        self._world_given = world_size is not None
        args = dict(world=self.world, batch_size=batch_size, train=train, image_size=image_size, device=device,
                    decoder=decoder, dtype=dtype, channels_last=channels_last, mean=mean, std=std, shuffle=shuffle,
                    seed=seed, drop_last=drop_last, order=order, num_threads=num_threads,
                    reader_threads=reader_threads, prefetch=prefetch, hw_decoder_load=hw_decoder_load,
                    pipelines=pipelines, on_error=on_error, orientation=orientation,
                    verify_checksums=verify_checksums, log_every=log_every, dataloader_kwargs=dataloader_kwargs)
        # Before the dataset is open its task is unknown: augment= alone says detection.
        args.update(task=task or ("detect" if augment is not None else "classify"), augment=augment, epochs=epochs,
                    fields=fields, mask=mask, ignore_index=ignore_index)
        self.settings: LoaderSettings = resolve_settings(**args)  # every argument checked before any I/O
        if batch_transform is not None and not callable(batch_transform):
            raise ValueError(f"batch_transform must be callable(images, labels), got {batch_transform!r}")
        self._batch_transform = batch_transform
        remote = {k: v for k, v in (("cache_dir", cache_dir), ("cache_size", cache_size)) if v is not None}
        # A URL opens with fetch="on_demand": each epoch makes its shards local through remote.epoch_fetch.
        self.dataset = open_dataset(path, storage_options=storage_options, fetch="on_demand", **remote)
        if len(self.dataset) == 0:
            raise ValueError(f"{path}: the dataset has no samples")
        # Resolved again with what the table says about the images: the decoder "auto" picks and the DALI thread
        # count depend on it (fastfeed/loader/settings.py).
        self._images = self.dataset.image_profile()  # a median over every sample: once
        held = getattr(self.dataset.manifest, "task", "classify")
        if task in BOX_TASKS and held not in BOX_TASKS:  # else every batch would come without a box, silently
            raise ValueError(f"{path}: task={task!r} reads each image's objects, and this dataset holds none: it "
                             f"was packed for task {held!r} (docs/detection.md says which sources carry boxes)")
        args["task"] = task or held  # default: what the pack holds
        self.settings = resolve_settings(**args, images=self._images,
                                         frame=getattr(self.dataset.manifest, "annotation_frame", "ignore"))
        if self.settings.task == "semantic" and self.settings.mask is None:
            self.settings = self.settings.replace(mask=pick_mask(self.dataset))
        s = self.settings
        if s.drop_last and len(self.dataset) < self.world.world_size * s.batch_size:
            raise ValueError(f"{path}: drop_last=True with {len(self.dataset)} samples, world size "
                             f"{self.world.world_size} and batch size {s.batch_size}: not one full batch per rank; "
                             "use drop_last=False or a smaller batch_size")
        self._stats = StageStats(stages=("read", "read_wait", "decode", "wait"))
        extents, fields = self.dataset.extents(), None
        members = s.fields + ((s.mask,) if s.mask is not None else ())
        if members:  # the ring reads each sample's image and requested members in one extent
            if s.task in GEOMETRY_TASKS and "cls" in s.fields:
                raise ValueError(f"fields=['cls'] is a classification label; a {s.task} batch has none")
            extents, fields = plan_fields(self.dataset, members)
        self._table = sample_table(self.dataset, s, extents, fields)
        # One for every run: it names each bad sample once (a run per epoch would name it again each epoch the loop
        # does not read on into: set_epoch to another epoch, a break, load_state_dict).
        self._assembler = BatchAssembler(s, self._table, self._stats)
        if s.task == "segment" and (note := missing_masks_note(self._table.targets, self._table.keys)):
            log.warning("fastfeed: %s: %s", path, note)
        self._shard_of = np.asarray(extents.file_index, dtype=np.int64) if s.order == "shard" else None
        self._pace = ConsumerPace()  # the loop's pace, which both tuners measure (fastfeed/tuning/)
        # Page-locked only when batches go to a GPU: a CPU Loader gains nothing from it, and in a child forked from
        # a CUDA process (NOTE [Loader pipeline and shutdown]: fork) touching CUDA at all fails.
        slot_bytes = auto_slot_bytes(extents.size, s.batch_size)
        budget = ring_budget_bytes(self.world)
        slots = s.ring_slots_within(slot_bytes, budget)
        if slots < s.ring_slots:
            log.info("fastfeed: %d ring slots of %.1f GB instead of %d: this rank's share of host memory for "
                     "read-ahead is %.1f GB (fastfeed/loader/settings.py, RING_MEMORY_SHARE)", slots, slot_bytes / 1e9,
                     s.ring_slots, budget / 1e9)
        # With checksums to verify, the ring's reader threads hash each sample after its read (no GIL), and the
        # epoch only compares: the training thread is not kept waiting for the GIL while batches are hashed. A read
        # that spans a sample's other members too is hashed over its image, whose checksum the table holds.
        window = None if fields is None else (fields.image_at, fields.image_size)
        self._ring = PrefetchRing(extents, s.batch_size, num_threads=s.reader_threads, num_slots=slots,
                                  slot_bytes=slot_bytes, pin_memory=s.device.type == "cuda",
                                  digests=self._table.bad_checksums is not None, digest_window=window)
        # The ring reads epoch 0 while the decoders are built (NOTE [Reading before the first iteration]); a failed
        # build must not leave it reading.
        self._primed = self._prime()
        # The hybrid decoder's CPU share, one for all pipelines, tuned on the loop (fastfeed/tuning/climber.py).
        self._climber = ShareClimber(self._pace, settle=s.ring_slots, start=s.hybrid_start_share) \
            if s.decoder == "hybrid" else None
        try:
            self._decoders = self._build_decoders()
        except BaseException:
            self._ring.close()
            raise
        # How many pipelines decode, tuned on the loop (fastfeed/tuning/pipelines.py); None: settings.pipelines, always.
        limit = s.pipeline_limit_within(slots)
        self._tuner = PipelineTuner(self._pace, start=s.pipelines, limit=limit, settle=slots,
                                    floor=s.pipeline_floor) if limit > s.pipeline_floor else None
        self._publish_settings()

        self._epoch = 0
        self._pending_resume: dict | None = None  # sampling state for the next iteration of self._epoch
        self._plan = None  # the EpochPlan of the iteration in progress (or the last one)
        self._batches_done = 0  # batches of self._plan handed to the consumer
        self._iterated = False  # an iteration of self._epoch began: a plain `for` again runs the next epoch
        self._active: EpochRun | None = None
        self._parked: EpochRun | None = None  # a finished epoch's run reading on into the next (see the NOTE)
        self._full_epoch: tuple[int, int] | None = None  # (batches, samples) of a full epoch for this rank
        self._forked = False
        self.end_of_dataloader = False  # Accelerate's dataloader-state protocol (fastfeed/loader/compat.py)
        self.remainder = -1
        self.sampler = EpochSampler(self)
        self.batch_sampler = None  # batching happens inside; Lightning reads the attribute of every loader
        self._closed = False
        lifecycle.track(self)
        if self._decodes_early:
            self._start_first_epoch()

    # ------------------------------------------------------------------ DataLoader-like surface
    @property
    def batch_size(self) -> int:
        return self.settings.batch_size

    @property
    def train(self) -> bool:
        return self.settings.train

    @property
    def device(self) -> torch.device:
        return self.settings.device

    @property
    def drop_last(self) -> bool:
        return self.settings.drop_last

    @property
    def num_threads(self) -> int:
        return self.settings.decode_threads

    @property
    def image_sizes(self) -> tuple[np.ndarray, np.ndarray]:
        """(widths, heights) of every sample as the batches see it: the stored size, or the displayed one under
        orientation "exif" (what boxes and crop windows are in)."""
        return self._table.widths, self._table.heights

    @property
    def targets(self):
        """Task "detect": every sample's objects (fastfeed.targets.Targets, as the batches are built from them);
        "semantic": a table without objects; None for classification."""
        return self._table.targets

    def __len__(self) -> int:
        """Batches in a full epoch for this rank (the same on every rank, and for every epoch)."""
        return self._full_epoch_sizes()[0]

    @property
    def samples_per_epoch(self) -> int:
        """Samples this rank reads in a full epoch, padding included (what `len(DistributedSampler)` counts)."""
        return self._full_epoch_sizes()[1]

    def _full_epoch_sizes(self) -> tuple[int, int]:
        if self._full_epoch is None:  # the same for every epoch; planning 10M samples takes ~0.3 s: once
            plan = self._make_plan(0, None)
            self._full_epoch = (plan.num_batches, len(plan.indices))
        return self._full_epoch

    @property
    def batches_left(self) -> int:
        """Batches still to come in the epoch in progress, or in the one the next iteration runs (fewer than
        `len(loader)` after `load_state_dict` of a mid-epoch state)."""
        if self._active is not None:
            return self._plan.num_batches - self._batches_done
        if self._pending_resume is not None:
            return self._make_plan(self._epoch, self._pending_resume).num_batches
        return len(self)

    def set_epoch(self, epoch: int) -> None:
        """Like `DistributedSampler.set_epoch`: the next iteration runs epoch `epoch`. A state loaded with
        `load_state_dict` for this same epoch is kept (the rest of that epoch runs); for another epoch it is
        dropped."""
        if isinstance(epoch, bool) or not isinstance(epoch, (int, np.integer)) or epoch < 0:
            raise ValueError(f"epoch must be an integer >= 0, got {epoch!r}")
        epoch = int(epoch)
        if epoch != self._epoch:
            self._pending_resume = None
        self._epoch = epoch
        self._iterated = False

    @property
    def epoch(self) -> int:
        return self._epoch

    def epoch_plan(self):
        """This rank's full plan (a `sampling.EpochPlan`) for the epoch the current or next iteration runs."""
        epoch = self._epoch + (1 if self._iterated and self._active is None else 0)
        return self._make_plan(epoch, None)

    def __iter__(self):
        if self._closed:
            raise RuntimeError("this Loader is closed")
        if self._forked:
            raise RuntimeError("this Loader was created in the parent process; build a new Loader in this child")
        self.world.check_still(self._world_given)
        return self._iterate()

    def _iterate(self):
        # at the first next(), not at iter(): NOTE [Loader pipeline and shutdown]
        run, started = self._begin_epoch()
        plan = self._plan
        s = self.settings
        finished = False
        try:
            with AccelerateState(self, plan) as accelerate:
                if not started:
                    run.begin()
                for k in range(plan.num_batches):
                    batch = run.next()
                    if self._batch_transform is not None:
                        batch = seeded_call(self._batch_transform, batch, seed=s.seed, epoch=plan.epoch,
                                            batch_number=plan.first_batch + k)
                    self._batches_done = k + 1
                    if k + 1 == plan.num_batches:
                        accelerate.last_batch()
                    if s.log_every and (k + 1) % s.log_every == 0:
                        log.info("fastfeed epoch %d batch %d/%d: %s", plan.epoch, k + 1, plan.num_batches,
                                 self._stats.summary_line())
                    yield batch
            finished = True
            if s.log_every:
                log.info("fastfeed epoch %d done: %s", plan.epoch, self._stats.summary_line())
        finally:
            if self._active is run:
                if finished and run.chains:  # the whole epoch was taken: let the run read on (see the NOTE)
                    self._active, self._parked = None, run
                else:
                    self._stop_active()

    def _begin_epoch(self) -> tuple[EpochRun, bool]:
        """The run for the next iteration, and whether it is already started (the parked run, reading on)."""
        if self._closed:
            raise RuntimeError("this Loader is closed")
        if self._active is not None:
            self._stop_active()
        if self._iterated:
            self._epoch += 1
            self._pending_resume = None
        self._iterated = True
        self._batches_done = 0
        run, self._parked = self._parked, None
        plan = run.plan_at(run.next_out) if run is not None and self._pending_resume is None else None
        if plan is not None and plan.epoch == self._epoch:  # it read on into exactly this epoch: continue it
            self._plan, self._active = plan, run
            self._pace.start()  # the time between the epochs is not a step of the loop
            return run, True
        if run is not None:
            self._stop_run(run)
        primed, self._primed = self._primed, None  # the ring runs on from it only at the first run
        if primed is not None and primed.epoch == self._epoch and self._pending_resume is None:
            self._plan = primed
        else:
            self._plan = self._make_plan(self._epoch, self._pending_resume)
        self._pending_resume = None
        if self._decoders is None:  # the last run could not free them: NOTE [Loader pipeline and shutdown]
            self._decoders = self._build_decoders()
        fetch = self._fetch_shards()
        # A Loader reads on into the next epoch (NOTE [Reading on into the next epoch]).
        planner = self._planner
        chain = (lambda epoch: planner(epoch + 1, None)) if self._reads_ahead else None
        self._active = EpochRun(self._plan, ring=self._ring, decoders=self._decoders, settings=self.settings,
                                table=self._table, stats=self._stats, fetch_shards=fetch, pace=self._pace,
                                next_plan=chain, tuner=self._tuner, new_decoder=self._new_decoder,
                                ring_started=self._plan is primed, assembler=self._assembler)
        return self._active, False

    def _stop_active(self) -> None:
        run, self._active = self._active, None
        self._stop_run(run)

    def _stop_parked(self) -> None:
        run, self._parked = self._parked, None
        if run is not None:
            self._stop_run(run)

    def _stop_run(self, run: EpochRun) -> None:
        if not run.stop():
            self._decoders = None  # a worker may still hold one; never share a decoder between two threads

    # ------------------------------------------------------------------ resume
    def state_dict(self) -> dict:
        """Where this rank is: small JSON-serialisable data to save next to the model and optimizer state.

        `load_state_dict` in a fresh process, with any world size, continues with exactly the batches not yet
        handed out (same samples, same order, same augmentation). A state taken after a finished epoch points at
        the start of the next one."""
        state = {"version": STATE_VERSION, "seed": self.settings.seed, "epoch": self._epoch, "sampling": None}
        if self._pending_resume is not None:
            state["sampling"] = self._pending_resume
        elif self._active is not None and self._batches_done < self._plan.num_batches:
            # mid-iteration: where it is, also after a set_epoch inside the loop (which names the next iteration's)
            state["epoch"] = self._plan.epoch
            state["sampling"] = self._plan.state(self._batches_done)
        elif self._iterated and self._plan is not None:
            if self._batches_done >= self._plan.num_batches:
                state["epoch"] = self._epoch + 1
            else:
                state["sampling"] = self._plan.state(self._batches_done)
        return state

    def load_state_dict(self, state: dict) -> None:
        if not isinstance(state, dict) or state.get("version") != STATE_VERSION:
            raise ValueError(f"not a fastfeed.Loader state (version {STATE_VERSION}): {state!r:.200}")
        if int(state["seed"]) != self.settings.seed:
            raise ValueError(f"state was saved with seed {state['seed']}, this Loader has seed {self.settings.seed}")
        if self._active is not None:
            self._stop_active()
        self._stop_parked()  # it read on from where the Loader was, not from this state
        epoch = int(state["epoch"])
        if state["sampling"] is not None:
            self._make_plan(epoch, state["sampling"])  # validate now, not at the first batch
        self._epoch = epoch
        self._pending_resume = state["sampling"]
        self._iterated = False
        self._plan = None
        self._batches_done = 0

    # ------------------------------------------------------------------ stats and lifetime
    def stats(self) -> dict:
        """Per-stage counters and timers, samples skipped with reasons, and the settings in use.

        Stages: `read` (native ring threads' pread time, summed over threads), `read_wait` (decode workers
        waiting for the ring: reading is the bottleneck if this grows), `decode` (summed over pipelines),
        `wait` (the training loop waiting for a batch: the number that matters). `ring` has the raw ring counters
        (`digest_seconds`: the reader threads' per-sample checksum hashing, when checksums are verified).
        `counters` "samples" and "batches" and the `decode` stage count what was decoded: the batches of the next
        epoch (or evaluation pass), decoded ahead while the loop finishes this one, included. `wait` counts the
        batches the loop took, and `skipped` the replaced samples, by code (read_error, checksum, not_image,
        decode_error), in those batches. With decoder="hybrid", `cpu_decoded`/`gpu_decoded` count the images each part has decoded.
        `pipelines_built` counts the decode pipelines built, before the first batch and when the tuner asked for more.
        """
        snap = self._stats.snapshot()
        ring = self._ring.stats()
        batches = int(ring.get("batches", 0))
        seconds = float(ring.get("read_seconds", 0.0))
        snap["stages"]["read"] = {"count": batches, "seconds": seconds, "max_s": 0.0,
                                  "mean_ms": 1e3 * seconds / batches if batches else 0.0}
        snap["counters"]["bytes_read"] = int(ring.get("bytes_read", 0))
        snap["ring"] = ring
        if self._tuner is not None:  # the pipelines decoding now, and what the tuner measured (tuning/pipelines.py)
            snap["info"]["pipelines"] = self._tuner.count
            start = self.settings.gpu_pipelines_from  # "cpu-dali": how many of them decode on the GPU
            if start is not None:
                snap["info"]["gpu_pipelines"] = max(0, self._tuner.count - start)
            snap["pipeline_history"] = [list(h) for h in self._tuner.history]
        if self._climber is not None:  # where the images were decoded: the split the climber chose
            decoders = self._decoders or ()
            snap["counters"]["cpu_decoded"] = sum(d.cpu_images for d in decoders)
            snap["counters"]["gpu_decoded"] = sum(d.gpu_images for d in decoders)
        # Neither online tuner (the pipeline count, the hybrid's CPU share) has a try in flight or waiting: what a
        # benchmark warms up for (fastfeed bench); each looks again later, so this turns False again for a while.
        snap["info"]["tuning_settled"] = all(t is None or t.settled for t in (self._tuner, self._climber))
        return snap

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        lifecycle.forget(self)
        if self._forked:
            return  # the parent's objects: see _after_fork
        if self._active is not None:
            self._stop_active()
        self._stop_parked()
        self._ring.close()
        for d in self._decoders or ():
            d.close()
        self.dataset.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _after_fork(self) -> None:
        """Called in a forked child (lifecycle.py): this is the parent's Loader. It refuses to iterate, and its
        decoders are never destroyed here: DALI's pipelines segfault when their destructors run in a forked child."""
        self._forked = True
        self._active = self._parked = None
        for d in self._decoders or ():
            ctypes.pythonapi.Py_IncRef(ctypes.py_object(d))

    def __del__(self):
        try:
            if threading.current_thread().name.startswith("fastfeed-"):
                # Freed in one of fastfeed's own threads (the cycle collector runs wherever an allocation triggers
                # it, a decode worker of this very Loader included): closing here would join that thread and shut
                # down the decoder pool it is using. Close from a thread of its own (it keeps the Loader alive).
                threading.Thread(target=self.close, name="closer of a fastfeed.Loader", daemon=True).start()
                return
            self.close()
        except Exception:
            pass

    # ------------------------------------------------------------------ internals
    def _build_decoders(self) -> list:
        """One decoder per starting pipeline (a run's workers build more with `_new_decoder` when the tuner asks)."""
        new = self._new_decoder
        decoders = [new(i) for i in range(self.settings.pipelines)]
        lifecycle.register_exit_hook()  # after the decoders: DALI registers its own when it is first imported
        return decoders

    @property
    def _new_decoder(self):
        """new(index) -> pipeline number `index`'s decoder for this Loader (parts.decoder_factory)."""
        return decoder_factory(self.settings, self._table, self._climber, self._stats)

    @property
    def _fetched_per_epoch(self) -> bool:
        """A dataset at a URL: each epoch makes its shards local (remote.epoch_fetch)."""
        return getattr(self.dataset, "fetch", None) == "on_demand"

    @property
    def _reads_ahead(self) -> bool:
        """Whether the ring reads beyond the epochs the loop asked for: epoch 0 from the constructor and the next
        epoch at the end of each (the two NOTEs on reading). Over local data only: a dataset at a URL keeps in its
        shard cache only the epoch it runs (remote/epoch.py)."""
        return not self._fetched_per_epoch

    @property
    def _decodes_early(self) -> bool:
        """Whether the constructor starts epoch 0's decode too (NOTE [Reading before the first iteration]): when
        the ring reads early and the decoders are on the GPU."""
        return self._primed is not None and self.settings.decoder in GPU_DECODERS

    def _start_first_epoch(self) -> None:
        """Epoch 0's run started and parked, so that the first iteration continues it (the NOTE)."""
        run, _ = self._begin_epoch()
        self._active, self._parked, self._iterated = None, run, False  # no iteration has begun yet
        try:
            run.begin()
        except BaseException:
            self.close()
            raise

    def _prime(self):
        """Start the ring on epoch 0 (NOTE [Reading before the first iteration]); the plan it reads, or None."""
        if not self._reads_ahead:
            return None
        plan = self._make_plan(0, None)
        self._ring.start(np.ascontiguousarray(plan.indices, dtype=np.int64))
        return plan

    def _fetch_shards(self):
        """For a dataset at a URL: what keeps the ring's read-ahead window in the local cache; None for a folder."""
        if not self._fetched_per_epoch:
            return None
        return shard_fetcher(self.dataset, self.settings.batch_size, self._ring.num_slots)

    def _publish_settings(self) -> None:
        info = self.settings.describe()
        info["num_threads"] = info.pop("decode_threads")  # the Loader argument's name
        for key, value in info.items():
            self._stats.set_info(key, value)
        self._stats.set_info("pinned", bool(self._ring.stats().get("pinned", False)))
        self._stats.set_info("ring_slots", self._ring.num_slots)
        # what the decoder and thread choices were made from (settings.resolve_settings), for stats() and bench
        self._stats.set_info("images", {"median_pixels": self._images.median_pixels,
                                        "cpu_decode_share": round(self._images.cpu_decode_share, 4),
                                        "large_size": list(self._images.large_size)})

    def _make_plan(self, epoch: int, resume: dict | None):
        return self._planner(epoch, resume)

    @property
    def _planner(self):
        """plan(epoch, resume) for this Loader (parts.epoch_planner)."""
        return epoch_planner(len(self.dataset), self.settings, self.world, self._shard_of)
