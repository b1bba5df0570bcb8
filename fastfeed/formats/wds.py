"""Reader for WebDataset shards written by `fastfeed pack --format wds`.

Each sample is the tar members `KEY.jpg` (or `.png`), `KEY.cls` (decimal label) and optionally `KEY.json`, so
the `webdataset` library reads the shards unchanged, and `shard-NNNNNN.idx` is DALI's `wds2idx` index. Random
access never parses tar headers: `samples.npz` already holds each image's (shard, offset, size); `fastfeed
verify` cross-checks those against the tar headers, the `.idx` files and the `.cls` members.
"""
from __future__ import annotations

import json
import mmap
import os
from typing import Iterator

import numpy as np

from fastfeed.formats.base import TableDataset, data_path
from fastfeed.types import DatasetError, Sample

__all__ = ["WdsDataset"]


class WdsDataset(TableDataset):
    """Args: root: a folder written by `fastfeed pack --format wds` (or merged by `fastfeed merge`)."""

    def __init__(self, root: str):
        super().__init__(root, "wds", ("shard", "offset", "meta_offset", "meta_size"))
        t = self._table
        has = t["meta_offset"] >= 0
        if has.any():
            end = t["meta_offset"][has] + t["meta_size"][has]
            sizes = np.array([s.bytes for s in self.manifest.shards], dtype=np.int64)
            bad = (t["meta_size"][has] < 0) | (end > sizes[t["shard"][has]])
            if bad.any():
                key = str(t["key"][has][np.flatnonzero(bad)[0]])
                raise DatasetError(f"{self.table_path}: sample {key}: metadata extent lies outside its shard",
                                   path=self.table_path, key=key)

    def _locate(self):
        paths = [data_path(self.root, s.path) for s in self.manifest.shards]
        return paths, self._table["shard"].astype(np.int32), self._table["offset"].astype(np.int64)

    def metadata(self, i: int) -> dict | None:
        i = self._index(i)
        t = self._table
        if t["meta_offset"][i] < 0:
            return None
        f, off, size = int(t["shard"][i]), int(t["meta_offset"][i]), int(t["meta_size"][i])
        try:
            data = os.pread(self._fd(f, i), size, off)
        except OSError as e:
            raise self._error(i, f"metadata unreadable ({e.strerror or e})") from None
        return self._json(i, data)

    def _fd(self, f: int, i: int) -> int:
        fd = self._fds.get(f)
        if fd is None:
            try:
                fd = self._open_fd(f)
            except OSError as e:
                raise self._error(i, f"unreadable ({e.strerror or e})") from None
        return fd

    def _error(self, i: int, what: str) -> DatasetError:
        path, key = self.file_of(i), str(self.keys[i])
        return DatasetError(f"{path}: sample {key}: {what}", path=path, key=key)

    def _json(self, i: int, raw) -> dict:
        try:
            return json.loads(bytes(raw))
        except ValueError as e:
            raise self._error(i, f"metadata is not valid JSON ({e})") from None

    def __iter__(self) -> Iterator[Sample]:
        """Sequential, in storage order: one mmap per shard, so the kernel reads ahead. Checksums are checked."""
        t = self._table
        labels, keys = t["label"], t["key"]
        i, n = 0, len(self)
        while i < n:
            shard = int(t["shard"][i])
            try:
                f = open(self._paths[shard], "rb")
            except OSError as e:
                raise self._error(i, f"unreadable ({e.strerror or e})") from None
            with f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
                m.madvise(mmap.MADV_SEQUENTIAL)
                while i < n and t["shard"][i] == shard:
                    off, size = int(t["offset"][i]), int(t["size"][i])
                    meta = None
                    if t["meta_offset"][i] >= 0:
                        mo = int(t["meta_offset"][i])
                        meta = self._json(i, m[mo : mo + int(t["meta_size"][i])])
                    data = m[off : off + size]
                    if len(data) != size:
                        raise self._error(i, "short read (file truncated?)")
                    self.check(i, data)
                    yield Sample(str(keys[i]), data, int(labels[i]), meta)
                    i += 1
