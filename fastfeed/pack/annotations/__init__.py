"""Annotated sources: detection and semantic segmentation layouts scanned into a `Source` (semantic ones, whose
masks are stored as members beside their images: masks.py).

Detection sources: YOLO, COCO and Pascal VOC layouts scanned into a `Source` whose entries carry the annotation
fastfeed/targets.py defines as their `metadata` (the sample's KEY.json member):

    {"boxes": [[x0, y0, x1, y1], ...], "labels": [c, ...], "iscrowd": [...], "polygons": [...], ...}

Boxes are XYXY in pixels of the source image (x1, y1 exclusive edges, as COCO's x + w); labels are 0-based in the
class order written to the manifest's `classes`. Each layout has its module: yolo.py (its data.yaml: data_yaml.py),
coco.py, voc.py; common.py holds what they share (names files, image size probes, the last check before an entry is
kept).

Nothing here stops a pack for one bad record. Images without objects are kept (negatives: empty lists). A label
file without its image, an unknown class, a malformed line or record, a box of zero size are rejections
{"path": annotation file, "reason": ..., "image": ...} naming the object (YOLO: "path" ends in ":LINE"; COCO:
"annotation_id"; VOC: "object", the 0-based index of the <object> element, as in its records of boxes clipped or
dropped); the image is kept without that object. Only an unreadable annotation file drops its image. Whether boxes
fit the stored image is checked once it is stored (`sample_issues`, with fastfeed.targets.annotation_issues: the
Loader's own rule; an object is numbered there by its SourceEntry.object_ids where the source gives them).
"""
from __future__ import annotations

import os

from fastfeed.constants import DEFAULT_ANNOTATION_ORIENTATION
from fastfeed.image.headers import swaps_axes

# The layout modules import common.py, never this package: __init__ sits on top of them, so there is no cycle.
from fastfeed.pack.annotations.coco import scan_coco
from fastfeed.pack.annotations.common import _has_file, read_names
from fastfeed.pack.annotations.masks import MASK_MEMBER, SEMANTIC_KINDS, scan_semantic, semantic_layout
from fastfeed.pack.annotations.voc import scan_voc
from fastfeed.pack.annotations.data_yaml import parse_yaml_names, yaml_source
from fastfeed.pack.annotations.yolo import is_yolo, scan_yolo
from fastfeed.pack.img2dataset import looks_like_img2dataset, scan_img2dataset
from fastfeed.pack.sources import SOURCE_KINDS, Source, SourceEntry, scan_source
from fastfeed.targets import annotation_issues

__all__ = ["DETECT_KINDS", "SEMANTIC_KINDS", "ALL_KINDS", "MASK_MEMBER", "scan", "detect_layout", "scan_yolo",
           "scan_coco", "scan_voc", "scan_semantic", "read_names", "parse_yaml_names", "sample_issues",
           "box_change_counts", "annotation_stats"]

DETECT_KINDS = ("yolo", "coco", "voc")
ALL_KINDS = SOURCE_KINDS + DETECT_KINDS + SEMANTIC_KINDS + ("img2dataset",)


def scan(src: str, kind: str = "auto", annotations: str | None = None, classes: str | None = None,
         split: str | None = None, masks: str | None = None,
         orientation: str = DEFAULT_ANNOTATION_ORIENTATION) -> Source:
    """Any source `fastfeed pack` reads: a detection layout (`kind` in DETECT_KINDS, or recognised under 'auto'),
    a semantic segmentation one (SEMANTIC_KINDS; `masks` the masks folder of kind 'masks'), img2dataset's `files`
    output (fastfeed/pack/img2dataset.py) or, otherwise, fastfeed.pack.sources.scan_source's classification
    sources. `orientation`: the frame of a detection source's annotations, "exif" (each image as displayed) or
    "ignore" (as stored); YOLO's fractions are turned into pixels of that frame."""
    if kind not in ALL_KINDS:
        raise ValueError(f"source kind must be one of {ALL_KINDS}, got {kind!r}")
    root = os.path.abspath(src)
    if annotations is not None and kind not in ("auto", "coco"):
        raise ValueError(f"--annotations names a COCO JSON file; it does not apply to --source {kind}")
    if masks is not None and (kind not in ("auto", "masks") or annotations is not None):
        raise ValueError(f"--masks names the masks folder of an image folder; it does not apply to "
                         f"--source {'coco' if annotations is not None else kind}")
    if kind in ("auto", "yolo") and os.path.isfile(root) and root.endswith((".yaml", ".yml")):
        root, split, classes = yaml_source(root, split, classes)  # ultralytics' data=coco128.yaml
        return scan_yolo(root, split, classes, orientation)
    if kind == "auto" and annotations is not None:
        kind = "coco"
    elif kind == "auto" and masks is not None:
        kind = "masks"
    elif kind == "auto" and os.path.isdir(root):
        kind = detect_layout(root, split) or ("img2dataset" if looks_like_img2dataset(root) else "auto")
    if kind == "img2dataset":
        if classes is not None or split is not None:
            raise ValueError("--classes and --split do not apply to img2dataset's output (no classes, one split)")
        if not os.path.isdir(root):
            raise NotADirectoryError(f"source {src!r} is not a folder")
        return scan_img2dataset(root)
    if kind in SEMANTIC_KINDS:
        if classes is not None:
            raise ValueError("--classes does not apply to segmentation sources: their masks hold class ids")
        return scan_semantic(root, kind, split, masks)
    if kind not in DETECT_KINDS:
        if classes is not None or split is not None:
            raise ValueError(f"--classes and --split apply to YOLO, VOC and ADE20K-style sources; {src!r} is not one "
                             f"(a YOLO folder holds images/ and labels/, a VOC folder Annotations/ and JPEGImages/, "
                             f"an ADE20K one images/ and annotations/)")
        return scan_source(src, kind)
    if not os.path.isdir(root):
        raise NotADirectoryError(f"source {src!r} is not a folder")
    if kind == "coco":
        if annotations is None:
            raise ValueError("--source coco needs --annotations FILE (the instances JSON)")
        if classes is not None or split is not None:
            raise ValueError("--classes and --split do not apply to COCO (names come from the JSON; pick the split "
                             "with its annotations file)")
        return scan_coco(root, annotations)
    if kind == "yolo":
        return scan_yolo(root, split, classes, orientation)
    return scan_voc(root, split, classes)


def detect_layout(root: str, split: str | None = None) -> str | None:
    """'yolo', 'voc', 'ade20k' or 'voc-seg' when `root` is laid out as one, else None. Recognised by its folders *and*
    their files, so an ImageFolder tree that happens to have classes named 'images' and 'labels' stays an ImageFolder
    tree. A VOC folder with both is packed for detection: `--source voc-seg` picks its segmentation set."""
    if is_yolo(root, split):
        return "yolo"
    ann = os.path.join(root, "Annotations")
    if os.path.isdir(ann) and os.path.isdir(os.path.join(root, "JPEGImages")) and _has_file(ann, ".xml"):
        return "voc"
    return semantic_layout(root, split)


# ---- after storing: what the Loader will make of each annotation, and the manifest's numbers ---------------------


def sample_issues(entry: SourceEntry, width: int, height: int, tag: int = 1,
                  orientation: str = DEFAULT_ANNOTATION_ORIENTATION) -> list[dict]:
    """rejected.jsonl records for one stored detection sample of width x height, EXIF orientation `tag`, whose
    annotations are in the `orientation` frame ("exif": as displayed, "ignore": as stored): a size other than the
    one the annotations were made for, and each box the Loader clips or drops (fastfeed.targets.annotation_issues),
    against the image in that frame. The stored annotation itself stays as the source gave it."""
    if orientation == "exif" and swaps_axes(tag):
        width, height = height, width
    out = []
    if entry.size is not None and tuple(entry.size) != (width, height):
        frame = "image" if tag == 1 else "displayed image" if orientation == "exif" else "stored image"
        # Some exporters (Label Studio's COCO) state the stored size of an image whose boxes they drew displayed:
        # the size alone cannot tell the frame, so the hint names both.
        other = "ignore" if orientation == "exif" else "exif"
        hint = (f"; the stated size is the image's as {'stored' if other == 'ignore' else 'displayed'}: if the "
                f"annotations are in that frame, pack with --orientation {other}"
                if swaps_axes(tag) and tuple(entry.size) == (height, width) else "")
        out.append({"path": entry.rel, "reason": f"the {frame} is {width}x{height}, the annotations were made "
                                                 f"for {entry.size[0]}x{entry.size[1]}: boxes may not match (the image is "
                                                 f"kept){hint}"})
    for j, why in annotation_issues(entry.metadata, width, height, entry.object_ids):
        out.append({"path": entry.rel, "reason": why, "object": j})
    return out


def box_change_counts(rejected: list[dict]) -> dict[str, int]:
    """The manifest's `changes` for boxes: how many the Loader clips and drops (sample_issues' records)."""
    out = {"clipped_boxes": 0, "dropped_boxes": 0}
    for r in rejected:
        if "object" in r and isinstance(r.get("reason"), str):
            if r["reason"].endswith(": clipped"):
                out["clipped_boxes"] += 1
            elif r["reason"].endswith(": dropped"):
                out["dropped_boxes"] += 1
    return {k: v for k, v in out.items() if v}


def annotation_stats(annotations, num_classes: int) -> dict:
    """The manifest's `objects`: images with and without objects, objects per image (min/mean/max) and per class,
    counted on the annotations as stored (before the Loader's clipping)."""
    counts = []
    per_class = [0] * num_classes
    for ann in annotations:
        labels = (ann or {}).get("labels") or []
        counts.append(len(labels))
        for c in labels:
            if 0 <= c < num_classes:
                per_class[c] += 1
    with_objects = sum(1 for n in counts if n)
    return {"images_with_objects": with_objects, "images_without_objects": len(counts) - with_objects,
            "objects": sum(counts),
            "per_image": {"min": min(counts, default=0), "max": max(counts, default=0),
                          "mean": round(sum(counts) / len(counts), 2) if counts else 0.0},
            "per_class": per_class}
