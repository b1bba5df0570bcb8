"""Random direct reads from a dataset's files: `fastfeed doctor`'s evidence about the storage under it.

A disk's rotational flag is often wrong (a hypervisor's virtio disk says 1 whatever backs it) and a freshly packed
dataset is usually served from the page cache, so the probe reads with O_DIRECT: the numbers are the device's.
No torch, no third-party imports.
"""
from __future__ import annotations

import mmap
import os
import random
import time

__all__ = ["SLOW_DIRECT_MB_S", "read_probe"]

SLOW_DIRECT_MB_S = 50.0  # random 1 MiB direct reads slower than this starve even a CPU decoder of big JPEGs


def read_probe(path: str, reads: int = 32, block: int = 1 << 20, budget_s: float = 1.0,
               seed: int = 0) -> dict | None:
    """Evidence about the storage under `path`: random direct reads from its largest files.

    O_DIRECT bypasses the page cache, so the numbers are the device's (a freshly packed dataset is usually all in
    cache). Returns {reads, block, mb_per_s, p50_ms}, or None where direct I/O is unsupported (tmpfs, some network
    filesystems) or there is nothing to read. Bounded by `reads` and `budget_s`.
    """
    files = []
    for dirpath, _, names in os.walk(path):
        for n in names:
            try:
                files.append((os.path.getsize(os.path.join(dirpath, n)), os.path.join(dirpath, n)))
            except OSError:
                continue
        if len(files) >= 2000:
            break
    files = [f for f in sorted(files, reverse=True)[:16] if f[0] > 0]
    if not files or not hasattr(os, "O_DIRECT"):
        return None
    rng = random.Random(seed)
    buf = mmap.mmap(-1, block)  # page-aligned, as O_DIRECT requires
    times, done = [], 0
    deadline = time.perf_counter() + budget_s
    try:
        for _ in range(reads):
            size, name = rng.choice(files)
            offset = rng.randrange(0, max(size - block, 0) + 1) // 4096 * 4096
            try:
                fd = os.open(name, os.O_RDONLY | os.O_DIRECT)
            except OSError:
                return None
            try:
                t0 = time.perf_counter()
                n = os.preadv(fd, [buf], offset)
                times.append(time.perf_counter() - t0)
                done += n
            except OSError:
                return None
            finally:
                os.close(fd)
            if time.perf_counter() > deadline:
                break
    finally:
        buf.close()
    total = sum(times)
    if not times or total <= 0:
        return None
    return {"reads": len(times), "block": block, "mb_per_s": done / total / 1e6,
            "p50_ms": 1e3 * sorted(times)[len(times) // 2]}
