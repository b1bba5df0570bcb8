"""Datasets in object storage (fsspec URLs) with a local shard cache, and packing to/from URLs and on Ray.

    open_remote(url, storage_options, cache_dir=, cache_size=, fetch=, ...)   fastfeed/remote/dataset.py
    ShardCache                                                                fastfeed/remote/cache.py
    pack_any(src, out, options, ...)      `fastfeed pack` with URLs and --engine ray: fastfeed/remote/pack.py
"""
from __future__ import annotations

from fastfeed.remote.store import is_url

__all__ = ["is_url", "open_remote", "ShardCache"]


def __getattr__(name: str):
    if name == "open_remote":
        from fastfeed.remote.dataset import open_remote

        return open_remote
    if name == "ShardCache":
        from fastfeed.remote.cache import ShardCache

        return ShardCache
    raise AttributeError(f"module 'fastfeed.remote' has no attribute {name!r}")
