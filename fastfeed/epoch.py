"""The decode workers of `fastfeed.Loader` for one epoch, and for the epochs after it while the loop asks for them
in order (see NOTE [Loader pipeline and shutdown] in fastfeed/loader.py, which every waiting and hand-off rule here
implements).

`EpochRun` takes its parts explicitly — the epoch's plan, the ring, the decoders, the settings, the sample table,
the stats and, to read on into the next epoch, a function that plans it — and nothing else: it never reaches back
into the Loader. Batch positions count on across the epochs it chains (`plan_at` says where each epoch starts).
"""
from __future__ import annotations

import logging
import threading
import time
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np
import torch

from fastfeed import jpeg
from fastfeed.constants import IGNORE_INDEX
from fastfeed.decode import crop_windows
from fastfeed.decode.base import DECODE_ERROR, CorruptSampleError, replacement_map
from fastfeed.pipelines import room_for_a_pipeline
from fastfeed.ring import RingReadError

__all__ = ["EpochRun", "LoaderError", "SampleTable", "SKIP_CODES"]

log = logging.getLogger("fastfeed")

_POLL_S = 0.1  # how often blocked waits re-check the stop flag
_JOIN_S = 5.0
_FILL_CANDIDATES = 64  # other samples of the epoch tried for a batch whose every sample is bad

# Why a batch position holds a copy of another sample (stats()["skipped"] keys; the same on every decoder).
SKIP_CODES = ("read_error", "checksum", "not_image", "decode_error")


class LoaderError(RuntimeError):
    """An error raised in a decode worker, re-raised in the training loop with where it happened."""


@dataclass(frozen=True)
class SampleTable:
    """What the epoch needs to know about every sample, by sample id.

    labels: int64 [N] (CPU). widths/heights: the displayed size crop windows are computed on (the stored size
    under the orientation policy: `decode.oriented_size`). keys: each sample's source
    name (for messages and logs). read(i): one sample's bytes, for the per-sample fallback after a ring read error
    and for refilling a batch. bad_checksums(indices, samples, digests=None): the positions whose bytes do not
    match the sample table's checksum, or None when the dataset has none or checks are off; `digests` is the ring
    batch's native xxh3_64 of each sample (`RingBatch.digests`) when the ring computed them, so only the comparison
    runs with the GIL held, and None where the samples must be hashed here (the per-sample fallback reads).
    """

    labels: torch.Tensor
    widths: np.ndarray
    heights: np.ndarray
    keys: Sequence
    read: Callable[[int], bytes]
    bad_checksums: Callable[..., list] | None = None


@dataclass
class _Failure:
    where: str
    exc: BaseException


class EpochRun:
    """One iteration of a Loader: its decode workers and the in-order hand-off to the consumer.

    The concurrency protocol is NOTE [Loader pipeline and shutdown] in fastfeed/loader.py. `joined` is False after
    `stop()` if a worker did not end in time: its decoder may still be in use, so the owner must not hand those
    decoders to another run.

    next_plan(epoch) -> the plan of the epoch after `epoch`, or None: given, the run reads on into that epoch as soon
    as the ring's read-ahead reaches the end of the current one (it is queued in the ring behind it), so its first
    batches are read and decoded while the loop finishes this epoch (NOTE [Reading on into the next epoch] in
    fastfeed/loader.py).

    tuner: a `pipelines.PipelineTuner` (or None: every decoder works, always): asked at each batch the consumer takes
    how many workers decode; worker w works while w < that count and waits, holding no batch, otherwise. A worker
    past the decoders given builds its own with `new_decoder()` and appends it to `decoders` (the owner's list, so
    the next run has it). The count changes which thread decodes a batch, never which batch comes at a position.
    """

    def __init__(self, plan, *, ring, decoders, settings, table: SampleTable, stats, fetch_shards=None, pace=None,
                 next_plan=None, tuner=None, new_decoder=None):
        self._segments: list[tuple[int, object]] = [(0, plan)]  # (first batch position, plan) per chained epoch
        self.total = plan.num_batches  # batch positions planned so far, over the chained epochs
        self._next_plan = next_plan
        self.ring = ring
        self.decoders = decoders
        self.settings = settings
        self.table = table
        self.stats = stats
        self.stop_flag = threading.Event()
        self.cond = threading.Condition()
        self.results: dict[int, object] = {}  # batch position -> (images, labels, event) or _Failure
        self.next_out = 0  # the position the consumer takes next
        self._tuner, self._new_decoder = tuner, new_decoder
        self._decoders_lock = threading.Lock()  # a worker appending the decoder it built
        self.active = tuner.current() if tuner is not None else len(decoders)  # workers that decode now
        self.window = self._window(self.active)  # decoded batches allowed ahead of the consumer
        self.ring_lock = threading.Lock()  # workers take ring batches one at a time, so positions are in order
        self.dispatched = 0
        # Set once batch 0 is decoded (or the run stops): until then the other workers wait with the batch they took,
        # so the first batch has the GPU's decoders to itself — with 12-MP photos, decoding two batches side by side
        # made the first one arrive ~0.5 s later.
        self.first_done = threading.Event()
        self.threads: list[threading.Thread] = []
        self.joined = True
        self._logged: set[str] = set()
        # fetch_shards(indices, stop) -> a remote dataset's EpochFetch (or None): it keeps the shards of the ring's
        # read-ahead window in the local cache (fastfeed/remote/epoch.py states the rule this relies on).
        self._fetch_shards = fetch_shards
        self.fetch = None
        self.pace = pace  # a ConsumerPace: told when the consumer takes each batch (fastfeed/pace.py)

    def begin(self) -> None:
        indices = self._segments[0][1].indices  # the first epoch's
        if self._fetch_shards is not None:
            self.fetch = self._fetch_shards(indices, self.stop_flag)
        self.ring.start(np.ascontiguousarray(indices, dtype=np.int64))
        if self.pace is not None:
            self.pace.start()
        self._start_workers()

    def _start_workers(self) -> None:
        """Threads for the workers up to `active` that have none yet (called by the consumer's thread only)."""
        for w in range(len(self.threads), self.active):
            t = threading.Thread(target=self._work, args=(w,), name=f"fastfeed-decode-{w}", daemon=True)
            t.start()
            self.threads.append(t)

    def _window(self, active: int) -> int:
        """Decoded batches allowed ahead of the consumer with `active` workers: `prefetch + active`, fewer when the
        ring has fewer slots than that plus one batch in each worker's hands. Why: the ring puts batch b in slot
        b % slots, and a worker holds its batch until decoded (positions are taken in order, released in any), so
        the ring can hand out batch b only while batch b - slots is released; the batches taken run at most
        window + active ahead of the consumer, so window + active <= slots keeps b - slots decoded (a ring sized
        down to fit host memory has fewer: settings.ring_slots_within)."""
        return max(1, min(self.settings.prefetch + active, self.ring.num_slots - active))

    def _resize(self, count: int) -> None:
        """The tuner changed the number of workers that decode."""
        with self.cond:
            self.active = count
            self.window = self._window(count)
            self.cond.notify_all()
        self._start_workers()

    # -- decode workers
    def _work(self, w: int) -> None:
        decoder = self._decoder(w)
        if decoder is None:
            return
        stream = None
        device = self.settings.device
        if device.type == "cuda":
            torch.cuda.set_device(device)
            stream = torch.cuda.Stream(device=device)
        while not self.stop_flag.is_set():
            if not self._wait_active(w):
                return
            k, slot = self._take()
            if k is None:
                return
            if not self._wait_for_first(k) or not self._wait_for_room(k):
                if not isinstance(slot, BaseException):
                    slot.release()
                return
            try:
                item = self._produce(k, slot, decoder, stream)
            except BaseException as exc:  # noqa: BLE001 - everything crosses to the consumer, who decides
                plan, j = self._locate(k)
                item = _Failure(f"fastfeed decode worker, epoch {plan.epoch}, batch {j}", exc)
            with self.cond:
                self.results[k] = item
                self.cond.notify_all()
            if k == 0:
                self.first_done.set()
            if isinstance(item, _Failure):
                return

    def _decoder(self, w: int):
        """Worker w's decoder: the owner's, or one this worker builds (the tuner asked for more workers than there
        were decoders) while the device has room for it (`pipelines.room_for_a_pipeline`). None when it has not or
        the build fails (logged): the worker ends, the others go on, and the tuner, which sees no gain from the
        count it asked for, goes back."""
        with self._decoders_lock:
            if w < len(self.decoders):
                return self.decoders[w]
            try:
                while len(self.decoders) <= w:
                    if self.settings.device.type == "cuda":
                        free, total = torch.cuda.mem_get_info(self.settings.device)
                        if not room_for_a_pipeline(free, total):
                            raise MemoryError(f"{free / 2**30:.1f} of {total / 2**30:.1f} GiB of device memory "
                                              "free: left to the model")
                    # the tuners measure nothing across the build (the new pipeline feeds nothing yet), start after it
                    t0 = time.perf_counter()
                    with self.pace.building() if self.pace is not None else nullcontext():
                        self.decoders.append(self._new_decoder())
                    # Said once per pipeline: the tuner's tries show in the user's own throughput log.
                    log.info("fastfeed: built decode pipeline %d in %.2f s for the pipeline tuner", len(self.decoders),
                             time.perf_counter() - t0)
                return self.decoders[w]
            except Exception as exc:  # noqa: BLE001 - GPU memory, a driver limit: run on with the pipelines built
                log.warning("fastfeed: could not build decode pipeline %d (%s: %s); running on with %d",
                            w + 1, type(exc).__name__, exc, len(self.decoders))
                return None

    def _wait_active(self, w: int) -> bool:
        """Wait, holding no batch, while the tuner runs fewer than w + 1 workers; False when the run stops."""
        with self.cond:
            while w >= self.active and not self.stop_flag.is_set():
                self.cond.wait(_POLL_S)
        return not self.stop_flag.is_set()

    def _take(self):
        """(position, ring batch or the exception the ring raised for it); (None, None) when the epoch is
        dispatched or stopping. Errors are returned, not raised, so they reach the consumer at their position."""
        with self.ring_lock:
            if self._next_plan is not None and self.dispatched + self.ring.num_slots >= self.total:
                self._chain()  # the ring's read-ahead reaches the epoch's end: queue the next one behind it
            if self.dispatched >= self.total:
                return None, None
            k = self.dispatched
            with self.stats.timed("read_wait"):
                if self.fetch is not None:
                    try:
                        if not self.fetch.before_batch(k, self.stop_flag):
                            return None, None
                    except Exception as exc:  # noqa: BLE001 - DatasetError naming the shard: fatal, at batch k
                        self.dispatched += 1
                        return k, exc
                while not self.stop_flag.is_set():
                    try:
                        slot = self.ring.next_batch(timeout=_POLL_S)
                        break
                    except TimeoutError:
                        continue
                    except Exception as exc:  # noqa: BLE001 - RingReadError (maybe skipped) or fatal
                        slot = exc
                        break
                else:
                    return None, None
            if slot is None:
                plan, j = self._locate(k)
                slot = LoaderError(f"the ring ended after {j} of {plan.num_batches} batches of epoch {plan.epoch}")
            self.dispatched += 1
            return k, slot

    def _chain(self) -> None:
        """Called with ring_lock held once the ring's read-ahead (its slots) reaches the end of the epochs planned:
        plan the next epoch and queue it in the ring behind them (`PrefetchRing.extend`), so the ring reads its first
        batches into the slots the current one frees and the workers decode them while the loop finishes this epoch;
        nothing waits at the boundary. Reads on no more (`_next_plan` None) once there is no next epoch."""
        if self.stop_flag.is_set():
            return
        plan = self._next_plan(self._segments[-1][1].epoch)
        if plan is None or plan.num_batches == 0:
            self._next_plan = None
            return
        self.ring.extend(np.ascontiguousarray(plan.indices, dtype=np.int64))
        with self.cond:
            self._segments.append((self.total, plan))
            self.total += plan.num_batches
            self.cond.notify_all()

    def _locate(self, k: int):
        """(plan, batch number within its epoch) of batch position k."""
        for base, plan in reversed(tuple(self._segments)):
            if k >= base:
                return plan, k - base
        raise IndexError(k)

    @property
    def chains(self) -> bool:
        """Whether the run reads on into the next epoch (given next_plan, and the next epoch is not empty)."""
        return self._next_plan is not None

    def plan_at(self, position: int):
        """The plan of the epoch whose first batch is `position`, waiting while the workers have not reached it yet;
        None when the run will not get there (it does not chain, stopped, or its workers ended)."""
        with self.cond:
            while True:
                for base, plan in self._segments:
                    if base == position:
                        return plan
                if self._next_plan is None or self.stop_flag.is_set() or position < self.total or \
                        not any(t.is_alive() for t in self.threads):
                    return None
                self.cond.wait(_POLL_S)

    def _wait_for_first(self, k: int) -> bool:
        """Batches after the first start once it is decoded (see `first_done`); False when the run stops."""
        while k > 0 and not self.first_done.wait(_POLL_S):
            if self.stop_flag.is_set():
                return False
        return not self.stop_flag.is_set()

    def _wait_for_room(self, k: int) -> bool:
        """Bound decoded-but-unconsumed batches (device memory) to `window`."""
        with self.cond:
            while k >= self.next_out + self.window:
                if self.stop_flag.is_set():
                    return False
                self.cond.wait(_POLL_S)
        return not self.stop_flag.is_set()

    def _produce(self, k: int, slot, decoder, stream):
        s = self.settings
        plan, j = self._locate(k)
        if isinstance(slot, BaseException) and not isinstance(slot, RingReadError):
            raise slot
        bad: dict[int, tuple[str, str]] = {}  # position -> (code, detail), found before decoding
        rb = None
        digests = None  # the ring's xxh3 of each sample, when it computes them
        if isinstance(slot, RingReadError):
            if s.on_error == "raise":
                raise slot
            # The ring failed this batch; read it sample by sample so one bad extent costs one sample, not a batch.
            indices = np.asarray(plan.batch(j), dtype=np.int64)
            samples = []
            for p, i in enumerate(indices.tolist()):
                data, err = self._read_one(i)
                samples.append(data)
                if err:
                    bad[p] = ("read_error", err)
        else:
            rb = slot
            indices = np.asarray(rb.indices, dtype=np.int64)
            samples = rb.samples()
            digests = rb.digests
        try:
            for p, why in self._untrusted(indices, samples, digests).items():
                bad.setdefault(p, why)
            if bad and s.on_error == "raise":
                raise LoaderError(f"sample(s) {self._names(indices, sorted(bad))} in batch {j} of epoch "
                                  f"{plan.epoch}: " + "; ".join(f"{c}: {d}" for c, d in bad.values()))
            for p in bad:
                samples[p] = _EMPTY  # the decoder reports it as not an image; its code stays the one found here
            with self.stats.timed("decode", n=len(indices)):
                if stream is not None:
                    with torch.cuda.stream(stream):
                        images, labels, replaced = self._decode(plan, j, decoder, indices, samples, bad)
                        event = torch.cuda.Event()
                        event.record(stream)
                else:
                    images, labels, replaced = self._decode(plan, j, decoder, indices, samples, bad)
                    event = None
        finally:
            del samples
            if rb is not None:
                rb.release()  # the decoder has returned: nothing reads the slot any more
        for p, code, detail in replaced:
            self._count_skip(code, self.table.keys[indices[p]], detail)
        self.stats.add("samples", len(indices))
        self.stats.add("batches", 1)
        return images, labels, event

    def _decode(self, plan, k, decoder, indices, samples, bad):
        """Batch k of `plan`: images, labels (on the device) and [(position, code, detail)] of positions holding
        another sample."""
        s = self.settings
        windows = crop_windows(self.table.widths[indices], self.table.heights[indices], indices, seed=s.seed,
                               epoch=plan.epoch, train=s.train, image_size=s.image_size)
        try:
            result = decoder(samples, windows)
        except CorruptSampleError as exc:
            if s.on_error == "raise":
                raise LoaderError(f"corrupt sample(s) {self._names(indices, exc.positions)} in batch {k} of epoch "
                                  f"{plan.epoch}: {exc}") from exc
            if len(exc.positions) < len(indices):
                raise
            return self._fill_from_epoch(plan, k, decoder, indices, exc, bad)
        replaced = [(r.position, *bad[r.position]) if r.position in bad else tuple(r) for r in result.replaced]
        labels = self.table.labels[torch.from_numpy(indices)]
        sources = replacement_map([p for p, _, _ in replaced], len(indices))
        for dst, src in sources.items():
            labels[dst] = labels[src]
        return result.images, self._finish_labels(plan, k, labels, sources), replaced

    def _untrusted(self, indices, samples, digests=None) -> dict[int, tuple[str, str]]:
        """The samples no decoder may see, by position, with (code, detail). Bytes that match the checksum pack
        stored are the bytes pack validated. Where no checksum is checked (the dataset has none, or
        verify_checksums=False), JPEGs and PNGs that pack would not have stored as they are (a broken header or
        chunk, no end marker) are held back: on an H200 DALI 2.4's GPU decoder segfaulted on the first batch holding a
        JPEG whose first segments are followed by garbage, its CPU decoder did in 4 runs of 6 at batch 64 (on such a
        PNG in 2 of 5), and the GPU decoder gave a cut JPEG's missing rows as pixels without an error
        (benchmarks/RESULTS.md, eighteenth session)."""
        if self.table.bad_checksums is not None:
            return {p: ("checksum", "its bytes do not match the checksum in the sample table")
                    for p in self.table.bad_checksums(indices, samples, digests=digests)}
        return {p: (DECODE_ERROR, why) for p, why in jpeg.header_failures(samples)}

    def _fill_from_epoch(self, plan, k, decoder, indices, exc: CorruptSampleError, bad):
        """Every sample of batch k is bad (skip mode): fill the batch with one good sample taken from the rest of
        the epoch (the next ones in the plan, cyclically), so the run goes on and the batch keeps its shape."""
        s = self.settings
        n = len(indices)
        replaced = [(p, *bad[p]) if p in bad else (p, code, detail)
                    for p, code, detail in zip(exc.positions, exc.codes, exc.details)]
        order = plan.indices
        start = min((k + 1) * plan.batch_size, len(order))
        candidates = np.concatenate((order[start:], order[:start]))[:_FILL_CANDIDATES]
        for c in candidates.tolist():
            data, err = self._read_one(c)
            if err or self._untrusted(np.asarray([c]), [data]):
                continue
            windows = crop_windows(self.table.widths[[c]], self.table.heights[[c]], np.asarray([c]), seed=s.seed,
                                   epoch=plan.epoch, train=s.train, image_size=s.image_size)
            try:
                one = decoder([data], windows)
            except CorruptSampleError:
                continue
            images = one.images.expand(n, *one.images.shape[1:]).contiguous(
                memory_format=torch.channels_last if s.channels_last else torch.contiguous_format)
            labels = self.table.labels[torch.full((n,), c, dtype=torch.int64)]
            return images, self._finish_labels(plan, k, labels, {p: -1 for p in range(n)}), replaced
        raise LoaderError(f"batch {k} of epoch {plan.epoch}: every sample is bad "
                          f"({self._names(indices, range(n))}) and none of {len(candidates)} other samples of the "
                          "epoch decodes either; check the dataset with `fastfeed verify`")

    def _finish_labels(self, plan, k: int, labels: torch.Tensor, replaced: dict) -> torch.Tensor:
        """In evaluation a position that holds no sample of its own (padding, a replaced sample) is labelled
        IGNORE_INDEX, so every sample is scored exactly once. Then to the device."""
        if not self.settings.train:
            padded = plan.padded[k * plan.batch_size:(k + 1) * plan.batch_size]
            ignore = torch.from_numpy(np.asarray(padded, dtype=bool).copy())
            if replaced:
                ignore[list(replaced)] = True
            labels[ignore] = IGNORE_INDEX
        if self.settings.device.type == "cuda":
            labels = labels.pin_memory().to(self.settings.device, non_blocking=True)
        return labels

    def _read_one(self, i: int):
        try:
            return np.frombuffer(self.table.read(i), dtype=np.uint8), None
        except (OSError, ValueError) as e:
            return _EMPTY, f"{type(e).__name__}: {e}"

    def _names(self, indices, positions) -> str:
        names = [str(self.table.keys[indices[p]]) for p in list(positions)[:8]]
        return ", ".join(names) + (" ..." if len(list(positions)) > 8 else "")

    def _count_skip(self, code: str, key, detail: str) -> None:
        self.stats.skip(code, key=str(key))
        if str(key) not in self._logged and len(self._logged) < 1000:
            self._logged.add(str(key))
            log.warning("fastfeed: sample %s replaced by another sample of its batch (%s: %s)", key, code, detail)

    # -- consumer side
    def next(self):
        k = self.next_out
        with self.stats.timed("wait") as waited:
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
        if self.pace is not None:
            self.pace.tick(wait=waited.seconds)
        if self._tuner is not None:
            count = self._tuner.current()
            if count != self.active:
                self._resize(count)
        if isinstance(item, _Failure):
            raise LoaderError(f"{type(item.exc).__name__} in {item.where}: {item.exc}") from item.exc
        images, labels, event = item
        if event is not None:
            current = torch.cuda.current_stream(self.settings.device)
            current.wait_event(event)
            images.record_stream(current)
            labels.record_stream(current)
        return images, labels

    def stop(self) -> bool:
        """Stop the workers; True when all of them ended (their decoders are free to be used again)."""
        self.stop_flag.set()
        self.first_done.set()
        with self.cond:
            self.cond.notify_all()
        for t in self.threads:
            if t is not threading.current_thread():
                t.join(timeout=_JOIN_S)
                if t.is_alive():
                    self.joined = False
                    log.warning("fastfeed decode worker did not stop within %.0f s; its decoder will not be reused",
                                _JOIN_S)
        self.threads = []
        with self.cond:
            self.results.clear()  # drop decoded batches nobody will take (frees their device memory)
        return self.joined


_EMPTY = np.empty(0, dtype=np.uint8)
