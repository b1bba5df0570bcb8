"""COCO's RLE masks (fastfeed/rle.py) against an encoder written from pycocotools' C source (maskApi.c: rleEncode,
rleToString), and instance masks drawn from them (`Loader(task="segment")` on a COCO pack whose objects carry RLE
segmentations instead of polygons) held to the pixel oracle of tests/test_instance_loader.py."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from PIL import Image
from test_instance_loader import NO_HSV, S, check_instances_against_pixels, make_yolo_segments

import fastfeed
from fastfeed.detect import DetectAugment
from fastfeed.rle import RleError, decode_rle
from fastfeed.targets import check_annotation


def encode(mask: np.ndarray, compressed: bool) -> dict:
    """pycocotools' mask.encode: runs of 0s then 1s down the columns; compressed: rleToString."""
    flat = mask.T.reshape(-1)
    change = np.flatnonzero(np.diff(flat)) + 1
    bounds = np.concatenate([[0], change, [len(flat)]])
    counts = np.diff(bounds).tolist()
    if flat[0] == 1:
        counts = [0] + counts
    if not compressed:
        return {"size": list(mask.shape), "counts": counts}
    s = []
    for i, x in enumerate(counts):
        if i > 2:
            x -= counts[i - 2]
        more = True
        while more:
            c = x & 0x1F
            x >>= 5
            more = (x != -1) if (c & 0x10) else (x != 0)
            if more:
                c |= 0x20
            s.append(chr(c + 48))
    return {"size": list(mask.shape), "counts": "".join(s)}


@pytest.mark.parametrize("compressed", [False, True])
def test_decode_is_the_inverse_of_cocos_encoding(compressed):
    rng = np.random.default_rng(0)
    for h, w in [(1, 1), (2, 2), (7, 13), (64, 48), (300, 5)]:
        for density in (0.0, 0.1, 0.5, 1.0):
            mask = (rng.random((h, w)) < density).astype(np.uint8)
            blobs = np.zeros((h, w), np.uint8)  # long runs too: large counts and negative differences
            blobs[h // 4:3 * h // 4 + 1, w // 3:] = 1
            for m in (mask, blobs):
                assert np.array_equal(decode_rle(encode(m, compressed)), m), (h, w, density)
    assert encode(np.ones((2, 2), np.uint8), True)["counts"] == "04" and decode_rle(
        {"size": [2, 2], "counts": "04"}).all()


def test_malformed_rle_is_named():
    bad = [({"size": [2, 2], "counts": [1, 2]}, "cover 3 pixels"), ({"size": [2, 2], "counts": "0~"}, "outside"),
           ({"size": [2], "counts": [4]}, r"not \[height, width\]"), ({"counts": [4]}, "RLE mask is a"),
           ({"size": [2, 2], "counts": [0, -1, 5]}, "cover"), ({"size": [2, 2], "counts": "0"}, "cover"),
           ({"size": [2, 2], "counts": "g"}, "end inside a number")]
    for rle, why in bad:
        with pytest.raises(RleError, match=why):
            decode_rle(rle)
    ann = {"boxes": [[0, 0, 1, 1]], "labels": [0], "rle": [{"size": [2, 2], "counts": [1]}]}
    assert "object 0's RLE mask" in check_annotation(ann, 1)


@pytest.fixture(scope="module")
def rle_pack(tmp_path_factory):
    """make_yolo_segments' scenes as a COCO dataset whose objects carry their exact pixel masks as RLE (lists and
    strings, alternately), no polygons."""
    from conftest import run_pack

    root = tmp_path_factory.mktemp("rle")
    make_yolo_segments(root / "yolo")  # the scenes tests/test_instance_loader.py draws from polygons
    images, annotations = [], []
    for i, path in enumerate(sorted((root / "yolo" / "images").glob("*.png"))):
        img = Image.open(path)
        (root / "images").mkdir(exist_ok=True)
        img.save(root / "images" / path.name)
        w, h = img.size
        images.append({"id": i + 1, "file_name": path.name, "width": w, "height": h})
        rgb = np.asarray(img).astype(np.int16)
        for line in (root / "yolo" / "labels" / f"{path.stem}.txt").read_text().splitlines():
            c, *xy = line.split()
            pts = np.array(xy, float).reshape(-1, 2) * (w, h)
            x0, y0, x1, y1 = int(pts[:, 0].min()), int(pts[:, 1].min()), int(np.ceil(pts[:, 0].max())), int(
                np.ceil(pts[:, 1].max()))
            colour = rgb[(y0 + y1) // 2, (x0 + x1) // 2 if len(pts) == 4 else (x0 + x1) // 2]
            mask = np.zeros((h, w), np.uint8)
            mask[y0:y1, x0:x1] = (np.abs(rgb[y0:y1, x0:x1] - colour).sum(-1) == 0)
            ys, xs = np.nonzero(mask)
            box = [int(xs.min()), int(ys.min()), int(xs.max() + 1 - xs.min()), int(ys.max() + 1 - ys.min())]
            annotations.append({"id": len(annotations) + 1, "image_id": i + 1, "category_id": int(c) + 1,
                                "bbox": box, "area": int(mask.sum()), "iscrowd": 0,
                                "segmentation": encode(mask, compressed=len(annotations) % 2 == 1)})
    coco = {"images": images, "annotations": annotations,
            "categories": [{"id": j + 1, "name": n} for j, n in enumerate(["red", "lime", "cyan", "violet"])]}
    (root / "instances.json").write_text(json.dumps(coco))
    run_pack(root / "images", root / "out", "--annotations", str(root / "instances.json"))
    return root / "out"


@pytest.mark.parametrize("augment", [DetectAugment(**NO_HSV), DetectAugment(mosaic=0.0, fliplr=1.0, **NO_HSV),
                                     DetectAugment(mosaic=0.5, degrees=20.0, shear=5.0, **NO_HSV),
                                     DetectAugment(mosaic=0.0, iou_crop=1.0, **NO_HSV)],
                         ids=["mosaic", "letterbox-flip", "rotate-shear", "iou-crop"])
def test_instance_masks_from_rle_follow_the_pixels(rle_pack, augment):
    rotated = augment.degrees > 0
    checked = 0
    with fastfeed.Loader(rle_pack, task="segment", batch_size=8, image_size=S, dtype=torch.uint8, device="cpu",
                         augment=augment, seed=2) as loader:
        for epoch in range(2):
            loader.set_epoch(epoch)
            for batch in loader:
                checked += check_instances_against_pixels(batch, rotated=rotated, outlines=False)
    assert checked > 20


def test_a_bad_rle_is_reported_and_its_box_kept(tmp_path):
    from conftest import run_pack

    (tmp_path / "images").mkdir()
    Image.new("RGB", (20, 10), (90, 90, 90)).save(tmp_path / "images" / "a.png")
    good = encode(np.pad(np.ones((4, 5), np.uint8), ((2, 4), (3, 12))), compressed=True)
    coco = {"images": [{"id": 1, "file_name": "a.png", "width": 20, "height": 10}],
            "categories": [{"id": 1, "name": "thing"}],
            "annotations": [{"id": 7, "image_id": 1, "category_id": 1, "bbox": [3, 2, 5, 4], "iscrowd": 0,
                             "segmentation": good},
                            {"id": 8, "image_id": 1, "category_id": 1, "bbox": [10, 1, 4, 4], "iscrowd": 0,
                             "segmentation": {"size": [10, 20], "counts": [5, 3]}}]}
    (tmp_path / "coco.json").write_text(json.dumps(coco))
    run_pack(tmp_path / "images", tmp_path / "out", "--annotations", str(tmp_path / "coco.json"))
    rejected = [json.loads(x) for x in (tmp_path / "out" / "rejected.jsonl").read_text().splitlines()]
    assert [(r["annotation_id"], "RLE mask" in r["reason"]) for r in rejected] == [(8, True)]
    with fastfeed.open_dataset(tmp_path / "out") as ds:
        ann = ds.metadata(0)
    assert ann["boxes"] == [[3, 2, 8, 6], [10, 1, 14, 5]] and ann["rle"] == [good, None]


def test_an_rle_of_another_size_is_reported_and_never_drawn(tmp_path):
    """COCO codes a mask at its image's size: one of another size (a mask of another image, or of the image before
    a resize) is named in rejected.jsonl at pack and not drawn by the Loader, which keeps the box and draws the
    good object's mask as before."""
    from conftest import run_pack

    (tmp_path / "images").mkdir()
    Image.new("RGB", (20, 10), (90, 90, 90)).save(tmp_path / "images" / "a.png")
    good = encode(np.pad(np.ones((4, 5), np.uint8), ((2, 4), (3, 12))), compressed=True)
    small = encode(np.ones((5, 10), np.uint8), compressed=False)  # the image at half size
    coco = {"images": [{"id": 1, "file_name": "a.png", "width": 20, "height": 10}],
            "categories": [{"id": 1, "name": "thing"}],
            "annotations": [{"id": 7, "image_id": 1, "category_id": 1, "bbox": [3, 2, 5, 4], "iscrowd": 0,
                             "segmentation": good},
                            {"id": 8, "image_id": 1, "category_id": 1, "bbox": [10, 1, 4, 4], "iscrowd": 0,
                             "segmentation": small}]}
    (tmp_path / "coco.json").write_text(json.dumps(coco))
    run_pack(tmp_path / "images", tmp_path / "out", "--annotations", str(tmp_path / "coco.json"))
    rejected = [json.loads(x) for x in (tmp_path / "out" / "rejected.jsonl").read_text().splitlines()]
    assert [(r["object"], r["reason"]) for r in rejected] == [
        (1, "object 1's RLE mask is 10x5, the image 20x10: the mask is not used (the box is kept)")]
    with fastfeed.Loader(tmp_path / "out", task="segment", batch_size=1, image_size=20, train=False,
                         dtype=torch.uint8, device="cpu") as loader:
        batch = next(iter(loader))
    assert batch["boxes"].tolist() == [[3, 7, 8, 11], [10, 6, 14, 10]]  # letterboxed: 5 px of padding on top
    masks = batch["masks"][0]
    assert set(masks.unique().tolist()) == {0, 1}  # the first object's index map value only
    assert (masks == 1).sum() == 20 and masks[7:11, 3:8].eq(1).all()
