"""Semantic segmentation masks: a sample's label image (one class id per pixel) through its batch's geometry.

A mask is a single-channel PNG (or any lossless single-channel image PIL reads) of the image's stored size: mode L
or P (the palette index is the class id, as in Pascal VOC's SegmentationClass; the palette itself is ignored), or
16-bit grey (I;16) for more than 256 classes. RGB "colour" masks are refused: their colours are a rendering of the
ids, not the ids.

Each output's mask is painted tile by tile with the same `BatchGeometry` as its pixels (fastfeed/detect/geometry.py),
nearest neighbour: an output pixel takes the source pixel under its centre, so each tile paints exactly the output
pixels its image tile paints (the centre rule), and the rest is `ignore` (the letterbox's and mosaic's padding).
Axis-aligned tiles map each output pixel's centre into the tile's source box (PIL's and torchvision's NEAREST_EXACT
rule, computed so that a centre on a pixel edge is exact: both of those drift there by float rounding); rotated or
sheared ones take the inverse affine of each pixel centre, inside the tile's quadrilateral as render.py masks its
pixels. Masks are rendered on the CPU on both decode paths (a gather: no filter to run), so both give the same
masks to the bit.
"""
from __future__ import annotations

import io
import math

import numpy as np
from PIL import Image

from fastfeed import _native
from fastfeed.decode.base import starts_with_png
from fastfeed.decode.numba_import import import_numba
from fastfeed.detect.geometry import BatchGeometry
from fastfeed.detect.render import quad_inside

numba = import_numba()

__all__ = ["decode_mask", "render_mask", "tile_view", "nearest_tile", "MaskError", "DEFAULT_IGNORE_INDEX"]

DEFAULT_IGNORE_INDEX = 255  # torch's CrossEntropyLoss(ignore_index=...) as segmentation references set it
_ID_MODES = {"1": np.uint8, "L": np.uint8, "P": np.uint8, "I;16": np.uint16, "I;16L": np.uint16, "I;16B": np.uint16,
             "I;16N": np.uint16}  # "1": a binary mask, ids 0 and 1


class MaskError(ValueError):
    """A mask that cannot be a label image for its sample (not decodable, not single-channel, another size)."""


def decode_mask(data, size: tuple[int, int], native: bool = True) -> np.ndarray:
    """A mask's bytes -> its class ids, uint8 or uint16 [h, w], checked to be `size` (the image's stored width,
    height). Raises MaskError naming what is wrong. With `native`, an 8-bit grey or palette PNG is decoded by the
    native core (csrc/png_decode.h: its samples, numpy's view of PIL's image; inflated faster), anything else by PIL;
    pack checks a mask with PIL alone (`native` False), which refuses a few files the native decode would take."""
    ids = _native.decode_png_samples(data) if native and starts_with_png(data) else None
    if isinstance(ids, np.ndarray):
        _check_size(ids.shape[1], ids.shape[0], size)
        return ids
    try:
        img = Image.open(io.BytesIO(memoryview(data)))
        img.load()
    except Exception as e:  # noqa: BLE001 - any PIL failure is this mask's, reported by the caller with its key
        raise MaskError(f"the mask does not decode ({type(e).__name__}: {e})") from e
    if img.mode not in _ID_MODES and img.mode != "I":
        raise MaskError(f"the mask is a {img.mode} image; a mask holds one class id per pixel (mode 1, L, P or I;16)")
    _check_size(*img.size, size)
    if img.mode == "I":  # PIL opens some 16-bit PNGs as 32-bit: ids must still fit 16 bits
        ids = np.asarray(img)
        if ids.size and (ids.min() < 0 or ids.max() > 0xFFFF):
            raise MaskError("the mask's class ids do not fit 16 bits")
        return ids.astype(np.uint16)
    return np.asarray(img, dtype=_ID_MODES[img.mode])


def _check_size(w: int, h: int, size: tuple[int, int]) -> None:
    if (w, h) != tuple(size):
        raise MaskError(f"the mask is {w}x{h}, its image {size[0]}x{size[1]}")


@numba.njit(nogil=True, cache=True)
def _nearest_into(src, x0, y0, x1, y1, out, flip):
    """The nearest-neighbour resize of box (x0, y0, x1, y1) of src into out (columns mirrored when `flip`): output
    pixel x takes the source column under its centre, floor(x0 + (x + 0.5) * (x1 - x0) / ow), clamped to the image
    (a box may overhang it by under half an output pixel)."""
    H, W = src.shape
    oh, ow = out.shape
    cols = np.empty(ow, np.int64)
    for x in range(ow):
        # multiplied before divided: where the centre falls exactly on a pixel edge (x0 = 0, whole sizes), the
        # quotient is exact and the edge's right-hand pixel is taken, as with exact arithmetic
        cols[x] = min(max(int(math.floor(x0 + (x + 0.5) * (x1 - x0) / ow)), 0), W - 1)
    for y in range(oh):
        r = min(max(int(math.floor(y0 + (y + 0.5) * (y1 - y0) / oh)), 0), H - 1)
        for x in range(ow):
            out[y, ow - 1 - x if flip else x] = src[r, cols[x]]


@numba.njit(nogil=True, cache=True)
def _warp_nearest_into(src, inv, inside, out, flip):
    """A rotated or sheared tile: out[y, x] (mirrored when `flip`) takes src under inv @ (x + 0.5, y + 0.5, 1)
    where `inside` (the pixel's centre lies in the tile's quadrilateral)."""
    H, W = src.shape
    oh, ow = out.shape
    for y in range(oh):
        for x in range(ow):
            if not inside[y, x]:
                continue
            u = inv[0, 0] * (x + 0.5) + inv[0, 1] * (y + 0.5) + inv[0, 2]
            v = inv[1, 0] * (x + 0.5) + inv[1, 1] * (y + 0.5) + inv[1, 2]
            c = min(max(int(math.floor(u)), 0), W - 1)
            r = min(max(int(math.floor(v)), 0), H - 1)
            out[y, ow - 1 - x if flip else x] = src[r, c]


def render_mask(masks, geometry: BatchGeometry, k: int, ignore: int, out: np.ndarray | None = None) -> np.ndarray:
    """Output k's mask [S, S] (masks' dtype), into `out` when given: masks[j] is batch position j's decoded mask
    (`decode_mask`, the stored size; all of one dtype), `ignore` fills what no tile paints."""
    S = geometry.image_size
    dtype = masks[int(geometry.source[k, 0])].dtype
    canvas = np.empty((S, S), dtype=dtype) if out is None else out
    canvas[...] = ignore
    for i, t in enumerate(geometry.tiles(k)):
        dst = tile_view(canvas, geometry, k, i)
        if dst is not None:
            nearest_tile(masks[t.source], geometry, k, i, dst)
    if geometry.flipud[k]:
        canvas[...] = canvas[::-1].copy()
    return canvas


def tile_view(canvas: np.ndarray, geometry: BatchGeometry, k: int, t: int) -> np.ndarray | None:
    """The part of output k's canvas [S, S] that tile t paints (its destination rectangle, mirrored when the output
    is flipped left to right; its caller mirrors the whole canvas top to bottom last), or None when it paints
    nothing."""
    S = geometry.image_size
    X0, Y0, X1, Y1 = (int(v) for v in geometry.dst_rect[k, t])
    if X1 <= X0 or Y1 <= Y0:
        return None
    return canvas[Y0:Y1, S - X1:S - X0] if geometry.flip[k] else canvas[Y0:Y1, X0:X1]


def nearest_tile(src: np.ndarray, geometry: BatchGeometry, k: int, t: int, out: np.ndarray, fx: float = 1.0,
                 fy: float = 1.0) -> None:
    """Tile t of output k drawn from `src` into `out` (its `tile_view`) by the nearest-neighbour rule; `fx`, `fy`
    scale the stored image's pixels to src's (1 for a mask of the image's size)."""
    flip = bool(geometry.flip[k])
    if geometry.axis_aligned:
        x0, y0, x1, y1 = (float(v) for v in geometry.src_rect[k, t])
        _nearest_into(src, x0 * fx, y0 * fy, x1 * fx, y1 * fy, out, flip)
        return
    # output pixel (x, y) of the tile's rectangle -> source pixels
    tile = geometry.tiles(k)[t]
    X0, Y0 = tile.dst_rect[:2]
    A = np.vstack([tile.affine, (0, 0, 1)])
    inv = np.linalg.inv(A) @ np.array([[1, 0, X0], [0, 1, Y0], [0, 0, 1]], dtype=np.float64)
    if (fx, fy) != (1.0, 1.0):
        inv = np.diag([fx, fy, 1.0]) @ inv
    _warp_nearest_into(src, np.ascontiguousarray(inv[:2]), quad_inside(tile), out, flip)
