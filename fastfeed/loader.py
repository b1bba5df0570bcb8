"""`fastfeed.Loader`: a drop-in for a torch `DataLoader` loop over a packed dataset.

    loader = fastfeed.Loader("out/", batch_size=256, train=True, image_size=224)
    for epoch in range(epochs):
        loader.set_epoch(epoch)            # optional: iterating again advances the epoch by itself
        for images, labels in loader:      # images [B,3,S,S] on the device, labels int64 [B] on the same device
            ...

It composes four pieces, each usable on its own: `sampling` (which sample ids this rank reads, in which order),
`formats` (where each sample's bytes sit), the native `ring` (reads them ahead into pinned slots, off the GIL)
and `decode` (DALI on the GPU, or the CPU decoders).

NOTE [Loader pipeline and shutdown]
Each iteration runs `pipelines` decode workers (threads), each with its own decoder (DALI pipeline) and CUDA stream:
    take the next ring slot (under a lock, so batch positions are handed out in order) -> crop windows ->
    decoder(slot views) -> release the slot -> results[position]
The consumer takes results strictly by position, so the order never depends on thread timing. The ring's reader
threads read `prefetch + 2*pipelines` batches of encoded bytes ahead; a worker may decode batch k only while
k < consumed + prefetch + pipelines, so decoded batches (device memory) are bounded too. A slot is released only
after the decoder returns, because the decoder reads the slot's bytes in place (DALI's external_source with
no_copy, or PIL from a view). On CUDA each worker decodes on its own stream and records an event after each batch;
the consumer's current stream waits on that event before the batch is handed out, and `record_stream` tells
torch's allocator that the consumer's stream uses the memory, so a batch is never overwritten or reused while
the training step reads it.
Shutdown: every blocking wait (ring, room in the window, the consumer's wait) polls a stop flag every 0.1 s; the
consumer leaving the loop early (break, exception, Ctrl-C, garbage collection of the generator) sets the flag,
joins the workers (bounded) and drops undelivered results; the next iteration restarts the ring cleanly. An error
in a worker travels to the consumer wrapped with where it happened and is raised at the batch that hit it.
"""
from __future__ import annotations

import logging
import os
import threading
import time

import numpy as np
import torch

from fastfeed import IMAGENET_MEAN, IMAGENET_STD
from fastfeed import sampling
from fastfeed.decode import make_decoder, resolve_kind
from fastfeed.epoch import EpochRun, LoaderError
from fastfeed.formats import open_dataset
from fastfeed.ring import PrefetchRing
from fastfeed.stats import StageStats
from fastfeed.world import World

__all__ = ["Loader", "LoaderError"]

log = logging.getLogger("fastfeed")

STATE_VERSION = 1


class Loader:
    """Iterate a packed dataset as decoded, augmented, normalised batches on the device.

    Args:
        path: a folder written by `fastfeed pack` (WebDataset shards or LMDB).
        batch_size: samples per batch on this rank.
        train: RandomResizedCrop(0.08-1, 3/4-4/3) + horizontal flip if True; resize to S/0.875 + centre crop if
            False. Either way normalised with `mean`/`std` (given in 0-1 units).
        image_size: output side S.
        device: "cuda", "cuda:N" or "cpu"; default: this rank's local GPU when CUDA is available, else "cpu".
        decoder: "dali", "cpu" (the fastest CPU decoder), "cpu-pil", "cpu-dali" or "auto" (DALI when importable).
        dtype: torch.float16 | bfloat16 | float32 | uint8 (uint8 skips normalisation).
        channels_last: return NCHW tensors with NHWC memory (what channels_last models want), written directly.
        shuffle, seed, drop_last, order: the epoch order, see `fastfeed.sampling`; every rank gets the same
            number of batches.
        rank, world_size, local_rank: default from torch.distributed, else torchrun's environment, else 0/1/0.
        num_threads: decoder threads per pipeline, or "auto": with DALI, start at once with the setting that
            trained fastest on the H200 (`tuning.START`) and adapt threads, hw_decoder_load and pipelines online
            from the training loop's own wait and step times (`tuning.OnlineTuner`; unless hw_decoder_load or
            pipelines are given; decisions in `stats()["info"]["online_tuning"]`); with a CPU decoder, the
            cores this rank may use (at most 8).
        reader_threads: native ring reader threads (default 4; more helps cold or network storage).
        prefetch: decoded batches queued ahead of the consumer (default 2); the ring reads `prefetch + 2 * pipelines` ahead.
        hw_decoder_load: share of JPEGs sent to the GPU's hardware decoder (DALI; default: the online tuner's,
            starting at 1.0; 0.9 when num_threads is given).
        pipelines: decoders working side by side on consecutive batches (default: the online tuner's, starting
            at 1, for DALI with num_threads="auto"; 2 for DALI with num_threads given; else 1).
        on_error: "skip" replaces a corrupt record by another sample of the same batch (counted in `stats()`);
            "raise" raises naming the sample.
        log_every: log a one-line stats summary every N batches (and at the end of each epoch).
    """

    def __init__(self, path, batch_size: int = 256, *, train: bool = True, image_size: int = 224,
                 device: str | torch.device | None = None, decoder: str = "auto",
                 dtype: torch.dtype = torch.float16, channels_last: bool = False,
                 mean=IMAGENET_MEAN, std=IMAGENET_STD, shuffle: bool = True, seed: int = 0,
                 drop_last: bool = True, order: str = "global", rank: int | None = None,
                 world_size: int | None = None, local_rank: int | None = None,
                 num_threads: int | str | None = "auto", reader_threads: int | None = None,
                 prefetch: int | None = None, hw_decoder_load: float | None = None, pipelines: int | None = None,
                 on_error: str = "skip",
                 log_every: int | None = None):
        if int(batch_size) < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if on_error not in ("skip", "raise"):
            raise ValueError(f"on_error must be 'skip' or 'raise', got {on_error!r}")
        self.dataset = open_dataset(path)
        if len(self.dataset) == 0:
            raise ValueError(f"{path}: the dataset has no samples")
        self.batch_size = int(batch_size)
        self.train = bool(train)
        self.image_size = int(image_size)
        self.shuffle = bool(shuffle)
        self.seed = int(seed)
        self.drop_last = bool(drop_last)
        self.order = order
        self.on_error = on_error
        self.log_every = log_every
        self.world = World.resolve(rank=rank, world_size=world_size, local_rank=local_rank)
        self.device = _resolve_device(device, self.world)
        self.prefetch = max(1, int(prefetch if prefetch is not None else 2))
        self._stats = StageStats(stages=("read", "read_wait", "decode", "wait"))
        self._labels = torch.from_numpy(np.ascontiguousarray(self.dataset.labels, dtype=np.int64))
        self._widths = np.asarray(self.dataset.widths)
        self._heights = np.asarray(self.dataset.heights)
        extents = self.dataset.extents()
        self._shard_of = np.asarray(extents.file_index, dtype=np.int64) if order == "shard" else None

        self._decoder_kind = resolve_kind(decoder, str(self.device))  # the concrete kind, for stats()
        self._decoders, settings = self._build_decoders(
            num_threads, hw_decoder_load, pipelines,
            dict(device=self.device.type, device_id=self.device.index or 0, image_size=self.image_size,
                 dtype=dtype, channels_last=channels_last, mean=mean, std=std, batch_size=self.batch_size,
                 on_error=on_error))
        self.num_threads = settings["num_threads"]
        n_pipelines = len(self._decoders)
        if self._tuner is not None:  # slots for the most pipelines the tuner may switch to
            n_pipelines = max(n_pipelines, max(r.pipelines for r in self._tuner.ladder))
        self._ring = PrefetchRing(extents, self.batch_size,
                                  num_threads=int(reader_threads or 4), num_slots=self.prefetch + 2 * n_pipelines)
        for key, value in settings.items():
            self._stats.set_info(key, value)
        self._stats.set_info("decoder", self._decoder_kind)
        self._stats.set_info("device", str(self.device))
        self._stats.set_info("reader_threads", int(reader_threads or 4))
        self._stats.set_info("prefetch", self.prefetch)
        self._stats.set_info("pinned", bool(self._ring.stats().get("pinned", False)))

        self._epoch = 0
        self._pending_resume: dict | None = None  # sampling state for the next iteration of self._epoch
        self._plan = None  # the EpochPlan of the iteration in progress (or the last one)
        self._batches_done = 0  # batches of self._plan handed to the consumer
        self._iterated = False  # an iteration of self._epoch began: a plain `for` again runs the next epoch
        self._active: EpochRun | None = None
        self._full_len: int | None = None
        self._closed = False

    # ------------------------------------------------------------------ DataLoader-like surface
    def __len__(self) -> int:
        """Batches per epoch for this rank (equal on every rank; fewer for the rest of a resumed epoch)."""
        if self._active is not None:
            return self._plan.num_batches
        if self._pending_resume is not None:
            return self._make_plan(self._epoch, self._pending_resume).num_batches
        if self._full_len is None:  # every full epoch has the same count; planning 10M samples takes ~0.3 s
            self._full_len = self._make_plan(self._epoch, None).num_batches
        return self._full_len

    def set_epoch(self, epoch: int) -> None:
        """Like `DistributedSampler.set_epoch`: the next iteration runs epoch `epoch`. A state loaded with
        `load_state_dict` for this same epoch is kept (the rest of that epoch runs); for another epoch it is
        dropped."""
        epoch = int(epoch)
        if epoch < 0:
            raise ValueError(f"epoch must be >= 0, got {epoch}")
        if epoch != self._epoch:
            self._pending_resume = None
        self._epoch = epoch
        self._iterated = False

    @property
    def epoch(self) -> int:
        return self._epoch

    def __iter__(self):
        if self._closed:
            raise RuntimeError("this Loader is closed")
        if self._active is not None:
            self._active.stop()
        if self._iterated:
            self._epoch += 1
            self._pending_resume = None
        self._iterated = True
        self._plan = self._make_plan(self._epoch, self._pending_resume)
        self._pending_resume = None
        self._batches_done = 0
        epoch = EpochRun(self, self._plan)
        self._active = epoch
        return self._consume(epoch)

    def _consume(self, epoch: EpochRun):
        plan = epoch.plan
        tuner = self._tuner
        asked = None  # when the consumer asked for the previous batch
        wait = 0.0
        try:
            epoch.begin()
            for k in range(plan.num_batches):
                now = time.perf_counter()
                switching = self._retuning is not None and self._retuning.is_alive()
                if tuner is not None and asked is not None and not switching:
                    # the previous batch: its wait, and its whole step (wait + the user's work on it); steps while
                    # a switch is being built are not the new setting's and are not shown to the tuner
                    logged = len(tuner.history)
                    new = tuner.observe(wait, now - asked)
                    if len(tuner.history) != logged:
                        self._stats.set_info("online_tuning", list(tuner.history))
                    if new is not None:
                        self._retune(epoch, new)
                images, labels = epoch.next()
                asked, wait = now, time.perf_counter() - now
                self._batches_done = k + 1
                if self.log_every and (k + 1) % self.log_every == 0:
                    log.info("fastfeed epoch %d batch %d/%d: %s", self._epoch, k + 1, plan.num_batches,
                             self._stats.summary_line())
                yield images, labels
            if self.log_every:
                log.info("fastfeed epoch %d done: %s", self._epoch, self._stats.summary_line())
        finally:
            epoch.stop()
            if self._active is epoch:
                self._active = None

    # ------------------------------------------------------------------ resume
    def state_dict(self) -> dict:
        """Where this rank is: small JSON-serialisable data to save next to the model and optimizer state.

        `load_state_dict` in a fresh process, with any world size, continues with exactly the batches not yet
        handed out (same samples, same order, same augmentation). A state taken after a finished epoch points at
        the start of the next one."""
        state = {"version": STATE_VERSION, "seed": self.seed, "epoch": self._epoch, "sampling": None}
        if self._pending_resume is not None:
            state["sampling"] = self._pending_resume
        elif self._iterated and self._plan is not None:
            if self._batches_done >= self._plan.num_batches:
                state["epoch"] = self._epoch + 1
            else:
                state["sampling"] = self._plan.state(self._batches_done)
        return state

    def load_state_dict(self, state: dict) -> None:
        if not isinstance(state, dict) or state.get("version") != STATE_VERSION:
            raise ValueError(f"not a fastfeed.Loader state (version {STATE_VERSION}): {state!r:.200}")
        if int(state["seed"]) != self.seed:
            raise ValueError(f"state was saved with seed {state['seed']}, this Loader has seed {self.seed}")
        if self._active is not None:
            self._active.stop()
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
        `wait` (the training loop waiting for a batch: the number that matters). `ring` has the raw ring counters.
        """
        snap = self._stats.snapshot()
        ring = self._ring.stats()
        batches = int(ring.get("batches", 0))
        seconds = float(ring.get("read_seconds", 0.0))
        snap["stages"]["read"] = {"count": batches, "seconds": seconds, "max_s": 0.0,
                                  "mean_ms": 1e3 * seconds / batches if batches else 0.0}
        snap["counters"]["bytes_read"] = int(ring.get("bytes_read", 0))
        snap["ring"] = ring
        return snap

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._active is not None:
            self._active.stop()
        if self._retuning is not None:
            self._retuning.join()
        self._ring.close()
        for d in {id(d): d for d in self._decoders + self._every}.values():  # active and idle ones
            d.close()
        self.dataset.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    # ------------------------------------------------------------------ internals
    def _build_decoders(self, num_threads, hw_decoder_load, pipelines, common: dict):
        """The decoders and the settings chosen: measured on this machine for DALI with num_threads="auto"."""
        auto = num_threads is None or num_threads == "auto"
        if not auto and (isinstance(num_threads, bool) or not isinstance(num_threads, int) or num_threads < 1):
            raise ValueError(f"num_threads must be 'auto' or an integer >= 1, got {num_threads!r}")
        if pipelines is not None and int(pipelines) < 1:
            raise ValueError(f"pipelines must be >= 1, got {pipelines}")
        kind = self._decoder_kind

        def build(hw, threads):
            # JPEG draft mode (DCT-domain downscaling) only pays in train mode on large images (16-30% faster
            # on ~1,500 px photos, no change on ImageNet-sized ones); eval keeps exact torchvision parity.
            return make_decoder(kind, num_threads=threads, hw_decoder_load=hw, draft=self.train, **common)

        self._tuner, self._retuning, self._build = None, None, build
        self._every, self._made = [], {}
        if kind == "dali" and auto:
            from fastfeed import tuning

            # No start-up measurement (it cost 6-7 s and tuned for the loader alone, not for training): start with
            # the setting that trained fastest, adapt online from the training loop (see fastfeed/tuning.py).
            start = tuning.START
            if hw_decoder_load is None and pipelines is None:
                cores = _cpu_count() // max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
                self._tuner = tuning.OnlineTuner(max_threads=max(2, cores))
                start = self._tuner.current
            else:
                start = tuning.DecodeSettings(start.hw_decoder_load if hw_decoder_load is None
                                              else float(hw_decoder_load), start.num_threads,
                                              start.pipelines if pipelines is None else int(pipelines))
            self._settings = start
            decoders = [build(start.hw_decoder_load, start.num_threads) for _ in range(start.pipelines)]
            self._every = list(decoders)  # every decoder built, for reuse by later switches and for close()
            self._made = {id(d): (start.hw_decoder_load, start.num_threads) for d in decoders}
            return decoders, {"num_threads": start.num_threads, "hw_decoder_load": start.hw_decoder_load,
                              "pipelines": start.pipelines, "online_tuning": [] if self._tuner else None}
        threads = _default_threads(self.world) if auto else int(num_threads)
        hw = 0.9 if hw_decoder_load is None else float(hw_decoder_load)
        # Two DALI pipelines side by side: while one waits for its GPU work the other parses and submits the next
        # batch, keeping the hardware decoder busy (one synchronous pipeline measured 9.0k img/s, two 13.6k, on
        # an H200). CPU decoders already spread a batch over a thread pool.
        n = int(pipelines) if pipelines else (2 if kind == "dali" else 1)
        decoders = [build(hw, threads) for _ in range(n)]
        self._every, self._made = list(decoders), {id(d): (hw, threads) for d in decoders}
        return decoders, {"num_threads": threads, "hw_decoder_load": hw, "pipelines": n}

    def _retune(self, epoch: EpochRun, new) -> None:
        """Switch the running epoch to the tuner's `new` DecodeSettings. Decoders already built with the same
        hw_decoder_load and threads are reused (active ones first, then idle ones kept from earlier switches);
        only missing ones are built, and warmed with one real batch, in a background thread while the current
        ones keep decoding. Measured 2026-11-30 on an H200: each switch that built and tore down DALI pipelines
        stalled ResNet-18 training for ~1.5 s (warming alone did not remove it), so nothing is torn down before
        close() and a switch back costs nothing."""
        if self._retuning is not None:
            self._retuning.join()  # one switch at a time (the tuner's window is far longer than a build)
        active = list(self._decoders)

        def work():
            key = (new.hw_decoder_load, new.num_threads)
            try:
                pool = [d for d in active if self._made[id(d)] == key]
                pool += [d for d in self._every if self._made[id(d)] == key and d not in pool]
                chosen = pool[:new.pipelines]
                fresh = [self._build(*key) for _ in range(new.pipelines - len(chosen))]
                for d in fresh:
                    self._made[id(d)] = key
                self._every += fresh  # before set_decoders: close() closes them whatever happens next
                self._warm(fresh)
                epoch.set_decoders(chosen + fresh)
            except Exception as exc:  # noqa: BLE001 - a setting that cannot be built is not used; training goes on
                log.warning("fastfeed: could not switch decode settings to %s: %s", new, exc)
                self._tuner.refused(self._settings)
                return
            self._settings = new
            self.num_threads = new.num_threads
            for name in ("num_threads", "hw_decoder_load", "pipelines"):
                self._stats.set_info(name, getattr(new, name))

        self._retuning = threading.Thread(target=work, name="fastfeed-retune", daemon=True)
        self._retuning.start()

    def _warm(self, decoders) -> None:
        """Decode one real batch with each new decoder, on a stream of its own, off the training loop."""
        if not decoders:
            return
        from fastfeed import tuning

        try:
            (samples, windows), = tuning.sample_batches(self.dataset, self._widths, self._heights, self.batch_size,
                                                        1, self.seed, self.train, self.image_size)
            stream = torch.cuda.Stream(device=self.device) if self.device.type == "cuda" else None
            for d in decoders:
                if stream is None:
                    d(samples, windows)
                else:
                    with torch.cuda.stream(stream):
                        d(samples, windows)
            if stream is not None:
                stream.synchronize()
        except Exception as exc:  # noqa: BLE001 - a cold decoder still works; it is only slower for one batch
            log.info("fastfeed: warming new decoders failed (%s); switching cold", exc)

    def _make_plan(self, epoch: int, resume: dict | None):
        return sampling.plan_epoch(
            len(self.dataset), seed=self.seed, epoch=epoch, world=self.world, batch_size=self.batch_size,
            drop_last=self.drop_last, shuffle=self.shuffle, order=self.order, shard_of=self._shard_of,
            resume=resume)


def _resolve_device(device, world: World) -> torch.device:
    if device is None:
        if torch.cuda.is_available():
            return torch.device("cuda", world.local_rank % max(1, torch.cuda.device_count()))
        return torch.device("cpu")
    dev = torch.device(device)
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError("device='cuda' but CUDA is not available; use device='cpu'")
        if dev.index is None:
            dev = torch.device("cuda", world.local_rank % torch.cuda.device_count())
    elif dev.type != "cpu":
        raise ValueError(f"device must be 'cuda' or 'cpu', got {device!r}")
    return dev


def _cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def _default_threads(world: World) -> int:
    cores = _cpu_count()
    local = max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    return max(1, min(8, cores // local))
