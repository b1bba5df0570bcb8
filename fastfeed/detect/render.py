"""The CPU renderer: executes a `BatchGeometry` (fastfeed/detect/geometry.py) on decoded images.

Per output: a canvas of pad_value; each tile resampled ONCE from its source image through the tile's affine
(source pixels -> output pixels, pixel edges at integers, as the boxes are transformed):
  - axis-aligned (degrees = shear = 0, the default, and evaluation): PIL's antialiased bilinear
    `resize(dst size, box=src_rect)`, computed by fastfeed/detect/resample.py straight into the whole-pixel
    destination rectangle, off the GIL. A source rectangle may overhang the image by under half an output pixel
    (the pixels whose centres lie inside are drawn): the filter reads the pixels inside, renormalised;
  - otherwise `Image.transform(AFFINE, BILINEAR)` of the tile's source crop (edges repeated, so bilinear never
    blends in a fill colour), reduced first by a whole factor where the affine shrinks it over 2x (transform has no
    antialiasing), and masked to the pixels whose centres lie in the tile's destination quadrilateral.
Then the horizontal flip and ultralytics' RandomHSV. Encoded sources (bytes) are decoded here with JPEG `draft`
(DCT-domain downscaling) where every tile of that source keeps >= 2 source pixels per output pixel, as
fastfeed/decode/cpu.py does for classification.
"""
from __future__ import annotations

import io
import math

import numpy as np
from PIL import Image

from fastfeed.detect.geometry import BatchGeometry
from fastfeed.detect.hsv import apply_hsv_inplace
from fastfeed.detect.resample import resize_into
from fastfeed.image.contract import to_rgb
from fastfeed.image.headers import png_text_over_limit, without_png_text

__all__ = ["render", "decode_image", "apply_hsv", "quad_inside", "DRAFT_MIN_SCALE"]

# Draft only while every tile keeps at least this many source pixels per output pixel (decode/cpu.py's default).
DRAFT_MIN_SCALE = 2.0


def decode_image(data, draft_size: tuple[int, int] | None = None) -> Image.Image:
    """Encoded bytes -> a loaded RGB PIL image by the decode contract (fastfeed/image/contract.py): any mode to RGB,
    the first frame, EXIF orientation ignored (the stored pixels, which the boxes are in). draft_size: let a JPEG
    decode at the smallest 1/2, 1/4, 1/8 scale still at least that size (`Image.draft`). Raises on bad data."""
    # PIL raises on truncated data (ImageFile.LOAD_TRUNCATED_IMAGES stays False), so a cut record is reported.
    return _decode(data, draft_size)[0]


def _decode(data, draft_size) -> tuple[Image.Image, float, tuple[int, int]]:
    """(decode_image's image, the draft's scale: 1, 1/2, 1/4 or 1/8, the full-size image's size)."""
    try:
        return _decode_as_is(data, draft_size)
    except ValueError as e:  # PIL's text-chunk limit: the pixels decode without the text (image/headers.py)
        if not png_text_over_limit(e):
            raise
        return _decode_as_is(without_png_text(data), draft_size)


def _decode_as_is(data, draft_size) -> tuple[Image.Image, float, tuple[int, int]]:
    img = Image.open(io.BytesIO(memoryview(data)))
    scale, full = 1.0, img.size
    if draft_size is not None and img.format == "JPEG":
        w0 = img.size[0]
        got = img.draft("RGB", draft_size)
        if got is not None:
            # libjpeg's scaled decode makes one pixel of each 2, 4 or 8 source pixels (the last one partial): the
            # scale is that factor, not the ratio of the rounded-up sizes
            scale = got[1][2] / w0
    img.load()
    return to_rgb(img), scale, full


def render(images, geometry: BatchGeometry, k: int, hsv: bool = True, out: np.ndarray | None = None) -> np.ndarray:
    """Output k of `geometry` as uint8 [S, S, 3] RGB, into `out` when given. images: the batch's sources by
    position, each a decoded uint8 [h, w, 3] array or PIL image (by the contract, `decode_image`) or the encoded
    bytes, decoded (with draft) by this call for this output alone: a batch whose outputs share sources (mosaic)
    decodes once and passes the arrays. hsv=False leaves the HSV gains to the caller (a GPU does them for the whole
    batch: fastfeed/detect/hsv.py)."""
    S = geometry.image_size
    canvas = np.empty((S, S, 3), dtype=np.uint8) if out is None else out
    canvas[...] = geometry.pad_value
    tiles = geometry.tiles(k)
    sources = {}
    for t in tiles:
        if t.source not in sources:
            sources[t.source] = _source(images[t.source], geometry.sizes[t.source],
                                        [u for u in tiles if u.source == t.source])
    # The flip is done by the resize that paints each tile (mirrored place and columns): no pass of its own.
    flip = bool(geometry.flip[k])
    for t in tiles:
        img, fx, fy = sources[t.source]
        X0, Y0, X1, Y1 = t.dst_rect
        if X1 <= X0 or Y1 <= Y0:
            continue
        if geometry.axis_aligned:
            x0, y0, x1, y1 = t.src_rect
            dst = canvas[Y0:Y1, S - X1:S - X0] if flip else canvas[Y0:Y1, X0:X1]
            resize_into(_array(img), (x0 * fx, y0 * fy, x1 * fx, y1 * fy), dst, flip)
        else:
            _warp_into(canvas, _pil(img), fx, fy, t, flip)
    gains = geometry.hsv[k]
    if hsv and (gains != 1).any():
        apply_hsv_inplace(canvas, gains)
    return canvas


def _array(img) -> np.ndarray:
    return img if isinstance(img, np.ndarray) else np.asarray(img)


def _pil(img) -> Image.Image:
    return Image.fromarray(img) if isinstance(img, np.ndarray) else img


def _zoom(tile) -> float:
    """The most output pixels one source pixel becomes along any direction (the affine's largest singular value)."""
    return float(np.linalg.svd(tile.affine[:, :2], compute_uv=False)[0])


def _source(image, size, tiles) -> tuple[Image.Image | np.ndarray, float, float]:
    """(image, fx, fy): the source decoded (bytes: with the draft every tile allows) and the factors from the
    stored size's pixels, which the geometry is in, to this image's (a draft, or a header that disagreed)."""
    W0, H0 = (int(v) for v in size)
    if isinstance(image, np.ndarray):
        return image, image.shape[1] / W0, image.shape[0] / H0
    if isinstance(image, Image.Image):
        img = to_rgb(image)
        return img, img.size[0] / W0, img.size[1] / H0
    f = DRAFT_MIN_SCALE * max(_zoom(t) for t in tiles)
    draft = (max(1, math.ceil(W0 * f)), max(1, math.ceil(H0 * f))) if f < 1 else None
    img, scale, (w, h) = _decode(image, draft)
    if scale != 1:
        return img, scale * w / W0, scale * h / H0
    return img, img.size[0] / W0, img.size[1] / H0


def _warp_into(canvas: np.ndarray, img: Image.Image, fx: float, fy: float, tile, flip: bool) -> None:
    """Paint a rotated or sheared tile: the affine through `Image.transform`, masked to its quadrilateral (and
    mirrored when the output is flipped)."""
    X0, Y0, X1, Y1 = tile.dst_rect
    W, H = img.size
    rx0, ry0, rx1, ry1 = tile.region
    # output px per image px, at its largest: reduce by a whole factor first where it shrinks the image over 2x
    zoom = _zoom(tile) / min(fx, fy)
    n = max(1, int(1 / zoom)) if zoom < 0.5 else 1
    m = 2 * n + 2  # the crop's margin around the visible region, for the bilinear reads at its edge
    cx0, cy0 = max(0, math.floor(rx0 * fx) - m), max(0, math.floor(ry0 * fy) - m)
    cx1, cy1 = min(W, math.ceil(rx1 * fx) + m), min(H, math.ceil(ry1 * fy) + m)
    crop = img.crop((cx0, cy0, cx1, cy1))
    if n > 1:
        crop = crop.reduce(n)
    e = 2  # repeated edge pixels
    arr = np.pad(np.asarray(crop), ((e, e), (e, e), (0, 0)), mode="edge")
    # output pixels -> padded crop pixels: inverse affine, then the stored-size -> image, crop, reduce, pad steps
    A = np.vstack([tile.affine, (0, 0, 1)])
    to_crop = np.array([[fx / n, 0, -cx0 / n + e], [0, fy / n, -cy0 / n + e], [0, 0, 1]])
    inv = to_crop @ np.linalg.inv(A) @ np.array([[1, 0, X0], [0, 1, Y0], [0, 0, 1]])
    w, h = X1 - X0, Y1 - Y0
    out = np.asarray(Image.fromarray(arr).transform((w, h), Image.AFFINE, tuple(inv[:2].ravel()), Image.BILINEAR))
    inside = quad_inside(tile)
    if flip:
        S = canvas.shape[1]
        np.copyto(canvas[Y0:Y1, S - X1:S - X0], out[:, ::-1], where=inside[:, ::-1, None])
    else:
        np.copyto(canvas[Y0:Y1, X0:X1], out, where=inside[:, :, None])


def quad_inside(tile) -> np.ndarray:
    """bool [h, w] over the tile's destination rectangle: the pixels whose centres lie in its quadrilateral."""
    X0, Y0, X1, Y1 = tile.dst_rect
    h = Y1 - Y0
    # The quad is convex: on each row, the centres inside form one run [lo, hi] where every edge's half-plane
    # (inner side by the affine's orientation) holds.
    yc = np.arange(Y0, Y1, dtype=np.float64) + 0.5
    lo, hi = np.full(h, -np.inf), np.full(h, np.inf)
    sign = 1.0 if np.linalg.det(tile.affine[:, :2]) > 0 else -1.0
    q = tile.quad
    for i in range(4):
        (ax, ay), (bx, by) = q[i], q[(i + 1) % 4]
        cx = -sign * (by - ay)  # inside: cx * x + c0 >= 0
        c0 = sign * ((bx - ax) * (yc - ay) + (by - ay) * ax)
        if cx > 0:
            lo = np.maximum(lo, -c0 / cx)
        elif cx < 0:
            hi = np.minimum(hi, -c0 / cx)
        else:
            hi = np.where(c0 >= 0, hi, -np.inf)
    cols = np.arange(X0, X1, dtype=np.float64) + 0.5
    return (cols >= lo[:, None]) & (cols <= hi[:, None])


def apply_hsv(rgb: np.ndarray, gains) -> np.ndarray:
    """ultralytics' RandomHSV with gains r (hue, saturation, value) on uint8 [h, w, 3] RGB, as a new array: the hue
    turned by r[0] on the circle, saturation and value times their gains, clipped (fastfeed/detect/hsv.py)."""
    out = np.array(rgb, dtype=np.uint8, order="C", copy=True)
    apply_hsv_inplace(out, gains)
    return out
