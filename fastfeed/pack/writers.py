"""Write samples into WebDataset tar shards (+ DALI index) or one LMDB environment.

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
from dataclasses import dataclass

from fastfeed.types import ShardInfo

__all__ = ["TarShardWriter", "LmdbWriter", "MemberExtent", "shard_name", "fsync_dir", "atomic_write"]

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


def _ustar_header(name: str, size: int) -> bytes:
    raw = name.encode("utf-8")
    if len(raw) > 100:
        raise ValueError(f"tar member name too long: {name!r}")
    h = bytearray(_BLOCK)
    h[0 : len(raw)] = raw
    h[100:108] = b"0000644\x00"
    h[108:116] = b"0000000\x00"
    h[116:124] = b"0000000\x00"
    h[124:136] = b"%011o\x00" % size
    h[136:148] = b"%011o\x00" % _MTIME
    h[148:156] = b" " * 8
    h[156:157] = b"0"
    h[257:263] = b"ustar\x00"
    h[263:265] = b"00"
    h[148:156] = b"%06o\x00 " % sum(h)
    return bytes(h)


@dataclass(frozen=True)
class MemberExtent:
    offset: int  # of the member's data inside the tar
    size: int


class TarShardWriter:
    """One WebDataset shard. `add()` appends a sample's members; `finish()` makes the shard and its index final.

    Args:
        folder: output folder; the shard is `folder/shard-NNNNNN.tar` and `.idx`.
        index: shard number.
    """

    def __init__(self, folder: str, index: int):
        self.name = shard_name(index)
        self.path = os.path.join(folder, self.name)
        self._tmp = self.path + ".tmp"
        self._f = open(self._tmp, "wb", buffering=1 << 20)
        # sha256 (~2 GB/s) would be the writer thread's largest cost; hashlib releases the GIL, so a helper
        # thread hashes the same chunks, in order, while this one writes.
        self._sha = hashlib.sha256()
        self._hash_q: queue.Queue = queue.Queue(maxsize=256)  # bounded: at most ~30 MB waiting
        self._hasher = threading.Thread(target=self._hash_loop, name="fastfeed-shard-sha256", daemon=True)
        self._hasher.start()
        self._pos = 0
        self._idx_lines: list[str] = []
        self.num_samples = 0

    @property
    def bytes_written(self) -> int:
        return self._pos

    def _hash_loop(self) -> None:
        while (chunk := self._hash_q.get()) is not None:
            self._sha.update(chunk)

    def _stop_hasher(self) -> None:
        if self._hasher.is_alive():
            self._hash_q.put(None)
            self._hasher.join()

    def _write(self, b: bytes) -> None:
        self._f.write(b)
        self._hash_q.put(b)
        self._pos += len(b)

    def _member(self, name: str, data: bytes) -> MemberExtent:
        self._write(_ustar_header(name, len(data)))
        ext = MemberExtent(self._pos, len(data))
        self._write(data)
        pad = -len(data) % _BLOCK
        if pad:
            self._write(b"\x00" * pad)
        return ext

    def add(self, key: str, ext: str, data: bytes, label: int, meta: bytes | None) -> tuple[MemberExtent, MemberExtent | None]:
        """Append `KEY.ext`, `KEY.cls` and (when `meta`) `KEY.json`. Returns the image and json extents."""
        members = [(ext, data), ("cls", b"%d" % label)]
        if meta is not None:
            members.append(("json", meta))
        parts, extents = [], []
        for e, payload in members:
            name = f"{key}.{e}"
            x = self._member(name, payload)
            extents.append(x)
            parts.append(f"{e} {x.offset} {x.size} {name}")
        self._idx_lines.append(" ".join(parts))
        self.num_samples += 1
        return extents[0], (extents[2] if meta is not None else None)

    def finish(self) -> ShardInfo:
        self._write(b"\x00" * (2 * _BLOCK))  # end-of-archive marker
        self._f.flush()
        os.fsync(self._f.fileno())
        self._f.close()
        self._stop_hasher()
        idx = f"{_IDX_VERSION} {self.num_samples}\n" + "".join(line + "\n" for line in self._idx_lines)
        atomic_write(self.path[: -len(".tar")] + ".idx", idx.encode("utf-8"))
        os.replace(self._tmp, self.path)
        fsync_dir(os.path.dirname(self.path))
        return ShardInfo(self.name, self._pos, self._sha.hexdigest(), self.num_samples)

    def abort(self) -> None:
        self._stop_hasher()
        if not self._f.closed:
            self._f.close()
        if os.path.exists(self._tmp):
            os.unlink(self._tmp)


class LmdbWriter:
    """One LMDB environment (`folder/data.lmdb/`); the key scheme is documented in fastfeed/formats/lmdb.py.

    Samples are buffered and written in one transaction per `flush()`; when the map is full the transaction is
    retried after doubling the map size, so no map size has to be guessed up front.
    """

    def __init__(self, folder: str, initial_map_size: int = 1 << 30):
        import lmdb

        self._lmdb = lmdb
        self.path = os.path.join(folder, "data.lmdb")
        self._env = lmdb.open(self.path, map_size=initial_map_size, subdir=True, meminit=False,
                              max_dbs=0, readahead=False)
        self._pending: list[tuple[bytes, bytes]] = []
        self.pending_bytes = 0

    def add(self, key: str, data: bytes, label: int, meta: bytes | None) -> None:
        from fastfeed.formats.lmdb import cls_key, img_key, json_key

        self._pending.append((img_key(key), data))
        self._pending.append((cls_key(key), b"%d" % label))
        if meta is not None:
            self._pending.append((json_key(key), meta))
        self.pending_bytes += len(data)

    def flush(self) -> None:
        """Commit everything added so far (durably: LMDB syncs on commit)."""
        while self._pending:
            try:
                with self._env.begin(write=True) as txn:
                    for k, v in self._pending:
                        txn.put(k, v)
                break
            except self._lmdb.MapFullError:
                self._env.set_mapsize(self._env.info()["map_size"] * 2)
        self._pending.clear()
        self.pending_bytes = 0

    def close(self) -> None:
        self.flush()
        self._env.sync(True)
        self._env.close()


def meta_bytes(meta: dict | None) -> bytes | None:
    if meta is None:
        return None
    return json.dumps(meta, ensure_ascii=False, sort_keys=True, separators=(",", ":")).encode("utf-8")
