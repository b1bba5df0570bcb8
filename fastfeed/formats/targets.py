"""A detection dataset's targets table, read once from the annotation each sample stores (fastfeed/targets.py)."""
from __future__ import annotations

from fastfeed.targets import Targets, build_targets, check_annotation
from fastfeed.types import DatasetError

__all__ = ["read_targets"]


def read_targets(ds, widths=None, heights=None) -> Targets:
    """Every sample's objects, from its stored annotation member (a missing one: no objects), clipped to each
    image's (width, height) in the annotations' frame (default: as stored). A malformed annotation is a DatasetError
    naming the sample: the targets of a whole epoch depend on it, so it is found before training."""
    num_classes = len(ds.classes)
    annotations = []
    for i in range(len(ds)):
        ann = ds.metadata(i)
        why = check_annotation(ann, num_classes)
        if why is not None:
            key = str(ds.keys[i])
            where = getattr(ds, "root", "dataset")
            raise DatasetError(f"{where}: sample {key}: {why}", path=where, key=key)
        annotations.append(ann)
    return build_targets(annotations, ds.widths if widths is None else widths,
                         ds.heights if heights is None else heights)
