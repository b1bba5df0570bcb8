"""fastfeed/detect/geometry.py and render.py against oracles that do not trust them.

Every object is a solid rectangle of its class's colour (one of 7 colours whose channels are 0 or 255) on a black or
dark-grey-noise background. A pixel's class is read back by thresholding each channel half-way (127.5): a symmetric
resampling filter (bilinear, antialiased or not) puts the half-way level of a blurred edge on the edge itself, at any
zoom, so the pixels of a class span its box within a pixel whether a 40 px image is enlarged 6x or a 1000 px one
shrunk 12x (a "within 10 levels of the colour" mask would end zoom/2 px inside the box when enlarging). Each output
box must equal the bounding box of its colour's pixels within 1.5 px, every patch of a colour must lie in a box of
its class, and the box rule (ultralytics' clip + box_candidates) is re-derived here from ultralytics' source.
"""
from __future__ import annotations

import io
import math

import numpy as np
import pytest
import torch
from PIL import Image
from scipy import ndimage

from fastfeed.detect import DetectAugment, plan_batch, transform_boxes
from fastfeed.detect.geometry import transform_batch_boxes
from fastfeed.detect.render import apply_hsv, decode_image, render

# class c is the colour whose channel bits are c + 1 (R = 1, G = 2, B = 4): red, green, yellow, blue, magenta, cyan,
# white. Black (0) is the background; the pad grey 114 and the noise (<= 40) threshold to black too.
PALETTE = np.array([[(code >> b) & 1 for b in range(3)] for code in range(1, 8)], dtype=np.uint8) * 255
SIZES = [(640, 480), (300, 500), (40, 30), (1000, 750), (517, 211), (123, 456), (40, 40), (800, 200)]
S = 160
TOL = 1.5  # px on each box edge: the half-way contour sits within half a pixel of the edge, plus pixel rounding
NO_HSV = dict(hsv_h=0.0, hsv_s=0.0, hsv_v=0.0)  # colour jitter would move the colours the oracle reads


def make_sample(rng, w: int, h: int, noise: bool):
    """(uint8 [h, w, 3] image, boxes float [n, 4] XYXY, labels [n]): 1-4 separated rectangles, some on the edge."""
    img = np.repeat(rng.integers(0, 41, (h, w, 1), dtype=np.uint8), 3, axis=2) if noise else np.zeros((h, w, 3),
                                                                                                         np.uint8)
    gap = max(3, int(0.08 * min(w, h)))
    boxes, labels = [], []
    for i in range(int(rng.integers(1, 5))):
        for _ in range(50):
            bw = int(rng.integers(max(4, w // 10), max(5, int(w * 0.4))))
            bh = int(rng.integers(max(4, h // 10), max(5, int(h * 0.4))))
            x0 = 0 if i == 0 and rng.random() < 0.5 else int(rng.integers(0, w - bw + 1))  # some touch the edge
            y0 = int(rng.integers(0, h - bh + 1))
            if all(x0 >= b[2] + gap or b[0] >= x0 + bw + gap or y0 >= b[3] + gap or b[1] >= y0 + bh + gap
                   for b in boxes):
                break
        else:
            continue
        c = int(rng.integers(0, len(PALETTE)))
        img[y0:y0 + bh, x0:x0 + bw] = PALETTE[c]
        boxes.append((x0, y0, x0 + bw, y0 + bh))
        labels.append(c)
    return img, np.array(boxes, np.float64).reshape(-1, 4), np.array(labels, np.int64)


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(7)
    samples = [make_sample(rng, w, h, noise=(i % 2 == 1) and min(w, h) > 40) for i, (w, h) in enumerate(SIZES)]
    return {"images": [Image.fromarray(s[0]) for s in samples], "boxes": [s[1] for s in samples],
            "labels": [s[2] for s in samples], "sizes": np.array(SIZES, np.int64)}


def classes_of(img: np.ndarray) -> np.ndarray:
    """Per pixel its class (-1: background, padding), each channel thresholded half-way."""
    bits = (img > 127).astype(np.int64)
    return bits[..., 0] + 2 * bits[..., 1] + 4 * bits[..., 2] - 1


def reference_boxes(geometry, k, data, positions):
    """ultralytics' box rule written again from its source (Mosaic._cat_labels' clip, RandomPerspective.apply_bboxes,
    Instances.clip, box_candidates, RandomFlip), from the tile's affine, visible region and drawn rectangle only.
    Returns [(box after, label, kept, box1 (w, h), whole)] with boxes in output pixels, before the flip; whole: the
    object is neither cut by its tile nor by the output."""
    out = []
    for t in geometry.tiles(k):
        i = positions[t.source]
        A = t.affine
        # the column norms of A are M's scale times the resize ratio: ultralytics' box1 scale (no shear here)
        sx, sy = np.hypot(A[0, 0], A[1, 0]), np.hypot(A[0, 1], A[1, 1])
        rx0, ry0, rx1, ry1 = t.region
        for b, c in zip(data["boxes"][i], data["labels"][i]):
            x0, y0, x1, y1 = max(b[0], rx0), max(b[1], ry0), min(b[2], rx1), min(b[3], ry1)
            if not (x1 > x0 and y1 > y0):  # remove_zero_area_boxes after the mosaic clip
                continue
            w1, h1 = (x1 - x0) * sx, (y1 - y0) * sy
            pts = np.array([(x0, y0, 1), (x1, y1, 1), (x0, y1, 1), (x1, y0, 1)], np.float64) @ A.T
            bx0, by0 = pts.min(0)
            bx1, by1 = pts.max(0)
            lim = (0, 0, S, S) if not geometry.axis_aligned else t.dst_rect  # the drawn pixels (within [0, S])
            whole = (x0, y0, x1, y1) == tuple(b) and lim[0] <= bx0 and lim[1] <= by0 and bx1 <= lim[2] and by1 <= lim[3]
            bx0, bx1 = np.clip([bx0, bx1], lim[0], lim[2])
            by0, by1 = np.clip([by0, by1], lim[1], lim[3])
            w2, h2 = bx1 - bx0, by1 - by0
            eps = 1e-16
            ar = max(w2 / (h2 + eps), h2 / (w2 + eps))
            kept = w2 > 2 and h2 > 2 and w2 * h2 / (w1 * h1 + eps) > 0.1 and ar < 100
            if not geometry.train:  # evaluation keeps every object (ultralytics' val transforms filter nothing)
                kept = w2 > 0 and h2 > 0
            out.append(((bx0, by0, bx1, by1), int(c), bool(kept), (w1, h1), bool(whole)))
    return out


def flipped(box, flip):
    x0, y0, x1, y1 = box
    return (S - x1, y0, S - x0, y1) if flip else (x0, y0, x1, y1)


def groups_of(boxes, near=2.0):
    """Boxes that touch (within `near` px) in groups: their pixels may join into one patch."""
    parent = list(range(len(boxes)))

    def find(i):
        while parent[i] != i:
            i = parent[i]
        return i
    for i in range(len(boxes)):
        for j in range(i):
            a, b = boxes[i], boxes[j]
            if a[0] <= b[2] + near and b[0] <= a[2] + near and a[1] <= b[3] + near and b[1] <= a[3] + near:
                parent[find(i)] = find(j)
    out = {}
    for i in range(len(boxes)):
        out.setdefault(find(i), []).append(i)
    return list(out.values())


def check_output(img, geometry, k, data, positions, exact: bool = True) -> int:
    """The oracles for output k (see the module docstring); `exact=False` (rotation): each box contains its pixels and
    is no larger than the rotated rectangle's hull + 1 px. Returns the number of boxes checked against pixels."""
    tiles = geometry.tiles(k)
    got_b, got_l = transform_boxes(geometry, k, [data["boxes"][positions[t.source]] for t in tiles],
                                   [data["labels"][positions[t.source]] for t in tiles])
    ref = reference_boxes(geometry, k, data, positions)
    flip = bool(geometry.flip[k])
    want = np.array([flipped(b, flip) for b, _, kept, _, _ in ref if kept], np.float64).reshape(-1, 4)
    assert got_l.tolist() == [c for _, c, kept, _, _ in ref if kept]
    np.testing.assert_allclose(got_b, want, atol=1e-3)

    cls = classes_of(img)
    checked = 0
    for c in range(len(PALETTE)):
        every = [(flipped(b, flip), kept, whole) for b, cc, kept, _, whole in ref if cc == c]
        patches, n = ndimage.label(cls == c, structure=np.ones((3, 3)))
        spans = ndimage.find_objects(patches)
        areas = ndimage.sum_labels(np.ones_like(patches), patches, range(1, n + 1)) if n else []
        spans = [(sl[1].start, sl[0].start, sl[1].stop, sl[0].stop) for sl in spans]
        for members in groups_of([e[0] for e in every]):
            boxes = np.array([every[i][0] for i in members])
            kept = np.array([every[i][0] for i in members if every[i][1]]).reshape(-1, 4)
            outer = (boxes[:, 0].min(), boxes[:, 1].min(), boxes[:, 2].max(), boxes[:, 3].max())
            mine = [p for p in spans if p[0] <= outer[2] + 1 and p[2] >= outer[0] - 1 and p[1] <= outer[3] + 1
                    and p[3] >= outer[1] - 1]
            if not len(kept):
                continue
            whole = all(every[i][2] for i in members)
            assert mine, f"output {k}: boxes {kept.tolist()} of class {c} hold none of its colour"
            pix = (min(p[0] for p in mine), min(p[1] for p in mine), max(p[2] for p in mine),
                   max(p[3] for p in mine))
            # the pixels lie in the boxes ...
            assert pix[0] >= outer[0] - TOL and pix[1] >= outer[1] - TOL and pix[2] <= outer[2] + TOL \
                and pix[3] <= outer[3] + TOL, (k, c, pix, outer)
            # ... and reach every edge of the kept ones. Rotated: only for an object shown whole (a cut corner leaves
            # its hull larger than what is shown), within 2.5 px (a rotated corner's tip is thinner than a pixel).
            reach = TOL if exact else 2.5 if whole else math.inf
            k_outer = (kept[:, 0].min(), kept[:, 1].min(), kept[:, 2].max(), kept[:, 3].max())
            assert pix[0] <= k_outer[0] + reach and pix[1] <= k_outer[1] + reach and pix[2] >= k_outer[2] - reach \
                and pix[3] >= k_outer[3] - reach, (k, c, pix, k_outer)
            checked += len(kept)
        # every patch of more than a few pixels lies in a box of its class (kept, or dropped by box_candidates)
        for p, area in zip(spans, areas):
            if area > 3:
                assert any(p[0] >= b[0] - TOL and p[1] >= b[1] - TOL and p[2] <= b[2] + TOL and p[3] <= b[3] + TOL
                           for b, _, _ in every), (k, c, p, [e[0] for e in every])
    _check_dropped_are_small(cls, ref, flip)
    return checked


def _check_dropped_are_small(cls, ref, flip):
    """A box box_candidates dropped shows little of its object: at most 2 px (+ tolerance) across, or at most a
    tenth of its transformed area (the pixels of its colour inside it, with a 1-px rim of slack)."""
    for b, c, kept, (w1, h1), _ in ref:
        if kept:
            continue
        x0, y0, x1, y1 = flipped(b, flip)
        w2, h2 = x1 - x0, y1 - y0
        thin = w2 <= 2 or h2 <= 2
        if not thin:
            assert w2 * h2 <= 0.1 * w1 * h1 or max(w2 / h2, h2 / w2) >= 100, (b, w1, h1)
            region = cls[max(0, int(y0)):math.ceil(y1), max(0, int(x0)):math.ceil(x1)] == c
            assert region.sum() <= 0.1 * w1 * h1 + 2 * (w2 + h2) + 4


def batch_case(data, seed, epoch, aug, n=8, start=0, train=True, epochs=None):
    positions = [(start + j) % len(SIZES) for j in range(n)]
    ids = np.array([1000 * seed + p for p in positions], np.int64)
    geometry = plan_batch(ids, data["sizes"][positions], S, epoch=epoch, seed=seed, aug=aug, train=train,
                          epochs=epochs)
    images = [data["images"][p] for p in positions]
    return geometry, images, positions


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("epoch", [0, 3])
def test_mosaic_boxes_follow_the_pixels(data, seed, epoch):
    geometry, images, positions = batch_case(data, seed, epoch, DetectAugment(**NO_HSV), start=seed)
    assert (geometry.n_tiles == 4).all()
    checked = sum(check_output(render(images, geometry, k), geometry, k, data, positions) for k in range(8))
    assert checked > 8


@pytest.mark.parametrize("n", [1, 2])
def test_a_small_batch_makes_its_mosaics_from_itself(data, n):
    geometry, images, positions = batch_case(data, 11, 0, DetectAugment(**NO_HSV), n=n, start=2)
    for k in range(n):
        assert set(geometry.source[k, :4].tolist()) <= set(range(n))
        if n == 2:
            assert (geometry.source[k, 1:4] == 1 - k).all()  # the other position, three times
        check_output(render(images, geometry, k), geometry, k, data, positions)


@pytest.mark.parametrize("seed", range(4))
def test_without_mosaic_letterbox_then_perspective(data, seed):
    aug = DetectAugment(mosaic=0.0, **NO_HSV)
    geometry, images, positions = batch_case(data, seed, 1, aug)
    assert (geometry.n_tiles == 1).all()
    for k in range(8):
        check_output(render(images, geometry, k), geometry, k, data, positions)


@pytest.mark.parametrize("mosaic", [1.0, 0.0])
@pytest.mark.parametrize("seed", range(3))
def test_rotated_boxes_contain_their_object(data, seed, mosaic):
    aug = DetectAugment(degrees=10.0, mosaic=mosaic, **NO_HSV)
    geometry, images, positions = batch_case(data, seed, 0, aug)
    assert not geometry.axis_aligned
    for k in range(8):
        for t in geometry.tiles(k):  # A = s * rotation(|angle| <= 10 deg) * resize, s in [0.5, 1.5]
            col = t.affine[:, 0]  # s * sx * (cos a, -sin a): cv2.getRotationMatrix2D's first column
            assert abs(math.degrees(math.atan2(-col[1], col[0]))) <= 10 + 1e-9
        img = render(images, geometry, k)
        check_output(img, geometry, k, data, positions, exact=False)
        # the rotated rectangle's hull, from the affine: a box never exceeds it by more than 1 px
        ref = reference_boxes(geometry, k, data, positions)
        tiles = geometry.tiles(k)
        got, _ = transform_boxes(geometry, k, [data["boxes"][positions[t.source]] for t in tiles],
                                 [data["labels"][positions[t.source]] for t in tiles])
        hulls = [flipped(b, geometry.flip[k]) for b, _, kept, _, _ in ref if kept]
        assert len(got) == len(hulls)
        for box, hull in zip(got, hulls):
            assert box[0] >= hull[0] - 1 and box[1] >= hull[1] - 1 and box[2] <= hull[2] + 1 \
                and box[3] <= hull[3] + 1


def test_mosaic_layout_is_ultralytics_mosaic4(data):
    """The four images meet at one point, the canvas centre (xc, yc) ~ U(S/2, 3S/2) through M: the top-left image's
    right and bottom edges, the top-right's left and bottom, and so on; tile 0 is the output's own sample."""
    for seed in range(20):
        geometry, _, _ = batch_case(data, seed, 0, DetectAugment(**NO_HSV))
        for k in range(8):
            tiles = geometry.tiles(k)
            assert tiles[0].source == k
            corners = []
            for i, t in enumerate(tiles):
                w0, h0 = geometry.sizes[t.source]
                x = w0 if i in (0, 2) else 0  # the edge on the centre
                y = h0 if i in (0, 1) else 0
                corners.append(t.affine @ (x, y, 1))
            np.testing.assert_allclose(corners, [corners[0]] * 4, atol=1e-6)
            s = tiles[0].affine[0, 0] * max(geometry.sizes[k]) / S  # RandomPerspective's scale draw
            assert 0.5 - 1e-9 <= s <= 1.5 + 1e-9
            # centre: s * (xc - S) + tx, xc in [S/2, 3S/2], tx in [0.4 S, 0.6 S]
            assert -s * S / 2 + 0.4 * S - 1e-6 <= corners[0][0] <= s * S / 2 + 0.6 * S + 1e-6
            # adjacent tiles share their whole-pixel edge: no gap, no overlap
            d = [t.dst_rect for t in tiles]
            assert d[0][2] == d[1][0] == d[2][2] == d[3][0] and d[0][3] == d[1][3] == d[2][1] == d[3][1]


def test_the_same_draw_gives_the_same_geometry_and_another_epoch_another(data):
    aug = DetectAugment(degrees=5.0, shear=2.0)
    a, _, _ = batch_case(data, 3, 4, aug)
    b, _, _ = batch_case(data, 3, 4, aug)
    c, _, _ = batch_case(data, 3, 5, aug)
    fields = ["n_tiles", "source", "affine", "region", "dst_rect", "src_rect", "quad", "flip", "hsv", "scale", "pad"]
    for f in fields:
        assert np.array_equal(getattr(a, f), getattr(b, f)), f
    assert not np.array_equal(a.affine, c.affine) and not np.array_equal(a.hsv, c.hsv)
    # an output's draws depend on its own sample id, not on where the batch puts it
    d = plan_batch([5, 1000 * 3 + 0], data["sizes"][[5, 0]], S, epoch=4, seed=3, aug=DetectAugment(mosaic=0.0))
    e = plan_batch([1000 * 3 + 0], data["sizes"][[0]], S, epoch=4, seed=3, aug=DetectAugment(mosaic=0.0))
    assert np.array_equal(d.affine[1], e.affine[0]) and d.flip[1] == e.flip[0] and np.array_equal(d.hsv[1], e.hsv[0])


def test_close_mosaic_turns_mosaic_off_for_the_last_epochs(data):
    aug = DetectAugment(close_mosaic=3)
    for epoch in range(10):
        g, _, _ = batch_case(data, 0, epoch, aug, epochs=10)
        assert (g.n_tiles == (1 if epoch >= 7 else 4)).all(), epoch
    g, _, _ = batch_case(data, 0, 9, aug)  # the run's length unknown: mosaic throughout
    assert (g.n_tiles == 4).all()


def test_mosaic_probability_and_flip_and_hsv_draws(data):
    aug = DetectAugment(mosaic=0.5, fliplr=0.5, hsv_h=0.015, hsv_s=0.7, hsv_v=0.4)
    ids = np.arange(2000)
    g = plan_batch(ids, np.tile([640, 480], (2000, 1)), S, epoch=0, seed=1, aug=aug)
    assert 0.45 < (g.n_tiles == 4).mean() < 0.55 and 0.45 < g.flip.mean() < 0.55
    r = (g.hsv - 1) / (0.015, 0.7, 0.4)  # U(-1, 1) each
    assert r.min() >= -1 and r.max() <= 1 and np.all(np.abs(r.mean(0)) < 0.06)


def test_evaluation_letterbox_equals_torchvision(data):
    """train=False: the geometry and boxes equal torchvision.transforms.v2 (Resize to load_image's size, Pad with
    LetterBox's left/top/right/bottom) to 1e-4; the pixels within 1 grey level. Measured: 0 (bit-identical) on
    every size tried; torchvision's uint8 antialiased bilinear resize is a port of PIL's fixed-point one, documented
    to differ by at most 1 level, which is the tolerance here."""
    from torchvision import tv_tensors
    from torchvision.transforms import v2

    rng = np.random.default_rng(3)
    sizes = [(int(rng.integers(20, 900)), int(rng.integers(20, 900))) for _ in range(12)] + [(160, 160), (161, 40)]
    for w0, h0 in sizes:
        pixels = rng.integers(0, 256, (h0, w0, 3), dtype=np.uint8)
        xs, ys = np.sort(rng.uniform(0, w0, (5, 2)), axis=1), np.sort(rng.uniform(0, h0, (5, 2)), axis=1)
        boxes = np.stack([xs[:, 0], ys[:, 0], xs[:, 1], ys[:, 1]], axis=1)
        g = plan_batch([0], [(w0, h0)], S, epoch=0, seed=0, train=False)
        r = S / max(w0, h0)
        w, h = (w0, h0) if r == 1 else (min(math.ceil(w0 * r), S), min(math.ceil(h0 * r), S))
        dw, dh = (S - w) / 2, (S - h) / 2
        pad = [round(dw - 0.1), round(dh - 0.1), round(dw + 0.1), round(dh + 0.1)]
        assert g.scale[0] == pytest.approx(r) and tuple(g.pad[0]) == (pad[0], pad[1])
        tv = v2.Compose([v2.Resize((h, w), interpolation=v2.InterpolationMode.BILINEAR, antialias=True),
                         v2.Pad(pad, fill=114)])
        img_t, box_t = tv(torch.from_numpy(pixels).permute(2, 0, 1).contiguous(),
                          tv_tensors.BoundingBoxes(torch.from_numpy(boxes), format="XYXY", canvas_size=(h0, w0)))
        got_b, _ = transform_boxes(g, 0, [boxes], [np.zeros(5, np.int64)])
        np.testing.assert_allclose(got_b, box_t.numpy(), atol=1e-4)
        mine = render([Image.fromarray(pixels)], g, 0).astype(int)
        theirs = img_t.permute(1, 2, 0).numpy().astype(int)
        assert mine.shape == theirs.shape == (S, S, 3)
        assert np.abs(mine - theirs).max() <= 1, (w0, h0)


def test_evaluation_boxes_and_pixels_pass_the_oracle(data):
    geometry, images, positions = batch_case(data, 0, 0, None, train=False)
    assert (geometry.n_tiles == 1).all() and not geometry.flip.any() and (geometry.hsv == 1).all()
    for k in range(8):
        check_output(render(images, geometry, k), geometry, k, data, positions)


def _jpeg(pixels: np.ndarray) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(np.ascontiguousarray(pixels)).save(buf, "JPEG", quality=95)
    return buf.getvalue()


def test_encoded_sources_render_as_the_decoded_ones(data):
    """Bytes are decoded by the contract: a PNG exactly as the PIL image; a JPEG with draft (DCT downscaling) close
    to its full decode, passing the box oracle, and at the same place to 0.05 px: a 2001 px wide JPEG drafted 1/8 is
    251 px wide, and mapping it by 251 / 2001 instead of the draft's exact 1/8 (or 501 / 2001 for 1/4) moves what
    lies 1701 px from its left edge by 0.6-0.7 draft pixels (0.2-0.4 output pixels here: measured)."""
    geometry, images, _ = batch_case(data, 2, 0, DetectAugment(**NO_HSV))
    png = []
    for im in images:
        buf = io.BytesIO()
        im.save(buf, "PNG")
        png.append(buf.getvalue())
    for k in range(3):
        assert np.array_equal(render(png, geometry, k), render(images, geometry, k))
    pixels, boxes, labels = make_sample(np.random.default_rng(5), 1701, 1501, noise=False)
    strip = np.broadcast_to(PALETTE[0], (1501, 300, 3))  # an object on the right edge
    jpeg = _jpeg(np.concatenate([pixels, strip], axis=1))
    one = {"boxes": [np.vstack([boxes, [(1701, 0, 2001, 1501)]])], "labels": [np.append(labels, 0)]}
    alone = _jpeg(np.concatenate([np.zeros((1501, 1701, 3), np.uint8), strip], axis=1))
    whole, whole_alone = decode_image(jpeg), decode_image(alone)
    aug = DetectAugment(mosaic=0.0, fliplr=0.0, **NO_HSV)
    for seed in range(3):
        g = plan_batch([seed], [(2001, 1501)], S, epoch=0, seed=seed, aug=aug)
        drafted = render([jpeg], g, 0)
        assert np.abs(drafted.astype(int) - render([whole], g, 0)).mean() < 2.0
        check_output(drafted, g, 0, one, [0])
        # the strip's width in output pixels, row by row (red is additive under any resampling filter)
        rows = slice(int(g.dst_rect[0, 0, 1]) + 2, int(g.dst_rect[0, 0, 3]) - 2)
        width = [render([src], g, 0)[rows, :, 0].astype(float).sum(1) / 255 for src in (alone, whole_alone)]
        assert abs(np.median(width[0] - width[1])) < 0.05


def test_decode_image_applies_the_contract():
    rgba = Image.fromarray(np.full((5, 7, 4), (10, 20, 30, 0), np.uint8))
    buf = io.BytesIO()
    rgba.save(buf, "PNG")
    img = decode_image(buf.getvalue())
    assert img.mode == "RGB" and np.array_equal(np.asarray(img)[0, 0], (10, 20, 30))  # alpha dropped
    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90: ignored, the boxes are in the stored pixels
    buf = io.BytesIO()
    Image.new("RGB", (40, 10), (200, 0, 0)).save(buf, "JPEG", exif=exif)
    assert decode_image(buf.getvalue()).size == (40, 10)


def test_hsv_is_ultralytics_random_hsv():
    """apply_hsv against colorsys in floats: hue times r[0] on the circle, saturation and value times their gains,
    clipped, rounded: equal but where the exact value is a rounding tie (x.5, which float32 and float64 round either
    way; a gain like 0.7 makes many), and a gain of 1 changes nothing."""
    import colorsys

    rng = np.random.default_rng(0)
    rgb = rng.integers(0, 256, (24, 24, 3), dtype=np.uint8)
    rgb[0, :6] = [[255, 0, 0], [0, 255, 0], [0, 0, 255], [0, 0, 0], [255, 255, 255], [128, 128, 128]]
    for gains in [(1.0, 1.0, 1.0), (1.01, 0.5, 1.3), (0.99, 1.6, 0.7), (1.015, 1.7, 1.4), (0.987, 1.23, 0.913)]:
        got = apply_hsv(rgb, gains).astype(int)
        exact = np.empty(got.shape)
        for (y, x), _ in np.ndenumerate(rgb[..., 0]):
            h, s, v = colorsys.rgb_to_hsv(*(rgb[y, x] / 255.0))
            h, s, v = (h * gains[0]) % 1.0, min(s * gains[1], 1.0), min(v * gains[2], 1.0)
            exact[y, x] = np.array(colorsys.hsv_to_rgb(h, s, v)) * 255
        differ = got != np.floor(exact + 0.5)
        tie = np.abs(exact - np.floor(exact) - 0.5) < 1e-3
        assert np.abs(got - exact).max() <= 0.5 + 1e-3 and not (differ & ~tie).any(), gains
    assert np.array_equal(apply_hsv(rgb, (1.0, 1.0, 1.0)), rgb)


def test_the_default_render_is_the_exact_one_to_a_level(monkeypatch):
    """render's default (pillow-simd inside each tile, Pillow's fixed point on the edge rows and columns whose
    source rectangle overhangs the image) against exact=True (Pillow's fixed point throughout, what the GPU
    renderer draws to the bit): within a level, on random pixels, where a misplaced strip or a shifted filter would
    show by many levels; mosaic, flipped, up- and downscaled. Without PIL's in-place paste, bit for bit."""
    from fastfeed.detect import render as render_module

    rng = np.random.default_rng(11)
    sizes = np.array([(37, 91), (160, 120), (301, 77), (64, 64), (500, 333), (23, 19), (240, 250), (90, 400)])
    images = [rng.integers(0, 256, (h, w, 3), dtype=np.uint8) for w, h in sizes]
    overhangs = 0
    for epoch in range(3):
        g = plan_batch(np.arange(8) + 8 * epoch, sizes, S, epoch=epoch, seed=3, aug=DetectAugment(**NO_HSV))
        for k in range(8):
            exact = render(images, g, k, exact=True).astype(int)
            assert np.abs(render(images, g, k).astype(int) - exact).max() <= 1, (epoch, k)
            for t in g.tiles(k):
                w, h = sizes[t.source]
                x0, y0, x1, y1 = t.src_rect
                overhangs += x0 < 0 or y0 < 0 or x1 > w or y1 > h
    assert overhangs > 10  # the strips were drawn
    monkeypatch.setattr(render_module, "_PIL_PASTE", False)
    g = plan_batch(np.arange(8), sizes, S, epoch=0, seed=3)
    for k in range(4):
        assert np.array_equal(render(images, g, k), render(images, g, k, exact=True))


def test_decode_rgbx_is_decode_image_in_rgbx():
    """The native RGBX decode of RGB and grey JPEGs (baseline and progressive, 4:2:0 and 4:4:4) is PIL's decode to
    the bit; CMYK JPEGs and other formats go through PIL's: the same pixels either way."""
    from fastfeed.detect.render import decode_rgbx

    rng = np.random.default_rng(2)
    rgb = Image.fromarray(rng.integers(0, 256, (61, 83, 3), dtype=np.uint8))
    cases = []
    for kwargs in ({"quality": 90}, {"quality": 75, "progressive": True}, {"quality": 95, "subsampling": 0}):
        buf = io.BytesIO()
        rgb.save(buf, "JPEG", **kwargs)
        cases.append(buf.getvalue())
    for mode, fmt in (("L", "JPEG"), ("CMYK", "JPEG"), ("RGBA", "PNG")):
        buf = io.BytesIO()
        rgb.convert(mode).save(buf, fmt)
        cases.append(buf.getvalue())
    for data in cases:
        got = decode_rgbx(data)
        assert got.shape == (61, 83, 4) and got.flags.c_contiguous
        assert np.array_equal(got[..., :3], np.asarray(decode_image(data)))
        assert np.array_equal(decode_rgbx(data, native=False)[..., :3], got[..., :3])
    with pytest.raises(Exception):
        decode_rgbx(cases[0][:len(cases[0]) // 2])


def test_sources_decode_as_displayed_into_the_recycled_buffer():
    """decode_for of a JPEG under each EXIF tag, into a buffer of `decoded_nbytes`: PIL's decode turned by the
    contract's own transposes (to the bit), whole and at a draft, RGB and grey; a tag that turns or mirrors the image
    takes twice the stored pixels' room (the stored decode and the displayed copy), and the pixels handed out are a
    view of the buffer either way."""
    from fastfeed.detect.render import decode_for, decoded_nbytes
    from fastfeed.image.contract import TRANSPOSE

    rng = np.random.default_rng(5)
    rgb = np.asarray(Image.fromarray(rng.integers(0, 256, (24, 31, 3), np.uint8)).resize((310, 240)))
    for mode in ("RGB", "L"):
        buf = io.BytesIO()
        Image.fromarray(rgb).convert(mode).save(buf, "JPEG", quality=90)
        data = buf.getvalue()
        for tag in range(1, 9):
            for zoom, draft in ((1.0, None), (0.2, (124, 96))):
                with Image.open(io.BytesIO(data)) as im:
                    if draft:
                        im.draft(mode, draft)
                    want = im.convert("RGB")
                want = np.asarray(want.transpose(TRANSPOSE[tag]) if tag in TRANSPOSE else want)
                shown = (240, 310) if tag >= 5 else (310, 240)
                n = decoded_nbytes(shown, zoom, tag)
                assert n == want.size // 3 * 4 * (1 if tag == 1 else 2), (mode, tag, zoom)
                out = np.empty(n, np.uint8)
                got = decode_for(data, shown, zoom, tag, out=out)
                assert np.shares_memory(got.rgbx, out) and got.rgbx.flags.c_contiguous, (mode, tag, zoom)
                assert np.array_equal(got.rgbx[..., :3], want), (mode, tag, zoom)
                assert (got.width, got.height) == shown


def test_the_last_pass_is_the_in_place_hsv_mirrored_and_laid_out():
    """finish (the CPU renderer's last pass): exactly apply_hsv_inplace's pixels of the canvas's RGB bytes, mirrored
    when flipped, interleaved or planar; without gains (or gains of 1) exactly the input; wrong layouts refused."""
    from fastfeed.detect.hsv import apply_hsv_inplace, finish

    rng = np.random.default_rng(3)
    rgbx = rng.integers(0, 256, (37, 29, 4), dtype=np.uint8)
    for gains in [(1.01, 0.5, 1.3), (0.99, 1.6, 0.7), (1.0, 1.0, 1.0), None]:
        want = rgbx[..., :3].copy()
        if gains is not None:
            apply_hsv_inplace(want, gains)
        for flip in (False, True):
            mirrored = want[:, ::-1] if flip else want
            planar, interleaved = np.empty((3, 37, 29), np.uint8), np.empty((37, 29, 3), np.uint8)
            finish(rgbx, planar, gains, flip, planar=True)
            finish(rgbx, interleaved, gains, flip, planar=False)
            assert np.array_equal(planar, mirrored.transpose(2, 0, 1)), (gains, flip)
            assert np.array_equal(interleaved, mirrored), (gains, flip)
    with pytest.raises(ValueError, match="output"):
        finish(rgbx, np.empty((37, 29, 3), np.uint8), None, False, planar=True)
    with pytest.raises(ValueError, match="canvas"):
        finish(rgbx[..., :3].copy(), np.empty((37, 29, 3), np.uint8), None, False, planar=False)


def test_render_applies_flip_and_hsv_after_the_geometry(data):
    aug = DetectAugment(fliplr=1.0, hsv_h=0.0, hsv_s=0.5, hsv_v=0.3)
    geometry, images, _ = batch_case(data, 4, 0, aug)
    plain = plan_batch(np.arange(8) + 4000, data["sizes"], S, epoch=0, seed=4, aug=DetectAugment(fliplr=0.0, **NO_HSV))
    assert geometry.flip.all()
    for k in range(2):
        assert np.array_equal(geometry.affine[k], plain.affine[k])
        want = apply_hsv(render(images, plain, k)[:, ::-1], geometry.hsv[k])
        assert np.array_equal(render(images, geometry, k), want)


@pytest.mark.parametrize("field, value", [("mosaic", 1.5), ("degrees", -1.0), ("translate", 2.0), ("scale", 1.0),
                                          ("shear", 90.0), ("fliplr", -0.1), ("hsv_h", 1.5), ("hsv_s", float("nan")),
                                          ("hsv_v", "0.4"), ("close_mosaic", -1), ("close_mosaic", 2.5),
                                          ("pad_value", 256), ("pad_value", True)])
def test_every_field_is_checked(field, value):
    with pytest.raises(ValueError, match=field):
        DetectAugment(**{field: value})


def test_plan_batch_checks_its_arguments(data):
    with pytest.raises(ValueError, match="size"):
        plan_batch([0, 1], [(10, 10)], S, epoch=0, seed=0)
    with pytest.raises(ValueError, match="width"):
        plan_batch([0], [(0, 10)], S, epoch=0, seed=0)
    g = plan_batch([0], [(10, 10)], S, epoch=0, seed=0)
    with pytest.raises(ValueError, match="tiles"):
        transform_boxes(g, 0, [np.zeros((0, 4))], [np.zeros(0)])


def test_the_batched_hsv_for_the_gpu_is_the_cpu_one_to_a_level():
    import torch

    from fastfeed.detect.hsv import apply_hsv_inplace, apply_hsv_torch

    rng = np.random.default_rng(1)
    x = rng.integers(0, 256, (4, 48, 48, 3), dtype=np.uint8)
    x[0, 0, :6] = [[255, 0, 0], [0, 255, 0], [0, 0, 255], [0, 0, 0], [255, 255, 255], [128, 128, 128]]
    gains = np.array([[1.01, 0.5, 1.3], [0.99, 1.6, 0.7], [1.0, 1.0, 1.0], [1.015, 1.7, 1.4]])
    want = x.copy()
    for k in range(4):
        apply_hsv_inplace(want[k], gains[k])
    got = apply_hsv_torch(torch.from_numpy(x).permute(0, 3, 1, 2), torch.from_numpy(gains)).permute(0, 2, 3, 1)
    diff = np.abs(got.numpy().astype(int) - want.astype(int))
    assert diff.max() <= 1 and (diff > 0).mean() < 0.02
    assert np.array_equal(got[2].numpy(), x[2])


def test_the_numba_resize_is_pils_to_a_level():
    """fastfeed/detect/resample.py against PIL's own `resize(size, BILINEAR, box=...)` (pillow-simd or Pillow: their
    fixed-point rounding differs by a level), up and down, whole and partial boxes."""
    from fastfeed.detect.resample import resize_into

    rng = np.random.default_rng(7)
    for trial in range(60):
        h, w = (int(v) for v in rng.integers(3, 200, 2))
        src = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
        ow, oh = (int(v) for v in rng.integers(1, 260, 2))
        x0, y0 = rng.uniform(0, w - 1), rng.uniform(0, h - 1)
        box = (0.0, 0.0, float(w), float(h)) if trial % 4 == 0 else (
            x0, y0, rng.uniform(x0 + 0.5, w), rng.uniform(y0 + 0.5, h))
        want = np.asarray(Image.fromarray(src).resize((ow, oh), Image.BILINEAR, box=box)).astype(int)
        got = np.zeros((oh, ow, 3), np.uint8)
        resize_into(src, box, got)
        assert np.abs(got.astype(int) - want).max() <= 1, (h, w, ow, oh, box)


@pytest.mark.parametrize("train,aug", [(True, DetectAugment()), (True, DetectAugment(mosaic=0.0)),
                                       (False, DetectAugment())])
def test_the_batch_box_transform_is_the_per_output_one_to_the_bit(train, aug):
    """transform_batch_boxes (the decoders' one pass) against transform_boxes output by output, crowd regions left
    out as Targets.of leaves them out, negatives included."""
    from fastfeed.targets import Targets

    rng = np.random.default_rng(5)
    n_samples, B, S = 40, 16, 96
    counts = rng.integers(0, 6, n_samples)
    start = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    xy = rng.uniform(-10, 150, (start[-1], 2))
    boxes = np.concatenate([xy, xy + rng.uniform(0.5, 60, (start[-1], 2))], axis=1).astype(np.float32)
    targets = Targets(boxes=boxes, labels=rng.integers(0, 5, start[-1]).astype(np.int64),
                      iscrowd=rng.random(start[-1]) < 0.2, start=start)
    for epoch in range(3):
        ids = rng.choice(n_samples, B, replace=False)
        g = plan_batch(ids, rng.integers(100, 400, (B, 2)), S, epoch=epoch, seed=1, aug=aug, train=train)
        got_boxes, got_labels, got_idx = transform_batch_boxes(g, ids, targets.trainable())
        want = []
        for k in range(B):
            objects = [targets.of(int(ids[t.source])) for t in g.tiles(k)]
            b, lab = transform_boxes(g, k, [o[0] for o in objects], [o[1] for o in objects])
            want.append((b, lab, np.full(len(lab), k)))
        assert len(got_boxes) > 10
        assert np.array_equal(got_boxes, np.concatenate([w[0] for w in want]))
        assert np.array_equal(got_labels, np.concatenate([w[1] for w in want]))
        assert np.array_equal(got_idx, np.concatenate([w[2] for w in want]))


def test_a_batchs_draws_are_each_samples_generator_to_the_bit():
    """streams.first_draws (numpy's SeedSequence and PCG64, compiled) against numpy itself:
    random entropy words of 0, 1 and 2 32-bit words (1-8 words a row, past SeedSequence's pool of 4), and a batch's
    rows with negative or huge seeds and sample ids."""
    from fastfeed.detect.geometry import sample_entropy, sample_rng
    from fastfeed.detect.streams import first_draws

    rng = np.random.default_rng(11)
    for words in (1, 2, 4, 5, 8):
        choices = [0, 1, 2 ** 32 - 1, 2 ** 32, 2 ** 64 - 1]
        rows = [[choices[int(rng.integers(len(choices)))] if rng.random() < 0.3
                 else int(rng.integers(0, 2 ** 63)) * 2 + 1 for _ in range(words)] for _ in range(300)]
        got = first_draws(np.array(rows, dtype=np.uint64), 23)
        for row, g in zip(rows, got):
            assert np.array_equal(g, np.random.default_rng(np.random.SeedSequence(row)).random(23)), row
    ids = np.array([0, 1, 7, 2 ** 40 + 3, 2 ** 63 - 1, -5])
    for seed, epoch in ((0, 0), (123, 9), (-1, 2 ** 64 + 5)):
        want = np.stack([sample_rng(seed, epoch, int(i)).random(17) for i in ids])
        assert np.array_equal(first_draws(sample_entropy(seed, epoch, ids), 17), want)
    with pytest.raises(ValueError):
        first_draws(np.array([[1, -2]]), 3)


def _numpy_crop_window(rng, w0, h0, boxes):
    """The IoU crop's sampler in numpy's array form (as it was first written): the reference the compiled one must
    equal, window for window and draw for draw."""
    from fastfeed.detect.iou_crop import ASPECT, MAX_DRAWS, OPTIONS, SCALE, TRIALS

    if not len(boxes):
        return 0, 0, w0, h0
    cx, cy = (boxes[:, 0] + boxes[:, 2]) / 2, (boxes[:, 1] + boxes[:, 3]) / 2
    area = (boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])
    for _ in range(MAX_DRAWS):
        least = OPTIONS[int(rng.integers(len(OPTIONS)))]
        if least is None:
            return 0, 0, w0, h0
        u = rng.random((TRIALS, 4))
        r = SCALE[0] + (SCALE[1] - SCALE[0]) * u[:, :2]
        w, h = (w0 * r[:, 0]).astype(np.int64), (h0 * r[:, 1]).astype(np.int64)
        left, top = ((w0 - w) * u[:, 2]).astype(np.int64), ((h0 - h) * u[:, 3]).astype(np.int64)
        right, bottom = left + w, top + h
        within = (left[:, None] < cx) & (cx < right[:, None]) & (top[:, None] < cy) & (cy < bottom[:, None])
        iw = np.clip(np.minimum(right[:, None], boxes[:, 2]) - np.maximum(left[:, None], boxes[:, 0]), 0, None)
        ih = np.clip(np.minimum(bottom[:, None], boxes[:, 3]) - np.maximum(top[:, None], boxes[:, 1]), 0, None)
        inter = iw * ih
        with np.errstate(divide="ignore", invalid="ignore"):
            iou = inter / ((w * h)[:, None] + area - inter)
            aspect = w / np.maximum(h, 1)
        ok = ((w > 0) & (h > 0) & (ASPECT[0] <= aspect) & (aspect <= ASPECT[1]) & within.any(axis=1)
              & (np.where(within, iou, -1.0).max(axis=1) >= least))
        hit = np.flatnonzero(ok)
        if len(hit):
            t = int(hit[0])
            return int(left[t]), int(top[t]), int(w[t]), int(h[t])
    return 0, 0, w0, h0


def _window(seed, epoch, i, w0, h0, boxes, skip=0):
    """iou_crop.crop_windows for one output: sample i's stream past `skip` draws."""
    from fastfeed.detect.geometry import sample_entropy
    from fastfeed.detect.iou_crop import crop_windows

    got = crop_windows(sample_entropy(seed, epoch, [i]), skip, [(w0, h0)], boxes, [0, len(boxes)], [0])
    return tuple(int(v) for v in got[0])


def test_the_compiled_iou_crop_sampler_is_the_array_form_on_numpys_generator():
    """iou_crop.crop_windows (numba, numpy's generator compiled: streams.py) against the array form above drawing
    from the sample's own numpy Generator (geometry.sample_rng, past its 17 fixed draws), on images from 1 px to
    2,000 px with 0-12 boxes (tiny, huge, on the edges): the same windows, several outputs in one call too."""
    from fastfeed.detect.geometry import sample_entropy, sample_rng
    from fastfeed.detect.iou_crop import crop_windows

    rng = np.random.default_rng(7)
    cases = []
    for i in range(3000):
        w0, h0 = (int(v) for v in rng.integers(1, 2000, 2))
        n = int(rng.integers(0, 13))
        a = rng.uniform(0, 1, (n, 2)) * (w0, h0)
        b = a + rng.uniform(0, 1, (n, 2)) ** 3 * (w0, h0)
        boxes = np.concatenate([a, np.minimum(b, (w0, h0))], axis=1)
        want_rng = sample_rng(3, 1, i)
        want_rng.random(17)
        want = _numpy_crop_window(want_rng, w0, h0, boxes)
        assert _window(3, 1, i, w0, h0, boxes, skip=17) == want, i
        cases.append((w0, h0, boxes, want))
    picked = np.arange(0, 3000, 7)
    start = np.cumsum([0] + [len(cases[i][2]) for i in picked])
    got = crop_windows(sample_entropy(3, 1, picked), 17, [cases[i][:2] for i in picked],
                       np.concatenate([cases[i][2] for i in picked]), start, np.arange(len(picked)))
    assert [tuple(w) for w in got.tolist()] == [cases[i][3] for i in picked]


def test_iou_crop_windows_follow_the_ssd_sampler():
    """fastfeed/detect/iou_crop.py: every window lies in its image, keeps 30-100% of each side at an aspect ratio
    in [0.5, 2] and holds a box's centre; the whole image is kept when "no crop" is drawn (1 option in 7) before an
    option a window meets; a window is a function of the sample's stream; an image without boxes is kept whole."""
    rng = np.random.default_rng(0)
    whole, best = 0, []
    for i in range(400):
        w0, h0 = int(rng.integers(50, 800)), int(rng.integers(50, 800))
        xy = rng.uniform(0, 0.5, (int(rng.integers(1, 6)), 2)) * (w0, h0)
        boxes = np.concatenate([xy, xy + rng.uniform(0.1, 0.5, xy.shape) * (w0, h0)], axis=1)
        L, T, W, H = _window(1, 0, i, w0, h0, boxes)
        assert (L, T, W, H) == _window(1, 0, i, w0, h0, boxes)
        assert 0 <= L and 0 <= T and L + W <= w0 and T + H <= h0
        if (L, T, W, H) == (0, 0, w0, h0):
            whole += 1
            continue
        assert W >= int(0.3 * w0) and H >= int(0.3 * h0) and 0.5 <= W / H <= 2
        cx, cy = (boxes[:, 0] + boxes[:, 2]) / 2, (boxes[:, 1] + boxes[:, 3]) / 2
        within = (L < cx) & (cx < L + W) & (T < cy) & (cy < T + H)
        assert within.any()
        iw = np.clip(np.minimum(L + W, boxes[:, 2]) - np.maximum(L, boxes[:, 0]), 0, None)
        ih = np.clip(np.minimum(T + H, boxes[:, 3]) - np.maximum(T, boxes[:, 1]), 0, None)
        area = (boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])
        best.append(float((iw * ih / (W * H + area - iw * ih))[within].max()))
    assert 0.1 < whole / 400 < 0.4
    assert np.mean(np.array(best) >= 0.5) > 0.1  # the higher IoU options are met too, not only "any overlap"
    assert _window(1, 0, 0, 300, 200, np.zeros((0, 4))) == (0, 0, 300, 200)
    with pytest.raises(ValueError, match="objects="):
        plan_batch([0], [(300, 200)], 64, epoch=0, seed=0, aug=DetectAugment(mosaic=0.0, iou_crop=1.0))
    with pytest.raises(ValueError, match="iou_crop"):
        DetectAugment(iou_crop=1.5)
