"""PIL's antialiased bilinear resize of a box of an image (`Image.resize(size, BILINEAR, box=...)`), in numba, written
straight into its place in the output canvas, with the GIL released.

The same arithmetic as Pillow's Resample.c: per output pixel a triangle filter widened by the downscale factor,
bounds rounded and clipped to the image, weights normalised, then fixed point with 22 fractional bits; a horizontal
pass over the rows the vertical pass needs, rounded to uint8, then the vertical pass. A box that overhangs the image
(the geometry allows under half an output pixel) reads only the pixels inside, renormalised, as Pillow's clipped
bounds do at any image edge. The CPU renderer (render.py) draws with it where PIL cannot or where the bits matter:
the edge rows and columns of a box that overhangs the image (PIL refuses such a box), and everything under
`exact=True` (what the GPU renderer computes to the bit); pillow-simd's resize, a level away, draws the rest.
"""
from __future__ import annotations

import math

import numpy as np

from fastfeed.decode.numba_import import import_numba

numba = import_numba()

__all__ = ["resize_into"]

_PRECISION_BITS = 32 - 8 - 2


@numba.njit(nogil=True, cache=True, inline="always")
def _span(in_size, center, support):
    """The input pixels an output pixel centred at `center` reads: (first, count). gpu_render.py's kernels compute
    it the same way."""
    xmin = int(center - support + 0.5)  # C's cast: toward zero
    if xmin < 0:
        xmin = 0
    xmax = int(center + support + 0.5)
    if xmax > in_size:
        xmax = in_size
    xmax -= xmin
    if xmax < 0:
        xmax = 0
    return xmin, xmax


@numba.njit(nogil=True, cache=True)
def _coeffs(in_size, in0, in1, out_size):
    """Pillow's precompute_coeffs + normalize_coeffs_8bpc for the bilinear filter: (bounds int64 [out, 2] = first
    input pixel and count, weights int64 [out, ksize])."""
    scale = (in1 - in0) / out_size
    filterscale = max(scale, 1.0)
    support = 1.0 * filterscale
    ksize = int(math.ceil(support)) * 2 + 1
    bounds = np.zeros((out_size, 2), np.int64)
    kk = np.zeros((out_size, ksize), np.int64)
    w = np.zeros(ksize, np.float64)
    one = float(1 << _PRECISION_BITS)
    for xx in range(out_size):
        center = in0 + (xx + 0.5) * scale
        ss = 1.0 / filterscale
        xmin, xmax = _span(in_size, center, support)
        ww = 0.0
        for x in range(xmax):
            t = abs((x + xmin - center + 0.5) * ss)
            w[x] = 1.0 - t if t < 1.0 else 0.0
            ww += w[x]
        for x in range(xmax):
            v = w[x] / ww if ww != 0.0 else w[x]
            kk[xx, x] = int(-0.5 + v * one) if v < 0 else int(0.5 + v * one)
        bounds[xx, 0] = xmin
        bounds[xx, 1] = xmax
    return bounds, kk


# int32 sums (Pillow's own: 8-bit values times weights summing to 2**22 stay under 2**31) and uint8 rows between
# the passes, with numpy's error model: the vertical pass's contiguous loop then vectorises 8 lanes wide.
@numba.njit(nogil=True, cache=True, error_model="numpy")
def _resize_into(src, x0, y0, x1, y1, out):
    H, W = src.shape[0], src.shape[1]
    oh, ow = out.shape[0], out.shape[1]
    need_h = ow != W or x0 != 0.0 or x1 != ow
    need_v = oh != H or y0 != 0.0 or y1 != oh
    hb, hk64 = _coeffs(W, x0, x1, ow)
    vb, vk64 = _coeffs(H, y0, y1, oh)
    hk, vk = hk64.astype(np.int32), vk64.astype(np.int32)
    half = np.int32(1 << (_PRECISION_BITS - 1))
    first = vb[0, 0] if need_v else 0
    last = vb[oh - 1, 0] + vb[oh - 1, 1] if need_v else H
    rows = last - first
    tw = ow if need_h else W
    tmp = np.empty((rows, tw * 3), np.uint8)
    for r in range(rows):
        y = first + r
        if need_h:
            for xx in range(ow):
                a = hb[xx, 0]
                s0 = s1 = s2 = half
                for x in range(hb[xx, 1]):
                    k = hk[xx, x]
                    s0 += np.int32(src[y, a + x, 0]) * k
                    s1 += np.int32(src[y, a + x, 1]) * k
                    s2 += np.int32(src[y, a + x, 2]) * k
                tmp[r, 3 * xx] = min(max(s0 >> _PRECISION_BITS, 0), 255)
                tmp[r, 3 * xx + 1] = min(max(s1 >> _PRECISION_BITS, 0), 255)
                tmp[r, 3 * xx + 2] = min(max(s2 >> _PRECISION_BITS, 0), 255)
        else:
            for xx in range(W):
                for c in range(3):
                    tmp[r, 3 * xx + c] = src[y, xx, c]
    acc = np.empty(tw * 3, np.int32)
    res = np.empty(tw * 3, np.uint8)
    for yy in range(oh):
        if need_v:
            acc[:] = half
            a = vb[yy, 0] - first
            for y in range(vb[yy, 1]):
                k = vk[yy, y]
                row = tmp[a + y]
                for i in range(tw * 3):  # contiguous: vectorised
                    acc[i] += np.int32(row[i]) * k
            for i in range(tw * 3):
                res[i] = min(max(acc[i] >> _PRECISION_BITS, 0), 255)
        else:
            res[:] = tmp[yy]
        for xx in range(ow):
            out[yy, xx, 0] = res[3 * xx]
            out[yy, xx, 1] = res[3 * xx + 1]
            out[yy, xx, 2] = res[3 * xx + 2]


def resize_into(src: np.ndarray, box: tuple[float, float, float, float], out: np.ndarray) -> None:
    """`out[:] = Image.fromarray(src).resize(out's size, BILINEAR, box=box)` for uint8 [h, w, 3] `src` and a uint8
    [oh, ow, 3] view `out` (a slice of the canvas); either may be a view of RGBX memory. The box may overhang
    `src`."""
    x0, y0, x1, y1 = (float(v) for v in box)
    _resize_into(src, x0, y0, x1, y1, out)
