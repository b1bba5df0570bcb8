"""Streaming a remote dataset through the native ring: keep the ring's read-ahead window in the cache.

The ring `pread`s local files, so every shard a batch touches must be cached before a ring producer may read
that batch. The ring's ordering rule (NOTE [ Prefetch ring protocol ] in csrc/ring.h) gives the window: batch
b is read only after batch b - num_slots was released, and a batch is released only after the epoch runner
took it. So the runner keeps reads safe by calling, for every batch position k in order,

    fetch.before_batch(k, stop)   # before taking batch k from the ring: makes batch k + num_slots local

and `EpochFetch(...)` itself makes batches 0..num_slots-1 local before the ring starts. By the same rule, when
batch k is about to be taken every batch up to k - 1 - num_slots has been released, so a shard whose last
batch is that old will not be read again this epoch: it is unpinned (evictable). Downloads run in the epoch's
shard order, `lookahead` shards beyond what the window needs (as many of them as the cache holds beside the
window), `parallel` at a time (the dataset's pool). So with
order="shard" training starts after the first shard, download overlaps decode, and a cache smaller than the
dataset suffices (it must hold the window plus the lookahead); with order="global" nearly every batch touches
every shard, so the first window is the whole dataset.

A shard that cannot be fetched raises DatasetError (naming it) from `before_batch(k)`: the runner hands it to
the consumer at batch k. Waits poll `stop` (a threading.Event) every 0.1 s, like every other wait of the epoch
runner: `before_batch` returns False when it is set, so a consumer leaving the loop is never held by a download.
"""
from __future__ import annotations

import concurrent.futures as cf
import threading

import numpy as np

__all__ = ["EpochFetch", "epoch_fetch"]

_POLL_S = 0.1  # the epoch runner's stop-flag poll interval (fastfeed/loader/epoch.py)


class EpochFetch:
    """Args: dataset: a remote dataset opened with fetch="on_demand"; indices: the epoch's sample ids in ring
    order (what `ring.start` gets); batch_size, num_slots: the ring's; stop: an Event that abandons the initial
    wait (`stopped` is then True); lookahead: shards fetched beyond the window (default 2 x the dataset's
    parallel downloads). Waits are bounded by the downloads' own retry bound (the dataset's `retry_timeout`)."""

    def __init__(self, dataset, indices, batch_size: int, num_slots: int, stop: threading.Event | None = None,
                 lookahead: int | None = None):
        self.dataset = dataset
        self.indices = np.asarray(indices, dtype=np.int64)
        self.batch_size = int(batch_size)
        self.ahead = int(num_slots)
        self.lookahead = int(lookahead if lookahead is not None else 2 * dataset.parallel)
        self.num_batches = -(-len(self.indices) // self.batch_size)
        shard = np.asarray(dataset.shard_index)[self.indices].astype(np.int64)
        batch = np.arange(len(self.indices), dtype=np.int64) // self.batch_size
        n = len(dataset.manifest.shards)
        first = np.full(n, np.iinfo(np.int64).max)
        last = np.full(n, -1)
        np.minimum.at(first, shard, batch)
        np.maximum.at(last, shard, batch)
        used = np.flatnonzero(last >= 0)
        self._by_first = used[np.argsort(first[used], kind="stable")]  # fetch order
        self._first_sorted = first[self._by_first]
        self._by_last = used[np.argsort(last[used], kind="stable")]  # release order
        self._last_sorted = last[self._by_last]
        self._submitted = 0
        self._released = 0
        self._bytes = np.array([s.bytes for s in dataset.manifest.shards], dtype=np.int64)
        self._held = 0  # bytes of the shards submitted and not released: pinned in the cache once fetched
        self._limit = getattr(getattr(dataset, "cache", None), "max_bytes", None)  # the cache's, None: no cache
        self._check_window(first, last, used)
        # The previous epoch's pins go (a dataset at a URL is never read on into the next epoch, so its reads are
        # over): kept, they would hold cache room that `_held` does not count. Those still cached are hits again.
        dataset.retain(())
        self.stopped = not all(self._ensure(k, stop) for k in range(min(self.ahead, self.num_batches)))

    def _check_window(self, first, last, used) -> None:
        """DatasetError, before any download, when the window's shards cannot all be pinned in the cache at once:
        shard s is held while batches first[s] - ahead .. last[s] + ahead are taken (the rules above), and a cache
        full of pinned shards fails the next download midway through the epoch."""
        from fastfeed.types import DatasetError

        limit = self._limit
        if limit is None or not len(used):
            return
        events = np.zeros(self.num_batches + 1, dtype=np.int64)
        np.add.at(events, np.clip(first[used] - self.ahead, 0, self.num_batches), self._bytes[used])
        np.add.at(events, np.minimum(last[used] + self.ahead + 1, self.num_batches), -self._bytes[used])
        held = np.cumsum(events)
        k = int(np.argmax(held))
        if held[k] > limit:
            url = getattr(self.dataset, "url", "this dataset")
            raise DatasetError(f"{url}: streaming this epoch holds up to {int(held[k])} bytes of shards at once (those "
                               f"the ring's {self.ahead}-batch read-ahead spans around batch {k}), more than the shard "
                               f"cache limit of {limit} bytes; raise cache_size (with order=\"global\" nearly every "
                               "batch reads every shard, so the cache must hold the whole dataset)", path=url)

    def before_batch(self, k: int, stop: threading.Event | None = None) -> bool:
        """Make batch k + num_slots local; False if `stop` was set first. Raises DatasetError naming a shard
        that cannot be fetched."""
        done = np.searchsorted(self._last_sorted, k - 1 - self.ahead, side="right")
        if done > self._released:
            released = self._by_last[self._released:done]
            self.dataset.release(released)
            self._held -= int(self._bytes[released].sum())
            self._released = int(done)
        return self._ensure(k + self.ahead, stop)

    def _ensure(self, k: int, stop: threading.Event | None) -> bool:
        if k >= self.num_batches:
            return True
        need = int(np.searchsorted(self._first_sorted, k, side="right"))
        upto = self._within_cache(need, min(len(self._by_first), need + self.lookahead))
        if upto > self._submitted:
            submitted = self._by_first[self._submitted:upto]
            self.dataset.prefetch(submitted)
            self._held += int(self._bytes[submitted].sum())
            self._submitted = upto
        ids = self.indices[k * self.batch_size:(k + 1) * self.batch_size]
        for _, fut in self.dataset.fetch_futures(ids):
            while True:
                try:
                    fut.result(timeout=_POLL_S)
                    break
                except cf.TimeoutError:
                    if stop is not None and stop.is_set():
                        return False
        return True

    def _within_cache(self, need: int, upto: int) -> int:
        """`upto` (shards in fetch order) lowered so that the lookahead past the window's `need` never holds more
        than the cache: pinned shards cannot be evicted, and a download that finds the cache full of them fails. The
        window itself is fetched whatever it holds (a cache smaller than the window is an error naming it)."""
        limit = self._limit
        start = max(need, self._submitted)
        if limit is None or upto <= start:
            return upto
        held = self._held + int(self._bytes[self._by_first[self._submitted:start]].sum())
        for j in range(start, upto):
            held += int(self._bytes[self._by_first[j]])
            if held > limit:
                return j
        return upto


def epoch_fetch(dataset, indices, batch_size: int, num_slots: int,
                stop: threading.Event | None = None) -> EpochFetch | None:
    """The EpochFetch for a dataset opened with fetch="on_demand"; None for any other (local) dataset."""
    if getattr(dataset, "fetch", None) != "on_demand":
        return None
    return EpochFetch(dataset, indices, batch_size, num_slots, stop)
