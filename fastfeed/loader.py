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
import queue
import threading
from dataclasses import dataclass

import numpy as np
import torch

from fastfeed import IMAGENET_MEAN, IMAGENET_STD
from fastfeed import sampling
from fastfeed.decode import crop_windows, make_decoder
from fastfeed.decode.base import CorruptSampleError, replacement_map
from fastfeed.formats import open_dataset
from fastfeed.ring import PrefetchRing, RingReadError
from fastfeed.stats import StageStats
from fastfeed.world import World

__all__ = ["Loader", "LoaderError"]

log = logging.getLogger("fastfeed")

STATE_VERSION = 1
_POLL_S = 0.1  # how often blocked pipeline calls re-check the stop flag
_JOIN_S = 5.0


class LoaderError(RuntimeError):
    """An error raised in the loader's pipeline thread, re-raised in the training loop with where it happened."""


@dataclass
class _Failure:
    where: str
    exc: BaseException


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
        num_threads: decoder threads per pipeline, or "auto": with DALI, a short measurement at start-up picks
            threads, hw_decoder_load and pipelines for this machine (see fastfeed/tuning.py; the choice and the
            table measured are in `stats()["info"]`); with a CPU decoder, the cores this rank may use (at most 8).
        reader_threads: native ring reader threads (default 4; more helps cold or network storage).
        prefetch: decoded batches queued ahead of the consumer (default 2); the ring reads `prefetch + 2` ahead.
        hw_decoder_load: share of JPEGs sent to the GPU's hardware decoder (DALI; default 0.9, measured best).
        pipelines: decoders working side by side on consecutive batches (default 2 for DALI, else 1).
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
        self._stats = StageStats()
        self._labels = torch.from_numpy(np.ascontiguousarray(self.dataset.labels, dtype=np.int64))
        self._widths = np.asarray(self.dataset.widths)
        self._heights = np.asarray(self.dataset.heights)
        self._shard_of = _shard_of(self.dataset) if order == "shard" else None

        self._decoder_kind = _resolve_decoder(decoder, self.device)
        self._decoders, settings = self._build_decoders(
            num_threads, hw_decoder_load, pipelines,
            dict(device=self.device.type, device_id=self.device.index or 0, image_size=self.image_size,
                 dtype=dtype, channels_last=channels_last, mean=mean, std=std, batch_size=self.batch_size,
                 on_error=on_error))
        self.num_threads = settings["num_threads"]
        n_pipelines = len(self._decoders)
        self._ring = PrefetchRing(self.dataset.extents(), self.batch_size,
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
        self._active: _Epoch | None = None
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
        epoch = _Epoch(self, self._plan)
        self._active = epoch
        return self._consume(epoch)

    def _consume(self, epoch: "_Epoch"):
        plan = epoch.plan
        try:
            epoch.begin()
            for k in range(plan.num_batches):
                images, labels = epoch.next()
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
        """Per-stage counters and timers (read, decode, wait, ...), samples skipped with reasons, the settings."""
        snap = self._stats.snapshot()
        ring = self._ring.stats()
        snap["ring"] = ring
        return snap

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._active is not None:
            self._active.stop()
        self._ring.close()
        for d in self._decoders:
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
            return make_decoder(kind, num_threads=threads, hw_decoder_load=hw, **common)

        if kind == "dali" and auto:
            from fastfeed import tuning

            wanted = [c for c in tuning.CANDIDATES
                      if (hw_decoder_load is None or c.hw_decoder_load == hw_decoder_load)
                      and (pipelines is None or c.pipelines == int(pipelines))]
            if not wanted:
                wanted = [tuning.DecodeSettings(0.9 if hw_decoder_load is None else float(hw_decoder_load), 4,
                                                int(pipelines or 2))]
            batches = tuning.sample_batches(self.dataset, self._widths, self._heights, self.batch_size, 8,
                                            self.seed, self.train, self.image_size)
            best, decoders, table = tuning.tune_decoders(build, batches, wanted, _cpu_count())
            return decoders, {"num_threads": best.num_threads, "hw_decoder_load": best.hw_decoder_load,
                              "pipelines": best.pipelines, "autotune": table}
        threads = _default_threads(self.world) if auto else int(num_threads)
        hw = 0.9 if hw_decoder_load is None else float(hw_decoder_load)
        # Two DALI pipelines side by side: while one waits for its GPU work the other parses and submits the next
        # batch, keeping the hardware decoder busy (one synchronous pipeline measured 9.0k img/s, two 13.6k, on
        # an H200). CPU decoders already spread a batch over a thread pool.
        n = int(pipelines) if pipelines else (2 if kind == "dali" else 1)
        return [build(hw, threads) for _ in range(n)], {"num_threads": threads, "hw_decoder_load": hw,
                                                         "pipelines": n}

    def _make_plan(self, epoch: int, resume: dict | None):
        return sampling.plan_epoch(
            len(self.dataset), seed=self.seed, epoch=epoch, world=self.world, batch_size=self.batch_size,
            drop_last=self.drop_last, shuffle=self.shuffle, order=self.order, shard_of=self._shard_of,
            resume=resume)


class _Epoch:
    """One iteration's decode workers and in-order hand-off (see NOTE [Loader pipeline and shutdown])."""

    def __init__(self, loader: Loader, plan):
        self.loader = loader
        self.plan = plan
        self.stop_flag = threading.Event()
        self.cond = threading.Condition()
        self.results: dict[int, object] = {}  # batch position -> (images, labels, event) or _Failure
        self.next_out = 0  # the position the consumer takes next
        self.window = loader.prefetch + len(loader._decoders)  # decoded batches allowed ahead of the consumer
        self.ring_lock = threading.Lock()  # workers take ring batches one at a time, so positions are in order
        self.dispatched = 0
        self.threads: list[threading.Thread] = []

    def begin(self) -> None:
        L = self.loader
        L._ring.start(np.ascontiguousarray(self.plan.indices, dtype=np.int64))
        for w, decoder in enumerate(L._decoders):
            t = threading.Thread(target=self._work, args=(decoder,), name=f"fastfeed-decode-{w}", daemon=True)
            t.start()
            self.threads.append(t)

    # -- decode workers
    def _work(self, decoder) -> None:
        L = self.loader
        stream = None
        if L.device.type == "cuda":
            torch.cuda.set_device(L.device)
            stream = torch.cuda.Stream(device=L.device)
        while not self.stop_flag.is_set():
            k, slot = self._take()
            if k is None:
                return
            if not self._wait_for_room(k):
                if not isinstance(slot, BaseException) and slot is not None:
                    slot.release()
                return
            try:
                item = self._produce(k, slot, decoder, stream)
            except BaseException as exc:  # noqa: BLE001 - everything crosses to the consumer, who decides
                item = _Failure(f"fastfeed decode worker, epoch {L._epoch}, batch {k}", exc)
            with self.cond:
                self.results[k] = item
                self.cond.notify_all()
            if isinstance(item, _Failure):
                return

    def _take(self):
        """(position, ring batch or the RingReadError it raised); (None, None) when the epoch is dispatched."""
        ring = self.loader._ring
        with self.ring_lock:
            if self.dispatched >= self.plan.num_batches:
                return None, None
            k = self.dispatched
            with self.loader._stats.timed("read_wait"):
                while not self.stop_flag.is_set():
                    try:
                        slot = ring.next_batch(timeout=_POLL_S)
                        break
                    except TimeoutError:
                        continue
                    except RingReadError as exc:
                        slot = exc
                        break
                else:
                    return None, None
            if slot is None:
                raise LoaderError(f"the ring ended after {k} of {self.plan.num_batches} batches")
            self.dispatched += 1
            return k, slot

    def _wait_for_room(self, k: int) -> bool:
        """Bound decoded-but-unconsumed batches (device memory) to `window`."""
        with self.cond:
            while k >= self.next_out + self.window:
                if self.stop_flag.is_set():
                    return False
                self.cond.wait(_POLL_S)
        return not self.stop_flag.is_set()

    def _produce(self, k: int, slot, decoder, stream):
        L = self.loader
        if isinstance(slot, RingReadError):
            if L.on_error == "raise":
                raise slot
            # The ring failed this batch; read it sample by sample so one bad extent costs one sample, not a batch.
            rb, indices = None, np.asarray(self.plan.batch(k), dtype=np.int64)
            samples = [_read_or_empty(L.dataset, int(i)) for i in indices]
            L._stats.skip("read_error", key=str(slot), n=sum(1 for s in samples if len(s) == 0))
        else:
            rb = slot
            indices = np.asarray(rb.indices, dtype=np.int64)
            samples = rb.samples()
        try:
            windows = crop_windows(L._widths[indices], L._heights[indices], indices, seed=L.seed,
                                   epoch=L._epoch, train=L.train, image_size=L.image_size)
            with L._stats.timed("decode", n=len(indices)):
                if stream is not None:
                    with torch.cuda.stream(stream):
                        result = decoder(samples, windows)
                        labels = self._labels(indices, result.replaced)
                        event = torch.cuda.Event()
                        event.record(stream)
                else:
                    result = decoder(samples, windows)
                    labels = self._labels(indices, result.replaced)
                    event = None
        except CorruptSampleError as exc:  # on_error="raise": name the samples, not batch positions
            names = ", ".join(str(L.dataset.keys[indices[p]]) for p in exc.positions[:8])
            raise LoaderError(f"corrupt sample(s) {names} in batch {k} of epoch {L._epoch}: {exc}") from exc
        finally:
            del samples
            if rb is not None:
                rb.release()  # the decoder has returned: nothing reads the slot any more
        for pos, reason in result.replaced:
            L._stats.skip(str(reason).split(":")[0], key=str(L.dataset.keys[indices[pos]]))
        L._stats.add("samples", len(indices))
        L._stats.add("batches", 1)
        if rb is not None:
            L._stats.add("bytes_read", int(np.sum(rb.sizes)))
        return result.images, labels, event

    def _labels(self, indices: np.ndarray, replaced) -> torch.Tensor:
        L = self.loader
        labels = L._labels[torch.from_numpy(indices)]
        if replaced:
            for dst, src in replacement_map([p for p, _ in replaced], len(indices)).items():
                labels[dst] = labels[src]
        if L.device.type == "cuda":
            labels = labels.pin_memory().to(L.device, non_blocking=True)
        return labels

    # -- consumer side
    def next(self):
        L = self.loader
        k = self.next_out
        with L._stats.timed("wait"):
            with self.cond:
                while k not in self.results:
                    if not any(t.is_alive() for t in self.threads):
                        raise LoaderError(f"fastfeed decode workers ended before batch {k}")
                    self.cond.wait(_POLL_S)
                item = self.results.pop(k)
                self.next_out = k + 1
                self.cond.notify_all()
        if isinstance(item, _Failure):
            raise LoaderError(f"{type(item.exc).__name__} in {item.where}: {item.exc}") from item.exc
        images, labels, event = item
        if event is not None:
            current = torch.cuda.current_stream(L.device)
            current.wait_event(event)
            images.record_stream(current)
            labels.record_stream(current)
        return images, labels

    def stop(self) -> None:
        self.stop_flag.set()
        with self.cond:
            self.cond.notify_all()
        for t in self.threads:
            if t is not threading.current_thread():
                t.join(timeout=_JOIN_S)
                if t.is_alive():
                    log.warning("fastfeed decode worker did not stop within %.0f s", _JOIN_S)
        self.threads = []
        with self.cond:
            self.results.clear()  # drop decoded batches nobody will take (frees their device memory)


def _read_or_empty(dataset, i: int) -> np.ndarray:
    try:
        return np.frombuffer(dataset.read(i), dtype=np.uint8)
    except (OSError, ValueError):
        return np.empty(0, dtype=np.uint8)


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


def _resolve_decoder(decoder: str, device: torch.device) -> str:
    if decoder not in ("auto", "dali", "cpu", "cpu-pil", "cpu-dali"):
        raise ValueError(f"decoder must be 'auto', 'dali', 'cpu', 'cpu-pil' or 'cpu-dali', got {decoder!r}")
    if decoder != "auto":
        return decoder
    if device.type == "cuda" and _dali_available():
        return "dali"
    return "cpu"


def _dali_available() -> bool:
    try:
        import nvidia.dali  # noqa: F401
    except ImportError:
        return False
    return True


def _cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def _default_threads(world: World) -> int:
    cores = _cpu_count()
    local = max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    return max(1, min(8, cores // local))


def _shard_of(dataset) -> np.ndarray:
    extents = dataset.extents()
    return np.asarray(extents.file_index, dtype=np.int64)
