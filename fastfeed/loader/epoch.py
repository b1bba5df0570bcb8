"""The decode workers of `fastfeed.Loader` for one epoch, and for the epochs after it while the loop asks for them
in order (NOTE [Loader pipeline and shutdown] below, which every waiting and hand-off rule here implements).

`EpochRun` takes its parts explicitly — the epoch's plan, the ring, the decoders, the settings, the sample table,
the stats and, to read on into the next epoch, a function that plans it — and nothing else: it never reaches back
into the Loader. Batch positions count on across the epochs it chains (`plan_at` says where each epoch starts).
What each ring batch becomes (bad samples held back and replaced, labels) is `assemble.BatchAssembler`'s.

NOTE [Loader pipeline and shutdown]
Each iteration runs `pipelines` decode workers (threads), each with its own decoder (DALI pipeline) and CUDA stream:
    take the next ring slot (under a lock, so batch positions are handed out in order) -> crop windows ->
    decoder(slot views) -> release the slot -> results[position]
The consumer takes results strictly by position, so the order never depends on thread timing. The ring's reader
threads read `prefetch + 2*pipelines` batches of encoded bytes ahead (slots); a worker may decode batch k only while
k < consumed + prefetch + pipelines, so decoded batches (device memory) are bounded too — fewer when the ring got
fewer slots: the ring puts batch b in slot b % slots and workers release batches out of order, so the decoded
window plus one batch per worker must fit in the slots (`EpochRun._window`); and batch k > 0 only once batch 0 is
decoded, so the first batch of an iteration does not share the decoder with the next ones. A slot is released
only after the decoder returns, because the decoder reads the slot's bytes in place (DALI's external_source with
no_copy, or PIL from a view). On CUDA each worker decodes on its own stream and records an event after each batch;
the consumer's current stream waits on that event before the batch is handed out, and `record_stream` tells torch's
allocator that the consumer's stream uses the memory, so a batch is never overwritten or reused while the training
step reads it.
The consumer's takes are also timed (`pace.ConsumerPace`): decoder "hybrid" tunes its CPU share on that period, and
a GPU Loader whose `pipelines` is not given its number of workers (`pipelines.PipelineTuner`): it starts with
`pipelines`, adds one while the loop waits for data and the extra one pays, and drops to fewer while the loop barely
waits and fewer are not slower; the two take turns (`ConsumerPace.claim`). A worker beyond the count waits, holding
nothing; one beyond the decoders built builds its own, kept for later runs. The ring is sized for the most the tuner
may run. Which thread decodes a batch never changes which batch comes at a position.
Iteration is lazy: `iter(loader)` only makes a generator; the epoch is chosen (and a loaded state consumed) at its
first `next()`, so frameworks that call `iter()` to probe the object change nothing (a Loader's ring has
been reading epoch 0 since the constructor: NOTE [Reading before the first iteration] in loader.py).
Shutdown: every blocking wait (ring, room in the window, the consumer's wait) polls a stop flag every 0.1 s; the
consumer leaving the loop early (break, exception, Ctrl-C, garbage collection of the generator) sets the flag,
joins the workers (bounded) and drops undelivered results; the next iteration restarts the ring cleanly. A worker
that did not end within the bound may still hold its decoder: the Loader then builds new decoders for the next
iteration instead of sharing one between two threads (the abandoned ones are left to that thread).
An error in a worker travels to the consumer wrapped with where it happened and is raised at the batch that hit
it. Fork and interpreter exit: `lifecycle` (a forked child's copy of a Loader refuses to iterate; every live Loader is
closed before DALI's own exit hook runs).
"""
from __future__ import annotations

import logging
import threading
import time
from contextlib import nullcontext
from dataclasses import dataclass

import numpy as np
import torch

from fastfeed.loader.assemble import BatchAssembler, LoaderError, SampleTable
from fastfeed.tuning.pipelines import room_for_a_pipeline

__all__ = ["EpochRun"]

log = logging.getLogger("fastfeed")

_POLL_S = 0.1  # how often blocked waits re-check the stop flag
_JOIN_S = 5.0


@dataclass
class _Failure:
    where: str
    exc: BaseException


class EpochRun:
    """One iteration of a Loader: its decode workers and the in-order hand-off to the consumer.

    The concurrency protocol is NOTE [Loader pipeline and shutdown] above. `joined` is False
    after `stop()` if a worker did not end in time: its decoder may still be in use, so the owner must not hand those
    decoders to another run.

    next_plan(epoch) -> the plan of the epoch after `epoch`, or None: given, the run reads on into that epoch as soon
    as the ring's read-ahead reaches the end of the current one (it is queued in the ring behind it), so its first
    batches are read and decoded while the loop finishes this epoch (NOTE [Reading on into the next epoch] in
    fastfeed/loader/loader.py).

    tuner: a `pipelines.PipelineTuner` (or None: every decoder works, always): asked at each batch the consumer takes
    how many workers decode; worker w works while w < that count and waits, holding no batch, otherwise. A worker
    past the decoders given builds its own with `new_decoder(index)` and appends it to `decoders` (the owner's list, so
    the next run has it). The count changes which thread decodes a batch, never which batch comes at a position.

    assembler: the `assemble.BatchAssembler` the workers share, given by the owner so that it outlives the run (it
    names each bad sample once: once per Loader, not once per run); None: one of the run's own.

    ring_started: the owner already started the ring on this plan's order (a Loader does at construction:
    NOTE [Reading before the first iteration] in fastfeed/loader/loader.py), so `begin()` does not start it again.
    """

    def __init__(self, plan, *, ring, decoders, settings, table: SampleTable, stats, fetch_shards=None, pace=None,
                 next_plan=None, tuner=None, new_decoder=None, ring_started=False, assembler=None):
        self._segments: list[tuple[int, object]] = [(0, plan)]  # (first batch position, plan) per chained epoch
        self.total = plan.num_batches  # batch positions planned so far, over the chained epochs
        self._next_plan = next_plan
        self.ring = ring
        self.decoders = decoders
        self.settings = settings
        self.batches = assembler or BatchAssembler(settings, table, stats)  # what each ring batch becomes
        self.stats = stats
        self.stop_flag = threading.Event()
        self.cond = threading.Condition()
        self.results: dict[int, object] = {}  # batch position -> (batch, event, replaced) or _Failure
        self.next_out = 0  # the position the consumer takes next
        self._tuner, self._new_decoder = tuner, new_decoder
        self._decoders_lock = threading.Lock()  # a worker appending the decoder it built
        self.active = tuner.current() if tuner is not None else len(decoders)  # workers that decode now
        self.window = self._window(self.active)  # decoded batches allowed ahead of the consumer
        self.ring_lock = threading.Lock()  # workers take ring batches one at a time, so positions are in order
        self.dispatched = 0
        # Set once batch 0 is decoded (or the run stops): until then the other workers wait with the batch they took,
        # so the first batch has the GPU's decoders to itself: two decoded side by side delay it, most with large
        # photos (docs/design/epochs.md#reading-before-the-first-iteration).
        self.first_done = threading.Event()
        self.threads: list[threading.Thread] = []
        self.joined = True
        # fetch_shards(indices, stop) -> a remote dataset's EpochFetch (or None): it keeps the shards of the ring's
        # read-ahead window in the local cache (fastfeed/remote/epoch.py states the rule this relies on).
        self._fetch_shards = fetch_shards
        self.fetch = None
        self.pace = pace  # a ConsumerPace: told when the consumer takes each batch (fastfeed/tuning/pace.py)
        self._ring_started = ring_started

    def begin(self) -> None:
        indices = self._segments[0][1].indices  # the first epoch's
        if self._fetch_shards is not None:
            self.fetch = self._fetch_shards(indices, self.stop_flag)
        if not self._ring_started:
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
                        self.decoders.append(self._new_decoder(len(self.decoders)))
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
        plan, j = self._locate(k)
        return self.batches.produce(plan, j, slot, decoder, stream)


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
                # An epoch the loop has taken every batch of is looked up no more (workers and plan_at ask only from
                # next_out on): a run read on from for hundreds of epochs keeps the plans of the last one or two.
                while len(self._segments) > 1 and self._segments[1][0] <= self.next_out:
                    del self._segments[0]
                self.cond.notify_all()
        if self.pace is not None:
            self.pace.tick(wait=waited.seconds)
        if self._tuner is not None:
            count = self._tuner.current()
            if count != self.active:
                self._resize(count)
        if isinstance(item, _Failure):
            raise LoaderError(f"{type(item.exc).__name__} in {item.where}: {item.exc}") from item.exc
        batch, event, replaced = item
        self.batches.report(replaced)  # the skips of the batches the loop got (assemble.py says why here)
        if event is not None:
            current = torch.cuda.current_stream(self.settings.device)
            current.wait_event(event)
            for value in (batch if isinstance(batch, tuple) else batch.values()):
                if isinstance(value, torch.Tensor) and value.is_cuda:  # fields may be lists, or CPU tensors
                    value.record_stream(current)
        return batch

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

