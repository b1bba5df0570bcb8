"""Reader for WebDataset shards written by `fastfeed pack --format wds`.

Each sample is the tar members `KEY.jpg` (or `.png`), `KEY.cls` (decimal label) and optionally `KEY.json`, so
the `webdataset` library reads the shards unchanged, and `shard-NNNNNN.idx` is DALI's `wds2idx` index. Random
access never parses tar headers: `samples.npz` already holds each image's (shard, offset, size).
"""
from __future__ import annotations

import json
import mmap
import os
from typing import Iterator

import numpy as np

from fastfeed.formats.base import TableDataset
from fastfeed.types import DatasetError, Extents, Sample

__all__ = ["WdsDataset"]


class WdsDataset(TableDataset):
    """Args: root: a folder written by `fastfeed pack --format wds` (or merged by `fastfeed merge`)."""

    def __init__(self, root: str):
        super().__init__(root, "wds", ("shard", "offset", "meta_offset", "meta_size"))
        self._paths = [os.path.join(self.root, s.path) for s in self.manifest.shards]
        self._fds: dict[int, int] = {}
        t = self._table
        if len(self) and (t["shard"].min() < 0 or t["shard"].max() >= len(self._paths)):
            raise DatasetError(f"{root}: samples.npz refers to shards the manifest does not list")

    def _fd(self, shard: int) -> int:
        fd = self._fds.get(shard)
        if fd is None:
            fd = self._fds[shard] = os.open(self._paths[shard], os.O_RDONLY)
        return fd

    def _pread(self, shard: int, offset: int, size: int) -> bytes:
        data = os.pread(self._fd(shard), size, offset)
        if len(data) != size:
            raise DatasetError(f"{self._paths[shard]}: short read at {offset} (file truncated?)")
        return data

    def read(self, i: int) -> bytes:
        i = self._index(i)
        t = self._table
        return self._pread(int(t["shard"][i]), int(t["offset"][i]), int(t["size"][i]))

    def metadata(self, i: int) -> dict | None:
        i = self._index(i)
        t = self._table
        if t["meta_offset"][i] < 0:
            return None
        raw = self._pread(int(t["shard"][i]), int(t["meta_offset"][i]), int(t["meta_size"][i]))
        return json.loads(raw)

    def extents(self) -> Extents:
        t = self._table
        return Extents(list(self._paths), t["shard"].astype(np.int32), t["offset"].astype(np.int64),
                       t["size"].astype(np.int64))

    def __iter__(self) -> Iterator[Sample]:
        """Sequential, in storage order: one mmap per shard, so the kernel reads ahead."""
        t = self._table
        labels, keys = t["label"], t["key"]
        i, n = 0, len(self)
        while i < n:
            shard = int(t["shard"][i])
            with open(self._paths[shard], "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
                m.madvise(mmap.MADV_SEQUENTIAL)
                while i < n and t["shard"][i] == shard:
                    off, size = int(t["offset"][i]), int(t["size"][i])
                    meta = None
                    if t["meta_offset"][i] >= 0:
                        mo = int(t["meta_offset"][i])
                        meta = json.loads(m[mo : mo + int(t["meta_size"][i])])
                    yield Sample(str(keys[i]), m[off : off + size], int(labels[i]), meta)
                    i += 1

    def close(self) -> None:
        fds, self._fds = self._fds, {}
        for fd in fds.values():
            os.close(fd)
