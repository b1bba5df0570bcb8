"""Packed-dataset readers: `open_dataset(path)` picks the reader from the folder's manifest.

Both readers share one interface (see `base.Dataset`): len(), labels, classes, keys, widths/heights, checksums,
orientations, read(i), metadata(i), extents(), iteration yielding `Sample`s, manifest, close(), and use as a
context manager. Every problem with a dataset is a `DatasetError` (a ValueError) naming the file and, when known,
the sample key. `fastfeed.formats.integrity.bad_checksums` checks a batch of read samples.
"""
from __future__ import annotations

import os

from fastfeed.formats.base import Dataset, load_manifest
from fastfeed.formats.lmdb import LmdbDataset
from fastfeed.formats.wds import WdsDataset
from fastfeed.types import DatasetError

__all__ = ["open_dataset", "Dataset", "DatasetError", "READERS"]

READERS: dict[str, type] = {"wds": WdsDataset, "lmdb": LmdbDataset}


def open_dataset(path: str | os.PathLike, storage_options: dict | None = None, **remote) -> Dataset:
    """Open a folder written by `fastfeed pack`; raises DatasetError when it is not a complete, intact dataset.
    An fsspec URL (s3://, gs://, https://, ...) opens through the shard cache: fastfeed/remote/dataset.py
    (`storage_options` go to fsspec; `remote` keywords: cache_dir, cache_size, fetch, parallel, retry_timeout)."""
    from fastfeed.remote import is_url, open_remote  # hook: remote datasets (fastfeed/remote/)
    if is_url(path):
        return open_remote(path, storage_options, **remote)

    root = os.fspath(path)
    return READERS[load_manifest(root).kind](root)
