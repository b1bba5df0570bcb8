"""Datasets in object storage (fsspec URLs) with a local shard cache. (Packing to/from URLs and on Ray, `pack_any`,
is fastfeed/pack/remote.py.)

    open_remote(url, storage_options, cache_dir=, cache_size=, fetch=, ...)   remote/dataset.py
    read_manifest(path_or_url)                             the manifest only (inspect, doctor): remote/dataset.py
    ShardCache                                             the shared, bounded shard cache: remote/cache.py
    epoch_fetch(dataset, indices, batch_size, num_slots)   streaming hook for the epoch runner: remote/epoch.py
"""
from __future__ import annotations

from fastfeed.remote.store import is_url

__all__ = ["is_url", "open_remote", "read_manifest", "ShardCache", "epoch_fetch"]


def __getattr__(name: str):
    if name in ("open_remote", "read_manifest"):
        from fastfeed.remote import dataset

        return getattr(dataset, name)
    if name == "epoch_fetch":
        from fastfeed.remote.epoch import epoch_fetch

        return epoch_fetch
    if name == "ShardCache":
        from fastfeed.remote.cache import ShardCache

        return ShardCache
    raise AttributeError(f"module 'fastfeed.remote' has no attribute {name!r}")
