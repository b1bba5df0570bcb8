"""Packed-dataset readers for a local folder: `open_local(path)` picks the reader from the folder's manifest
(`fastfeed.open_dataset` also takes URLs: fastfeed/datasets.py).

Both readers share one interface (see `base.Dataset`): len(), labels, classes, keys, widths/heights, checksums,
orientations, read(i), metadata(i), extents(), iteration yielding `Sample`s, manifest, close(), and use as a
context manager. Every problem with a dataset is a `DatasetError` (a ValueError) naming the file and, when known,
the sample key. `fastfeed.formats.integrity.bad_checksums` checks a batch of read samples.
"""
from __future__ import annotations

import os

from fastfeed.formats.base import Dataset, load_manifest, remote_shards
from fastfeed.formats.lmdb import LmdbDataset
from fastfeed.formats.targets import read_targets
from fastfeed.formats.wds import WdsDataset
from fastfeed.types import DatasetError

__all__ = ["open_local", "read_targets", "Dataset", "DatasetError", "READERS"]

READERS: dict[str, type] = {"wds": WdsDataset, "lmdb": LmdbDataset}


def open_local(path: str | os.PathLike, manifest=None) -> Dataset:
    """Open a folder written by `fastfeed pack`; raises DatasetError when it is not a complete, intact dataset.
    `manifest`: its `load_manifest`, when the caller has read it already."""
    root = os.fspath(path)
    manifest = manifest or load_manifest(root)
    if remote_shards(manifest):
        raise DatasetError(f"{root}: its shards are at {manifest.data_root}: open it with fastfeed.open_dataset, "
                           "which reads them through the shard cache", path=root)
    return READERS[manifest.kind](root)
