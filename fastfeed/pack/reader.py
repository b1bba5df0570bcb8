"""Read a batch of source files straight into one reused buffer as finished tar records (WebDataset packing).

Why batches and a buffer pool: per-file Python work (a future, a queue hop, a bytes object per read) cost more
than the copy itself, and reading into freshly allocated memory costs many times reading into memory that is
already mapped (page faults; benchmarks/README.md, pack). So a worker takes ~32 files, reads
each one with a single `readv` into its slot of a pooled buffer, checks it there (header probe on the first
16 KB, end marker in the last 512 bytes) and writes the tar headers and padding around it. The writer thread then
only concatenates the records (`os.writev`), and the buffer goes back to the pool once its bytes are written
and hashed (`ShardHasher.call`). Converted images (transcoded, re-encoded) get a record of their own.
"""
from __future__ import annotations

import dataclasses
import os
import threading
from dataclasses import dataclass

from fastfeed.pack.members import member_pairs, member_sizes, members_problem, read_members
from fastfeed.pack.validate import LoadOptions, Loaded, Rejected, _os_reason, check_image, stat_size
from fastfeed.pack.writers import TarRecord, build_record, make_record, record_size

__all__ = ["BatchItem", "BatchResult", "BufferPool", "read_batch"]

_O_FLAGS = os.O_RDONLY | getattr(os, "O_CLOEXEC", 0)


@dataclass(frozen=True)
class BatchItem:
    path: str
    key: str
    label: int
    meta: bytes | None
    members: tuple[tuple[str, str], ...] = ()  # SourceEntry.members: stored after the image (pack/members.py)


@dataclass
class BatchResult:
    """One (Loaded | Rejected, TarRecord | None) per item, in order; `buffer` goes back to the pool after the
    records were written and hashed."""

    results: list[tuple[Loaded | Rejected, TarRecord | None]]
    buffer: bytearray | None


class BufferPool:
    """Reusable bytearrays (already faulted in), at least `min_size` bytes each; keeps at most `keep`."""

    def __init__(self, min_size: int = 2 << 20, keep: int = 16):
        self.min_size, self.keep = min_size, keep
        self._free: list[bytearray] = []
        self._lock = threading.Lock()

    def get(self, need: int) -> bytearray:
        with self._lock:
            for i, b in enumerate(self._free):
                if len(b) >= need:
                    return self._free.pop(i)
        return bytearray(max(need, self.min_size))

    def put(self, buf: bytearray) -> None:
        with self._lock:
            if len(self._free) < self.keep:
                self._free.append(buf)


def read_batch(items: list[BatchItem], opts: LoadOptions, pool: BufferPool) -> BatchResult:
    """Read, check and frame `items` (see the module docstring). Never raises for a bad file."""
    sizes: list[int | Rejected] = []
    extras = [read_members(it.members) if it.members else [] for it in items]  # a mask: read and decoded
    need = 0
    for it, extra in zip(items, extras):
        s = stat_size(it.path)
        sizes.append(s)
        if not isinstance(s, Rejected):
            need += record_size(s, it.label, it.meta, member_sizes(extra))
    buf = pool.get(need) if need else None
    out: list[tuple[Loaded | Rejected, TarRecord | None]] = []
    at = 0
    for it, size, extra in zip(items, sizes, extras):
        if isinstance(size, Rejected):
            out.append((size, None))
            continue
        view = memoryview(buf)[at + 512 : at + 512 + size]
        err = _read_into(it.path, view)
        if err is not None:
            out.append((err, None))
            continue
        res = check_image(view, opts, name=it.path)
        why = None if isinstance(res, Rejected) else members_problem(extra, res.width, res.height, res.orientation,
                                                                     opts.orientation)
        if why is not None:
            res = Rejected(why)
        if isinstance(res, Rejected):
            out.append((res, None))
            continue
        pairs = member_pairs(extra)
        if res.data is view:
            rec = build_record(buf, at, it.key, res.ext, size, it.label, it.meta, pairs)
            at += len(rec.data)
            out.append((res, rec))
        else:
            if isinstance(res.data, memoryview):
                # A trimmed view into `buf`, where the next file is read: keep its own bytes (the row's checksum
                # is computed from them after the whole batch was read).
                res = dataclasses.replace(res, data=bytes(res.data))
            out.append((res, make_record(it.key, res.ext, res.data, it.label, it.meta, pairs)))
    return BatchResult(out, buf)


def _read_into(path: str, view: memoryview) -> Rejected | None:
    """Fill `view` with the file's bytes; one extra byte of room tells a file that grew since stat()."""
    extra = bytearray(1)
    try:
        fd = os.open(path, _O_FLAGS)
    except OSError as e:
        return Rejected(_os_reason(path, e))
    try:
        got = 0
        while got < len(view):  # short reads only at EOF or on a signal
            n = os.readv(fd, [view[got:], extra])
            if n == 0:
                break
            got += n
        if got > len(view):
            return Rejected("file changed while reading (grew)")
    except OSError as e:
        return Rejected(_os_reason(path, e))
    finally:
        os.close(fd)
    if got < len(view):
        return Rejected("file changed while reading (shrank)" if got else "empty file (0 bytes)")
    return None
