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
address. Since format version 2 the packer resolves them once (`resolve_offsets`) and stores them in the
`offset` column, so images are `pread` straight from `data.mdb` and checked against their checksums: liblmdb
trusts its pages, and a damaged B-tree can make it return garbage sizes or crash, so the reader never walks the
tree for image bytes. LMDB itself is opened only for metadata (`json/` values) and for version 1 datasets
(offsets resolved at open, every liblmdb error turned into a DatasetError). The readonly environment is opened
with `lock=False`: packed datasets are never written after the manifest exists.
"""
from __future__ import annotations

import json
import os
import threading
from typing import Iterator

import numpy as np

from fastfeed.formats.base import TableDataset
from fastfeed.types import DatasetError, Sample

__all__ = ["LmdbDataset", "img_key", "cls_key", "json_key", "resolve_offsets", "DATA_FILE"]

DATA_FILE = os.path.join("data.lmdb", "data.mdb")


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


def resolve_offsets(env_path: str, keys: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """File offsets inside `env_path/data.mdb` of every `img/KEY` value (one lookup per key). Raises
    DatasetError naming the file (and sample) on any LMDB problem: missing value, size mismatch, damaged pages."""
    import lmdb

    data_file = os.path.join(env_path, "data.mdb")
    try:
        env = _acquire_env(env_path)
    except (lmdb.Error, OSError, MemoryError) as e:
        raise DatasetError(f"{data_file}: cannot open the LMDB environment ({e})", path=data_file) from None
    try:
        with env.begin(buffers=True) as txn:
            addrs = np.empty(len(keys), dtype=np.int64)
            for i, k in enumerate(keys):
                try:
                    view = txn.get(img_key(str(k)))
                except (lmdb.Error, MemoryError, SystemError) as e:
                    raise DatasetError(f"{data_file}: sample {k}: LMDB lookup failed ({type(e).__name__}: {e})",
                                       path=data_file, key=str(k)) from None
                if view is None:
                    raise DatasetError(f"{data_file}: sample {k} is missing from data.lmdb", path=data_file, key=str(k))
                if len(view) != sizes[i]:
                    raise DatasetError(f"{data_file}: sample {k} has {len(view)} bytes, samples.npz says {sizes[i]}",
                                       path=data_file, key=str(k))
                addrs[i] = np.frombuffer(view, dtype=np.uint8).ctypes.data
            if not len(keys):
                return addrs
            offsets = addrs - _map_base(env, data_file, int(addrs[0]))
            # Cheap proof that the arithmetic is right: the first and last values read back from the file.
            with open(data_file, "rb") as f:
                for i in (0, len(keys) - 1):
                    if os.pread(f.fileno(), int(sizes[i]), int(offsets[i])) != bytes(txn.get(img_key(str(keys[i])))):
                        raise DatasetError(f"{data_file}: cannot locate LMDB values inside data.mdb", path=data_file)
            return offsets
    except lmdb.Error as e:
        raise DatasetError(f"{data_file}: damaged LMDB environment ({type(e).__name__}: {e})", path=data_file) from None
    finally:
        _release_env(env_path)


def _map_base(env, data_file: str, some_addr: int) -> int:
    """Address where data.mdb is mapped. py-lmdb's `info()['map_addr']` is 0 unless MDB_FIXEDMAP, so on Linux the
    mapping that holds a known value is looked up in /proc/self/maps (file offset 0: LMDB maps the whole file from
    its start)."""
    base = int(env.info()["map_addr"])
    if base:
        return base
    st = os.stat(data_file)
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
    raise DatasetError(f"{data_file}: cannot find where data.mdb is mapped (extents need Linux /proc)", path=data_file)


class LmdbDataset(TableDataset):
    """Args: root: a folder written by `fastfeed pack --format lmdb` (or merged by `fastfeed merge`)."""

    def __init__(self, root: str):
        self._env = None
        super().__init__(root, "lmdb")

    def _locate(self):
        self._env_path = os.path.join(self.root, "data.lmdb")
        self._data_path = os.path.join(self.root, DATA_FILE)
        listed = [s.path for s in self.manifest.shards]
        if listed != [DATA_FILE]:
            where = os.path.join(self.root, "fastfeed.json")
            raise DatasetError(f"{where}: an LMDB dataset lists data files {listed}, expected [{DATA_FILE!r}]",
                               path=where)
        if "offset" in self._table:
            offsets = self._table["offset"].astype(np.int64)
        else:  # format version 1: no stored offsets
            offsets = resolve_offsets(self._env_path, self.keys, self.sizes)
        return [self._data_path], np.zeros(len(self), dtype=np.int32), offsets

    def _txn(self):
        import lmdb

        if self._env is None:
            try:
                env = _acquire_env(self._env_path)
            except (lmdb.Error, OSError, MemoryError) as e:
                raise DatasetError(f"{self._data_path}: cannot open the LMDB environment ({e})",
                                   path=self._data_path) from None
            self._env, self._txn_obj = env, env.begin(buffers=True)
        return self._txn_obj

    def metadata(self, i: int) -> dict | None:
        import lmdb

        i = self._index(i)
        key = str(self.keys[i])
        txn = self._txn()
        try:
            raw = txn.get(json_key(key))
            if raw is None:
                return None
            return json.loads(bytes(raw))
        except (lmdb.Error, MemoryError, SystemError, ValueError) as e:
            raise DatasetError(f"{self._data_path}: sample {key}: metadata unreadable ({type(e).__name__}: {e})",
                               path=self._data_path, key=key) from None

    def __iter__(self) -> Iterator[Sample]:
        """In samples.npz order (the pack's shuffled order), which is also roughly the file order."""
        labels = self.labels
        for i, k in enumerate(self.keys):
            yield Sample(str(k), self.read(i), int(labels[i]), self.metadata(i))

    def check_layout(self, damaged: set[str], unavailable: frozenset[str] = frozenset()
                     ) -> tuple[list[str], list[str], list[str]]:
        """Each `cls/KEY` record against the label and each `img/KEY` size, walked only when data.mdb matches its
        sha256: liblmdb trusts its pages, and a damaged file can make it crash, so it is not handed one."""
        import lmdb

        if damaged:
            return [], ["LMDB records not cross-checked: data.mdb does not match its sha256, and liblmdb is not safe "
                        "to walk on damaged pages (the per-sample checksums name the damaged images)"], []
        errors: list[str] = []
        t = self._table
        try:
            txn = self._txn()
            for i, k in enumerate(t["key"].tolist()):
                img, cls = txn.get(img_key(k)), txn.get(cls_key(k))
                if img is None or len(img) != int(t["size"][i]):
                    errors.append(f"{DATA_FILE}: {self.describe(i)}: img/{k} is "
                                  f"{'missing' if img is None else f'{len(img)} bytes'}, samples.npz says "
                                  f"{int(t['size'][i])} bytes")
                if cls is None or bytes(cls).strip() != b"%d" % int(t["label"][i]):
                    errors.append(f"{DATA_FILE}: {self.describe(i)}: cls/{k} holds "
                                  f"{None if cls is None else bytes(cls)[:20]!r}, samples.npz says label "
                                  f"{int(t['label'][i])}")
        except (lmdb.Error, MemoryError, DatasetError) as e:
            errors.append(f"{DATA_FILE}: damaged LMDB environment ({e})")
        return errors, [], ["LMDB labels and sizes"]

    def close(self) -> None:
        super().close()
        if getattr(self, "_env", None) is not None:
            self._txn_obj.abort()
            self._env = None
            _release_env(self._env_path)
