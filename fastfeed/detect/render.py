"""The CPU renderer: executes a `BatchGeometry` (fastfeed/detect/geometry.py) on decoded images.

Per output: a canvas of pad_value, RGBX (PIL's own layout for RGB, so PIL draws into it in place); each tile
resampled ONCE from its source image through the tile's affine (source pixels -> output pixels, pixel edges at
integers, as the boxes are transformed):
  - axis-aligned (degrees = shear = 0, the default, and evaluation): the antialiased bilinear resize of the exact
    source rectangle into the whole-pixel destination rectangle: pillow-simd's `resize(size, BILINEAR, box=...)`,
    pasted in place, for the pixels whose filter window starts inside the image; Pillow's own fixed point
    (fastfeed/detect/resample.py, numba) for the edge rows and columns whose source rectangle overhangs the image
    (by under half an output pixel: the pixels whose centres lie inside are drawn; PIL refuses such a box), and
    for the whole tile with `exact=True` (what the GPU renderer computes to the bit; pillow-simd rounds its
    fixed point differently, by a level at most);
  - otherwise `Image.transform(AFFINE, BILINEAR)` of the tile's source crop (edges repeated, so bilinear never
    blends in a fill colour), reduced first by a whole factor where the affine shrinks it over 2x (transform has no
    antialiasing), and masked to the pixels whose centres lie in the tile's destination quadrilateral.
Then one pass (fastfeed/detect/hsv.py `finish`) mirrors the canvas for the flips, applies ultralytics'
RandomHSV and writes the output, interleaved or planar. Encoded sources (bytes) are decoded here with JPEG `draft`
(DCT-domain downscaling) where every tile of that source keeps >= 2 source pixels per output pixel, as
fastfeed/decode/cpu.py does for classification; an RGB or grey JPEG, drafted or not, is decoded by the native core
straight into RGBX, at the scale PIL's draft would pick (its pixels to the bit; `decode_rgbx`, `draft_denominator`).
"""
from __future__ import annotations

import io
import math
import threading
from typing import NamedTuple

import numpy as np
from PIL import Image

from fastfeed.decode.cpu import whole_jpeg_rgbx, whole_png_rgbx
from fastfeed.detect.geometry import BatchGeometry
from fastfeed.detect.hsv import apply_hsv_inplace, finish
from fastfeed.detect.resample import resize_into
from fastfeed.image.contract import to_rgb
from fastfeed.image.headers import pil_read, swaps_axes

__all__ = ["Decoded", "decode_for", "decoded_nbytes", "draft_denominator", "source_zooms", "displayed", "render",
           "decode_image", "decode_rgbx", "apply_hsv", "quad_inside", "DRAFT_MIN_SCALE"]

# Draft only while every tile keeps at least this many source pixels per output pixel (decode/cpu.py's default).
DRAFT_MIN_SCALE = 2.0


def _paste_writes_the_buffer() -> bool:
    """Whether a paste into a PIL image that wraps a numpy buffer (`Image.frombuffer`, RGBX: shared memory) writes
    that buffer. It does in Pillow and pillow-simd (the core image points at the buffer; the core paste makes no
    copy); were that to change, the renderer draws with numpy and numba alone (slower, the same pixels as exact)."""
    buf = np.zeros((2, 2, 4), np.uint8)
    try:
        _wrap(buf).im.paste(Image.new("RGB", (1, 1), (1, 2, 3)).im, (1, 1, 2, 2))
    except Exception:  # noqa: BLE001 - any failure means: do not rely on it
        return False
    return buf[1, 1, :3].tolist() == [1, 2, 3] and not buf[0].any()


def _wrap(rgbx: np.ndarray) -> Image.Image:
    """A PIL RGBX image sharing the memory of a C-contiguous uint8 [h, w, 4] array."""
    return Image.frombuffer("RGBX", (rgbx.shape[1], rgbx.shape[0]), rgbx, "raw", "RGBX", 0, 1)


_PIL_PASTE = _paste_writes_the_buffer()
_CANVAS = threading.local()  # each renderer thread's canvas, reused output after output


def decode_image(data, draft_size: tuple[int, int] | None = None) -> Image.Image:
    """Encoded bytes -> a loaded RGB PIL image by the decode contract (fastfeed/image/contract.py): any mode to RGB,
    the first frame, EXIF orientation ignored (the stored pixels; `displayed` turns them). draft_size: let a JPEG
    decode at the smallest 1/2, 1/4, 1/8 scale still at least that size (`Image.draft`). Raises on bad data."""
    # PIL raises on truncated data (ImageFile.LOAD_TRUNCATED_IMAGES stays False), so a cut record is reported.
    return _decode(data, draft_size)[0]


def decode_rgbx(data, native: bool = True) -> np.ndarray:
    """Encoded bytes -> uint8 [h, w, 4] RGBX (the fourth byte unused): `decode_image`'s pixels, an RGB or grey JPEG
    decoded by the native core straight into this layout unless `native` is False (a sample kept for PIL's decode
    alone). Raises on bad data."""
    return _to_rgbx(_decode(data, None, native=native)[0])


# EXIF orientation tag -> the view of an [h, w, C] array that displays it (contract.TRANSPOSE's PIL operations).
_DISPLAY = {2: lambda a: a[:, ::-1], 3: lambda a: a[::-1, ::-1], 4: lambda a: a[::-1],
            5: lambda a: a.transpose(1, 0, 2), 6: lambda a: a[::-1].transpose(1, 0, 2),
            7: lambda a: a[::-1, ::-1].transpose(1, 0, 2), 8: lambda a: a[:, ::-1].transpose(1, 0, 2)}


def displayed(pixels: np.ndarray, tag: int, out: np.ndarray | None = None) -> np.ndarray:
    """A decoded [h, w, C] image as its EXIF orientation `tag` displays it (C-contiguous; as it is for tag 1 or an
    unknown tag, as the decode contract treats one); a copy into `out` (uint8, from its start) when it fits."""
    view = _DISPLAY.get(int(tag))
    if view is None:
        return pixels
    words = pixels.dtype == np.uint8 and pixels.shape[2] == 4 and pixels.flags.c_contiguous
    # RGBX moved as one 4-byte word a pixel: numpy's transposed copy of single bytes is 8x slower
    shown = view(pixels.view(np.uint32)) if words else view(pixels)
    if out is not None and out.nbytes >= pixels.nbytes:
        copy = out[:pixels.nbytes].view(shown.dtype).reshape(shown.shape)
        np.copyto(copy, shown)
    else:
        copy = np.ascontiguousarray(shown)
    return copy.view(np.uint8) if words else copy


class Decoded(NamedTuple):
    """A batch source decoded once for all the tiles that show it: RGBX pixels (a JPEG maybe at a DCT-scaled draft),
    the factors from the geometry's pixels to these (fx, fy), the full-size image's (width, height) as the decoder
    displays it, which must be the sample table's, and a PIL image sharing the pixels' memory (wrapped once for its
    four tiles: the renderer's threads hold the GIL while they wrap)."""

    rgbx: np.ndarray
    fx: float
    fy: float
    width: int
    height: int
    image: Image.Image


def source_zooms(geometry: BatchGeometry) -> np.ndarray:
    """float64 [B]: for each batch position, the most output pixels one of its source pixels becomes in any tile that
    shows it (the tiles' affines' largest singular values; 0 for a position no tile shows)."""
    used = np.arange(geometry.source.shape[1])[None, :] < geometry.n_tiles[:, None]
    linear = geometry.affine[used][:, :, :2]
    zoom = np.linalg.svd(linear, compute_uv=False)[:, 0] if len(linear) else np.zeros(0)
    out = np.zeros(len(geometry), np.float64)
    np.maximum.at(out, geometry.source[used], zoom)
    return out


def decode_for(data, size: tuple[int, int], zoom: float, tag: int = 1, native: bool = True,
               out: np.ndarray | None = None) -> Decoded:
    """`data` decoded for tiles that magnify it by at most `zoom` (output px per pixel of the geometry, whose image is
    `size` (width, height) as displayed): a JPEG at the smallest DCT scale that keeps DRAFT_MIN_SCALE source pixels
    per output pixel (as `render` drafts encoded sources), shown by its EXIF `tag` (`displayed`). An RGB or grey JPEG
    the native core decodes whole goes into `out` (uint8, from its start) when it fits; one its tag turns or
    mirrors is decoded into `out`'s second half and displayed into its first (`decoded_nbytes` counts both).
    Raises on bad data."""
    W0, H0 = (int(v) for v in size)
    stored = (H0, W0) if swaps_axes(tag) else (W0, H0)  # the draft is asked of the stored image
    shown_out = None
    if out is not None and int(tag) in _DISPLAY:
        half = len(out) // 2
        shown_out, out = out[:half], out[half:]
    img, scale, (w, h) = _decode(data, _draft_size(stored, zoom), native=native, out=out, stored=stored)
    rgbx = displayed(_to_rgbx(img), tag, shown_out)
    if swaps_axes(tag):
        w, h = h, w
    return Decoded(rgbx, scale * w / W0, scale * h / H0, w, h, _wrap(rgbx))


def _draft_size(stored: tuple[int, int], zoom: float) -> tuple[int, int] | None:
    """The size to ask a JPEG's draft for, for tiles that magnify its stored image (width, height) by at most
    `zoom`: DRAFT_MIN_SCALE source pixels per output pixel; None when that is the full size or more."""
    f = DRAFT_MIN_SCALE * zoom
    if f >= 1:
        return None
    return max(1, math.ceil(stored[0] * f)), max(1, math.ceil(stored[1] * f))


def draft_denominator(stored: tuple[int, int], draft_size: tuple[int, int] | None) -> int:
    """The DCT scale (1, 2, 4 or 8) PIL's `draft(mode, draft_size)` picks for a JPEG of that stored size: the largest
    that keeps the image at least draft_size (JpegImagePlugin.draft's rule)."""
    if draft_size is None:
        return 1
    scale = min(stored[0] // draft_size[0], stored[1] // draft_size[1])
    return next((d for d in (8, 4, 2) if scale >= d), 1)


def decoded_nbytes(size: tuple[int, int], zoom: float, tag: int = 1, draft: bool = True) -> int:
    """The bytes of the RGBX pixels `decode_for` makes of an RGB or grey JPEG natively (`out`'s size for it), or
    with `draft` False of a PNG (decoded whole): twice that where its EXIF tag turns or mirrors it (the stored pixels
    and the displayed ones)."""
    W0, H0 = (int(v) for v in size)
    stored = (H0, W0) if swaps_axes(tag) else (W0, H0)
    d = draft_denominator(stored, _draft_size(stored, zoom)) if draft else 1
    return -(-W0 // d) * -(-H0 // d) * 4 * (2 if int(tag) in _DISPLAY else 1)


def _decode(data, draft_size, native: bool = False, out=None,
            stored=None) -> tuple[Image.Image | np.ndarray, float, tuple[int, int]]:
    """(decode_image's image, or with `native` possibly its RGBX array, in `out` when given and it fits; the draft's
    scale: 1, 1/2, 1/4 or 1/8; the full-size image's size). A native draft needs the `stored` size that
    `draft_size` was drawn on (the sample table's), to pick PIL's scale; without it, a draft is PIL's."""
    # (without its text where PIL refuses that: image/headers.py)
    return pil_read(lambda readable: _decode_as_is(readable, draft_size, native, out, stored), data)


def _decode_as_is(data, draft_size, native, out=None,
                  stored=None) -> tuple[Image.Image | np.ndarray, float, tuple[int, int]]:
    if native:
        got = whole_png_rgbx(data, out)  # None for anything but a PNG (no draft: a PNG decodes whole)
        if got is not None:
            return got[0], 1.0, got[1]
    if native and (draft_size is None or stored is not None):
        denom = draft_denominator(stored, draft_size)
        got = whole_jpeg_rgbx(data, out, denom)  # at PIL's draft scale: its pixels to the bit
        if got is not None:
            return got[0], 1.0 / denom, got[1]
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


def _to_rgbx(image) -> np.ndarray:
    """A decoded image (uint8 [h, w, 4] RGBX as it is, uint8 [h, w, 3], or a PIL image by the contract) as a
    C-contiguous uint8 [h, w, 4] RGBX array."""
    if isinstance(image, np.ndarray) and image.ndim == 3 and image.shape[2] == 4:
        return np.ascontiguousarray(image)
    img = to_rgb(image if isinstance(image, Image.Image) else Image.fromarray(np.ascontiguousarray(image)))
    if not _PIL_PASTE:
        return np.asarray(img.convert("RGBX"))
    out = np.empty((img.size[1], img.size[0], 4), np.uint8)
    _wrap(out).im.paste(img.im, (0, 0) + img.size)  # PIL's memory is RGBX already: a copy row by row
    return out


def _canvas(S: int) -> tuple[np.ndarray, Image.Image]:
    """This thread's RGBX canvas [S, S, 4] and the PIL image that shares its memory (a fresh array per output
    would page-fault on every first write)."""
    c = getattr(_CANVAS, "c", None)
    if c is None or c[0].shape[0] != S:
        rgbx = np.empty((S, S, 4), np.uint8)
        c = _CANVAS.c = (rgbx, _wrap(rgbx))
    return c


def render(images, geometry: BatchGeometry, k: int, hsv: bool = True, out: np.ndarray | None = None,
           planar: bool = False, exact: bool = False) -> np.ndarray:
    """Output k of `geometry` as uint8 [S, S, 3] RGB ([3, S, S] when `planar`), into `out` when given. images: the
    batch's sources by position, each decoded (a PIL image by the contract, `decode_image`; a uint8 [h, w, 3] RGB or
    [h, w, 4] RGBX array, `decode_rgbx`) or the encoded bytes, decoded (with draft) by this call for this output
    alone: a batch whose outputs share sources (mosaic) decodes once and passes the arrays. hsv=False leaves the HSV
    gains to the caller (a GPU does them for the whole batch: fastfeed/detect/hsv.py). exact: Pillow's fixed point
    throughout (module docstring)."""
    S = geometry.image_size
    if out is None:
        out = np.empty((3, S, S) if planar else (S, S, 3), dtype=np.uint8)
    canvas, canvas_img = _canvas(S)
    canvas[...] = geometry.pad_value
    tiles = geometry.tiles(k)
    sources = {}
    for t in tiles:
        if t.source not in sources:
            sources[t.source] = _source(images[t.source], geometry.sizes[t.source],
                                        [u for u in tiles if u.source == t.source])
    for t in tiles:
        rgbx, img, fx, fy = sources[t.source]
        X0, Y0, X1, Y1 = t.dst_rect
        if X1 <= X0 or Y1 <= Y0:
            continue
        if geometry.axis_aligned:
            x0, y0, x1, y1 = t.src_rect
            _resize_tile(rgbx, img, (x0 * fx, y0 * fy, x1 * fx, y1 * fy), canvas, canvas_img, t.dst_rect, exact)
        else:
            _warp_into(canvas, img, fx, fy, t)
    finish(canvas, out, geometry.hsv[k] if hsv else None, bool(geometry.flip[k]), planar, bool(geometry.flipud[k]))
    return out


def _resize_tile(src: np.ndarray, src_img: Image.Image, box, canvas: np.ndarray, canvas_img: Image.Image, dst_rect,
                 exact: bool) -> None:
    """canvas[dst_rect] = the RGBX `src`'s box resized to the rectangle's size: pillow-simd for the pixels whose
    box lies inside the image, Pillow's fixed point (resample.py) for the edge rows and columns whose box overhangs
    it (each pixel's filter depends only on its centre and the scale: the two parts are one resize). src_img: a PIL
    image sharing src's memory."""
    X0, Y0, X1, Y1 = dst_rect
    x0, y0, x1, y1 = box
    w, h = X1 - X0, Y1 - Y0
    H, W = src.shape[:2]
    sx, sy = (x1 - x0) / w, (y1 - y0) / h
    # output columns/rows at each edge whose box starts outside the image
    left = math.ceil(-x0 / sx) if x0 < 0 else 0
    right = math.ceil((x1 - W) / sx) if x1 > W else 0
    top = math.ceil(-y0 / sy) if y0 < 0 else 0
    bottom = math.ceil((y1 - H) / sy) if y1 > H else 0
    rgb = src[..., :3]
    if exact or not _PIL_PASTE or left + right >= w or top + bottom >= h:
        resize_into(rgb, box, canvas[Y0:Y1, X0:X1, :3])
        return
    ix0, ix1 = max(x0 + left * sx, 0.0), min(x1 - right * sx, float(W))
    iy0, iy1 = max(y0 + top * sy, 0.0), min(y1 - bottom * sy, float(H))
    # the core image's resize: what Image.resize calls for an RGBX image, without its Python around it
    inner = src_img.im.resize((w - left - right, h - top - bottom), Image.BILINEAR, (ix0, iy0, ix1, iy1))
    canvas_img.im.paste(inner, (X0 + left, Y0 + top, X1 - right, Y1 - bottom))
    if left:
        resize_into(rgb, (x0, y0, x0 + left * sx, y1), canvas[Y0:Y1, X0:X0 + left, :3])
    if right:
        resize_into(rgb, (x1 - right * sx, y0, x1, y1), canvas[Y0:Y1, X1 - right:X1, :3])
    if top:
        resize_into(rgb, (x0 + left * sx, y0, x1 - right * sx, y0 + top * sy),
                    canvas[Y0:Y0 + top, X0 + left:X1 - right, :3])
    if bottom:
        resize_into(rgb, (x0 + left * sx, y1 - bottom * sy, x1 - right * sx, y1),
                    canvas[Y1 - bottom:Y1, X0 + left:X1 - right, :3])


def _zoom(tile) -> float:
    """The most output pixels one source pixel becomes along any direction (the affine's largest singular value)."""
    return float(np.linalg.svd(tile.affine[:, :2], compute_uv=False)[0])


def _source(image, size, tiles) -> tuple[np.ndarray, Image.Image, float, float]:
    """(rgbx, img, fx, fy): the source as uint8 [h, w, 4] RGBX (bytes decoded, with the draft every tile allows), a
    PIL image sharing its memory, and the factors from the stored size's pixels, which the geometry is in, to this
    image's (a draft, or a header that disagreed)."""
    if isinstance(image, Decoded):
        return image.rgbx, image.image, image.fx, image.fy
    W0, H0 = (int(v) for v in size)
    if isinstance(image, (np.ndarray, Image.Image)):
        rgbx = _to_rgbx(image)
        return rgbx, _wrap(rgbx), rgbx.shape[1] / W0, rgbx.shape[0] / H0
    draft = _draft_size((W0, H0), max(_zoom(t) for t in tiles))
    img, scale, (w, h) = _decode(image, draft, native=True, stored=(W0, H0))
    rgbx = _to_rgbx(img)
    if scale != 1:
        return rgbx, _wrap(rgbx), scale * w / W0, scale * h / H0
    return rgbx, _wrap(rgbx), rgbx.shape[1] / W0, rgbx.shape[0] / H0


def _warp_into(canvas: np.ndarray, img: Image.Image, fx: float, fy: float, tile) -> None:
    """Paint a rotated or sheared tile into the RGBX canvas: the affine through `Image.transform`, masked to its
    quadrilateral."""
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
    arr = np.pad(np.asarray(crop)[..., :3], ((e, e), (e, e), (0, 0)), mode="edge")
    # output pixels -> padded crop pixels: inverse affine, then the stored-size -> image, crop, reduce, pad steps
    A = np.vstack([tile.affine, (0, 0, 1)])
    to_crop = np.array([[fx / n, 0, -cx0 / n + e], [0, fy / n, -cy0 / n + e], [0, 0, 1]])
    inv = to_crop @ np.linalg.inv(A) @ np.array([[1, 0, X0], [0, 1, Y0], [0, 0, 1]])
    w, h = X1 - X0, Y1 - Y0
    out = np.asarray(Image.fromarray(arr).transform((w, h), Image.AFFINE, tuple(inv[:2].ravel()), Image.BILINEAR))
    np.copyto(canvas[Y0:Y1, X0:X1, :3], out, where=quad_inside(tile)[:, :, None])


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
