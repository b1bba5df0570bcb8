"""Semantic segmentation sources: images paired with their class-id masks, each mask stored byte for byte beside its
image as the member `KEY.seg.png` (SourceEntry.members), which Loader(task="semantic") reads.

Layouts (`--source`, recognised under 'auto' but for `masks`):
- `ade20k`: `ROOT/images/[SPLIT/]` + `ROOT/annotations/[SPLIT/]` (ADEChallengeData2016: `--split training`);
- `voc-seg`: Pascal VOC's `ROOT/JPEGImages/` + `ROOT/SegmentationClass/`, the images that have a mask or those
  `ImageSets/Segmentation/SPLIT.txt` lists (JPEGImages/ also holds the detection set's images, which have none);
- `cityscapes`: `ROOT/leftImg8bit/SPLIT/CITY/NAME_leftImg8bit.png` + `ROOT/gtFine/SPLIT/CITY/NAME_gtFine_*.png`
  (`--split train`): the `labelTrainIds` masks (19 classes, 255 ignored: what cityscapesScripts'
  createTrainIdLabelImgs writes and models train on) when the split has any, else the `labelIds` ones; gtFine's
  other files (colour, instance ids, polygons) are not masks and are passed over;
- `masks` (`--masks MASKS`): any folder of images, IMAGES/a/b.jpg's mask being MASKS/a/b.png.

An image and its mask share their path below their folders, less the extension; masks are `.png` files. Nothing
here stops a pack: an image without its mask ("no mask"), a mask without its image and a file in the masks folder
that is not a PNG are rejections naming the files. What a mask holds (decodes, one id per pixel, its image's size)
is checked when the pair is read (fastfeed/pack/members.py).
"""
from __future__ import annotations

import os

from fastfeed.pack.annotations.common import _has_file
from fastfeed.pack.annotations.voc import _image_of_id, _split_ids
from fastfeed.pack.sources import Source, SourceEntry, _count_link, _listdir, _walk_files

__all__ = ["MASK_MEMBER", "SEMANTIC_KINDS", "scan_semantic", "semantic_layout"]

MASK_MEMBER = "seg.png"  # the member name segmentation shards use (fastfeed/loader/fields.py pick_mask finds it)
SEMANTIC_KINDS = ("ade20k", "voc-seg", "cityscapes", "masks")
_MASK_EXT = ".png"
# Cityscapes' file-name suffixes: images, then the masks in order of preference
_CITY_IMAGE = "_leftImg8bit"
_CITY_MASKS = ("_gtFine_labelTrainIds", "_gtFine_labelIds")


def _ade_dirs(root: str, split: str | None, need_masks: bool = True) -> tuple[str, str] | None:
    """(images folder, masks folder) of an ADE20K-style layout, or None. `need_masks`: only when the masks folder
    (or a folder in it) holds .png files (how 'auto' tells it from an ImageFolder tree)."""
    images, masks = os.path.join(root, "images"), os.path.join(root, "annotations")
    if split is not None:
        images, masks = os.path.join(images, split), os.path.join(masks, split)
    if os.path.isdir(images) and os.path.isdir(masks) and (not need_masks or _has_file(masks, _MASK_EXT)):
        return images, masks
    return None


def semantic_layout(root: str, split: str | None = None) -> str | None:
    """'ade20k', 'voc-seg' or 'cityscapes' when `root` is laid out as one (folders and their files), else None."""
    if _ade_dirs(root, split) is not None:
        return "ade20k"
    gt = os.path.join(root, "gtFine")
    if os.path.isdir(os.path.join(root, _CITY_IMAGE[1:])) and os.path.isdir(gt) and _has_file(gt, _MASK_EXT, 2):
        return "cityscapes"
    seg = os.path.join(root, "SegmentationClass")
    if os.path.isdir(os.path.join(root, "JPEGImages")) and os.path.isdir(seg) and _has_file(seg, _MASK_EXT, 0):
        return "voc-seg"
    return None


def scan_semantic(root: str, kind: str, split: str | None = None, masks: str | None = None) -> Source:
    """The image/mask pairs of `root` laid out as `kind` (one of SEMANTIC_KINDS; `masks` is the masks folder of
    kind 'masks')."""
    root = os.path.abspath(root)
    if not os.path.isdir(root):
        raise NotADirectoryError(f"source {root!r} is not a folder")
    if kind == "masks":
        if masks is None:
            raise ValueError("--source masks needs --masks FOLDER (the masks, laid out as the images)")
        if split is not None:
            raise ValueError("--split does not apply to --masks (point SRC and --masks at the split's folders)")
        masks = os.path.abspath(masks)
        if not os.path.isdir(masks):
            raise NotADirectoryError(f"--masks {masks!r} is not a folder")
        if os.path.commonpath([root, masks]) in (root, masks):
            raise ValueError(f"--masks {masks} and the images {root} are inside one another: give separate folders")
        return _pair(root, root, masks, kind)
    if kind == "voc-seg":
        return _scan_voc_seg(root, split)
    if kind == "cityscapes":
        return _scan_cityscapes(root, split)
    dirs = _ade_dirs(root, split, need_masks=False)
    if dirs is None:
        where = f"images/{split} + annotations/{split}" if split else "images/ + annotations/"
        raise ValueError(f"{root}: not an ADE20K-style dataset: no {where} folders")
    if split is None:
        top = _listdir(dirs[0], Source(dirs[0], "", [], [], {}))
        splits = [n for n, is_dir in top if is_dir]
        if splits and all(is_dir for _, is_dir in top):
            raise ValueError(f"{root}: the images are split into {', '.join(splits)}: pass --split NAME")
    return _pair(root, *dirs, kind)


def _new_source(root: str, kind: str) -> Source:
    return Source(root, kind, [], [], {}, task="semantic", fields=(MASK_MEMBER,))


def _entry(root: str, image: str, mask: str) -> SourceEntry:
    return SourceEntry(image, os.path.relpath(image, root), -1, members=((MASK_MEMBER, mask),))


def _pair(root: str, img_dir: str, mask_dir: str, kind: str) -> Source:
    """Every image below `img_dir` with the mask of its relative path below `mask_dir`."""
    src = _new_source(root, kind)
    masks: dict[str, str] = {}
    for path, _ in _walk_files(mask_dir, src):
        stem, ext = os.path.splitext(path[len(mask_dir) + 1:])
        if ext.lower() == _MASK_EXT:
            masks[stem] = path
        else:
            src.rejected.append({"path": path, "reason": f"not a {_MASK_EXT} file: masks are PNGs paired with their "
                                                         f"image as STEM{_MASK_EXT}"})
    _match(src, root, img_dir, masks, lambda stem: stem, lambda stem: os.path.join(mask_dir, stem + _MASK_EXT),
           lambda stem: os.path.join(img_dir, stem))
    return src


def _match(src: Source, root: str, img_dir: str, masks: dict[str, str], name_of, mask_of, image_of) -> None:
    """Each image below `img_dir` into `src` with masks[name_of(its relative path less the extension)]: a pair, else a
    "no mask" rejection naming mask_of(name), the mask it wants; the masks no image took, rejections naming
    image_of(name)."""
    used: set[str] = set()
    for path, via_link in _walk_files(img_dir, src):
        if via_link:
            _count_link(src, path)
        name = name_of(os.path.splitext(path[len(img_dir) + 1:])[0])
        mask = masks.get(name)
        if mask is None:
            src.rejected.append({"path": path, "mask": mask_of(name), "reason": "no mask"})
            continue
        used.add(name)
        src.entries.append(_entry(root, path, mask))
    for name in sorted(set(masks) - used):
        src.rejected.append({"path": masks[name], "mask": masks[name],
                             "reason": f"mask without an image (no {image_of(name)}.*)"})


def _scan_voc_seg(root: str, split: str | None) -> Source:
    img_dir, mask_dir = os.path.join(root, "JPEGImages"), os.path.join(root, "SegmentationClass")
    if not (os.path.isdir(img_dir) and os.path.isdir(mask_dir)):
        raise ValueError(f"{root}: not a Pascal VOC segmentation dataset (needs JPEGImages/ and SegmentationClass/)")
    src = _new_source(root, "voc-seg")
    same_id: dict[str, list[str]] = {}
    for name, is_dir in _listdir(img_dir, src):
        if not is_dir:
            same_id.setdefault(os.path.splitext(name)[0], []).append(name)
    # one image an id (a.jpg beside a.png: detection's rule); the others are rejected below
    images = {stem: os.path.join(img_dir, _image_of_id(stem, names, None)) for stem, names in same_id.items()}
    others = [(stem, os.path.join(img_dir, n)) for stem, names in same_id.items() for n in names
              if os.path.join(img_dir, n) != images[stem]]
    masks: dict[str, str] = {}
    for name, is_dir in _listdir(mask_dir, src):
        stem, ext = os.path.splitext(name)
        if not is_dir and ext.lower() == _MASK_EXT:
            masks[stem] = os.path.join(mask_dir, name)
    stems = _split_ids(root, split, "Segmentation") if split is not None else sorted(masks)
    for stem in stems:
        image, mask = images.get(stem), masks.get(stem)
        if image is None:
            src.rejected.append({"path": os.path.join(img_dir, stem + ".jpg"),
                                 "mask": mask or os.path.join(mask_dir, stem + _MASK_EXT),
                                 "reason": "mask without an image" if mask else "neither image nor mask"})
        elif mask is None:
            src.rejected.append({"path": image, "mask": os.path.join(mask_dir, stem + _MASK_EXT), "reason": "no mask"})
        else:
            src.entries.append(_entry(root, image, mask))
    wanted = set(stems)
    for stem, path in others:
        if stem in wanted:
            src.rejected.append({"path": path, "mask": masks.get(stem) or os.path.join(mask_dir, stem + _MASK_EXT),
                                 "reason": f"{os.path.basename(images[stem])} has its id {stem!r}, and an id is one "
                                           f"image: image not packed"})
    return src


def _scan_cityscapes(root: str, split: str | None) -> Source:
    img_top, gt_top = os.path.join(root, _CITY_IMAGE[1:]), os.path.join(root, "gtFine")
    if not (os.path.isdir(img_top) and os.path.isdir(gt_top)):
        raise ValueError(f"{root}: not a Cityscapes dataset (needs leftImg8bit/ and gtFine/)")
    splits = sorted(n for n, is_dir in _listdir(img_top, Source(img_top, "", [], [], {})) if is_dir)
    if split is None or split not in splits:
        raise ValueError(f"{root}: pass --split NAME, one of {', '.join(splits) or 'none found'} "
                         f"(leftImg8bit/NAME and gtFine/NAME)")
    img_dir, gt_dir = os.path.join(img_top, split), os.path.join(gt_top, split)
    src = _new_source(root, "cityscapes")
    masks: dict[str, dict[str, str]] = {suffix: {} for suffix in _CITY_MASKS}
    for path, _ in _walk_files(gt_dir, src) if os.path.isdir(gt_dir) else ():
        stem = os.path.splitext(path[len(gt_dir) + 1:])[0]
        for suffix in _CITY_MASKS:
            if stem.endswith(suffix) and path.endswith(_MASK_EXT):
                masks[suffix][stem[: -len(suffix)]] = path
    suffix = next((s for s in _CITY_MASKS if masks[s]), _CITY_MASKS[0])
    _match(src, root, img_dir, masks[suffix],
           lambda stem: stem[: -len(_CITY_IMAGE)] if stem.endswith(_CITY_IMAGE) else stem,
           lambda name: os.path.join(gt_dir, name + suffix + _MASK_EXT),
           lambda name: os.path.join(img_dir, name + _CITY_IMAGE))
    return src
