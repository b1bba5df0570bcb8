"""COCO instances JSON (`--annotations FILE`; SRC is the image folder `file_name`s are relative to). Categories map
to 0, 1, ... in the order of their ids (the ids are kept in the manifest's `objects.source_ids`); bbox [x, y, w, h]
-> [x, y, x + w, y + h]; `iscrowd` (0 or 1, JSON's false and true taken as 0 and 1, as pycocotools takes them);
polygon `segmentation`s kept as "polygons"; an RLE segmentation (a dict) is kept as given under "rle" (one entry per
object, null for the others) with its box and iscrowd, checked (fastfeed/rle.py) with the rest of the annotation;
`task="segment"` draws it."""
from __future__ import annotations

import json
import math
import os

from fastfeed.pack.annotations.common import _add
from fastfeed.pack.sources import Source, SourceEntry
from fastfeed.rle import RleError, rle_counts
from fastfeed.targets import box_size_issue

def scan_coco(images_root: str, ann_path: str) -> Source:
    """`images_root`: the folder the JSON's `file_name`s are relative to. Images on disk that the JSON does not
    list are not packed (pycocotools ignores them too); listed images missing on disk are rejected."""
    images_root, ann_path = os.path.abspath(images_root), os.path.abspath(ann_path)
    try:
        with open(ann_path, "rb") as f:
            data = json.loads(f.read())
    except (OSError, ValueError) as e:
        raise ValueError(f"annotations file {ann_path!r} unreadable: {e}") from None
    if not isinstance(data, dict) or not isinstance(data.get("images"), list) or \
            not isinstance(data.get("categories"), list):
        raise ValueError(f"{ann_path}: not a COCO instances file (needs 'images' and 'categories' lists)")
    cats = data["categories"]
    if not all(isinstance(c, dict) and _is_int(c.get("id")) and isinstance(c.get("name"), str) for c in cats):
        raise ValueError(f"{ann_path}: every category needs an integer 'id' and a 'name'")
    cats = sorted(cats, key=lambda c: c["id"])
    ids = [c["id"] for c in cats]
    if len(set(ids)) != len(ids):
        raise ValueError(f"{ann_path}: duplicate category ids")
    src = Source(images_root, "coco", [], [c["name"] for c in cats], {}, task="detect", class_ids=ids)
    src.class_to_idx = {c: i for i, c in enumerate(src.classes)}
    index = {cid: i for i, cid in enumerate(ids)}

    images: dict = {}  # image id -> (file_name, declared size)
    seen: dict[str, object] = {}
    for k, im in enumerate(data["images"]):
        if not (isinstance(im, dict) and isinstance(im.get("file_name"), str) and im["file_name"]
                and isinstance(im.get("id"), (int, str)) and not isinstance(im.get("id"), bool)):
            src.rejected.append({"path": ann_path, "reason": f"images[{k}]: malformed (needs 'id' and 'file_name')"})
            continue
        name = im["file_name"]
        if im["id"] in images:
            src.rejected.append({"path": ann_path, "image": name, "reason": f"image id {im['id']!r} listed twice"})
            continue
        if name in seen:
            src.rejected.append({"path": ann_path, "image": name,
                                 "reason": f"file_name listed twice (image ids {seen[name]!r}, {im['id']!r})"})
            continue
        seen[name] = im["id"]
        size = (im["width"], im["height"]) if _is_int(im.get("width")) and _is_int(im.get("height")) else None
        images[im["id"]] = (name, size)

    objects: dict = {i: [] for i in images}
    for k, a in enumerate(data.get("annotations") or []):
        aid = a.get("id", f"#{k}") if isinstance(a, dict) else f"#{k}"
        iid = a.get("image_id") if isinstance(a, dict) else None
        image = images.get(iid) if isinstance(iid, (int, str)) and not isinstance(iid, bool) else None

        bad = _coco_reporter(src, ann_path, aid, image)
        if not isinstance(a, dict):
            bad("not a JSON object")
            continue
        if image is None:
            bad(f"image id {iid!r} is not in 'images'")
            continue
        obj = _coco_object(a, index, bad)
        if obj is not None:
            objects[iid].append(obj)

    for iid, (name, size) in sorted(images.items(), key=lambda kv: kv[1][0]):
        path = os.path.join(images_root, name)
        if not os.path.isfile(path) and "\\" in name:  # a JSON written on Windows (sub\a.jpg)
            posix = name.replace("\\", "/")
            if os.path.isfile(os.path.join(images_root, posix)):
                name, path = posix, os.path.join(images_root, posix)
        if not os.path.isfile(path):
            src.rejected.append({"path": path, "reason": f"listed in {os.path.basename(ann_path)} but not found"})
            continue
        objs = objects[iid]
        ann = {"boxes": [o[0] for o in objs], "labels": [o[1] for o in objs], "iscrowd": [o[2] for o in objs]}
        if any(o[3] for o in objs):
            ann["polygons"] = [o[3] for o in objs]
        if any(o[4] is not None for o in objs):
            ann["rle"] = [o[4] for o in objs]
        _add(src, SourceEntry(path, name, -1, ann, size), path)
    return src


def _coco_reporter(src: Source, ann_path: str, aid, image):
    """bad(why): reject one COCO annotation, named by its id (and its image's file_name when known)."""
    def bad(why: str) -> None:
        rec = {"path": ann_path, "annotation_id": aid, "reason": f"annotation {aid}: {why}"}
        if image is not None:
            rec["image"] = image[0]
        src.rejected.append(rec)

    return bad


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _coco_object(a: dict, index: dict, bad) -> tuple | None:
    """(box, label, iscrowd, polygons, rle or None) of one COCO annotation, or None after reporting it."""
    if not _is_int(a.get("category_id")) or a["category_id"] not in index:
        bad(f"unknown category id {a.get('category_id')!r}")
        return None
    b = a.get("bbox")
    if not (isinstance(b, list) and len(b) == 4 and all(_number(v) for v in b)):
        bad(f"malformed bbox {b!r:.80}")
        return None
    x, y, w, h = b
    no_area = box_size_issue([x, y, x + w, y + h])
    if no_area is not None:
        bad(f"box of {no_area} size (bbox {b}: [x, y, width, height])")
        return None
    crowd = a.get("iscrowd", 0)
    if crowd not in (0, 1):
        bad(f"iscrowd {crowd!r} is not 0 or 1 (or false or true)")
        return None
    seg = a.get("segmentation")
    polys, rle = [], None
    if isinstance(seg, dict):
        try:
            rle_counts(seg)
            rle = seg  # kept as given; the box stands for it in detection
        except RleError as e:
            bad(f"RLE mask: {e}: dropped (the box is kept)")
    elif isinstance(seg, list):
        for q, p in enumerate(seg):
            if isinstance(p, list) and len(p) >= 6 and len(p) % 2 == 0 and all(_number(v) for v in p):
                polys.append(p)
            else:
                bad(f"polygon {q} is not three or more x, y pairs: dropped (the box is kept)")
    elif seg is not None:
        bad(f"segmentation of type {type(seg).__name__} ignored (the box is kept)")
    return [x, y, x + w, y + h], index[a["category_id"]], int(crowd), polys, rle


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
