"""Detection and segmentation targets: the annotation each sample stores, and the table the Loader batches from.

What a detection sample stores (the `KEY.json` member of a WebDataset record, `json/KEY` in LMDB), written by pack
from COCO, YOLO or VOC annotations, readable by any WebDataset or DALI reader as plain JSON:

    {"boxes": [[x0, y0, x1, y1], ...],    pixels of the stored image, XYXY (x1, y1 exclusive edges, as COCO's
                                          x + w), as the source gave them: never clipped or changed in storage
     "labels": [c, ...],                  0-based, in the manifest's class order
     "iscrowd": [0 | 1, ...],             optional (COCO); absent = all 0
     "polygons": [[[x, y, x, y, ...], ...], ...],   optional: per object, its outline polygons in pixels
     "rle": [{"size": [h, w], "counts": ...} | null, ...],   optional (COCO): an object's mask as the source gave
                                          it (crowd regions, and objects annotated by mask rather than outline)
     "difficult": [0 | 1, ...]}           optional (VOC): kept for evaluation, never used to drop an object

`Targets` is every sample's objects in flat arrays (sample i owns rows `start[i]:start[i + 1]`), built once per
Loader by `build_targets` from those members. It applies the one rule for what a stored annotation becomes in
training: boxes clipped to the image, and an object whose clipped box has no area dropped. `annotation_issues` is
the same rule as a report, for pack's rejected.jsonl: what was clipped or dropped, named by object.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Sequence

import numpy as np

from fastfeed.rle import RleError, rle_counts

__all__ = ["Targets", "build_targets", "annotation_issues", "check_annotation", "box_size_issue", "TASKS",
           "GEOMETRY_TASKS", "BOX_TASKS", "ANNOTATION_KEYS"]

TASKS = ("classify", "detect", "segment", "semantic")
# The tasks whose batches go through the detection geometry (fastfeed/detect/): boxes, or masks, follow the pixels.
GEOMETRY_TASKS = ("detect", "segment", "semantic")
# The tasks whose batches carry the samples' objects (boxes, labels; "segment" their polygons drawn as masks).
BOX_TASKS = ("detect", "segment")
ANNOTATION_KEYS = ("boxes", "labels", "iscrowd", "polygons", "rle", "difficult", "keypoints")
_EMPTY_BOXES = np.zeros((0, 4), dtype=np.float32)


@dataclass(frozen=True)
class Targets:
    """Every sample's objects. boxes float32 [M, 4] XYXY in stored-image pixels, clipped; labels int64 [M];
    iscrowd bool [M]; start int64 [N + 1]: sample i's objects are rows start[i]:start[i+1]. Polygons, when any
    sample has them: poly_start int64 [M + 1] (object j's polygons are poly_start[j]:poly_start[j+1]) into
    pt_start int64 [Q + 1] (polygon q's points are pt_start[q]:pt_start[q+1]) into points float32 [P, 2]. rle,
    when any sample has one: per row its COCO RLE mask (a dict, fastfeed/rle.py) or None."""

    boxes: np.ndarray
    labels: np.ndarray
    iscrowd: np.ndarray
    start: np.ndarray
    poly_start: np.ndarray | None = None
    pt_start: np.ndarray | None = None
    points: np.ndarray | None = None
    rle: tuple | None = None

    def __len__(self) -> int:
        return len(self.start) - 1

    def count(self, i: int) -> int:
        return int(self.start[i + 1] - self.start[i])

    def of(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        """(boxes, labels) of sample i's objects to train on: crowd regions left out, as ultralytics' COCO
        conversion and torchvision's detection references leave them out (they mark many objects, not one)."""
        a, b = int(self.start[i]), int(self.start[i + 1])
        keep = ~self.iscrowd[a:b]
        if keep.all():
            return self.boxes[a:b], self.labels[a:b]
        return self.boxes[a:b][keep], self.labels[a:b][keep]

    def trainable(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Every sample's `of(i)` at once: (boxes [M', 4], labels [M'], start [N + 1]) without the crowd regions."""
        keep = ~self.iscrowd
        kept = np.concatenate([[0], np.cumsum(keep)])
        return self.boxes[keep], self.labels[keep], kept[self.start].astype(np.int64)

    def polygons_of(self, i: int) -> list[list[np.ndarray]]:
        """Sample i's polygons: per object a list of float32 [K, 2] arrays (empty lists without polygons)."""
        a, b = int(self.start[i]), int(self.start[i + 1])
        if self.poly_start is None:
            return [[] for _ in range(b - a)]
        return [[self.points[self.pt_start[q]:self.pt_start[q + 1]] for q in range(self.poly_start[j],
                                                                                    self.poly_start[j + 1])]
                for j in range(a, b)]


def check_annotation(ann, num_classes: int) -> str | None:
    """Why a stored annotation cannot be used at all (malformed JSON structure, a label outside the classes), or
    None. Per-object geometry is `annotation_issues`' business."""
    if ann is None:
        return None
    if not isinstance(ann, dict):
        return "annotation is not a JSON object"
    boxes, labels = ann.get("boxes", []), ann.get("labels", [])
    if not isinstance(boxes, list) or not isinstance(labels, list) or len(boxes) != len(labels):
        return "annotation needs 'boxes' and 'labels' lists of equal length"
    for key in ANNOTATION_KEYS[2:]:
        if key in ann and (not isinstance(ann[key], list) or len(ann[key]) != len(boxes)):
            return f"annotation's '{key}' must be a list with one entry per box"
    for b in boxes:
        if not (isinstance(b, list) and len(b) == 4 and all(_finite(v) for v in b)):
            return f"a box is not four finite numbers: {b!r:.80}"
    for c in labels:
        if isinstance(c, bool) or not isinstance(c, int) or not 0 <= c < num_classes:
            return f"label {c!r} is not a class index in [0, {num_classes})"
    for obj in ann.get("polygons", []):
        if not isinstance(obj, list) or not all(isinstance(p, list) and len(p) >= 6 and len(p) % 2 == 0
                                                and all(_finite(v) for v in p) for p in obj):
            return "a polygon is not a list of at least three x, y pairs"
    for kp in ann.get("keypoints", []):
        if not (isinstance(kp, list) and all(_finite(v) for v in kp)):
            return f"an object's keypoints are not a list of finite numbers: {kp!r:.80}"
    for j, mask in enumerate(ann.get("rle", [])):
        if mask is not None:
            try:
                rle_counts(mask)
            except RleError as e:
                return f"object {j}'s RLE mask: {e}"
    return None


def _finite(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _table(boxes) -> np.ndarray:
    """Boxes [n, 4] as the Targets table holds them: float32, so that whether a box has area is judged in the
    precision training uses (x = 5000 plus a width of 1e-4 px is no width in float32)."""
    with np.errstate(over="ignore"):  # a finite float64 past float32's range is inf there, as in the table
        return np.asarray(boxes, dtype=np.float32).reshape(-1, 4)


def _has_area(boxes: np.ndarray) -> np.ndarray:
    return (boxes[:, 2] > boxes[:, 0]) & (boxes[:, 3] > boxes[:, 1])


def box_size_issue(box) -> str | None:
    """'zero' or 'negative' when the box [x0, y0, x1, y1] has no area in the Targets table, else None: the scanners'
    rule for a box of zero size, so that pack rejects every box build_targets would drop for its size alone."""
    b = _table([box])
    if _has_area(b)[0]:
        return None
    return "negative" if b[0, 2] < b[0, 0] or b[0, 3] < b[0, 1] else "zero"


def _clip(boxes: np.ndarray, width: int, height: int) -> np.ndarray:
    out = boxes.copy()
    np.clip(out[:, 0::2], 0, width, out=out[:, 0::2])
    np.clip(out[:, 1::2], 0, height, out=out[:, 1::2])
    return out


def annotation_issues(ann: dict | None, width: int, height: int,
                      ids: Sequence[int] | None = None) -> list[tuple[int, str]]:
    """[(object number, reason)] for the objects `build_targets` clips or drops in an image of width x height; an
    object's number is ids[index] when `ids` is given (its number in the annotation file), else its index."""
    if not ann or not ann.get("boxes"):
        return []
    ids = range(len(ann["boxes"])) if ids is None else ids
    boxes = _table(ann["boxes"])
    clipped = _clip(boxes, width, height)
    area, kept = _has_area(boxes), _has_area(clipped)
    out = []
    for j, (b, c) in enumerate(zip(boxes, clipped)):
        given = list(ann["boxes"][j])  # reported as stored, not as float32 spells it
        if not kept[j]:
            what = "outside the image" if area[j] else "of zero size"
            out.append((ids[j], f"box {ids[j]} {given} is {what} ({width}x{height}): dropped"))
        elif not np.array_equal(b, c):
            out.append((ids[j], f"box {ids[j]} {given} crosses the image edge ({width}x{height}): clipped"))
    for j, mask in enumerate(ann.get("rle", [])):
        if not _rle_fits(mask, width, height):
            h, w = mask["size"]
            out.append((ids[j], f"object {ids[j]}'s RLE mask is {w}x{h}, the image {width}x{height}: the mask is "
                                f"not used (the box is kept)"))
    return out


def _rle_fits(mask, width: int, height: int) -> bool:
    """Whether an object's RLE mask (or its absence) can be drawn on an image of width x height: COCO codes a mask
    at its image's size, so one of another size belongs to another image (or to the image before a resize)."""
    return mask is None or list(mask["size"]) == [int(height), int(width)]


def build_targets(annotations: Iterable[dict | None], widths: Sequence[int], heights: Sequence[int]) -> Targets:
    """The Targets table of samples whose stored annotations are `annotations` (None: no objects), in order, with
    each image's stored size. Boxes are clipped to the image; objects left without area are dropped."""
    boxes, labels, crowd, counts = [], [], [], []
    polys, any_polygons, rles = [], False, []
    for ann, w, h in zip(annotations, widths, heights):
        if not ann or not ann.get("boxes"):
            counts.append(0)
            continue
        b = _clip(_table(ann["boxes"]), int(w), int(h))
        keep = _has_area(b)
        boxes.append(b[keep])
        labels.append(np.asarray(ann["labels"], dtype=np.int64)[keep])
        crowd.append(np.asarray(ann.get("iscrowd", [0] * len(keep)), dtype=bool)[keep])
        counts.append(int(keep.sum()))
        if "polygons" in ann:
            any_polygons = True
        objects = ann.get("polygons", [[]] * len(keep))
        polys.extend(obj for obj, k in zip(objects, keep) if k)
        rles.extend(m if _rle_fits(m, w, h) else None for m, k in zip(ann.get("rle", [None] * len(keep)), keep) if k)
    start = np.zeros(len(counts) + 1, dtype=np.int64)
    np.cumsum(counts, out=start[1:])
    t = dict(boxes=np.concatenate(boxes) if boxes else _EMPTY_BOXES,
             labels=np.concatenate(labels) if labels else np.zeros(0, np.int64),
             iscrowd=np.concatenate(crowd) if crowd else np.zeros(0, bool), start=start)
    if any(m is not None for m in rles):
        t["rle"] = tuple(rles)
    if any_polygons:
        per_object = [len(obj) for obj in polys]
        flat = [np.asarray(p, dtype=np.float32).reshape(-1, 2) for obj in polys for p in obj]
        poly_start = np.zeros(len(per_object) + 1, np.int64)
        np.cumsum(per_object, out=poly_start[1:])
        pt_start = np.zeros(len(flat) + 1, np.int64)
        np.cumsum([len(p) for p in flat], out=pt_start[1:])
        t.update(poly_start=poly_start, pt_start=pt_start,
                 points=np.concatenate(flat) if flat else np.zeros((0, 2), np.float32))
    return Targets(**t)
