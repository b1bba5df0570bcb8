"""One epoch's worth of decode workers for `fastfeed.Loader` (see NOTE [Loader pipeline and shutdown] in
fastfeed/loader.py, which every waiting and hand-off rule here implements)."""
from __future__ import annotations

import logging
import threading
from dataclasses import dataclass

import numpy as np
import torch

from fastfeed.decode import crop_windows
from fastfeed.decode.base import CorruptSampleError, replacement_map
from fastfeed.ring import RingReadError

__all__ = ["EpochRun", "LoaderError"]

log = logging.getLogger("fastfeed")

_POLL_S = 0.1  # how often blocked waits re-check the stop flag
_JOIN_S = 5.0


class LoaderError(RuntimeError):
    """An error raised in a decode worker, re-raised in the training loop with where it happened."""


@dataclass
class _Failure:
    where: str
    exc: BaseException


class EpochRun:
    """One iteration of a Loader: its decode workers and the in-order hand-off to the consumer.

    The concurrency protocol is NOTE [Loader pipeline and shutdown] in fastfeed/loader.py.
    """

    def __init__(self, loader, plan):
        self.loader = loader
        self.plan = plan
        self.stop_flag = threading.Event()
        self.cond = threading.Condition()
        self.results: dict[int, object] = {}  # batch position -> (images, labels, event) or _Failure
        self.next_out = 0  # the position the consumer takes next
        # worker w decodes with decoders[w]; the online tuner may swap the list mid-epoch (set_decoders)
        self.decoders = list(loader._decoders)
        self._workers: set[int] = set()  # indices w with a live worker thread (guarded by cond)
        self._holder: dict[int, int] = {}  # id(decoder) -> the worker using it: one thread per decoder at a time
        self.ring_lock = threading.Lock()  # workers take ring batches one at a time, so positions are in order
        self.dispatched = 0
        self.threads: list[threading.Thread] = []

    def begin(self) -> None:
        L = self.loader
        L._ring.start(np.ascontiguousarray(self.plan.indices, dtype=np.int64))
        self._workers = set(range(len(self.decoders)))
        for w in range(len(self.decoders)):
            self._start_worker(w)

    @property
    def window(self) -> int:
        """Decoded batches allowed ahead of the consumer (bounds device memory)."""
        return self.loader.prefetch + len(self.decoders)

    def _start_worker(self, w: int) -> None:
        t = threading.Thread(target=self._work, args=(w,), name=f"fastfeed-decode-{w}", daemon=True)
        t.start()
        self.threads.append(t)

    def set_decoders(self, decoders: list) -> None:
        """Switch to `decoders` (the online tuner's new setting) without stopping the epoch: worker w moves to
        decoders[w] before its next batch (waiting, if another worker still finishes a batch with it); workers
        beyond the new count finish their batch and exit; missing workers start. Nothing is closed here: the
        Loader keeps decoders it no longer uses, idle, for the tuner's next switch (building and tearing down
        DALI pipelines mid-training stalled the step for ~1.5 s per switch, measured 2026-11-30)."""
        room = (self.loader._ring.num_slots - self.loader.prefetch) // 2  # the ring was sized for this many
        if not 1 <= len(decoders) <= room:
            raise ValueError(f"{len(decoders)} decoders; this Loader's ring has slots for 1..{room}")
        with self.cond:
            self.decoders = list(decoders)
            self.loader._decoders = self.decoders
            start = [w for w in range(len(decoders)) if w not in self._workers]
            self._workers.update(start)
            self.cond.notify_all()
        for w in start:
            self._start_worker(w)

    # -- decode workers
    def _work(self, w: int) -> None:
        L = self.loader
        stream = None
        if L.device.type == "cuda":
            torch.cuda.set_device(L.device)
            # Lowest priority (CUDA's default is already the lowest, so this only documents it): the training
            # step's kernels must never queue behind decode work. Measured 2026-11-30: a higher-priority training
            # stream gained nothing (+0.6%, noise), so the loader does not ask users to change streams.
            stream = torch.cuda.Stream(device=L.device, priority=0)
        decoder = None
        registered = True  # self._workers holds w for this thread
        try:
            while not self.stop_flag.is_set():
                with self.cond:
                    if w >= len(self.decoders):  # retired: fewer pipelines now
                        self._workers.discard(w)  # in the same lock as the check: set_decoders may restart w
                        registered = False
                        return
                    current = self.decoders[w]
                    if current is not decoder:
                        if decoder is not None:
                            self._holder.pop(id(decoder), None)
                            self.cond.notify_all()
                        decoder = None
                        if self._holder.get(id(current), w) != w:
                            self.cond.wait(_POLL_S)  # another worker still finishes a batch with it
                            continue
                        self._holder[id(current)] = w
                        decoder = current
                if not self._work_one(decoder, stream):
                    return
        finally:
            with self.cond:
                if registered:
                    self._workers.discard(w)
                if decoder is not None:
                    self._holder.pop(id(decoder), None)
                self.cond.notify_all()

    def _work_one(self, decoder, stream) -> bool:
        """Decode the next batch of the epoch; False when this worker should end."""
        k, slot = self._take()
        if k is None:
            return False
        if not self._wait_for_room(k):
            if not isinstance(slot, BaseException):
                slot.release()
            return False
        try:
            item = self._produce(k, slot, decoder, stream)
        except BaseException as exc:  # noqa: BLE001 - everything crosses to the consumer, who decides
            item = _Failure(f"fastfeed decode worker, epoch {self.loader._epoch}, batch {k}", exc)
        with self.cond:
            self.results[k] = item
            self.cond.notify_all()
        return not isinstance(item, _Failure)

    def _take(self):
        """(position, ring batch or the exception the ring raised for it); (None, None) when the epoch is
        dispatched or stopping. Errors are returned, not raised, so they reach the consumer at their position."""
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
                    except Exception as exc:  # noqa: BLE001 - RingReadError (maybe skipped) or fatal
                        slot = exc
                        break
                else:
                    return None, None
            if slot is None:
                slot = LoaderError(f"the ring ended after {k} of {self.plan.num_batches} batches")
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
        if isinstance(slot, BaseException) and not isinstance(slot, RingReadError):
            raise slot
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
                    if self.stop_flag.is_set():
                        raise LoaderError("this iteration was stopped (the Loader was closed, re-iterated or "
                                          "given a state); start a new `for` over the Loader")
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
