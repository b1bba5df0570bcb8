"""`Loader(task="detect")` end to end on the CPU: a YOLO-layout folder packed by the CLI, read back as detection
batches. The oracle does not trust the implementation: every object is a solid rectangle of its class's colour on a
grey background, so after any augmentation each output box must be the bounding box of its colour's pixels in the
output image, and every coloured area must lie in a box of its class.
"""
from __future__ import annotations

import colorsys
import io
import json
import math
import re
import struct

import numpy as np
import pytest
import torch
from PIL import Image

import fastfeed
from fastfeed.detect import DetectAugment
from fastfeed.detect.clients import to_torchvision, to_ultralytics

# Hues far apart, so that HSV jitter (hue +-0.015 of the circle) never turns one class into another.
CLASS_HUES = (0.0, 0.25, 0.5, 0.75)
NAMES = ("red", "lime", "cyan", "violet")
S = 160


def make_yolo(root, n: int = 24, seed: int = 0, negatives: int = 2) -> list[dict]:
    """A YOLO folder (images/, labels/, data.yaml) of n JPEG-free PNG images (lossless, so colours stay exact) with
    1-4 non-overlapping solid rectangles each; the last `negatives` have none. Returns each image's truth."""
    rng = np.random.default_rng(seed)
    (root / "images").mkdir(parents=True)
    (root / "labels").mkdir()
    (root / "data.yaml").write_text("names:\n" + "".join(f"  {i}: {name}\n" for i, name in enumerate(NAMES)))
    truth = []
    for i in range(n):
        w, h = int(rng.integers(90, 400)), int(rng.integers(90, 400))
        grey = rng.integers(20, 200, size=(h, w, 1), dtype=np.uint8)
        img = np.repeat(grey, 3, axis=2)  # R = G = B: saturation 0, never mistaken for an object
        boxes, labels, lines = [], [], []
        for _ in range(0 if i >= n - negatives else int(rng.integers(1, 5))):
            for _attempt in range(20):
                bw, bh = int(rng.integers(12, max(13, w // 2))), int(rng.integers(12, max(13, h // 2)))
                x0, y0 = int(rng.integers(0, w - bw + 1)), int(rng.integers(0, h - bh + 1))
                if all(x0 >= b[2] + 4 or b[0] >= x0 + bw + 4 or y0 >= b[3] + 4 or b[1] >= y0 + bh + 4
                       for b in boxes):
                    break
            else:
                continue
            c = int(rng.integers(0, len(CLASS_HUES)))
            img[y0:y0 + bh, x0:x0 + bw] = np.round(np.array(colorsys.hsv_to_rgb(CLASS_HUES[c], 1.0, 0.9)) * 255)
            boxes.append((x0, y0, x0 + bw, y0 + bh))
            labels.append(c)
            lines.append(f"{c} {(x0 + bw / 2) / w:.6f} {(y0 + bh / 2) / h:.6f} {bw / w:.6f} {bh / h:.6f}\n")
        Image.fromarray(img).save(root / "images" / f"im{i:03d}.png")
        (root / "labels" / f"im{i:03d}.txt").write_text("".join(lines))
        truth.append({"size": (w, h), "boxes": boxes, "labels": labels})
    return truth


@pytest.fixture(scope="module")
def yolo_pack(tmp_path_factory):
    from conftest import run_pack

    root = tmp_path_factory.mktemp("yolo")
    truth = make_yolo(root / "src")
    run_pack(root / "src", root / "out", "--format", "wds")
    return root / "out", truth


def colour_classes(images: torch.Tensor) -> np.ndarray:
    """Per pixel the class whose hue it has, -1 for grey (background, padding) and blended edge pixels."""
    rgb = images.permute(0, 2, 3, 1).numpy().astype(np.float32) / 255
    mx, mn = rgb.max(-1), rgb.min(-1)
    sat = (mx - mn) / np.maximum(mx, 1e-6)
    r, g, b = rgb[..., 0], rgb[..., 1], rgb[..., 2]
    d = np.maximum(mx - mn, 1e-6)
    hue = np.where(mx == r, ((g - b) / d) % 6, np.where(mx == g, (b - r) / d + 2, (r - g) / d + 4)) / 6
    dist = np.abs(((hue[..., None] - np.array(CLASS_HUES)) + 0.5) % 1.0 - 0.5)
    cls = dist.argmin(-1)
    return np.where((sat > 0.2) & (mx > 0.2) & (dist.min(-1) < 0.06), cls, -1)


def strays(mask: np.ndarray) -> list:
    """The bounding slices (ys, xs) of the connected areas of `mask`. (scipy: imported here, so that the GPU host,
    which has none, can still run this file's GPU test.)"""
    from scipy import ndimage

    return ndimage.find_objects(ndimage.label(mask)[0])


def check_boxes_against_pixels(batch: dict, tol: float = 1.5) -> int:
    """The oracle: for each image, each box's colour pixels span the box (within tol px), and every coloured pixel
    lies in a box of its class (or in an object the output's edge cut). Returns the number of boxes checked."""
    classes = colour_classes(batch["images"])
    checked = 0
    for k in range(len(batch["images"])):
        mine = batch["batch_idx"] == k
        boxes, labels = batch["boxes"][mine].numpy(), batch["labels"][mine].numpy()
        covered = np.zeros(classes.shape[1:], dtype=bool)
        for (x0, y0, x1, y1), c in zip(boxes, labels):
            xa, ya, xb, yb = int(np.floor(x0)), int(np.floor(y0)), int(np.ceil(x1)), int(np.ceil(y1))
            inside = classes[k, ya:yb, xa:xb] == c
            assert inside.any(), f"image {k}: box {[x0, y0, x1, y1]} of class {c} holds none of its colour"
            ys, xs = np.nonzero(inside)
            got = (xa + xs.min(), ya + ys.min(), xa + xs.max() + 1, ya + ys.max() + 1)
            assert np.allclose(got, (x0, y0, x1, y1), atol=tol + 1), (k, c, got, (x0, y0, x1, y1))
            covered[max(0, ya - 2):yb + 2, max(0, xa - 2):xb + 2] |= True
            checked += 1
        # ultralytics' rule drops a box cut to a sliver (box_candidates), so coloured pixels outside every box are
        # right only where the output's edge cut an object: each such area must touch the edge.
        for ys, xs in strays((classes[k] >= 0) & ~covered):
            assert min(ys.start, xs.start) <= 1 or max(ys.stop, xs.stop) >= classes.shape[1] - 1, (
                f"image {k}: coloured pixels at x {xs.start}-{xs.stop}, y {ys.start}-{ys.stop} lie in no box")
    return checked


@pytest.mark.parametrize("epoch", [0, 1, 2])
def test_training_batches_boxes_follow_the_pixels(yolo_pack, epoch):
    out, _ = yolo_pack
    loader = fastfeed.Loader(out, batch_size=8, train=True, image_size=S, dtype=torch.uint8, device="cpu", seed=3)
    assert loader.settings.task == "detect"  # from the manifest
    loader.set_epoch(epoch)
    checked = sum(check_boxes_against_pixels(b) for b in loader)
    assert checked > 20
    loader.close()


def test_vertical_flips_boxes_follow_the_pixels(yolo_pack):
    """DetectAugment(flipud=0.5), ultralytics' vertical flip: outputs mirrored top to bottom (`flipped_ud`), with
    and without the horizontal flip and mosaic; the oracle holds on every output and each flip pairing occurs
    (rotated outputs: test_without_mosaic_and_with_rotation_boxes_contain_their_object)."""
    out, _ = yolo_pack
    aug = DetectAugment(flipud=0.5, mosaic=0.5, hsv_h=0.0, hsv_s=0.0, hsv_v=0.0)
    checked, flips = 0, set()
    with fastfeed.Loader(out, batch_size=8, image_size=S, dtype=torch.uint8, device="cpu", seed=3,
                         augment=aug) as loader:
        for epoch in range(2):
            loader.set_epoch(epoch)
            for b in loader:
                checked += check_boxes_against_pixels(b)
                flips |= set(zip(b["flipped"].tolist(), b["flipped_ud"].tolist()))
    assert flips == {(False, False), (False, True), (True, False), (True, True)} and checked > 40


def test_the_iou_crop_stretches_a_window_and_the_boxes_follow_the_pixels(yolo_pack):
    """DetectAugment(iou_crop=1, mosaic=0): each output is a window of its image stretched to S x S (no padding);
    the oracle holds on every output, and most outputs show a part of their image."""
    out, _ = yolo_pack
    aug = DetectAugment(mosaic=0.0, iou_crop=1.0, scale=0.0, translate=0.0)
    checked = cropped = outputs = 0
    for epoch in range(3):
        with fastfeed.Loader(out, batch_size=8, train=True, image_size=S, dtype=torch.uint8, device="cpu", seed=6,
                             augment=aug) as loader:
            loader.set_epoch(epoch)
            for b in loader:
                checked += check_boxes_against_pixels(b)
                h0, w0 = b["orig_size"][:, 0].double(), b["orig_size"][:, 1].double()
                shown_w, shown_h = S / b["scale"][:, 0].double(), S / b["scale"][:, 1].double()  # the window
                assert (shown_w <= w0 + 1e-3).all() and (shown_h <= h0 + 1e-3).all()  # float32 scales
                assert (b["pad"] <= 1e-3).all()  # the window's origin at the output's, no letterbox
                assert ((shown_w >= 0.3 * w0 - 1) & (shown_h >= 0.3 * h0 - 1)).all()
                cropped += int(((shown_w < w0 - 0.5) | (shown_h < h0 - 0.5)).sum())
                outputs += len(b["images"])
    assert checked > 40 and cropped > outputs // 2


def test_without_mosaic_and_with_rotation_boxes_contain_their_object(yolo_pack):
    out, _ = yolo_pack
    plain = fastfeed.Loader(out, batch_size=8, image_size=S, dtype=torch.uint8, device="cpu",
                            augment=DetectAugment(mosaic=0.0))
    assert sum(check_boxes_against_pixels(b) for b in plain) > 10
    rotated = fastfeed.Loader(out, batch_size=8, image_size=S, dtype=torch.uint8, device="cpu",
                              augment=DetectAugment(degrees=10.0, flipud=0.5))
    for batch in rotated:
        classes = colour_classes(batch["images"])
        for k in range(len(batch["images"])):
            mine = batch["batch_idx"] == k
            covered = np.zeros(classes.shape[1:], dtype=bool)
            for x0, y0, x1, y1 in batch["boxes"][mine].numpy():
                covered[max(0, int(y0) - 2):int(np.ceil(y1)) + 2, max(0, int(x0) - 2):int(np.ceil(x1)) + 2] = True
            for ys, xs in strays((classes[k] >= 0) & ~covered):
                assert min(ys.start, xs.start) <= 1 or max(ys.stop, xs.stop) >= S - 1
    plain.close()
    rotated.close()


def test_evaluation_letterboxes_every_image_once_with_exact_boxes(yolo_pack):
    """train=False: ultralytics' evaluation letterbox (long side to S, centred, grey padding), every image exactly
    once over any number of ranks, boxes = the source's boxes * scale + pad."""
    out, truth = yolo_pack
    seen = {}
    for rank in range(2):
        loader = fastfeed.Loader(out, batch_size=5, train=False, image_size=S, dtype=torch.uint8, device="cpu",
                                 rank=rank, world_size=2)
        ds = loader.dataset
        for batch in loader:
            assert batch["images"].shape[1:] == (3, S, S)
            check_boxes_against_pixels(batch)
            for k in range(len(batch["images"])):
                if not batch["valid"][k]:
                    continue
                i = int(batch["ids"][k])
                src = truth[_source_number(ds, i)]
                h, w = batch["orig_size"][k].tolist()
                assert (w, h) == src["size"]
                # ultralytics' rule, restated: the long side to S, the short one rounded up, centred
                r = S / max(w, h)
                rw, rh = min(math.ceil(w * r), S), min(math.ceil(h * r), S)
                px, py = round((S - rw) / 2 - 0.1), round((S - rh) / 2 - 0.1)
                assert batch["scale"][k].tolist() == pytest.approx([rw / w, rh / h])
                assert batch["pad"][k].tolist() == [px, py]
                (gy, gx), pad = to_ultralytics(batch)["ratio_pad"][k]  # what its validator maps predictions back by
                assert (gy, gx) == pytest.approx((rh / h, rw / w)) and pad == (px, py)
                want = np.array(src["boxes"], dtype=np.float64).reshape(-1, 4) * ([rw / w, rh / h] * 2) + [px, py] * 2
                got = batch["boxes"][batch["batch_idx"] == k].numpy()
                assert got.shape == want.shape and np.allclose(got, want, atol=1e-3)
                assert batch["labels"][batch["batch_idx"] == k].tolist() == src["labels"]
                assert i not in seen
                seen[i] = rank
        loader.close()
    assert len(seen) == len(truth)


def test_training_outputs_map_their_boxes_by_scale_pad_and_flipped(yolo_pack):
    """Training without mosaic or rotation: each output's own boxes that stay inside it are its source's boxes *
    scale + pad, mirrored (x -> S - x) where `flipped` says so; both sides of the flip occur."""
    out, truth = yolo_pack
    loader = fastfeed.Loader(out, batch_size=6, image_size=S, dtype=torch.uint8, device="cpu", seed=1,
                             augment=DetectAugment(mosaic=0.0, hsv_h=0.0, hsv_s=0.0, hsv_v=0.0))
    checked, flips = 0, set()
    for batch in loader:
        for k in range(len(batch["images"])):
            src = truth[_source_number(loader.dataset, int(batch["ids"][k]))]
            w, h = src["size"]
            scale, pad = batch["scale"][k].tolist() * 2, batch["pad"][k].tolist() * 2
            want = np.array(src["boxes"], dtype=np.float64).reshape(-1, 4) * scale + pad
            shown = np.array([0, 0, w, h]) * scale + pad  # the image's area, clipped to whole output pixels
            lo, hi = np.maximum(shown[:2], 0) + 1, np.minimum(shown[2:], S) - 1
            inside = want[((want[:, :2] >= lo) & (want[:, 2:] <= hi)).all(axis=1)]
            if batch["flipped"][k]:
                inside = np.stack([S - inside[:, 2], inside[:, 1], S - inside[:, 0], inside[:, 3]], axis=1)
            got = batch["boxes"][batch["batch_idx"] == k].numpy()
            for box in inside:  # a box wholly inside the output is kept as it maps
                assert np.abs(got - box).max(axis=1).min() < 1e-3, (box, got)
                checked += 1
            flips.add(bool(batch["flipped"][k]))
    loader.close()
    assert checked > 20 and flips == {False, True}


# An EXIF tag's PIL operation undone: the stored pixels of an image that the tag displays as the scene.
_UNDO = {Image.Transpose.ROTATE_270: Image.Transpose.ROTATE_90, Image.Transpose.ROTATE_90: Image.Transpose.ROTATE_270}


@pytest.fixture(scope="module")
def exif_yolo(tmp_path_factory):
    """make_yolo's scenes as JPEGs, most stored turned and tagged with the EXIF orientation (2-8) that displays them
    as the scene, whose labels describe it (what labelling tools show and ultralytics reads); packed with the
    default frame (the displayed image) and with --orientation ignore."""
    from conftest import run_pack
    from fastfeed.image.contract import TRANSPOSE

    root = tmp_path_factory.mktemp("yolo-exif")
    truth = make_yolo(root / "src", n=16)
    for k, path in enumerate(sorted((root / "src" / "images").glob("*.png"))):
        pixels = np.asarray(Image.open(path).convert("RGB")).copy()
        pixels[(pixels == pixels[..., :1]).all(-1)] = 128  # a flat background: JPEG turns grey noise into colour
        scene, tag = Image.fromarray(pixels), 1 + k % 8
        exif = Image.Exif()
        if tag > 1:
            op = TRANSPOSE[tag]
            scene = scene.transpose(_UNDO.get(op, op))
            exif[0x0112] = tag
        scene.save(path.with_suffix(".jpg"), quality=95, subsampling=0, exif=exif)  # 4:4:4: sharp colour edges
        path.unlink()
    run_pack(root / "src", root / "out", "--format", "wds")
    run_pack(root / "src", root / "stored", "--format", "wds", "--orientation", "ignore")
    return root, truth


def test_exif_rotated_images_load_as_displayed_with_their_boxes(exif_yolo):
    """YOLO labels of EXIF-tagged photos are fractions of the displayed image: packed in that frame by default, the
    Loader decodes each image as displayed, so the boxes are the scene's (evaluation: exactly, its letterbox) and
    the oracle holds on every batch, training ones included. Packed as stored, the same labels miss their pixels."""
    root, truth = exif_yolo
    manifest = json.loads((root / "out" / "fastfeed.json").read_text())
    assert manifest["options"]["orientation"] == "exif" and manifest["rejected"] == 0
    loader = fastfeed.Loader(root / "out", batch_size=4, train=False, image_size=S, dtype=torch.uint8, device="cpu")
    assert loader.settings.orientation == "exif"
    tags = set()
    for batch in loader:
        check_boxes_against_pixels(batch)
        for k in range(len(batch["images"])):
            i = int(batch["ids"][k])
            number = int(re.search(r"im(\d+)\.jpg$", str(loader.dataset.sources[i])).group(1))
            tags.add(int(loader.dataset.orientations[i]))
            src = truth[number]
            h, w = batch["orig_size"][k].tolist()
            assert (w, h) == src["size"]
            (sx, sy), (px, py) = batch["scale"][k].tolist(), batch["pad"][k].tolist()
            want = np.array(src["boxes"], np.float64).reshape(-1, 4) * [sx, sy, sx, sy] + [px, py, px, py]
            assert np.allclose(batch["boxes"][batch["batch_idx"] == k].numpy(), want, atol=1e-3)
    assert tags == set(range(1, 9))
    loader.close()
    train = fastfeed.Loader(root / "out", batch_size=4, image_size=S, dtype=torch.uint8, device="cpu", seed=2)
    assert sum(check_boxes_against_pixels(b) for b in train) > 0
    with pytest.raises(ValueError, match="orientation must be 'exif'"):
        fastfeed.Loader(root / "out", batch_size=4, device="cpu", orientation="ignore")
    train.close()

    stored = fastfeed.Loader(root / "stored", batch_size=16, train=False, image_size=S, dtype=torch.uint8,
                             device="cpu")
    assert stored.settings.orientation == "ignore"
    with pytest.raises(AssertionError):
        for batch in stored:
            check_boxes_against_pixels(batch)
    stored.close()


def test_an_image_decoded_in_another_frame_is_a_reported_skip(exif_yolo, monkeypatch):
    """A decoder that does not turn the tagged images (as one reading another EXIF tag would): those whose axes the
    tag swaps come out at a size other than the table's, and are skipped and reported (replaced, with their boxes,
    by another sample), never drawn under boxes of the other frame."""
    import fastfeed.detect.decoder as decoder

    untagged = decoder.decode_for
    monkeypatch.setattr(decoder, "decode_for", lambda data, size, zoom, tag=1, native=True, out=None:
                        untagged(data, size, zoom, 1, native, out))
    root, _ = exif_yolo
    loader = fastfeed.Loader(root / "out", batch_size=4, train=False, image_size=S, dtype=torch.uint8, device="cpu")
    ds = loader.dataset
    swapped = set(np.flatnonzero((ds.orientations >= 5) & (ds.widths != ds.heights)).tolist())
    scored = set()
    for batch in loader:
        scored |= set(batch["ids"][batch["valid"]].tolist())
    assert swapped and not swapped & scored and len(scored) == len(ds) - len(swapped)
    assert loader.stats()["skipped"]["total"] == len(swapped)
    loader.close()


# Files whose EXIF orientation the header readers (fastfeed's, DALI's) and PIL's read differently, each written with
# the tag PIL displays it by (`tag`): (name, bytes of the stored image `im` and `tag`, the tag fastfeed's header
# reader finds). Pack keeps them for PIL's decode with PIL's tag; the cases are tests/odd_images/build.py's.
def _odd_exif_variants():
    import zlib

    from odd_images.build import _chunk_app, _exif, _ifd0_orientation, _png, _rows

    def jpeg(im):
        buf = io.BytesIO()
        im.save(buf, "JPEG", quality=95, subsampling=0)  # 4:4:4: sharp colour edges
        return buf.getvalue()

    def app1(im, body):
        data = jpeg(im)
        return data[:2] + _chunk_app(0xE1, body) + data[2:]

    def xmp(tag):
        return (b"http://ns.adobe.com/xap/1.0/\x00<x:xmpmeta xmlns:x='adobe:ns:meta/'><rdf:RDF xmlns:rdf='http://"
                b"www.w3.org/1999/02/22-rdf-syntax-ns#'><rdf:Description xmlns:tiff='http://ns.adobe.com/tiff/1.0/' "
                b"tiff:Orientation=\"%d\"/></rdf:RDF></x:xmpmeta>" % tag)

    def raw_profile(tag):
        hexed = _exif(tag)[6:].hex()
        text = f"\nexif\n{len(hexed) // 2:8d}\n" + "\n".join(hexed[i:i + 72] for i in range(0, len(hexed), 72))
        return b"Raw profile type exif\x00\x00" + zlib.compress(text.encode() + b"\n")

    return [
        ("jpeg_long", lambda im, t: app1(im, b"Exif\x00\x00" + _ifd0_orientation("<", 4, 1, struct.pack("<I", t))),
         lambda t: 1),
        # two SHORT entries: the header reader takes the first, PIL the last
        ("jpeg_twice", lambda im, t: app1(im, b"Exif\x00\x00" + _ifd0_orientation(
            ">", 3, 1, struct.pack(">HH", 6 if t < 5 else 1, 0), again=struct.pack(">HH", t, 0))),
         lambda t: 6 if t < 5 else 1),
        ("jpeg_xmp", lambda im, t: app1(im, xmp(t)), lambda t: 1),
        ("png_raw_profile", lambda im, t: _png(im.width, im.height, 8, 2, _rows(np.asarray(im)),
                                               extra=[(b"zTXt", raw_profile(t))]), lambda t: 1),
        ("png_exif_jpeg_header", lambda im, t: _png(im.width, im.height, 8, 2, _rows(np.asarray(im)),
                                                    extra=[(b"eXIf", _exif(t))]), lambda t: t),
    ]


def make_odd_exif_scenes(folder, tags=(1, 2, 3, 5, 6, 8)) -> dict[str, dict]:
    """Non-square scenes (solid rectangles of class colours on flat grey) in `folder`, each stored turned and
    written with an EXIF tag its readers disagree on, PIL's of which displays the scene: {file name: truth in the
    displayed frame}. Every tag of `tags` with every variant, so that PIL's tag and the header reader's differ both
    where one swaps the axes and where neither does."""
    from fastfeed.image.contract import TRANSPOSE
    from fastfeed.image.headers import exif_orientation

    folder.mkdir(parents=True)
    rng = np.random.default_rng(7)
    truth = {}
    for name, make, header_tag in _odd_exif_variants():
        for tag in tags:
            w, h = int(rng.integers(90, 140)), int(rng.integers(50, 80))
            img = np.full((h, w, 3), 128, np.uint8)
            boxes, labels = [], []
            for c in (0, 1):  # one object in each half
                bw, bh = int(rng.integers(12, w // 3)), int(rng.integers(12, h // 2))
                x0, y0 = c * (w // 2) + int(rng.integers(0, w // 2 - bw)), int(rng.integers(0, h - bh))
                img[y0:y0 + bh, x0:x0 + bw] = np.round(np.array(colorsys.hsv_to_rgb(CLASS_HUES[c], 1, .9)) * 255)
                boxes.append((x0, y0, x0 + bw, y0 + bh))
                labels.append(c)
            stored = Image.fromarray(img)
            if tag > 1:
                op = TRANSPOSE[tag]
                stored = stored.transpose(_UNDO.get(op, op))
            data = make(stored, tag)
            file = f"{name}_{tag}.{'png' if name.startswith('png') else 'jpg'}"
            (folder / file).write_bytes(data)
            # the premise: PIL shows the scene, fastfeed's header reader finds the other tag
            assert Image.open(io.BytesIO(data)).getexif().get(0x0112, 1) == tag, file
            assert exif_orientation(data) == header_tag(tag), file
            truth[file] = {"size": (w, h), "boxes": boxes, "labels": labels, "mask": np.zeros((h, w), np.uint8)}
            for (x0, y0, x1, y1), c in zip(boxes, labels):
                truth[file]["mask"][y0:y1, x0:x1] = c + 1
    return truth


@pytest.fixture(scope="module")
def odd_exif_packs(tmp_path_factory):
    """make_odd_exif_scenes labelled in the displayed frame, packed from a YOLO layout and from a COCO JSON."""
    from conftest import run_pack

    root = tmp_path_factory.mktemp("odd-exif")
    truth = make_odd_exif_scenes(root / "yolo" / "images")
    (root / "yolo" / "labels").mkdir()
    (root / "yolo" / "data.yaml").write_text("names: [red, lime]\n")
    coco = {"images": [], "annotations": [], "categories": [{"id": 1, "name": "red"}, {"id": 2, "name": "lime"}]}
    for i, (file, t) in enumerate(sorted(truth.items())):
        (w, h), stem = t["size"], file.rsplit(".", 1)[0]
        (root / "yolo" / "labels" / f"{stem}.txt").write_text("".join(
            f"{c} {(x0 + x1) / 2 / w:.6f} {(y0 + y1) / 2 / h:.6f} {(x1 - x0) / w:.6f} {(y1 - y0) / h:.6f}\n"
            for (x0, y0, x1, y1), c in zip(t["boxes"], t["labels"])))
        coco["images"].append({"id": i, "file_name": file, "width": w, "height": h})
        coco["annotations"] += [{"id": len(coco["annotations"]) + j, "image_id": i, "category_id": c + 1,
                                 "bbox": [x0, y0, x1 - x0, y1 - y0], "iscrowd": 0}
                                for j, ((x0, y0, x1, y1), c) in enumerate(zip(t["boxes"], t["labels"]))]
    (root / "coco.json").write_text(json.dumps(coco))
    run_pack(root / "yolo", root / "yolo-out", "--format", "wds")
    run_pack(root / "yolo" / "images", root / "coco-out", "--annotations", str(root / "coco.json"), "--format", "wds")
    return root, truth


def check_boxes_are_the_scenes(batch, ds, truth) -> None:
    """An evaluation batch of make_odd_exif_scenes: each image at its scene's displayed size, its boxes the scene's
    exactly, through the letterbox's scale and pad."""
    for k in range(len(batch["images"])):
        t = truth[str(ds.sources[int(batch["ids"][k])]).rsplit("/", 1)[-1]]
        h, w = batch["orig_size"][k].tolist()
        assert (w, h) == t["size"]
        (sx, sy), (px, py) = batch["scale"][k].tolist(), batch["pad"][k].tolist()
        want = np.array(t["boxes"], np.float64) * [sx, sy, sx, sy] + [px, py, px, py]
        assert np.allclose(batch["boxes"][batch["batch_idx"] == k].numpy(), want, atol=1e-3)


@pytest.mark.parametrize("source", ["yolo", "coco"])
def test_boxes_of_images_whose_exif_readers_disagree_are_in_the_frame_the_loader_shows(odd_exif_packs, source):
    """Images whose EXIF tag fastfeed's header reader and PIL read differently are kept for PIL's decode with PIL's
    tag: the annotations are turned into pixels in that same frame (YOLO's fractions by its displayed size), so
    nothing is reported, evaluation boxes are the scene's exactly and the oracle holds in training."""
    root, truth = odd_exif_packs
    out = root / f"{source}-out"
    manifest = json.loads((out / "fastfeed.json").read_text())
    assert manifest["rejected"] == 0, (out / "rejected.jsonl").read_text()
    with fastfeed.Loader(out, batch_size=4, train=False, image_size=S, dtype=torch.uint8, device="cpu") as loader:
        ds = loader.dataset
        assert len(ds) == len(truth) and ds.pil_only.all()
        for batch in loader:
            check_boxes_against_pixels(batch)
            check_boxes_are_the_scenes(batch, ds, truth)
        assert loader.stats()["skipped"]["total"] == 0
    with fastfeed.Loader(out, batch_size=4, image_size=S, dtype=torch.uint8, device="cpu", seed=4) as loader:
        for epoch in range(2):
            loader.set_epoch(epoch)
            assert sum(check_boxes_against_pixels(b) for b in loader) > len(truth)
        assert loader.stats()["skipped"]["total"] == 0


def test_jpegs_pack_codes_again_keep_the_frame_their_exif_shows(odd_exif_packs):
    """--jpeg reencode codes every JPEG again, its EXIF carried over: where the readers disagree on that EXIF's tag,
    the table holds PIL's, as for a file kept as it is, so the boxes stay on their pixels."""
    from conftest import run_pack

    root, truth = odd_exif_packs
    out = root / "reencoded"
    run_pack(root / "yolo", out, "--format", "wds", "--jpeg", "reencode", "--quality", "100")  # few artefacts
    manifest = json.loads((out / "fastfeed.json").read_text())
    assert manifest["rejected"] == 0, (out / "rejected.jsonl").read_text()
    assert manifest["changes"].get("reencoded_jpeg", 0) > 0  # the files were coded again
    # Lossy coding blurs the colours past the rectangles, so the frame is checked without the colour oracle: each
    # stored file displays at the scene's size by the tag the table holds, and the boxes are the scene's exactly.
    with fastfeed.Loader(out, batch_size=4, train=False, image_size=S, dtype=torch.uint8, device="cpu") as loader:
        ds = loader.dataset
        for i in range(len(ds)):
            with Image.open(io.BytesIO(ds.read(i))) as im:
                assert int(ds.orientations[i]) == im.getexif().get(0x0112, 1), ds.sources[i]
        for batch in loader:
            check_boxes_are_the_scenes(batch, ds, truth)
        assert loader.stats()["skipped"]["total"] == 0


def test_large_photos_decode_at_a_draft_with_the_full_decodes_pixels(tmp_path, monkeypatch):
    """Photos eight times larger than the output: the CPU path decodes each JPEG at a DCT-scaled draft that keeps
    two source pixels per output pixel for its largest tile, the batches pass the oracle, and they are the full-size
    decode's within the decode contract (2/255 on average)."""
    from conftest import run_pack

    import fastfeed.detect.decoder as decoder

    make_yolo(tmp_path / "src", n=8, negatives=0)
    for path in sorted((tmp_path / "src" / "images").glob("*.png")):
        pixels = np.asarray(Image.open(path).convert("RGB")).copy()
        pixels[(pixels == pixels[..., :1]).all(-1)] = 128  # a flat background: JPEG turns grey noise into colour
        big = Image.fromarray(pixels).resize((pixels.shape[1] * 8, pixels.shape[0] * 8), Image.NEAREST)
        big.save(path.with_suffix(".jpg"), quality=95, subsampling=0)
        path.unlink()
    run_pack(tmp_path / "src", tmp_path / "out", "--format", "wds")

    seen = []  # each decode's factor from the geometry's pixels to the decoded ones: the draft's scale
    decode_for = decoder.decode_for

    def recorded(*args, **kwargs):
        d = decode_for(*args, **kwargs)
        seen.append(d.fx)
        return d

    monkeypatch.setattr(decoder, "decode_for", recorded)
    kw = dict(batch_size=4, image_size=S, dtype=torch.uint8, device="cpu", seed=4)
    for train in (False, True):
        seen.clear()
        with fastfeed.Loader(tmp_path / "out", train=train, **kw) as loader:
            drafted = list(loader)
        assert min(seen) <= 0.25
        assert sum(check_boxes_against_pixels(b) for b in drafted) > 0
        seen.clear()
        with monkeypatch.context() as m:
            m.setattr(decoder, "source_zooms", lambda g: np.ones(len(g)))  # no draft: the full decode
            with fastfeed.Loader(tmp_path / "out", train=train, **kw) as loader:
                full = list(loader)
        assert min(seen) == 1.0
        for a, b in zip(drafted, full):
            assert torch.equal(a["boxes"], b["boxes"])
            diff = (a["images"].float() - b["images"].float()).abs().mean(dim=(1, 2, 3))
            assert diff.max() < 2.0, diff


def test_dali_turns_images_only_where_the_table_has_a_tag():
    from fastfeed.detect.gpu import dali_orientation

    assert dali_orientation(None) == "ignore"
    assert dali_orientation(np.ones(5, np.uint8)) == "ignore"  # a displayed-frame pack without tagged images
    assert dali_orientation(np.array([1, 6, 1], np.uint8)) == "exif"


def test_dalis_whole_decode_displays_each_tag_as_the_cpu_path(exif_yolo):
    """The GPU path's decode (DaliDecoder.decode_whole, here on DALI's CPU backend) under orientation "exif": each
    stored image of the pack comes back in the displayed size the sample table says and with the CPU path's pixels
    (`displayed` of the stored decode)."""
    pytest.importorskip("nvidia.dali")
    from fastfeed.decode.dali import DaliDecoder
    from fastfeed.detect.render import decode_rgbx, displayed

    root, _ = exif_yolo
    loader = fastfeed.Loader(root / "out", batch_size=4, train=False, image_size=S, device="cpu")
    ds, (widths, heights) = loader.dataset, loader.image_sizes
    samples = [np.frombuffer(ds.read(i), np.uint8) for i in range(len(ds))]
    with DaliDecoder(device_id=None, whole_images=True, batch_size=len(samples), num_threads=2,
                     orientation="exif") as d:
        got = d.decode_whole(samples)
    assert not got.bad and set(ds.orientations.tolist()) == set(range(1, 9))
    flat = got.flat.numpy()
    for i, data in enumerate(samples):
        w, h = got.size[i]
        assert (w, h) == (widths[i], heights[i])
        img = flat[got.offset[i]:got.offset[i] + w * h * 3].reshape(h, w, 3).astype(np.int16)
        ref = displayed(decode_rgbx(bytes(data)), ds.orientations[i])[..., :3].astype(np.int16)
        assert np.abs(img - ref).mean() < 0.5, i
    loader.close()


def test_the_gpu_paths_whole_decode_takes_pngs_natively(monkeypatch):
    """DaliDecoder.decode_whole (the detection GPU path's decode; DALI's CPU backend here) hands the PNGs every
    decoder reads to the native decode (PIL's pixels), except one DALI turns by its EXIF tag under "exif", which
    DALI decodes and displays; JPEGs stay DALI's."""
    pytest.importorskip("nvidia.dali")
    import fastfeed.decode.cpu as cpu
    from fastfeed.decode.dali import DaliDecoder
    from test_png_decode import chunk, encode, pil_rgb

    rng = np.random.default_rng(6)
    pixels = [rng.integers(0, 256, (30 + i, 41, 3), dtype=np.uint8) for i in range(3)]
    exif = b"MM\x00\x2a\x00\x00\x00\x08" + struct.pack(">HHHIHH", 1, 0x0112, 3, 1, 6, 0) + b"\0" * 4
    plain, other = encode(pixels[0], 2, rng), encode(pixels[1], 2, rng)
    turned = encode(pixels[2], 2, rng, before=chunk(b"eXIf", exif))
    buf = io.BytesIO()
    Image.fromarray(pixels[0]).save(buf, "JPEG", quality=95)
    samples = [np.frombuffer(b, np.uint8) for b in (plain, buf.getvalue(), other, turned)]
    native = []
    inner = cpu._native.decode_png_rgb
    monkeypatch.setattr(cpu._native, "decode_png_rgb", lambda s, out=None: (native.append(bytes(s)), inner(s, out))[1])
    for orientation in ("ignore", "exif"):
        native.clear()
        with DaliDecoder(device_id=None, whole_images=True, batch_size=4, num_threads=2,
                         orientation=orientation) as d:
            got = d.decode_whole(samples)
        assert not got.bad
        flat = got.flat.numpy()
        images = [flat[o:o + w * h * 3].reshape(h, w, 3) for o, (w, h) in zip(got.offset, got.size)]
        np.testing.assert_array_equal(images[0], pixels[0])
        np.testing.assert_array_equal(images[2], pixels[1])
        shown = pixels[2] if orientation == "ignore" else np.rot90(pixels[2], -1)
        np.testing.assert_array_equal(images[3], shown)
        assert np.abs(images[1].astype(int) - pil_rgb(buf.getvalue())).mean() < 0.5  # the JPEG: DALI's libjpeg
        assert native == ([plain, other, turned] if orientation == "ignore" else [plain, other])

@pytest.mark.gpu
def test_on_the_gpu_exif_rotated_images_are_the_cpu_ones(exif_yolo):
    """DALI displays each tagged JPEG by its EXIF orientation on the GPU: the CPU path's boxes exactly, its pixels
    within the decode contract, the oracle on the GPU's own pixels."""
    root, _ = exif_yolo
    for train in (False, True):
        stats, settings = gpu_batches_are_the_cpu_ones(root / "out", batch_size=4, train=train)
        assert settings.orientation == "exif"
        assert stats["skipped"]["total"] == 0  # no image's decoded size was off the table's


def _source_number(ds, i: int) -> int:
    """The number in sample i's source file name (images/imNNN.png)."""
    return int(re.search(r"im(\d+)\.png$", str(ds.sources[i])).group(1))


def test_same_seed_same_batches_and_a_resumed_epoch_is_the_rest(yolo_pack):
    out, _ = yolo_pack

    def epoch(loader):
        return [(b["images"].clone(), b["boxes"].clone(), b["labels"].clone(), b["batch_idx"].clone())
                for b in loader]

    a = fastfeed.Loader(out, batch_size=6, image_size=S, dtype=torch.uint8, device="cpu", seed=5)
    full = epoch(a)
    b = fastfeed.Loader(out, batch_size=6, image_size=S, dtype=torch.uint8, device="cpu", seed=5)
    it = iter(b)
    next(it)
    state = b.state_dict()
    b.close()
    c = fastfeed.Loader(out, batch_size=6, image_size=S, dtype=torch.uint8, device="cpu", seed=5)
    c.load_state_dict(state)
    rest = epoch(c)
    assert len(rest) == len(full) - 1
    for got, want in zip(rest, full[1:]):
        assert all(torch.equal(x, y) for x, y in zip(got, want))
    d = fastfeed.Loader(out, batch_size=6, image_size=S, dtype=torch.uint8, device="cpu", seed=6)
    assert not torch.equal(epoch(d)[0][0], full[0][0])
    for loader in (a, c, d):
        loader.close()


def test_batches_held_are_never_overwritten_and_released_ones_are_reused(yolo_pack):
    """The CPU batches are written into the memory of earlier ones nobody holds any more (fresh pages cost more
    than drawing into them): a batch, or a view of one, that the caller keeps stays as it was handed out."""
    out, _ = yolo_pack
    ref = fastfeed.Loader(out, batch_size=2, image_size=S, dtype=torch.uint8, device="cpu", seed=3)
    want = [b["images"].clone() for b in ref]
    ref.close()
    loader = fastfeed.Loader(out, batch_size=2, image_size=S, dtype=torch.uint8, device="cpu", seed=3)
    it = iter(loader)
    held = next(it)["images"]
    view = next(it)["images"][1:3]
    ptrs = []
    for b in it:
        ptrs.append(b["images"].untyped_storage().data_ptr())
        del b
    loader.close()
    assert len(ptrs) == len(want) - 2 >= 8
    assert torch.equal(held, want[0]) and torch.equal(view, want[1][1:3])
    assert held.untyped_storage().data_ptr() not in ptrs and view.untyped_storage().data_ptr() not in ptrs
    assert len(set(ptrs)) < len(ptrs)  # released batches' memory is written again


def test_jpeg_sources_decode_into_recycled_memory_with_the_pixels_of_their_own(jpeg_yolo_pack, monkeypatch):
    """The CPU path decodes a batch's JPEGs whole into one buffer an earlier batch's sources used (decode/recycle.py
    SourceArena): the batches are those of decodes into memory of their own, the buffer is written again batch after
    batch, and one a view still holds is never handed out."""
    from fastfeed.decode import recycle

    def epoch():
        with fastfeed.Loader(jpeg_yolo_pack, batch_size=4, image_size=S, dtype=torch.uint8, device="cpu", seed=5,
                             num_threads=2) as loader:
            return [(b["images"].clone(), b["boxes"].clone()) for b in loader]

    a = recycle.SourceArena()
    first = a.take([1000, 0, 10])
    assert first[1] is None and [len(first[0]), len(first[2])] == [1024, 64]  # cache lines, side by side
    assert first[2].ctypes.data == first[0].ctypes.data + 1024
    kept = first[2][:5]
    del first
    second = a.take([10])
    assert not np.shares_memory(second[0], kept)  # a view of the old buffer is alive: a new one
    del kept, second
    third = a.take([100])
    again = third[0].ctypes.data
    del third
    assert a.take([50])[0].ctypes.data == again  # nothing alive: the same memory
    buffers = []
    take = recycle.SourceArena.take

    def spy(self, nbytes):
        views = take(self, nbytes)
        buffers.append(next(v for v in views if v is not None).base.ctypes.data)
        return views

    monkeypatch.setattr(recycle.SourceArena, "take", spy)
    arena = epoch()
    assert len(buffers) >= 4 and len(set(buffers)) < len(buffers)  # the same memory, batch after batch
    monkeypatch.setattr(recycle.SourceArena, "take", lambda self, nbytes: [None] * len(nbytes))
    own = epoch()
    assert len(arena) == len(own)
    for (a, ab), (b, bb) in zip(arena, own):
        assert torch.equal(a, b) and torch.equal(ab, bb)


def test_the_client_helpers_give_each_stack_its_shapes(yolo_pack):
    out, _ = yolo_pack
    loader = fastfeed.Loader(out, batch_size=4, image_size=S, dtype=torch.uint8, device="cpu")
    batch = next(iter(loader))
    images, targets = to_torchvision(batch, label_offset=1)
    assert len(images) == 4 and sum(len(t["boxes"]) for t in targets) == len(batch["boxes"])
    assert all(t["labels"].min() >= 1 for t in targets if len(t["labels"]))
    yolo = to_ultralytics(batch)
    n = len(batch["boxes"])
    assert yolo["img"].dtype == torch.uint8 and yolo["cls"].shape == (n, 1) and yolo["bboxes"].shape == (n, 4)
    assert float(yolo["bboxes"].min()) >= 0 and float(yolo["bboxes"].max()) <= 1
    xywh = yolo["bboxes"] * S
    assert torch.allclose(xywh[:, 0] - xywh[:, 2] / 2, batch["boxes"][:, 0], atol=1e-3)
    loader.close()
    floats = fastfeed.Loader(out, batch_size=4, image_size=S, device="cpu")
    with pytest.raises(ValueError, match="dtype=torch.uint8"):
        to_ultralytics(next(iter(floats)))
    floats.close()


def test_to_ultralytics_gives_a_validator_every_image_once_over_all_ranks(yolo_pack):
    """ultralytics' validator scores every image it is given, so an evaluation batch's padding (the positions that
    even out the ranks' shares) must not reach it: over 5 ranks of 24 images every image comes out exactly once,
    with exactly its own objects (their classes and count from the source's labels)."""
    import re

    out, truth = yolo_pack
    scored = []
    for rank in range(5):  # 24 = 5 x 5 - 1: one rank's last batch holds a padding position
        loader = fastfeed.Loader(out, batch_size=4, image_size=S, dtype=torch.uint8, device="cpu", train=False,
                                 rank=rank, world_size=5)
        sources = loader.dataset.sources
        for batch in loader:
            yolo = to_ultralytics(batch)
            assert len(yolo["img"]) == len(yolo["im_file"]) == len(yolo["ori_shape"]) == int(batch["valid"].sum())
            for k, name in enumerate(yolo["im_file"]):
                want = truth[int(re.search(r"im(\d+)\.png$", str(sources[int(name)])).group(1))]
                got = yolo["cls"][yolo["batch_idx"] == k].flatten().long().tolist()
                assert sorted(got) == sorted(want["labels"])
                assert tuple(yolo["ori_shape"][k]) == want["size"][::-1]
                scored.append(int(name))
        loader.close()
    assert sorted(scored) == list(range(len(truth)))


def test_a_torchvision_detector_trains_on_the_batches(yolo_pack):
    """A real torchvision detector (no weights) takes the batches through `to_torchvision` and trains."""
    from torchvision.models.detection import fasterrcnn_mobilenet_v3_large_fpn

    out, _ = yolo_pack
    torch.manual_seed(0)
    model = fasterrcnn_mobilenet_v3_large_fpn(weights=None, weights_backbone=None, num_classes=len(NAMES) + 1,
                                              min_size=S, max_size=S)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loader = fastfeed.Loader(out, batch_size=2, image_size=S, device="cpu")
    model.train()
    losses = []
    for step, batch in enumerate(loader):
        images, targets = to_torchvision(batch, label_offset=1)
        loss = sum(model(images, targets).values())
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
        if step == 1:
            break
    assert len(losses) == 2 and all(np.isfinite(losses))
    loader.close()


def test_detection_arguments_are_checked(yolo_pack, tmp_path):
    out, _ = yolo_pack
    with pytest.raises(ValueError, match="decodes on a CUDA device"):
        fastfeed.Loader(out, batch_size=4, device="cpu", decoder="dali")
    with pytest.raises(ValueError, match="decodes with one of"):
        fastfeed.Loader(out, batch_size=4, device="cpu", decoder="hybrid")
    cpu = fastfeed.Loader(out, batch_size=4, device="cpu")
    assert cpu.settings.decoder == "cpu"
    cpu.close()
    with pytest.raises(ValueError, match="orientation must be 'exif'"):  # the boxes' frame: packed by default
        fastfeed.Loader(out, batch_size=4, device="cpu", orientation="ignore")
    with pytest.raises(ValueError, match="orientation must be one of"):
        fastfeed.Loader(out, batch_size=4, device="cpu", orientation="rotate")
    with pytest.raises(ValueError, match="augment="):
        fastfeed.Loader(out, batch_size=4, device="cpu", task="classify", augment=DetectAugment())
    with pytest.raises(ValueError, match="mosaic"):
        DetectAugment(mosaic=1.5)
    for c in range(2):  # a classification pack holds no boxes: a detection batch of it would have none, silently
        (tmp_path / "src" / f"c{c}").mkdir(parents=True)
        Image.new("RGB", (40, 30), (90 * c, 60, 30)).save(tmp_path / "src" / f"c{c}" / "0.jpg")
    from conftest import run_pack

    run_pack(tmp_path / "src", tmp_path / "cls")
    for task in ("detect", "segment"):
        with pytest.raises(ValueError, match=f"task='{task}' reads each image's objects.*packed for task 'classify'"):
            fastfeed.Loader(tmp_path / "cls", batch_size=2, device="cpu", task=task)


@pytest.mark.gpu
@pytest.mark.parametrize("decoder,augment", [("cpu", None), ("dali", None), ("dali", DetectAugment(flipud=0.5))],
                         ids=["cpu", "dali", "dali-flipud"])
def test_on_the_gpu_the_batches_are_the_cpu_ones_normalised_there(yolo_pack, decoder, augment):
    """device="cuda": the same geometry as on the CPU, the same pixels to a level (the HSV gains are applied on the
    GPU in float32, on the CPU in float64), scaled to [0, 1] on the GPU. With decoder="dali" (what "auto" picks)
    DALI decodes these PNGs to the same pixels and the GPU renderer draws them to the bit of Pillow's fixed point,
    which the CPU renderer's pillow-simd resize rounds differently by a level at most (tests/test_detect_gpu_render.py):
    two levels there."""
    out, _ = yolo_pack
    cpu = fastfeed.Loader(out, batch_size=8, image_size=S, dtype=torch.uint8, device="cpu", seed=4, augment=augment)
    gpu = fastfeed.Loader(out, batch_size=8, image_size=S, dtype=torch.float32, device="cuda", seed=4,
                          decoder=decoder, augment=augment)
    assert gpu.settings.decoder == decoder
    levels = 1 if decoder == "cpu" else 2
    n = 0
    for a, b in zip(cpu, gpu):
        assert b["images"].is_cuda and b["images"].dtype == torch.float32
        diff = (b["images"].cpu() * 255 - a["images"].float()).abs()
        assert diff.max() <= levels + 1e-3 and (diff > 0.5).float().mean() < 0.01
        assert torch.equal(a["boxes"], b["boxes"].cpu()) and torch.equal(a["labels"], b["labels"].cpu())
        n += 1
    assert n == len(cpu)
    cpu.close()
    gpu.close()


@pytest.fixture(scope="module")
def jpeg_yolo_pack(tmp_path_factory):
    """make_yolo's scenes as baseline 4:2:0 JPEGs (quality 95): what the hardware decoder takes."""
    from conftest import run_pack

    root = tmp_path_factory.mktemp("yolo-jpeg")
    make_yolo(root / "src")
    for path in sorted((root / "src" / "images").glob("*.png")):
        Image.open(path).save(path.with_suffix(".jpg"), quality=95)
        path.unlink()
    run_pack(root / "src", root / "out", "--format", "wds")
    return root / "out"


@pytest.mark.gpu
@pytest.mark.parametrize("train", [False, True], ids=["eval", "train"])
def test_on_the_gpu_jpeg_batches_are_the_cpu_ones_within_the_contract(jpeg_yolo_pack, train):
    """JPEGs through DALI's GPU decode and the GPU renderer: the CPU path's boxes exactly (the geometry is drawn
    before decoding) and its pixels within the decode contract's 2/255 (nvJPEG is not libjpeg to the bit); the box
    oracle holds on the GPU's own pixels."""
    gpu_batches_are_the_cpu_ones(jpeg_yolo_pack, batch_size=8, train=train)


def gpu_batches_are_the_cpu_ones(path, *, batch_size: int, train: bool):
    """The GPU path's batches of `path` (DALI's decode, the GPU renderer; HSV off) against the CPU path's: the boxes
    exactly (the geometry is drawn before decoding), the pixels within the decode contract's 2/255 (nvJPEG is not
    libjpeg to the bit), the box oracle on the GPU's own pixels. Returns the GPU Loader's (stats(), settings)."""
    aug = DetectAugment(hsv_h=0.0, hsv_s=0.0, hsv_v=0.0)
    kw = dict(batch_size=batch_size, image_size=S, dtype=torch.uint8, seed=3, train=train,
              augment=aug if train else None)
    with fastfeed.Loader(path, device="cpu", **kw) as cpu, fastfeed.Loader(path, device="cuda", **kw) as gpu:
        assert gpu.settings.decoder == "dali"
        for a, b in zip(cpu, gpu):
            for key in ("boxes", "labels", "batch_idx", "scale", "pad"):
                assert torch.equal(a[key], b[key].cpu()), key
            diff = (a["images"].float() - b["images"].cpu().float()).abs().mean(dim=(1, 2, 3))
            assert diff.max() < 2.0, diff
            check_boxes_against_pixels({k: v.cpu() for k, v in b.items() if torch.is_tensor(v)})
        return gpu.stats(), gpu.settings


@pytest.mark.gpu
def test_on_the_gpu_the_iou_crop_is_the_cpu_ones(yolo_pack):
    """The IoU crop's stretched windows through DALI and the GPU renderer: the CPU path's boxes and pixels (no HSV,
    so to the bit)."""
    out, _ = yolo_pack
    aug = DetectAugment(mosaic=0.0, iou_crop=1.0, hsv_h=0.0, hsv_s=0.0, hsv_v=0.0)
    cpu = fastfeed.Loader(out, batch_size=8, image_size=S, dtype=torch.uint8, device="cpu", seed=7, augment=aug)
    gpu = fastfeed.Loader(out, batch_size=8, image_size=S, dtype=torch.uint8, device="cuda", seed=7, augment=aug)
    assert gpu.settings.decoder == "dali"
    for a, b in zip(cpu, gpu):
        for key in ("images", "boxes", "labels", "batch_idx", "scale", "pad"):
            assert torch.equal(a[key], b[key].cpu()), key
    cpu.close()
    gpu.close()


@pytest.mark.gpu
def test_on_the_gpu_evaluation_batches_equal_the_cpu_ones_to_the_bit(yolo_pack):
    """The letterbox (no HSV) through DALI and the GPU renderer: the CPU path's uint8 pixels exactly, and its
    boxes, scale and pad."""
    out, _ = yolo_pack
    cpu = fastfeed.Loader(out, batch_size=8, image_size=S, dtype=torch.uint8, device="cpu", train=False)
    gpu = fastfeed.Loader(out, batch_size=8, image_size=S, dtype=torch.uint8, device="cuda", train=False)
    assert gpu.settings.decoder == "dali"
    for a, b in zip(cpu, gpu):
        for key in ("images", "boxes", "labels", "batch_idx", "scale", "pad", "orig_size"):
            assert torch.equal(a[key], b[key].cpu()), key
    cpu.close()
    gpu.close()


@pytest.fixture(scope="module")
def odd_yolo_pack(tmp_path_factory):
    """make_yolo's folder with a third of its images in formats only PIL reads as the decode contract says (a
    16-bit RGB PNG whose high bytes are the pixels, a PNG with alpha, a TIFF): the same pixels, `pil_only` packed."""
    from conftest import run_pack
    from odd_images.build import _png, _rows

    root = tmp_path_factory.mktemp("yolo-odd")
    truth = make_yolo(root / "src", n=12, negatives=1)
    for i, path in enumerate(sorted((root / "src" / "images").glob("*.png"))):
        if i % 3:
            continue
        rgb = np.asarray(Image.open(path).convert("RGB"))
        h, w = rgb.shape[:2]
        kind = (i // 3) % 3
        if kind == 0:
            path.write_bytes(_png(w, h, 16, 2, _rows((rgb.astype(np.uint16) * 257 + 99).astype(">u2"))))
        elif kind == 1:
            alpha = np.full((h, w, 1), 7, np.uint8)
            Image.fromarray(np.concatenate([rgb, alpha], axis=2), "RGBA").save(path)
        else:
            path.unlink()
            Image.fromarray(rgb).save(path.with_suffix(".tif"))
    run_pack(root / "src", root / "out", "--format", "wds")
    return root / "out", truth


def test_images_only_pil_reads_come_as_the_contract_says_with_their_boxes(odd_yolo_pack):
    out, _ = odd_yolo_pack
    with fastfeed.open_dataset(out) as ds:
        assert int(ds.pil_only.sum()) == ds.manifest.pil_only == 4
    with fastfeed.Loader(out, batch_size=6, train=True, image_size=S, dtype=torch.uint8, device="cpu",
                         seed=2) as loader:
        assert sum(check_boxes_against_pixels(b) for b in loader) > 10


@pytest.mark.gpu
def test_on_the_gpu_images_only_pil_reads_are_decoded_by_pil_to_the_bit(odd_yolo_pack):
    """DALI hands the `pil_only` samples to the contract's PIL decoder (decode/dali.py decode_whole): evaluation
    batches equal the CPU path's to the bit, those samples included."""
    out, _ = odd_yolo_pack
    cpu = fastfeed.Loader(out, batch_size=6, image_size=S, dtype=torch.uint8, device="cpu", train=False)
    gpu = fastfeed.Loader(out, batch_size=6, image_size=S, dtype=torch.uint8, device="cuda", train=False)
    assert gpu.settings.decoder == "dali"
    for a, b in zip(cpu, gpu):
        for key in ("images", "boxes", "labels", "batch_idx", "scale", "pad"):
            assert torch.equal(a[key], b[key].cpu()), key
    assert gpu.stats()["skipped"]["total"] == 0
    cpu.close()
    gpu.close()


@pytest.mark.parametrize("device, verify", [("cpu", True), ("cpu", False),
                                            pytest.param("cuda", False, marks=pytest.mark.gpu)])
def test_a_bad_record_is_replaced_by_a_copy_of_another_with_its_boxes(yolo_pack, tmp_path, device, verify):
    """A sample whose bytes no longer match their checksum (or, unchecked, no longer decode): under on_error="skip"
    its position holds an exact copy of another sample of the batch (pixels and boxes), marked not valid and
    counted; under "raise" the error names the sample."""
    import shutil

    src, _ = yolo_pack
    out = tmp_path / "damaged"
    shutil.copytree(src, out)
    ds = fastfeed.open_dataset(out)
    victim = 3
    ext = ds.extents()
    key = str(ds.keys[victim])
    with open(ext.paths[ext.file_index[victim]], "r+b") as f:
        f.seek(int(ext.offset[victim]) + int(ext.size[victim]) // 2)
        f.write(b"\x00" * 16)
    ds.close()
    loader = fastfeed.Loader(out, batch_size=8, train=False, image_size=S, dtype=torch.uint8, device=device,
                             verify_checksums=verify)
    seen = 0
    for batch in loader:
        batch = {k: v.cpu() if torch.is_tensor(v) else v for k, v in batch.items()}
        ids = batch["ids"].tolist()
        for k in np.nonzero(~batch["valid"].numpy())[0]:
            j = next(j for j in range(len(ids)) if j != k and ids[j] == ids[k] and batch["valid"][j])
            assert ids[k] != victim and torch.equal(batch["images"][k], batch["images"][j])
            assert torch.equal(batch["boxes"][batch["batch_idx"] == k], batch["boxes"][batch["batch_idx"] == j])
            seen += 1
        assert victim not in ids
    assert seen == 1
    assert loader.stats()["skipped"]["by_reason"] == {"checksum" if verify else "decode_error": 1}
    loader.close()
    strict = fastfeed.Loader(out, batch_size=8, train=False, image_size=S, device=device, on_error="raise",
                             verify_checksums=verify)
    with pytest.raises(fastfeed.LoaderError, match=re.escape(key)):
        for _ in strict:
            pass
    strict.close()


def test_a_batch_of_bad_records_is_filled_alike_in_a_resumed_run(yolo_pack, tmp_path):
    """A batch whose every sample is bad is filled with a sample from the rest of the epoch; for the epoch's last
    batch there is none, and the fill came from the plan's first samples, which a resumed plan does not share: found
    by resuming over a damaged pack with batches of one, where the resumed run's last batch held another sample than
    the uninterrupted run's. The rest of the epoch must be the same batches, the filled ones included."""
    import shutil

    src, _ = yolo_pack
    out = tmp_path / "damaged"
    shutil.copytree(src, out)
    ds = fastfeed.open_dataset(out)
    victim = len(ds) - 1  # in evaluation the epoch's last sample, and with batches of one its last batch
    ext = ds.extents()
    with open(ext.paths[ext.file_index[victim]], "r+b") as f:
        f.seek(int(ext.offset[victim]) + int(ext.size[victim]) // 2)
        f.write(b"\x00" * 16)
    ds.close()

    def batches(loader):
        return [(b["ids"].clone(), b["images"].clone(), b["boxes"].clone(), b["valid"].clone()) for b in loader]

    kw = dict(batch_size=1, train=False, image_size=S, dtype=torch.uint8, device="cpu")
    with fastfeed.Loader(out, **kw) as loader:
        it = iter(loader)
        next(it), next(it)
        state = loader.state_dict()
        rest = batches(it)
    assert rest[-1][0].item() != victim and not rest[-1][3].any()  # filled, and not scored
    with fastfeed.Loader(out, **kw) as resumed:
        resumed.load_state_dict(state)
        got = batches(resumed)
    assert len(got) == len(rest)
    for k, (a, b) in enumerate(zip(got, rest)):
        assert all(torch.equal(x, y) for x, y in zip(a, b)), f"batch {k} of the rest differs"
