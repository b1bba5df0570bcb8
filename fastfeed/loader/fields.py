"""`Loader(fields=[...])`: the members a sample carries besides its image, read with it and handed out with it.

A sample's image and its requested members lie together in one shard (a webdataset sample is consecutive tar
members), so the ring reads one extent per sample that spans them all: no read of its own per field, no GIL held
per sample for I/O. `SampleFields.split` cuts each read into the image (what the decoder gets) and the members'
bytes, and checks each member (present, checksum, value): a sample that fails is a bad record like a broken image,
replaced in its batch or raised on, per `on_error`. `collate` makes a batch's values what a DataLoader's
default_collate would, wherever that does not depend on which samples share the batch: numbers and same-shaped
arrays stacked into tensors, text and other JSON values as lists.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from fastfeed.decode.base import BAD_FIELD, MISSING_FIELD
from fastfeed.formats.fields import INT64_MAX, INT64_MIN, FieldError, decode_value, value_kind
from fastfeed.formats.integrity import checksum
from fastfeed.types import Extents

__all__ = ["SampleFields", "plan_fields", "pick_mask", "collate", "MISSING_FIELD", "BAD_FIELD"]

_FLOAT64_MAX = int(np.finfo(np.float64).max)


@dataclass(frozen=True)
class SampleFields:
    """Where each requested member lies relative to the start of its sample's read (`at`, -1 sizes: absent), its
    checksum (None: not recorded), and the image's place in the read. "cls" is the label column: never read, its
    size -1 where the sample has no label."""

    names: tuple[str, ...]
    kinds: dict  # name -> value_kind, or "label"
    image_at: np.ndarray  # int64[N]
    image_size: np.ndarray  # int64[N]
    at: dict  # name -> int64[N]
    size: dict  # name -> int64[N]
    checksum: dict  # name -> uint64[N] | None

    def split(self, indices: np.ndarray, reads: list) -> tuple[list, dict, dict]:
        """(images, {name: [value per position]}, {position: (code, detail)}) for one batch of the ring's reads
        (uint8 views; an empty one is a failed read, already reported)."""
        images, bad = [], {}
        # The batch's rows of each column as Python ints, gathered once: a numpy scalar per sample and column would
        # cost more than the values themselves (this runs under the GIL, beside the other workers).
        image_at, image_size = self.image_at[indices].tolist(), self.image_size[indices].tolist()
        for raw, a, n in zip(reads, image_at, image_size):
            images.append(raw[a:a + n] if len(raw) else raw)
        values = {}
        for name in self.names:
            kind = self.kinds[name]
            if kind == "label":  # its values are the labels; only a sample without one is found here
                for p, size in enumerate(self.size[name][indices].tolist()):
                    if size < 0 and len(reads[p]):
                        bad.setdefault(p, (MISSING_FIELD, f"no .{name} member"))
                continue
            out = values[name] = [None] * len(indices)
            sums = self.checksum[name]
            rows = zip(self.at[name][indices].tolist(), self.size[name][indices].tolist(),
                       sums[indices].tolist() if sums is not None else [None] * len(indices))
            for p, (raw, (at, size, expected)) in enumerate(zip(reads, rows)):
                if not len(raw):
                    continue
                if size < 0:
                    bad.setdefault(p, (MISSING_FIELD, f"no .{name} member"))
                    continue
                member = raw[at:at + size]
                if expected is not None and checksum(member) != expected:
                    bad.setdefault(p, ("checksum", f"its .{name} member does not match the checksum in the table"))
                    continue
                try:
                    out[p] = decode_value(kind, member)
                except FieldError as e:
                    bad.setdefault(p, (BAD_FIELD, f".{name}: {e}"))
        return images, values, bad


def plan_fields(dataset, names: tuple[str, ...]) -> tuple[Extents, SampleFields]:
    """The ring's extents (one per sample, spanning its image and every requested member) and the SampleFields
    that split them. ValueError naming what the dataset has when a field is not there."""
    if dataset.manifest.kind != "wds" and any(n != "cls" for n in names):
        raise ValueError(f"{dataset.root}: fields other than 'cls' are read from WebDataset shards; this dataset "
                         f"is {dataset.manifest.kind!r} (pack it with --format wds)")
    missing = [n for n in names if n not in dataset.fields]
    if missing:
        raise ValueError(f"{dataset.root}: the samples carry no {missing} member; they carry {dataset.fields}")
    base = dataset.extents()
    start, end = base.offset.copy(), base.offset + base.size
    at, size, sums, kinds = {}, {}, {}, {}
    for n in names:
        if n == "cls":  # the label column, never read; a sample without a label (-1) lacks it like a member
            kinds[n] = "label"
            labels = np.asarray(dataset.labels, dtype=np.int64)
            at[n], size[n], sums[n] = np.zeros_like(labels), np.where(labels >= 0, 0, -1), None
            continue
        kinds[n] = value_kind(n)
        fe = dataset.field_extents(n)
        has = fe.size >= 0
        start = np.where(has, np.minimum(start, fe.offset), start)
        end = np.where(has, np.maximum(end, fe.offset + fe.size), end)
        at[n], size[n], sums[n] = fe.offset, fe.size, fe.checksum
    carried = np.logical_and.reduce([size[n] >= 0 for n in names])
    if not carried.any():  # every sample would be a bad record: say so now, by field
        counts = ", ".join(f".{n} {int((size[n] >= 0).sum())}" for n in names)
        raise ValueError(f"{dataset.root}: no sample carries every requested field {list(names)} (samples with "
                         f"each, of {len(carried)}: {counts})")
    for n in at:
        if kinds[n] != "label":
            at[n] = at[n] - start
    spans = Extents(base.paths, base.file_index, start, end - start)
    return spans, SampleFields(tuple(names), kinds, base.offset - start, base.size.astype(np.int64), at, size, sums)


def pick_mask(dataset) -> str:
    """Task "semantic" without mask=: the samples' one PNG member besides the image."""
    pngs = [n for n in dataset.fields if n.rsplit(".", 1)[-1] == "png"]
    if len(pngs) != 1:
        raise ValueError(f"{dataset.root}: task='semantic' needs mask= naming the member that holds each image's "
                         f"mask; the samples carry {dataset.fields}")
    return pngs[0]


def collate(values: list):
    """One field's values for a batch, as torch's default_collate gives them where that does not depend on the
    batch's mix: all bools -> a bool tensor; all ints -> int64; ints and floats with a float among them -> float64
    (default_collate's dtype for Python floats); arrays of one shape and dtype -> one stacked tensor, of other
    shapes or dtypes -> a list of tensors; anything else (text, JSON objects, None, bytes, bools among numbers, an
    int outside int64) -> a list."""
    first = values[0]
    if all(isinstance(v, bool) for v in values):
        return torch.tensor(values, dtype=torch.bool)
    if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
        # An int outside int64 fits no tensor; one past float64's range fits no float64 either.
        if all(isinstance(v, int) for v in values):
            if all(INT64_MIN <= v <= INT64_MAX for v in values):
                return torch.tensor(values, dtype=torch.int64)
        elif all(isinstance(v, float) or abs(v) <= _FLOAT64_MAX for v in values):
            return torch.tensor(values, dtype=torch.float64)
        return list(values)
    if isinstance(first, np.ndarray) and all(isinstance(v, np.ndarray) and v.shape == first.shape
                                             and v.dtype == first.dtype for v in values):
        return torch.from_numpy(np.stack(values))
    if isinstance(first, np.ndarray):
        return [torch.from_numpy(np.array(v)) for v in values]
    return list(values)
