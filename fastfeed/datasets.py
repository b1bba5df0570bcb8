"""`open_dataset(path_or_url)`: the one place that tells a local folder (formats/) from a URL (remote/)."""
from __future__ import annotations

import os

from fastfeed.formats import Dataset, open_local
from fastfeed.formats.base import load_manifest, remote_shards
from fastfeed.remote.store import is_url

__all__ = ["open_dataset"]


def open_dataset(path: str | os.PathLike, storage_options: dict | None = None, **remote) -> Dataset:
    """Open a dataset written by `fastfeed pack`; raises DatasetError when it is not a complete, intact dataset.
    An fsspec URL (s3://, gs://, https://, ...) opens through the shard cache: fastfeed/remote/dataset.py
    (`storage_options` go to fsspec; `remote` keywords: cache_dir, cache_size, fetch, parallel, retry_timeout)."""
    if is_url(path):
        from fastfeed.remote.dataset import open_remote  # fsspec only when a URL needs it

        return open_remote(path, storage_options, **remote)
    manifest = load_manifest(os.fspath(path))
    if remote_shards(manifest):  # a folder `fastfeed index` wrote for shards at a URL
        from fastfeed.remote.dataset import open_remote

        return open_remote(os.fspath(path), storage_options, **remote)
    return open_local(path, manifest)
