"""YOLO layout (`ROOT/images/` + `ROOT/labels/`, optionally split: `images/train` + `labels/train`, picked with
`--split`; Roboflow's and ultralytics' split-first export `ROOT/train/images` + `ROOT/train/labels` too, recognised
by the data.yaml naming them: `_yaml_splits`). Class names from `data.yaml` (`names:` a list or a {id: name} map, or
`nc:` alone: "0" .. "nc - 1"; an `nc` disagreeing with `names` stops the pack), else `--classes FILE`, else
`classes.txt` (in ROOT, or in the labels folder, where LabelImg writes it), else "0", "1", ... Label lines `cls cx cy
w h` (normalised) or `cls x1 y1 x2 y2 ...` (a normalised polygon: its bounds are the box, the polygon is kept),
turned into pixels with the image's size and EXIF tag as pack stores them (common.py `_probe_size`: from the header,
PIL's where the EXIF readers disagree): the displayed size under orientation "exif" (axes swapped for EXIF tags 5-8,
as ultralytics reads its labels against the image OpenCV rotates), else the stored one. Pixels are rounded to 1e-6 px
(float noise), and a value past the image edge by less than 1e-6 of its side is the edge (6-decimal label files
overshoot it)."""
from __future__ import annotations

import math
import os

from fastfeed.constants import DEFAULT_ANNOTATION_ORIENTATION
from fastfeed.image.headers import swaps_axes

from fastfeed.pack.annotations.common import _add, _has_file, _probe_sizes, read_names
from fastfeed.pack.annotations.data_yaml import (_DATA_YAML, _SPLIT_KEYS, _read_yaml, _yaml_split_paths,
                                                 parse_yaml_kpt_shape, parse_yaml_names)
from fastfeed.pack.sources import Source, SourceEntry, _count_link, _listdir, _walk_files
from fastfeed.targets import box_size_issue

_ROUND = 6  # YOLO -> pixels: decimals kept (1e-6 px), so 0.1 * 640 is stored as 64.0, not 64.00000000000001
_NAMES_FILE = "classes.txt"  # darknet's names file: in ROOT, or beside the labels (LabelImg's YOLO mode)


def _yolo_dirs(root: str, split: str | None, need_labels: bool = True) -> tuple[str, str] | None:
    """(images folder, labels folder) of a YOLO layout, split ones included, or None: ROOT/images + ROOT/labels;
    with a split, images/SPLIT + labels/SPLIT (ultralytics), SPLIT/images + SPLIT/labels (Roboflow exports), or the
    folders ROOT's data.yaml names for the key SPLIT or in a folder named SPLIT (`valid` for `val: ../valid/images`).
    `need_labels`: only when the labels folder holds .txt files (how 'auto' tells YOLO from an ImageFolder tree)."""
    candidates = [(os.path.join(root, "images"), os.path.join(root, "labels"))]
    if split is not None:
        named = _yaml_splits(root, need_labels)
        candidates = ([named[split]] if split in named else []) + \
            [(os.path.join(i, split), os.path.join(lab, split)) for i, lab in candidates] + \
            [(os.path.join(root, split, "images"), os.path.join(root, split, "labels"))] + \
            [dirs for dirs in named.values() if _split_folder(dirs[0]) == split]
    for images, labels in candidates:
        if os.path.isdir(images) and os.path.isdir(labels) and (not need_labels or _has_file(labels, ".txt")):
            return images, labels
    return None


def is_yolo(root: str, split: str | None) -> bool:
    """Whether `root` is laid out as a YOLO dataset (labels holding .txt files): the folders of `_yolo_dirs`, with
    or without the split, or a data.yaml naming split folders or lists of images. A split it lacks, or none picked
    where it is split, is then scan_yolo's error, naming the splits it has."""
    return (_yolo_dirs(root, split) is not None or _yolo_dirs(root, None) is not None
            or bool(_yaml_splits(root)) or bool(_yaml_lists(root)))


def _yaml_splits(root: str, need_labels: bool = True) -> dict[str, tuple[str, str]]:
    """{key: (images folder, labels folder)} of the train/val/test keys of ROOT's data.yaml that name an images
    folder with its labels folder beside it (the "split first" export of Roboflow and ultralytics: `train:
    ../train/images` for ROOT/train/images), as `_yaml_split_paths` resolves them; the labels folder is the images
    folder with its last `images` component made `labels` (img2label_paths). A key naming a list of folders is left
    out, and one naming a .txt list of images is `_yaml_lists`'."""
    found = {}
    for key, images in _yaml_split_paths(root).items():
        labels = _labels_folder(images)
        if (labels is not None and os.path.isdir(images) and os.path.isdir(labels)
                and (not need_labels or _has_file(labels, ".txt"))):
            found[key] = (images, labels)
    return found


def _yaml_lists(root: str) -> dict[str, str]:
    """{key: list file} of the train/val/test keys of ROOT's data.yaml that name a .txt list of images, one path a
    line (ultralytics' autosplit_train.txt, COCO's train2017.txt), resolved as `_yaml_split_paths` resolves them."""
    return {key: path for key, path in _yaml_split_paths(root).items()
            if path.endswith(".txt") and os.path.isfile(path)}


def _labels_folder(images: str) -> str | None:
    """The labels folder of an images folder: its last `images` component made `labels`, or None without one."""
    parts = images.split(os.sep)
    if "images" not in parts:
        return None
    parts[len(parts) - 1 - parts[::-1].index("images")] = "labels"
    return os.sep.join(parts)


def _split_folder(images: str) -> str:
    """The folder that names a split's images folder: itself (images/val2017), or its parent when it is `images`
    (valid/images)."""
    name = os.path.basename(images)
    return os.path.basename(os.path.dirname(images)) if name == "images" else name


def _split_names(root: str, dirs: tuple[str, str] | None) -> list[str]:
    """The splits --split picks from when ROOT is split and none was picked, else []: the folders of images/ when
    it holds nothing else (images/train, images/val), else the keys of data.yaml's split folders."""
    if dirs is not None:
        top = _listdir(dirs[0], Source(dirs[0], "", [], [], {}))  # (its hidden entries are counted by the scan)
        names = [n for n, is_dir in top if is_dir]
        if names and all(is_dir for _, is_dir in top):
            return names
        named = {}
    else:
        named = {key: images for key, (images, _) in _yaml_splits(root, need_labels=False).items()}
    named.update({key: path for key, path in _yaml_lists(root).items() if key not in named})
    return [f"{key} ({os.path.relpath(path, root)})" for key, path in sorted(named.items(),
                                                                               key=lambda kv: _SPLIT_KEYS.index(kv[0]))]


# ---- class names --------------------------------------------------------------------------------------------


def _yolo_names(root: str, classes: str | None) -> tuple[list[str] | None, tuple[int, int] | None]:
    """(class names, kpt_shape): names from `classes` (a names file, or a data.yaml kept apart from its dataset,
    as ultralytics keeps coco8.yaml and coco128.yaml), else the dataset's data.yaml (in ROOT, or in its parent when
    ROOT is a split folder of a Roboflow export), else darknet's classes.txt in ROOT (scan_yolo then takes the one
    LabelImg writes beside the labels); kpt_shape from that data.yaml."""
    if classes is not None and classes.endswith((".yaml", ".yml")):
        text = _read_yaml(classes)
        names = parse_yaml_names(text, classes)
        if names is None:
            raise ValueError(f"--classes {classes}: the YAML names no classes (no names: or nc:)")
        return names, parse_yaml_kpt_shape(text, classes)
    names = read_names(classes) if classes is not None else None
    for folder in (root, os.path.dirname(root)):
        for name in _DATA_YAML:
            path = os.path.join(folder, name)
            if os.path.isfile(path):
                text = _read_yaml(path)
                found = parse_yaml_names(text, path) if names is None else None  # --classes overrides it
                if found is not None or names is not None:
                    return names or found, parse_yaml_kpt_shape(text, path)
    path = os.path.join(root, _NAMES_FILE)
    return names or (read_names(path) if os.path.isfile(path) else None), None


# ---- YOLO ---------------------------------------------------------------------------------------------------


def scan_yolo(root: str, split: str | None = None, classes: str | None = None,
              orientation: str = DEFAULT_ANNOTATION_ORIENTATION) -> Source:
    root = os.path.abspath(root)
    src = Source(root, "yolo", [], [], {}, task="detect")
    lists = _yaml_lists(root) if split is not None else {}
    if split in lists:  # data.yaml's key names a .txt list of images: it is the split, wherever its images lie
        names, kpt_shape = _yolo_names(root, classes)
        parsed = _listed_images(lists[split], root, src)
    else:
        names, kpt_shape, parsed = _folder_images(root, split, classes, src)

    lines = {}  # label file -> [(line number, tokens)] or an error string
    for _, _, label in parsed:
        if label is not None and label not in lines:
            lines[label] = _read_label_lines(label)
    top = -1
    for v in lines.values():
        if not isinstance(v, str):
            for _, toks in v:
                c = _class_id(toks[0])
                if c is not None:
                    top = max(top, c)
    if names is None:  # no names anywhere: the ids are the names
        names = [str(i) for i in range(top + 1)]
    src.classes = names
    src.class_to_idx = {c: i for i, c in enumerate(names)}

    need = [p for p, _, label in parsed if label is not None and not isinstance(lines[label], str) and lines[label]]
    sizes = dict(zip(need, _probe_sizes(need)))
    for path, rel, label in parsed:
        if label is None:
            src.entries.append(SourceEntry(path, rel, -1, {"boxes": [], "labels": []}))
            continue
        got = lines[label]
        if isinstance(got, str):
            src.rejected.append({"path": path, "reason": f"label file {label} unreadable ({got}): image not packed"})
            continue
        if not got:
            src.entries.append(SourceEntry(path, rel, -1, {"boxes": [], "labels": []}))
            continue
        size = sizes[path]
        if isinstance(size, str):
            src.rejected.append({"path": path, "reason": f"image size unreadable ({size}): its labels cannot be "
                                                         f"converted to pixels; image not packed"})
            continue
        w, h, tag = size
        if orientation == "exif" and swaps_axes(tag):
            w, h = h, w
        ann = _yolo_annotation(got, w, h, len(names), label, rel, src, kpt_shape)
        _add(src, SourceEntry(path, rel, -1, ann, (w, h)), path)
    return src


def _folder_images(root: str, split: str | None, classes: str | None, src: Source):
    """(names, kpt_shape, [(image path, rel, label file or None)]) of the images folder of ROOT (or of its split),
    each with the label file of its path below the labels folder; a label file no image takes is a rejection."""
    dirs = _yolo_dirs(root, split, need_labels=False)  # --source yolo: a set of negatives only is fine too
    splits = _split_names(root, _yolo_dirs(root, None, need_labels=False))
    if splits and (split is None or dirs is None):
        asked = "pass --split NAME" if split is None else f"there is no split {split!r}"
        raise ValueError(f"{root}: the YOLO images are split into {', '.join(splits)}: {asked}")
    if dirs is None:
        where = (f"images/{split} + labels/{split}, {split}/images + {split}/labels, nor a data.yaml key {split} "
                 f"naming them" if split else "images/ + labels/ folders, nor a data.yaml whose train/val/test keys "
                 "name them")
        raise ValueError(f"{root}: not a YOLO dataset: no {where}")
    img_dir, lab_dir = dirs
    names, kpt_shape = _yolo_names(root, classes)
    images = _walk_files(img_dir, src)
    label_files = {p[len(lab_dir) + 1:]: p for p, _ in _walk_files(lab_dir, src) if p.endswith(".txt")}
    stems = {os.path.splitext(p[len(img_dir) + 1:])[0] for p, _ in images}
    if _NAMES_FILE in label_files and os.path.splitext(_NAMES_FILE)[0] not in stems:
        # LabelImg's YOLO mode writes its names file beside the labels: no image's labels, the names when nothing
        # else gives them.
        names_file = label_files.pop(_NAMES_FILE)
        names = read_names(names_file) if names is None else names
    used: set[str] = set()
    parsed: list[tuple[str, str, str | None]] = []  # (image path, rel, label file or None)
    for path, via_link in images:
        if via_link:
            _count_link(src, path)
        stem = os.path.splitext(path[len(img_dir) + 1:])[0]
        label = label_files.get(stem + ".txt")
        if label is not None:
            used.add(stem + ".txt")
        parsed.append((path, os.path.relpath(path, root), label))
    for rel in sorted(set(label_files) - used):
        src.rejected.append({"path": label_files[rel], "reason": "label file without an image"})
    return names, kpt_shape, parsed


def _listed_images(list_path: str, root: str, src: Source) -> list[tuple[str, str, str | None]]:
    """[(image path, rel, label file or None)] of a .txt list of images, one path a line: absolute, or relative to
    the list's folder (ultralytics takes "./x" so and other relative lines from the working directory; a pack does
    not depend on where it runs). Each image's labels are at its path with the last `images` folder made `labels`
    and the extension `.txt` (img2label_paths), else beside it; a listed image that is not a file is a rejection.
    Label files no image takes are not reported: a list's folders hold the other splits' files too."""
    try:
        with open(list_path, encoding="utf-8-sig") as f:
            lines = [line.strip() for line in f]
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"{list_path}: the list of images is unreadable ({e})") from None
    base = os.path.dirname(list_path)
    parsed, seen = [], set()
    for n, line in enumerate(lines, 1):
        if not line or line.startswith("#"):
            continue
        path = os.path.normpath(os.path.join(base, line))  # (an absolute line stays as it is)
        if path in seen:
            continue
        seen.add(path)
        if not os.path.isfile(path):
            src.rejected.append({"path": f"{list_path}:{n}", "image": path,
                                 "reason": f"line {n}: {line!r} is listed but not found"})
            continue
        folder = _labels_folder(os.path.dirname(path))
        stem = os.path.splitext(os.path.basename(path))[0] + ".txt"
        label = os.path.join(folder, stem) if folder is not None else os.path.join(os.path.dirname(path), stem)
        parsed.append((path, os.path.relpath(path, root), label if os.path.isfile(label) else None))
    return parsed


def _read_label_lines(path: str) -> list[tuple[int, list[str]]] | str:
    """[(line number, tokens)] of the non-blank lines, or why the file is unreadable."""
    try:
        with open(path, "rb") as f:
            text = f.read().decode("utf-8-sig")  # Windows tools write a BOM
    except OSError as e:
        return e.strerror or str(e)
    except UnicodeDecodeError as e:
        return f"not UTF-8 text: {e}"
    return [(n, line.split()) for n, line in enumerate(text.splitlines(), 1) if line.strip()]


def _class_id(tok: str) -> int | None:
    try:
        v = float(tok)
    except ValueError:
        return None
    return int(v) if math.isfinite(v) and v >= 0 and v == int(v) else None  # some exporters write "3.0"


def _yolo_annotation(lines, w: int, h: int, num_classes: int, label_path: str, rel: str, src: Source,
                     kpt_shape: tuple[int, int] | None = None) -> dict:
    """One label file's objects in pixels. With `kpt_shape` (K, D) (a pose set's data.yaml) every line is a box and
    K keypoints of D values (x, y normalised, then visibility), kept as the object's `keypoints` in pixels: read as
    a polygon, they would make a wrong box."""
    boxes, labels, polys, points = [], [], [], []

    def bad(n: int, why: str) -> None:
        src.rejected.append({"path": f"{label_path}:{n}", "image": rel, "reason": f"line {n}: {why}"})

    for n, toks in lines:
        c = _class_id(toks[0])
        try:
            vals = [float(t) for t in toks[1:]]
        except ValueError:
            vals = None
        if kpt_shape is not None:
            shape_ok = vals is not None and len(vals) == 4 + kpt_shape[0] * kpt_shape[1]
            expected = f"'class cx cy w h' and {kpt_shape[0]} keypoints of {kpt_shape[1]} values (kpt_shape)"
        else:
            shape_ok = vals is not None and (len(vals) == 4 or (len(vals) >= 6 and len(vals) % 2 == 0))
            expected = "'class cx cy w h' or 'class x1 y1 x2 y2 x3 y3 ...'"
        if c is None or not shape_ok or not all(math.isfinite(v) for v in vals):
            bad(n, f"malformed (expected {expected}, normalised): {' '.join(toks)[:80]!r}")
            continue
        if c >= num_classes:
            bad(n, f"unknown class id {c} ({num_classes} classes)")
            continue
        if len(vals) == 4 or kpt_shape is not None:
            cx, cy, bw, bh = vals[:4]
            box = [_px((cx - bw / 2), w), _px(cy - bh / 2, h), _px(cx + bw / 2, w), _px(cy + bh / 2, h)]
            no_area = box_size_issue(box)
            if no_area is not None:
                bad(n, f"box of {no_area} size (w {bw}, h {bh})")
                continue
            poly = None
        else:
            poly = [_px(v, w if k % 2 == 0 else h) for k, v in enumerate(vals)]
            box = [min(poly[0::2]), min(poly[1::2]), max(poly[0::2]), max(poly[1::2])]
            if box_size_issue(box) is not None:
                bad(n, "box of zero size (the polygon has no area)")
                continue
        boxes.append(box)
        labels.append(c)
        polys.append([poly] if poly is not None else [])
        if kpt_shape is not None:
            d = kpt_shape[1]
            points.append([_px(v, w if k % d == 0 else h) if k % d < 2 else v for k, v in enumerate(vals[4:])])
    ann = {"boxes": boxes, "labels": labels}
    if any(polys):
        ann["polygons"] = polys
    if kpt_shape is not None:
        ann["keypoints"] = points
    return ann


def _px(v: float, side: int) -> float:
    """Normalised `v` in pixels of a `side`-pixel axis. A value past the edge by less than 1e-6 of the side is the
    edge: YOLO files hold 6 decimals, so a box drawn to the edge comes back up to 0.75e-6 of the side beyond it,
    and would be reported as crossing it. Values inside the image are never moved."""
    p = v * side
    if side < p <= side * (1 + 1e-6):
        p = float(side)
    elif -side * 1e-6 <= p < 0:
        p = 0.0
    return round(p, _ROUND)
