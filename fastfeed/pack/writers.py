"""WebDataset tar framing (shards, records, DALI index, shard hashing) and durable-write helpers; the format
writers that use them are pack/wds.py and pack/lmdb.py.

Tar shards are written by hand rather than with `tarfile`: a ustar header is 512 bytes we can build in a few
microseconds, we need each member's data offset anyway (for `samples.npz` and the DALI index), and a fixed
mtime/uid makes the output byte-identical across runs, parts and resumes. A shard is written to `NAME.tmp`,
fsynced and renamed, so a shard file that exists under its final name is complete.

The `.idx` sidecar is exactly what DALI's `wds2idx` writes: a first line `v1.2 <num_samples>`, then one line
per sample listing, for each of its members in tar order, `<ext> <data offset> <size> <member name>`.
"""
from __future__ import annotations

import hashlib
import json
import os
import queue
import threading
from concurrent.futures import Future
from dataclasses import dataclass

from fastfeed.types import ShardInfo

__all__ = ["TarShardWriter", "ShardHasher", "TarRecord", "MemberExtent", "shard_name", "fsync_dir",
           "atomic_write", "record_size", "build_record", "make_record", "meta_bytes"]

_BLOCK = 512
_MTIME = 0  # fixed, so shards are reproducible
_IDX_VERSION = "v1.2"


def shard_name(index: int) -> str:
    return f"shard-{index:06d}.tar"


def fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: str, data: bytes) -> None:
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(os.path.dirname(os.path.abspath(path)))


_ZEROS = bytes(2 * _BLOCK)
_HEADER_TEMPLATE = bytearray(_BLOCK)
_HEADER_TEMPLATE[100:108] = b"0000644\x00"
_HEADER_TEMPLATE[108:116] = b"0000000\x00"
_HEADER_TEMPLATE[116:124] = b"0000000\x00"
_HEADER_TEMPLATE[136:148] = b"%011o\x00" % _MTIME
_HEADER_TEMPLATE[148:156] = b" " * 8
_HEADER_TEMPLATE[156:157] = b"0"
_HEADER_TEMPLATE[257:263] = b"ustar\x00"
_HEADER_TEMPLATE[263:265] = b"00"
_HEADER_TEMPLATE = bytes(_HEADER_TEMPLATE)
_TEMPLATE_SUM = sum(_HEADER_TEMPLATE)


def _put_header(buf, at: int, name: bytes, size: int) -> None:
    """Write a ustar header into `buf[at:at+512]`. The checksum is the template's plus the variable fields',
    so no 512-byte sum per member (the packer writes ~3 members per image)."""
    if len(name) > 100:
        raise ValueError(f"tar member name too long: {name!r}")
    size_field = b"%011o\x00" % size
    buf[at : at + _BLOCK] = _HEADER_TEMPLATE
    buf[at : at + len(name)] = name
    buf[at + 124 : at + 136] = size_field
    # the size field replaces 12 zero bytes of the template, so its sum simply adds
    buf[at + 148 : at + 156] = b"%06o\x00 " % (_TEMPLATE_SUM + sum(name) + sum(size_field))


def _ustar_header(name: str, size: int) -> bytes:
    h = bytearray(_BLOCK)
    _put_header(h, 0, name.encode("utf-8"), size)
    return bytes(h)


def _padded(n: int) -> int:
    return n + (-n % _BLOCK)


@dataclass(frozen=True)
class MemberExtent:
    offset: int  # of the member's data inside the tar
    size: int


class TarRecord:
    """One sample's complete tar bytes (`KEY.ext`, `KEY.cls`, optional `KEY.json` and further members such as a
    mask's `KEY.seg.png`), position-independent: ustar headers hold no offsets, so workers build records in parallel
    and the writer only concatenates them.

    `data` is a bytes-like view of the record; `members` lists (ext, data offset inside the record, size).
    """

    __slots__ = ("key", "data", "members", "base", "start")

    def __init__(self, key: str, data, members: list[tuple[str, int, int]], base=None, start: int = 0):
        self.key, self.data, self.members = key, data, members
        self.base, self.start = base, start  # the buffer `data` views, and where: lets the writer merge neighbours

    @property
    def image_size(self) -> int:
        return self.members[0][2]


def record_size(image_size: int, label: int, meta: bytes | None, member_sizes=()) -> int:
    n = _BLOCK + _padded(image_size) + _BLOCK + _padded(len(b"%d" % label))
    n += sum(_BLOCK + _padded(m) for m in member_sizes)
    return n + (_BLOCK + _padded(len(meta)) if meta is not None else 0)


def build_record(buf, at: int, key: str, ext: str, image_size: int, label: int, meta: bytes | None,
                 members=()) -> TarRecord:
    """Complete a record in `buf` (a bytearray) starting at `at`, whose image bytes the caller already put at
    `at + 512`: headers, zero padding (buf may be a reused buffer holding old bytes), `.cls`, `.json` and then
    `members` ((ext, bytes) pairs: a mask's `.seg.png`). Returns the record over a memoryview of
    `buf[at : at + record_size(...)]`."""
    kb = key.encode("utf-8")
    members_out = []
    pos = at
    json_member = () if meta is None else (("json", meta, 0),)
    for e, payload, size in ((ext, None, image_size), ("cls", b"%d" % label, 0), *json_member,
                             *((e, data, 0) for e, data in members)):
        if payload is not None:
            size = len(payload)
            buf[pos + _BLOCK : pos + _BLOCK + size] = payload
        _put_header(buf, pos, kb + b"." + e.encode("ascii"), size)
        members_out.append((e, pos + _BLOCK - at, size))
        end = pos + _BLOCK + size
        pos = pos + _BLOCK + _padded(size)
        buf[end:pos] = _ZEROS[: pos - end]
    return TarRecord(key, memoryview(buf)[at:pos], members_out, buf, at)


def make_record(key: str, ext: str, data, label: int, meta: bytes | None, members=()) -> TarRecord:
    """A record in a fresh buffer (a copy of `data`): for samples whose bytes did not come from the batch reader."""
    buf = bytearray(record_size(len(data), label, meta, [len(m) for _, m in members]))
    buf[_BLOCK : _BLOCK + len(data)] = data
    return build_record(buf, 0, key, ext, len(data), label, meta, members)


class ShardHasher:
    """sha256 of every shard, on one helper thread, in write order.

    sha256 is the single largest cost of packing (benchmarks/README.md); hashlib releases the GIL on large buffers, so
    hashing the chunks the writer has just written overlaps the next writes. The queue is FIFO, so `digest()`
    (end of a shard) and `call()` (hand a reused buffer back to its pool) take effect after everything queued
    before them. Bounded: the writer blocks rather than pile up buffers.
    """

    def __init__(self, max_pending: int = 8):
        self._q: queue.Queue = queue.Queue(maxsize=max_pending)
        self._sha = hashlib.sha256()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._loop, name="fastfeed-shard-sha256", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while (item := self._q.get()) is not None:
            op, arg = item
            try:
                if op == "update":
                    for chunk in arg:
                        self._sha.update(chunk)
                elif op == "digest":
                    arg.set_result(self._sha.hexdigest())
                    self._sha = hashlib.sha256()
                else:
                    arg()
            except BaseException as e:  # surfaces through the next digest() future
                self._error = e

    def update(self, chunks: list) -> None:
        self._q.put(("update", chunks))

    def digest(self) -> Future:
        """Future of the sha256 of everything updated since the previous digest()."""
        f: Future = Future()
        self._q.put(("digest", f))
        return f

    def call(self, fn) -> None:
        self._q.put(("call", fn))

    def close(self) -> None:
        if self._thread.is_alive():
            self._q.put(None)
            self._thread.join()
        if self._error is not None:
            raise RuntimeError(f"shard hashing failed: {self._error!r}") from self._error


class TarShardWriter:
    """One WebDataset shard. `add_record()` appends a sample; `end()` (writer thread) closes the archive and
    `finish()` (any thread) makes the shard and its index durable and final.

    Records are gathered and written with one `os.writev` per ~8 MB, so a sample costs no syscall of its own.

    Args:
        folder: output folder; the shard is `folder/shard-NNNNNN.tar` and `.idx`.
        index: shard number.
        hasher: the ShardHasher every shard of this pack goes through (owned by the caller; None: a private one).
    """

    _FLUSH_BYTES = 8 << 20
    _MAX_IOV = 512  # below Linux's IOV_MAX (1024)

    def __init__(self, folder: str, index: int, hasher: ShardHasher | None = None):
        self.name = shard_name(index)
        self.path = os.path.join(folder, self.name)
        self._tmp = self.path + ".tmp"
        self._own_hasher = hasher is None
        self._hasher = hasher or ShardHasher()
        self._fd = os.open(self._tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_CLOEXEC", 0), 0o644)
        self._pending: list = []
        self._pending_bytes = 0
        self._pos = 0
        self._idx_lines: list[str] = []
        self._digest: Future | None = None
        self.num_samples = 0

    @property
    def bytes_written(self) -> int:
        return self._pos

    def add_record(self, rec: TarRecord) -> tuple[MemberExtent, MemberExtent | None]:
        """Append one sample. Returns the image's and the json member's data extents inside the tar."""
        base = self._pos
        parts = []
        for e, off, size in rec.members:
            parts.append(f"{e} {base + off} {size} {rec.key}.{e}")
        self._idx_lines.append(" ".join(parts))
        self._pending.append(rec)
        n = len(rec.data)
        self._pos += n
        self._pending_bytes += n
        self.num_samples += 1
        if self._pending_bytes >= self._FLUSH_BYTES or len(self._pending) >= self._MAX_IOV:
            self.flush()
        img = MemberExtent(base + rec.members[0][1], rec.members[0][2])
        js = next((MemberExtent(base + off, size) for e, off, size in rec.members[2:] if e == "json"), None)
        return img, js

    def add(self, key: str, ext: str, data: bytes, label: int,
            meta: bytes | None) -> tuple[MemberExtent, MemberExtent | None]:
        """Append `KEY.ext`, `KEY.cls` and (when `meta`) `KEY.json`. Returns the image and json extents."""
        return self.add_record(make_record(key, ext, data, label, meta))

    def flush(self) -> None:
        """Write what add_record() gathered (one writev) and queue it for hashing."""
        if not self._pending:
            return
        recs, self._pending, self._pending_bytes = self._pending, [], 0
        chunks = _coalesce(recs)
        _writev_all(self._fd, chunks)
        self._hasher.update(chunks)

    def end(self) -> None:
        """Append the end-of-archive marker and close the hash. Call on the thread that added the records."""
        self._pending.append(TarRecord("", _ZEROS, []))
        self._pos += len(_ZEROS)
        self.flush()
        self._digest = self._hasher.digest()

    def finish(self) -> ShardInfo:
        if self._digest is None:
            self.end()
        os.fsync(self._fd)
        os.close(self._fd)
        self._fd = -1
        sha = self._digest.result()
        if self._own_hasher:
            self._hasher.close()
        idx = f"{_IDX_VERSION} {self.num_samples}\n" + "".join(line + "\n" for line in self._idx_lines)
        atomic_write(self.path[: -len(".tar")] + ".idx", idx.encode("utf-8"))
        os.replace(self._tmp, self.path)
        fsync_dir(os.path.dirname(self.path))
        return ShardInfo(self.name, self._pos, sha, self.num_samples)

    def abort(self) -> None:
        if self._own_hasher:
            self._hasher.close()
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        if os.path.exists(self._tmp):
            os.unlink(self._tmp)


def _coalesce(recs: list[TarRecord]) -> list:
    """Records that sit back to back in one buffer become one chunk: one hash update (one GIL round trip for
    the hashing thread, which otherwise waits behind the Python threads for each of ~3 per file)."""
    chunks: list = []
    base = None
    start = end = 0
    for r in recs:
        n = len(r.data)
        if base is not None and r.base is base and r.start == end:
            end += n
            continue
        if base is not None:
            chunks.append(memoryview(base)[start:end])
        if r.base is None:
            chunks.append(r.data)
            base = None
        else:
            base, start, end = r.base, r.start, r.start + n
    if base is not None:
        chunks.append(memoryview(base)[start:end])
    return chunks


def _writev_all(fd: int, chunks: list) -> None:
    """os.writev, continuing after short writes (signals, a nearly full disk) until everything is written."""
    views = [memoryview(c).cast("B") for c in chunks]
    while views:
        n = os.writev(fd, views)
        if n == 0:
            raise OSError(f"writev wrote nothing to fd {fd}")
        while views and n >= len(views[0]):
            n -= len(views[0])
            views.pop(0)
        if views and n:
            views[0] = views[0][n:]


def meta_bytes(meta: dict | None) -> bytes | None:
    if meta is None:
        return None
    return json.dumps(meta, ensure_ascii=False, sort_keys=True, separators=(",", ":")).encode("utf-8")
