"""CPU output batches (and a batch's decoded sources) written into the memory of an earlier batch once nothing
references it any more.

A fresh batch tensor of several MB is fresh mmap'd memory: its page faults on first write cost more than the
kernels that fill it (docs/design/decoders.md#cpu-pil). A kept tensor is handed out again only when torch's storage
use count says that no tensor, view or numpy array made from it is alive (the check torch's own CUDA graph trees
make), so nothing handed out is ever overwritten. Hand out views of the kept tensor itself (slices, `permute`,
`.numpy()` to write through): a `torch.from_numpy` of such an array is a second storage the count does not see.
"""
from __future__ import annotations

import sys
import threading
from typing import Callable

import numpy as np

__all__ = ["OutputBuffers", "SourceArena"]

_MAX_KEPT = 8  # consumer + prefetch + pipelines in flight, with room


def _storage_users(t) -> int | None:
    """How many tensors/arrays hold t's memory (with the temporary reference this call makes); None when this torch
    has no such count, and then nothing is kept."""
    import torch

    use_count = getattr(torch._C, "_storage_Use_Count", None)
    if use_count is None:
        return None
    return int(use_count(t.untyped_storage()._cdata))


class OutputBuffers:
    """`take(n, alloc)`: the first n rows of a kept tensor nobody else holds, else of a new one from `alloc()` (at
    least n rows), kept for later. Thread-safe: a tensor is never handed to two callers at once."""

    def __init__(self) -> None:
        self._kept: list = []  # (tensor, its use count when only this list holds it)
        self._lock = threading.Lock()

    def take(self, n: int, alloc: Callable):
        with self._lock:
            for t, idle in self._kept:
                if t.shape[0] >= n and _storage_users(t) == idle:
                    return t[:n]
            t = alloc()
            idle = _storage_users(t)
            if idle is not None and len(self._kept) < _MAX_KEPT:
                self._kept.append((t, idle))
            return t[:n]

    def clear(self) -> None:
        with self._lock:
            self._kept = []


_ALIGN = 64  # each source starts on a cache line
_HEADROOM = 1.25  # a new arena's size over the batch that needed it: later batches of other sizes fit too


class SourceArena:
    """`take(nbytes)`: a writable uint8 view per entry (None for 0 bytes), all in one buffer that the previous batch's
    sources used, once no view of it is alive (numpy views keep their base array referenced, so its reference count
    says when); else in a new one. A batch's decoded sources are several MB each, and fresh memory for them
    page-faults on every first write (docs/design/decoders.md#cpu-pil). The price: the decoder keeps its largest
    batch's sources' worth of memory (and a quarter more) between batches, where it was that batch's peak before.
    Not OutputBuffers: its batches have one size, these a new total each batch, and it would keep every buffer that
    grew too small. Thread-safe."""

    def __init__(self) -> None:
        self._buffer = np.empty(0, np.uint8)
        self._lock = threading.Lock()

    def take(self, nbytes) -> list:
        sizes = -(-np.asarray(nbytes, np.int64) // _ALIGN) * _ALIGN
        ends = np.cumsum(sizes)
        total = int(ends[-1]) if len(ends) else 0
        with self._lock:
            # references: self._buffer, getrefcount's argument; any more is a view still alive
            if len(self._buffer) < total or sys.getrefcount(self._buffer) > 2:
                self._buffer = np.empty(int(total * _HEADROOM), np.uint8)
            buf = self._buffer
        return [buf[e - n:e] if n else None for e, n in zip(ends.tolist(), sizes.tolist())]
