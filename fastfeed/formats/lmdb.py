"""Reader for the LMDB environment written by `fastfeed pack --format lmdb`.

Key scheme of `OUT/data.lmdb` (one unnamed database; all keys and values are plain bytes, no pickle), readable
with nothing but the `lmdb` package:

    b"img/" + KEY   the encoded image bytes, exactly as stored (JPEG or PNG)
    b"cls/" + KEY   the label as ASCII decimal (b"-1" for unlabelled), like WebDataset's `.cls`
    b"json/" + KEY  per-sample metadata as UTF-8 JSON (only for samples that have metadata)

KEY is the sample key from `samples.npz` (ASCII digits). Labels, sizes and dimensions are also in `samples.npz`,
so the reader needs only the image values.

Extents: LMDB keeps each value contiguous inside the memory-mapped `data.mdb` (overflow pages for large
values), and the map starts at file offset 0, so a value's file offset is its address in the map minus the map
address. They are resolved once at open, with one cursor pass, letting the native ring `pread` images straight
from `data.mdb` without LMDB. The readonly environment is opened with `lock=False`: packed datasets are never
written after the manifest exists.
"""
from __future__ import annotations

import json
import os
import threading
from typing import Iterator

import numpy as np

from fastfeed.formats.base import TableDataset
from fastfeed.types import DatasetError, Extents, Sample

__all__ = ["LmdbDataset", "img_key", "cls_key", "json_key"]


# py-lmdb refuses to open one environment twice in a process, yet a training script commonly holds two readers of
# the same dataset (a train and a val Loader, or a Loader next to `fastfeed.open_dataset`): share one handle.
_ENVS: dict[str, list] = {}  # realpath -> [Environment, users]
_ENVS_LOCK = threading.Lock()


def _acquire_env(path: str):
    import lmdb

    key = os.path.realpath(path)
    with _ENVS_LOCK:
        entry = _ENVS.get(key)
        if entry is None:
            env = lmdb.open(path, readonly=True, lock=False, readahead=False, subdir=True, max_readers=512)
            entry = _ENVS[key] = [env, 0]
        entry[1] += 1
        return entry[0]


def _release_env(path: str) -> None:
    key = os.path.realpath(path)
    with _ENVS_LOCK:
        entry = _ENVS.get(key)
        if entry is None:
            return
        entry[1] -= 1
        if entry[1] == 0:
            entry[0].close()
            del _ENVS[key]


def img_key(key: str) -> bytes:
    return b"img/" + key.encode("ascii")


def cls_key(key: str) -> bytes:
    return b"cls/" + key.encode("ascii")


def json_key(key: str) -> bytes:
    return b"json/" + key.encode("ascii")


class LmdbDataset(TableDataset):
    """Args: root: a folder written by `fastfeed pack --format lmdb` (or merged by `fastfeed merge`)."""

    def __init__(self, root: str):
        import lmdb

        super().__init__(root, "lmdb")
        self._data_path = os.path.join(self.root, "data.lmdb", "data.mdb")
        self._env_path = os.path.join(self.root, "data.lmdb")
        try:
            self._env = _acquire_env(self._env_path)
        except lmdb.Error as e:
            raise DatasetError(f"{root}: cannot open data.lmdb ({e})") from None
        self._txn = self._env.begin(buffers=True)
        self._offsets = self._resolve_offsets()

    def _resolve_offsets(self) -> np.ndarray:
        keys = self.keys
        sizes = self.sizes
        addrs = np.empty(len(keys), dtype=np.int64)
        for i, k in enumerate(keys):
            view = self._txn.get(img_key(str(k)))
            if view is None:
                raise DatasetError(f"{self.root}: sample {k} is missing from data.lmdb")
            if len(view) != sizes[i]:
                raise DatasetError(f"{self.root}: sample {k} has {len(view)} bytes, samples.npz says {sizes[i]}")
            addrs[i] = np.frombuffer(view, dtype=np.uint8).ctypes.data
        if not len(keys):
            return addrs
        offsets = addrs - self._map_base(int(addrs[0]))
        # Cheap proof that the arithmetic is right: the first and last values read back from the file.
        with open(self._data_path, "rb") as f:
            for i in (0, len(keys) - 1):
                if os.pread(f.fileno(), int(sizes[i]), int(offsets[i])) != bytes(self._txn.get(img_key(str(keys[i])))):
                    raise DatasetError(f"{self.root}: cannot locate LMDB values inside data.mdb")
        return offsets

    def _map_base(self, some_addr: int) -> int:
        """Address where data.mdb is mapped. py-lmdb's `info()['map_addr']` is 0 unless MDB_FIXEDMAP, so on
        Linux the mapping that holds a known value is looked up in /proc/self/maps (file offset 0: LMDB maps
        the whole file from its start)."""
        base = int(self._env.info()["map_addr"])
        if base:
            return base
        st = os.stat(self._data_path)
        try:
            with open("/proc/self/maps", encoding="ascii", errors="replace") as f:
                for line in f:
                    fields = line.split()
                    if len(fields) < 6 or int(fields[4]) != st.st_ino or int(fields[2], 16) != 0:
                        continue
                    lo, hi = (int(x, 16) for x in fields[0].split("-"))
                    if lo <= some_addr < hi:
                        return lo
        except OSError:
            pass
        raise DatasetError(f"{self.root}: cannot find where data.mdb is mapped (extents need Linux /proc)")

    def read(self, i: int) -> bytes:
        i = self._index(i)
        return bytes(self._txn.get(img_key(str(self.keys[i]))))

    def metadata(self, i: int) -> dict | None:
        i = self._index(i)
        raw = self._txn.get(json_key(str(self.keys[i])))
        return None if raw is None else json.loads(bytes(raw))

    def extents(self) -> Extents:
        n = len(self)
        return Extents([self._data_path], np.zeros(n, dtype=np.int32), self._offsets.copy(),
                       self.sizes.astype(np.int64))

    def __iter__(self) -> Iterator[Sample]:
        """In samples.npz order (the pack's shuffled order), which is also roughly the file order."""
        labels = self.labels
        for i, k in enumerate(self.keys):
            key = str(k)
            meta = self._txn.get(json_key(key))
            yield Sample(key, bytes(self._txn.get(img_key(key))), int(labels[i]),
                         None if meta is None else json.loads(bytes(meta)))

    def close(self) -> None:
        if getattr(self, "_env", None) is not None:
            self._txn.abort()
            self._env = None
            _release_env(self._env_path)
