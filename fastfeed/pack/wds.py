"""Pack writer for WebDataset shards (read by fastfeed/formats/wds.py): tar shards cut at `shard_size`, each with
DALI's `.idx` sidecar, hashed on a helper thread and made durable (fsync + rename + journal) on another. The tar
framing itself is in pack/writers.py; the batch reader builds records straight into pooled buffers
(pack/reader.py), so this writer mostly concatenates them.
"""
from __future__ import annotations

import os
from dataclasses import asdict

import numpy as np

from fastfeed.formats.fields import columns
from fastfeed.formats.integrity import checksum
from fastfeed.pack.base import WRITERS, Cut, Stored
from fastfeed.pack.reader import BatchItem, BatchResult, BufferPool, read_batch
from fastfeed.pack.validate import LoadOptions
from fastfeed.pack.writers import ShardHasher, TarShardWriter, make_record
from fastfeed.types import ShardInfo

__all__ = ["WdsWriter", "field_cells", "table_fields"]


def field_cells(name: str, offset: int, size: int, xxh3: int) -> dict:
    """One sample's values for field `name`'s columns: its member's data extent in the tar and its xxh3."""
    return dict(zip(columns(name), (offset, size, xxh3)))


def table_fields(table: dict) -> list[str]:
    """The fields a samples.npz table has columns for, in column order."""
    return [c[len("field."):-len(".offset")] for c in table if c.startswith("field.") and c.endswith(".offset")]


class WdsWriter:
    kind = "wds"
    columns = {"shard": np.int32, "offset": np.int64, "meta_offset": np.int64, "meta_size": np.int64}
    stores_fields = True  # members besides the image (a mask's seg.png), with field columns (table.table_columns)

    def __init__(self, folder: str, shard_size: int, next_shard: int, cut: Cut):
        self.folder, self.shard_size, self.next_shard, self._cut = folder, shard_size, next_shard, cut
        self.tar: TarShardWriter | None = None
        self._hasher = ShardHasher()
        self._pool = BufferPool()

    def load(self, items: list[BatchItem], opts: LoadOptions) -> BatchResult:
        return read_batch(items, opts, self._pool)

    def start_sample(self, nbytes: int, pos: int) -> None:
        if self.tar is not None and self.tar.num_samples and self.tar.bytes_written + nbytes > self.shard_size:
            self._finish_shard(pos)  # this sample opens the next shard

    def add(self, key: str, ext: str, data, label: int, meta: bytes | None, rec, members=()) -> dict:
        if self.tar is None:
            self.tar = TarShardWriter(self.folder, self.next_shard, self._hasher)
        if rec is None:
            rec = make_record(key, ext, data, label, meta, members)
        base = self.tar.bytes_written
        img, js = self.tar.add_record(rec)
        row = {"shard": self.next_shard, "offset": img.offset, "meta_offset": js.offset if js else -1,
               "meta_size": js.size if js else 0}
        for e, off, size in rec.members[2:]:  # after the image and .cls: the fields (a mask's seg.png)
            if e != "json":
                row.update(field_cells(e, base + off, size, checksum(rec.data[off:off + size])))
        return row

    def end_sample(self, pos: int) -> None:
        pass

    def end_batch(self, batch: BatchResult) -> None:
        if batch.buffer is None:
            return
        if self.tar is not None:
            self.tar.flush()
        # FIFO behind the hashing of this batch's bytes: the buffer is reused only once they are hashed.
        buf, pool = batch.buffer, self._pool
        self._hasher.call(lambda: pool.put(buf))

    def _finish_shard(self, pos: int) -> None:
        """fsync + rename + journal on the helper thread (via cut), so writing the next shard overlaps the flush."""
        tar, self.tar = self.tar, None
        self.next_shard += 1
        tar.end()  # on this thread: the end marker and the hash close must precede the next shard's bytes
        self._cut(pos, lambda: asdict(tar.finish()), background=True)

    def close(self, end: int) -> None:
        if self.tar is not None:
            self._finish_shard(end)

    def shutdown(self) -> None:
        self._hasher.close()

    def abort(self) -> None:
        try:
            if self.tar is not None:
                self.tar.abort()
        finally:
            self._hasher.close()

    @staticmethod
    def drop_stale(folder: str, keep_shards: int) -> None:
        for n in os.listdir(folder):
            if n.startswith("shard-"):
                stem = n.split(".")[0]
                if n.endswith(".tmp") or int(stem[len("shard-"):]) >= keep_shards:
                    os.unlink(os.path.join(folder, n))

    @staticmethod
    def data_files(folder: str, table: dict[str, np.ndarray], shards: list[ShardInfo]) -> list[ShardInfo]:
        return shards

    @staticmethod
    def stored(folder, table, shards):
        """Each shard's members read back in ~8 MB preads (records lie back to back in table order); the image
        extension comes from the image member's tar header name (`KEY.ext`), the fields from the table's field
        columns."""
        shard_col, offset, size = table["shard"], table["offset"], table["size"]
        meta_offset, meta_size = table["meta_offset"], table["meta_size"]
        fields = [(name, *(table[c] for c in columns(name)[:2])) for name in table_fields(table)]
        n = len(shard_col)
        i = 0
        for s_idx, shard in enumerate(shards):
            path = os.path.join(folder, shard.path)
            with open(path, "rb") as f:
                while i < n and shard_col[i] == s_idx:
                    j, start = i, int(offset[i]) - _HEADER
                    end = start
                    while j < n and shard_col[j] == s_idx and (j == i or end - start < _READ_BYTES):
                        end = max(int(offset[j] + size[j]), int(meta_offset[j] + meta_size[j]),
                                  *(int(f_off[j] + f_size[j]) for _, f_off, f_size in fields))
                        j += 1
                    buf = memoryview(os.pread(f.fileno(), end - start, start))
                    if len(buf) != end - start:
                        raise ValueError(f"{path}: ends at {start + len(buf)}, the table has members up to {end}")
                    for r in range(i, j):
                        at = int(offset[r]) - start
                        name = bytes(buf[at - _HEADER : at - _HEADER + 100]).rstrip(b"\0").decode("utf-8")
                        key = str(table["key"][r])
                        if not name.startswith(key + "."):
                            raise ValueError(f"{path}: sample {key}: the tar member at {start + at} is {name!r}")
                        meta = None
                        if meta_offset[r] >= 0:
                            mo = int(meta_offset[r]) - start
                            meta = bytes(buf[mo : mo + int(meta_size[r])])
                        members = tuple((f, bytes(buf[int(fo[r]) - start:int(fo[r]) - start + int(fs[r])]))
                                        for f, fo, fs in fields if fs[r] >= 0)
                        yield Stored(name[len(key) + 1 :], buf[at : at + int(size[r])], meta, members)
                    i = j
        if i != n:
            raise ValueError(f"{folder}: samples.npz row {i} names shard {int(shard_col[i])}, which is not listed")


_HEADER = 512  # a ustar header precedes every member's data
_READ_BYTES = 8 << 20


WRITERS["wds"] = WdsWriter
