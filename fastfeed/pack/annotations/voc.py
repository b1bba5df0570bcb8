"""Pascal VOC layout (`ROOT/Annotations/*.xml` + `ROOT/JPEGImages/`, `--split NAME` reads
`ImageSets/Main/NAME.txt`). Class names from `--classes FILE`, else the sorted names of the objects seen. VOC's
1-based inclusive pixel boxes become [xmin - 1, ymin - 1, xmax, ymax] (detectron2's conversion); `difficult` is kept
as its own list "difficult" (it is not COCO's iscrowd: VOC's evaluation ignores such objects, training usually keeps
them)."""
from __future__ import annotations

import math
import os
import xml.etree.ElementTree as ET

from fastfeed.pack.annotations.common import _add, read_names
from fastfeed.pack.sources import Source, SourceEntry, _listdir
from fastfeed.targets import box_size_issue

def scan_voc(root: str, split: str | None = None, classes: str | None = None) -> Source:
    """Images of JPEGImages/ (or those `ImageSets/Main/SPLIT.txt` lists), each with Annotations/STEM.xml when it
    exists (an image without one is a negative). An annotation is paired with its image by id (the XML's stem), as
    torchvision's VOCDetection and detectron2 pair them: `<filename>` is often stale in XMLs copied for augmented
    images. Only an XML with no image of its stem is paired by its `<filename>`; an image is never packed twice, so
    an XML naming an image already paired is rejected, naming both annotation files. Of images sharing an id (a.jpg,
    a.png) one is packed (`_image_of_id`) and the others are rejected by name."""
    root = os.path.abspath(root)
    ann_dir, img_dir = os.path.join(root, "Annotations"), os.path.join(root, "JPEGImages")
    if not (os.path.isdir(ann_dir) and os.path.isdir(img_dir)):
        raise ValueError(f"{root}: not a Pascal VOC dataset (needs Annotations/ and JPEGImages/)")
    src = Source(root, "voc", [], [], {}, task="detect")
    images = [name for name, is_dir in _listdir(img_dir, src) if not is_dir]
    same_id: dict[str, list[str]] = {}
    for name in images:
        same_id.setdefault(os.path.splitext(name)[0], []).append(name)
    xmls = {os.path.splitext(n)[0]: os.path.join(ann_dir, n) for n, is_dir in _listdir(ann_dir, src)
            if not is_dir and n.endswith(".xml")}
    if split is not None:
        ids = _split_ids(root, split)
        for i in ids:
            if i not in same_id and i not in xmls:
                src.rejected.append({"path": os.path.join(root, "ImageSets", "Main", f"{split}.txt"),
                                     "reason": f"id {i!r} has neither an image nor an annotation file"})
        stems = [i for i in ids if i in same_id or i in xmls]
    else:
        stems = sorted(set(same_id) | set(xmls))

    read = {stem: _read_voc(xmls[stem]) for stem in stems if stem in xmls}
    by_stem = {stem: _image_of_id(stem, names, read.get(stem, (None, None, None))[2])
               for stem, names in same_id.items()}
    for stem in stems:
        for name in same_id.get(stem, ()):
            if name != by_stem[stem]:
                src.rejected.append({"path": os.path.join(img_dir, name),
                                     "reason": f"an image of the same id {stem!r}, {by_stem[stem]}, is the one "
                                               f"packed (a VOC id names one image): image not packed"})
    owner = {by_stem[s]: xmls[s] for s in stems if s in by_stem and s in xmls}  # image name -> its XML
    images = set(images)
    for stem in stems:  # XMLs without an image of their id: by <filename>, first come first paired
        filename = read[stem][2] if stem not in by_stem else None
        if filename in images and filename not in owner:
            owner[filename] = xmls[stem]
    parsed = []  # (XML or None, image name, objects or error, declared size)
    for stem in stems:
        xml = xmls.get(stem)
        objs, size, filename = read.get(stem, ([], None, None))
        if stem in by_stem:
            if owner.get(by_stem[stem], xml) == xml:  # (else an XML of another id holds it by its <filename>)
                parsed.append((xml, by_stem[stem], objs, size))
        elif filename not in images:
            src.rejected.append({"path": xml, "reason": "annotation file without an image"})
        elif owner[filename] != xml:
            src.rejected.append({"path": xml, "image": os.path.join("JPEGImages", filename),
                                 "reason": f"no image of its id, and its <filename> {filename} is paired with "
                                           f"{os.path.relpath(owner[filename], root)}: annotation not used"})
        else:
            parsed.append((xml, filename, objs, size))
    if classes is not None:
        names = read_names(classes)
    else:
        names = sorted({o[0] for _, _, objs, _ in parsed if not isinstance(objs, str) for o in objs
                        if isinstance(o, tuple)})
    src.classes = names
    src.class_to_idx = {c: i for i, c in enumerate(names)}
    for xml, name, objs, size in parsed:
        path = os.path.join(img_dir, name)
        rel = os.path.relpath(path, root)
        if isinstance(objs, str):
            src.rejected.append({"path": path, "reason": f"annotation file {xml} unreadable ({objs}): "
                                                         f"image not packed"})
            continue
        ann, ids = {"boxes": [], "labels": [], "difficult": []}, []
        for k, o in enumerate(objs):
            why = o if isinstance(o, str) else None
            if why is None and o[0] not in src.class_to_idx:
                why = f"unknown class {o[0]!r} (not in {classes})"
            if why is not None:
                src.rejected.append({"path": xml, "image": rel, "object": k, "reason": f"object {k}: {why}"})
                continue
            ann["boxes"].append(o[1])
            ann["labels"].append(src.class_to_idx[o[0]])
            ann["difficult"].append(o[2])
            ids.append(k)
        _add(src, SourceEntry(path, rel, -1, ann, size, object_ids=tuple(ids)), path)
    return src


def _image_of_id(stem: str, names: list[str], filename: str | None) -> str:
    """The image an id names where several share its stem (a.jpg and a.png): the one its XML's `<filename>` names,
    else ID.jpg (what torchvision's VOCDetection and detectron2 open), else the first by name."""
    if filename in names:
        return filename
    return stem + ".jpg" if stem + ".jpg" in names else names[0]


def _split_ids(root: str, split: str, folder: str = "Main") -> list[str]:
    """The sorted ids `ImageSets/FOLDER/SPLIT.txt` lists (Main: detection; Segmentation: fastfeed/pack/annotations/
    masks.py)."""
    path = os.path.join(root, "ImageSets", folder, f"{split}.txt")
    try:
        with open(path, encoding="utf-8") as f:
            ids = [line.split()[0] for line in f if line.strip()]
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"--split {split}: {path} unreadable ({e})") from None
    return sorted(set(ids))


def _read_voc(path: str):
    """(objects, declared (width, height) or None, <filename> or None) of one VOC XML file; objects are
    (name, box, difficult) tuples or, for a malformed one, why. An unreadable file gives (why, None, None)."""
    try:
        top = ET.parse(path).getroot()
    except (OSError, ET.ParseError) as e:
        return f"{type(e).__name__}: {e}", None, None
    size = None
    try:
        size = (int(top.findtext("size/width")), int(top.findtext("size/height")))
        size = size if min(size) > 0 else None  # VOC files with <width>0</width> exist: no size
    except (TypeError, ValueError):
        pass
    objs = []
    for o in top.findall("object"):
        name = (o.findtext("name") or "").strip()
        try:
            x0, y0, x1, y1 = (_voc_number(o.findtext(f"bndbox/{t}")) for t in ("xmin", "ymin", "xmax", "ymax"))
        except (TypeError, ValueError):
            objs.append("malformed <bndbox> (needs numeric xmin, ymin, xmax, ymax)")
            continue
        if not name:
            objs.append("no <name>")
            continue
        box = [x0 - 1, y0 - 1, x1, y1]  # 1-based inclusive pixel indices -> edges
        no_area = box_size_issue(box)
        if no_area is not None:
            objs.append(f"box of {no_area} size (xmin {x0}, ymin {y0}, xmax {x1}, ymax {y1})")
            continue
        difficult = (o.findtext("difficult") or "0").strip()
        objs.append((name, box, 1 if difficult in ("1", "true", "True") else 0))
    return objs, size, (top.findtext("filename") or "").strip() or None


def _voc_number(text):
    v = float(text)
    if not math.isfinite(v):
        raise ValueError(text)
    return int(v) if v == int(v) else v
