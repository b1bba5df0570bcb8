"""Streaming a remote dataset through the native ring: keep the ring's read-ahead window in the cache.

The ring `pread`s local files, so every shard a batch touches must be cached before a ring producer may read
that batch. The ring's ordering rule (NOTE [ Prefetch ring protocol ] in csrc/ring.h) gives the window: batch
b is read only after batch b - num_slots was released, and a batch is released only after the epoch runner
took it. So the runner keeps reads safe by calling, for every batch position k in order,

    fetch.before_batch(k, stop)   # before taking batch k from the ring: makes batch k + num_slots local

and `EpochFetch(...)` itself makes batches 0..num_slots-1 local before the ring starts. Meanwhile the dataset
downloads every shard of the epoch in the order the epoch first reads it (`prepare_epoch(wait=False)`,
`parallel` at a time), so with order="shard" the first batches start after one shard, download overlaps decode,
and `before_batch` only waits when the network is slower than training. A failed shard raises DatasetError
(naming it) from `before_batch(k)`: the runner hands it to the consumer at batch k. Waits poll `stop` (a
threading.Event) every 0.1 s, like every other wait of the epoch runner: `before_batch` returns False when it is
set, so a consumer leaving the loop is never held up by a download.
"""
from __future__ import annotations

import concurrent.futures as cf
import threading

import numpy as np

__all__ = ["EpochFetch", "epoch_fetch"]

_POLL_S = 0.1  # the epoch runner's stop-flag poll interval (fastfeed/epoch.py)


class EpochFetch:
    """Args: dataset: a remote dataset opened with fetch="on_demand"; indices: the epoch's sample ids in ring
    order (what `ring.start` gets); batch_size, num_slots: the ring's; stop: an Event that abandons the
    initial wait (construction then returns with `stopped` True). Waits are bounded by the downloads' own retry
    bound (`retry_timeout` of the dataset)."""

    def __init__(self, dataset, indices, batch_size: int, num_slots: int, stop: threading.Event | None = None):
        self.dataset = dataset
        self.indices = np.asarray(indices, dtype=np.int64)
        self.batch_size = int(batch_size)
        self.ahead = int(num_slots)
        self.num_batches = -(-len(self.indices) // self.batch_size)
        dataset.prepare_epoch(self.indices, wait=False)
        self.stopped = not all(self._ensure(k, stop) for k in range(min(self.ahead, self.num_batches)))

    def before_batch(self, k: int, stop: threading.Event | None = None) -> bool:
        """Make batch k + num_slots local; False if `stop` was set first. Raises DatasetError naming a shard
        that cannot be fetched."""
        return self._ensure(k + self.ahead, stop)

    def _ensure(self, k: int, stop: threading.Event | None = None) -> bool:
        if k >= self.num_batches:
            return True
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


def epoch_fetch(dataset, indices, batch_size: int, num_slots: int,
                stop: threading.Event | None = None) -> EpochFetch | None:
    """The EpochFetch for a dataset opened with fetch="on_demand"; None for any other (local) dataset."""
    if getattr(dataset, "fetch", None) != "on_demand":
        return None
    return EpochFetch(dataset, indices, batch_size, num_slots, stop)
