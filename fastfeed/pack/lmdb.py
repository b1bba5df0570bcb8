"""Pack writer for one LMDB environment (read by fastfeed/formats/lmdb.py, whose docstring has the key scheme).

Samples are buffered and written in one transaction per ~64 MB; when the map is full the transaction is retried
after doubling the map size, so no map size has to be guessed up front. `meminit=True`: LMDB otherwise leaves
uninitialised heap bytes in the unused part of pages, which made two packs of the same tree differ. When the
pack finishes, every image value's offset inside data.mdb is resolved once and stored in samples.npz (`offset`),
so readers pread images without walking the B-tree.
"""
from __future__ import annotations

import os

import numpy as np

from fastfeed.formats.integrity import sha256_file
from fastfeed.formats.lmdb import DATA_FILE, cls_key, img_key, json_key, resolve_offsets
from fastfeed.pack.base import WRITERS, Cut, Stored
from fastfeed.pack.reader import BatchItem, BatchResult
from fastfeed.pack.validate import LoadOptions, load_image
from fastfeed.types import ShardInfo

__all__ = ["LmdbWriter"]

_COMMIT_BYTES = 64 << 20


class LmdbWriter:
    kind = "lmdb"
    columns = {"offset": np.int64}
    stores_fields = False  # no members besides the image's (a mask's seg.png): those go into WebDataset shards

    def __init__(self, folder: str, shard_size: int, next_shard: int, cut: Cut, initial_map_size: int = 1 << 30):
        import lmdb

        self._lmdb = lmdb
        self._cut = cut
        self.path = os.path.join(folder, "data.lmdb")
        self._env = lmdb.open(self.path, map_size=initial_map_size, subdir=True, meminit=True,
                              max_dbs=0, readahead=False)
        self._pending: list[tuple[bytes, bytes]] = []
        self.pending_bytes = 0

    def load(self, items: list[BatchItem], opts: LoadOptions) -> BatchResult:
        return BatchResult([(load_image(it.path, opts), None) for it in items], None)

    def start_sample(self, nbytes: int, pos: int) -> None:
        pass

    def add(self, key: str, ext: str, data, label: int, meta: bytes | None, rec, members=()) -> dict:
        self._pending.append((img_key(key), data if isinstance(data, bytes) else bytes(data)))
        self._pending.append((cls_key(key), b"%d" % label))
        if meta is not None:
            self._pending.append((json_key(key), meta))
        self.pending_bytes += len(data)
        return {"offset": -1}  # resolved in data_files(), once the environment is final

    def end_sample(self, pos: int) -> None:
        if self.pending_bytes >= _COMMIT_BYTES:
            self.flush()
            self._cut(pos)

    def end_batch(self, batch: BatchResult) -> None:
        pass

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

    def close(self, end: int) -> None:
        self.flush()
        self._env.sync(True)
        self._env.close()
        self._cut(end)

    def shutdown(self) -> None:
        pass

    def abort(self) -> None:
        self._env.close()

    @staticmethod
    def drop_stale(folder: str, keep_shards: int) -> None:
        pass  # uncommitted transactions never reach data.mdb

    @staticmethod
    def data_files(folder: str, table: dict[str, np.ndarray], shards: list[ShardInfo]) -> list[ShardInfo]:
        table["offset"] = resolve_offsets(os.path.join(folder, "data.lmdb"), table["key"], table["size"])
        path = os.path.join(folder, DATA_FILE)
        return [ShardInfo(DATA_FILE, os.path.getsize(path), sha256_file(path), len(table["key"]))]

    @staticmethod
    def stored(folder, table, shards):
        import lmdb

        path = os.path.join(folder, "data.lmdb")
        env = lmdb.open(path, readonly=True, lock=False, subdir=True)
        try:
            with env.begin(buffers=True) as txn:
                for key in table["key"]:
                    key = str(key)
                    data = txn.get(img_key(key))
                    if data is None:
                        raise ValueError(f"{path}: sample {key}: no {img_key(key)!r} record")
                    meta = txn.get(json_key(key))
                    # copies: the buffers are valid only inside this transaction
                    yield Stored("", bytes(data), None if meta is None else bytes(meta))
        finally:
            env.close()


WRITERS["lmdb"] = LmdbWriter
