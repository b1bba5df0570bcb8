"""CPU output batches written into the memory of an earlier batch once nothing references it any more.

A fresh batch tensor of several MB is fresh mmap'd memory: its page faults on first write cost more than the
kernels that fill it (docs/design/decoders.md#cpu-pil). A kept tensor is handed out again only when torch's storage
use count says that no tensor, view or numpy array made from it is alive (the check torch's own CUDA graph trees
make), so nothing handed out is ever overwritten. Hand out views of the kept tensor itself (slices, `permute`,
`.numpy()` to write through): a `torch.from_numpy` of such an array is a second storage the count does not see.
"""
from __future__ import annotations

import threading
from typing import Callable

__all__ = ["OutputBuffers"]

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
