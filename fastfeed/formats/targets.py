"""A detection dataset's targets table, read once from the annotation each sample stores (fastfeed/targets.py)."""
from __future__ import annotations

import numpy as np

from fastfeed.targets import Targets, build_targets, check_annotation
from fastfeed.types import DatasetError

__all__ = ["read_targets"]


def read_targets(ds, widths=None, heights=None) -> Targets:
    """Every sample's objects, from its stored annotation member (a missing one: no objects), clipped to each
    image's (width, height) in the annotations' frame (default: as stored). A malformed annotation is a DatasetError
    naming the sample: the targets of a whole epoch depend on it, so it is found before training."""
    num_classes = len(ds.classes)
    annotations = [None] * len(ds)
    for ids, done in _in_cache_order(ds):
        for i in ids:
            ann = ds.metadata(int(i))
            why = check_annotation(ann, num_classes)
            if why is not None:
                key = str(ds.keys[i])
                where = getattr(ds, "root", "dataset")
                raise DatasetError(f"{where}: sample {key}: {why}", path=where, key=key)
            annotations[i] = ann
        done()
    return build_targets(annotations, ds.widths if widths is None else widths,
                         ds.heights if heights is None else heights)


def _in_cache_order(ds):
    """(sample ids, what to call once they are read): all at once for a local dataset. At a URL opened to fetch
    on demand (the Loader's) each shard is fetched into the bounded shard cache to be read: shard by shard, a few
    ahead, each released once read, so the cache need not hold the whole dataset (order="shard" streams with a
    cache smaller than it). One opened with fetch="all" keeps every shard pinned, as its extents promise."""
    if getattr(ds, "fetch", None) != "on_demand" or not len(ds):
        yield range(len(ds)), lambda: None
        return
    shard_of = np.asarray(ds.shard_index)
    order = np.argsort(shard_of, kind="stable")
    shards = ds.shards_of(order)
    for j, ids in enumerate(np.split(order, np.searchsorted(shard_of[order], shards[1:]))):
        ds.prefetch(shards[j:j + ds.parallel])
        yield ids, lambda s=shards[j]: ds.release([s])
