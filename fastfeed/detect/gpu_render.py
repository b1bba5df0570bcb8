"""The GPU renderer: an axis-aligned `BatchGeometry` executed on decoded images that are already on the device.

It computes what the CPU renderer (render.py + resample.py) computes, to the bit: per tile, Pillow's antialiased
bilinear resize of the tile's source rectangle into its destination rectangle (mirrored as the output is
flipped), in Pillow's fixed point. The host plans only each tile (a row of numbers: where its source is, its source
box and scale, where it goes). On the GPU, one kernel computes Pillow's coefficients for every output column and
row (resample.py `_coeffs`, in float64 with no fused multiply-adds, so to the bit), and two apply them over every
tile of the batch at once:
  1. horizontal: for each tile, each source row its vertical filter reads -> a uint8 row of the tile's output width;
  2. vertical: each output row of each tile from those rows -> its place in the [B, S, S, 3] canvas.
Each pass's rows are numbered across the batch, one program a row: it finds its tile by a binary search of the
tiles' first rows, then walks the row in blocks, each value through as many taps as its own tile's filter has (a
batch mixes tiles shrunk 2x, 7 taps, with magnified ones, 3). So a batch decoded on the GPU differs from the CPU
path only by its decoder (within the decode contract), and the boxes, which never see pixels, are the same. Rotated
or sheared tiles are the CPU renderer's (settings.py routes such an augmentation there).

Triton kernels run on CPU tensors under TRITON_INTERPRET=1, which is how the tests check them without a GPU.
"""
from __future__ import annotations

import numpy as np
import torch

from fastfeed.decode.numba_import import import_numba
from fastfeed.detect.geometry import BatchGeometry
from fastfeed.detect.resample import _span

numba = import_numba()

__all__ = ["render_batch", "plan_tiles"]

# Columns of the per-tile table the kernels read (int64; the kernels name them by number): where its source is and
# its size, its output size, the first source row the vertical filter reads and how many, where its rows go in the
# scratch buffer and in the batch, how it is mirrored (bit 0 left-right, bit 1 top-bottom), the number of its first job in each pass, its first
# output column's coefficients, and its own filter lengths across and down.
(_IMG_OFF, _SRC_W, _SRC_H, _OW, _OH, _FIRST, _ROWS, _TMP_OFF, _OUT, _X0, _Y0, _FLIP, _JOB1, _JOB2,
 _H_OFF, _KH, _KV) = range(17)
_NCOL = 17
# Columns of the float64 table: the source box (x0, y0) and the scales (source pixels per output pixel).
_BX0, _BY0, _SCALE_X, _SCALE_Y = range(4)
_BLOCK = 256  # values (or coefficient rows) a program makes


@numba.njit(nogil=True, cache=True)
def _plan(W, H, boxes, ow, oh, image_off, out_at, X0, Y0, flip):
    """The tile tables for tiles of source size (W, H), source box (source pixels), output size (ow, oh) at
    (X0, Y0) of output `out_at` (element offset), mirrored as `flip` says (bit 0 left-right, bit 1 top-bottom): (table int64 [T, 17], box float64 [T, 4],
    kh, kv (the longest filters), jobs of pass 1, jobs of pass 2 (= output rows), output columns, scratch bytes)."""
    T = len(W)
    table = np.empty((T, 17), np.int64)
    fbox = np.empty((T, 4), np.float64)
    kh = kv = 1
    tmp = j1 = j2 = h = 0
    for t in range(T):
        sx = (boxes[t, 2] - boxes[t, 0]) / ow[t]
        sy = (boxes[t, 3] - boxes[t, 1]) / oh[t]
        # Pillow's filter length: every weight of the tile's columns (rows) past it is zero
        table[t, 15] = int(np.ceil(max(sx, 1.0))) * 2 + 1
        table[t, 16] = int(np.ceil(max(sy, 1.0))) * 2 + 1
        kh = max(kh, table[t, 15])
        kv = max(kv, table[t, 16])
        # the source rows the vertical filter reads: from its first output row's first to its last one's end
        support = max(sy, 1.0)
        first, _ = _span(H[t], boxes[t, 1] + 0.5 * sy, support)
        last, count = _span(H[t], boxes[t, 1] + (oh[t] - 1 + 0.5) * sy, support)
        rows = last + count - first
        table[t, 0], table[t, 1], table[t, 2], table[t, 3], table[t, 4] = image_off[t], W[t], H[t], ow[t], oh[t]
        table[t, 5], table[t, 6], table[t, 7], table[t, 8] = first, rows, tmp, out_at[t]
        table[t, 9], table[t, 10], table[t, 11], table[t, 12], table[t, 13] = X0[t], Y0[t], flip[t], j1, j2
        table[t, 14] = h
        fbox[t, 0], fbox[t, 1], fbox[t, 2], fbox[t, 3] = boxes[t, 0], boxes[t, 1], sx, sy
        tmp += rows * ow[t] * 3
        j1 += rows
        j2 += oh[t]
        h += ow[t]
    return table, fbox, kh, kv, j1, j2, h, tmp


class TilePlan:
    """What the kernels of one batch read, on the host: `table` int64 [T, 17] and `box` float64 [T, 4] (see the
    column names above), the longest filters (kh, kv), each pass's number of jobs and the scratch buffer's size."""

    def __init__(self, geometry: BatchGeometry, image_off, image_size):
        S = geometry.image_size
        g = geometry
        used = np.arange(g.source.shape[1])[None, :] < g.n_tiles[:, None]
        rect = g.dst_rect
        used &= (rect[..., 2] > rect[..., 0]) & (rect[..., 3] > rect[..., 1])
        k, t = np.nonzero(used)
        src = g.source[k, t]
        W, H = image_size[src, 0], image_size[src, 1]
        # the geometry is in stored pixels; a decoded size that differs (a header that disagreed) scales it
        fx, fy = W / g.sizes[src, 0], H / g.sizes[src, 1]
        box = np.ascontiguousarray(g.src_rect[k, t] * np.stack([fx, fy, fx, fy], axis=1))
        X0, Y0, X1, Y1 = (np.ascontiguousarray(rect[k, t, i]) for i in range(4))
        ow = X1 - X0
        self.table, self.box, self.kh, self.kv, self.jobs1, self.jobs2, self.columns, self.tmp_bytes = _plan(
            W, H, box, ow, Y1 - Y0, image_off[src], k * S * S * 3, X0, Y0,
            g.flip[k].astype(np.int64) | (g.flipud[k].astype(np.int64) << 1))


def plan_tiles(geometry: BatchGeometry, image_off, image_size) -> TilePlan:
    """The kernels' plan for `geometry` over sources at `image_off` (int64 [B], element offsets of each batch
    position's HWC image in the flat buffer) of decoded size `image_size` (int64 [B, 2], width, height)."""
    if not geometry.axis_aligned:
        raise ValueError("the GPU renderer draws axis-aligned tiles only (degrees = shear = 0)")
    return TilePlan(geometry, np.asarray(image_off, np.int64), np.asarray(image_size, np.int64))


def render_batch(flat: torch.Tensor, image_off, image_size, geometry: BatchGeometry) -> torch.Tensor:
    """The batch's outputs as uint8 [B, S, S, 3] on flat's device: `flat` uint8 holds the decoded HWC RGB sources,
    position j's at element image_off[j], of size image_size[j] (width, height). HSV is the caller's."""
    plan = plan_tiles(geometry, image_off, image_size)
    S, B, dev = geometry.image_size, len(geometry), flat.device
    out = torch.full((B, S, S, 3), geometry.pad_value, dtype=torch.uint8, device=dev)
    if not len(plan.table):
        return out
    table, box = torch.from_numpy(plan.table), torch.from_numpy(plan.box)
    if dev.type == "cuda":  # page-locked, so the copies do not wait for the GPU
        table, box = table.pin_memory().to(dev, non_blocking=True), box.pin_memory().to(dev, non_blocking=True)
    tmp = torch.empty(max(plan.tmp_bytes, 1), dtype=torch.uint8, device=dev)
    n, steps = len(plan.table), len(plan.table).bit_length()  # steps: of the binary search for a job's tile
    h_start = torch.empty(plan.columns, dtype=torch.int32, device=dev)
    h_w = torch.empty(plan.columns * plan.kh, dtype=torch.int32, device=dev)
    v_start = torch.empty(plan.jobs2, dtype=torch.int32, device=dev)
    v_w = torch.empty(plan.jobs2 * plan.kv, dtype=torch.int32, device=dev)
    coeffs, horizontal, vertical = _kernels()
    # Pillow's float64 arithmetic to the bit: no multiply-add fused into one rounding.
    exact = {} if _interpreted() else {"enable_fp_fusion": False}
    # each output column's and row's coefficients, once (columns: source x, width, box x0, scale x)
    coeffs[(triton_cdiv(plan.columns, _BLOCK),)](table, box, n, steps, plan.columns, plan.kh, h_start, h_w,
                                                 OFF=_H_OFF, SIZE=_SRC_W, BOX=_BX0, NCOL=_NCOL, BLOCK=_BLOCK, **exact)
    coeffs[(triton_cdiv(plan.jobs2, _BLOCK),)](table, box, n, steps, plan.jobs2, plan.kv, v_start, v_w,
                                               OFF=_JOB2, SIZE=_SRC_H, BOX=_BY0, NCOL=_NCOL, BLOCK=_BLOCK, **exact)
    horizontal[(plan.jobs1,)](flat, tmp, table, n, steps, h_start, h_w, plan.kh, NCOL=_NCOL, BLOCK=_BLOCK)
    vertical[(plan.jobs2,)](tmp, out, table, n, steps, v_start, v_w, plan.kv, S, NCOL=_NCOL, BLOCK=_BLOCK)
    return out


def triton_cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _interpreted() -> bool:
    import os

    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


_KERNELS = None


def _kernels():
    """The two Triton kernels, defined on first use (importing Triton costs a second; TRITON_INTERPRET is read when
    they are defined). Table columns by number: see _IMG_OFF... and _BX0... above."""
    global _KERNELS
    if _KERNELS is not None:
        return _KERNELS
    import triton
    import triton.language as tl

    @triton.jit
    def coeffs(table, box, n_tiles, steps, total, K, starts, weights, OFF: tl.constexpr, SIZE: tl.constexpr,
               BOX: tl.constexpr, NCOL: tl.constexpr, BLOCK: tl.constexpr):
        # resample.py's _coeffs for output columns (or rows) j of the batch, numbered across its tiles: the first
        # input pixel in starts[j], the K weights in weights[j * K:], zero past the pixels read
        j = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        inside = j < total
        lo = tl.zeros([BLOCK], tl.int64)
        hi = tl.zeros([BLOCK], tl.int64) + n_tiles
        for _ in range(steps):  # each j's tile: the last whose first column (table column OFF) is at most j
            mid = (lo + hi) // 2
            ok = tl.load(table + mid * NCOL + OFF, mask=inside, other=0) <= j
            lo = tl.where(ok, mid, lo)
            hi = tl.where(ok, hi, mid)
        xx = j - tl.load(table + lo * NCOL + OFF, mask=inside, other=0)
        size = tl.load(table + lo * NCOL + SIZE, mask=inside, other=1)
        x0 = tl.load(box + lo * 4 + BOX, mask=inside, other=0.0)
        scale = tl.load(box + lo * 4 + BOX + 2, mask=inside, other=1.0)
        support = tl.maximum(scale, 1.0)
        ss = 1.0 / support
        center = x0 + (xx.to(tl.float64) + 0.5) * scale
        xmin = tl.maximum((center - support + 0.5).to(tl.int64), 0)
        count = tl.maximum(tl.minimum((center + support + 0.5).to(tl.int64), size) - xmin, 0)
        ww = tl.zeros([BLOCK], tl.float64)
        for k in range(K):
            d = tl.abs(((k + xmin).to(tl.float64) - center + 0.5) * ss)
            ww += tl.where((k < count) & (d < 1.0), 1.0 - d, 0.0)
        for k in range(K):
            d = tl.abs(((k + xmin).to(tl.float64) - center + 0.5) * ss)
            w = tl.where((k < count) & (d < 1.0), 1.0 - d, 0.0)
            w = tl.where(ww != 0.0, w / ww, w)
            tl.store(weights + j * K + k, (0.5 + w * 4194304.0).to(tl.int32), mask=inside)  # 2 ** 22: Pillow's
        tl.store(starts + j, xmin.to(tl.int32), mask=inside)

    @triton.jit
    def horizontal(src, tmp, table, n_tiles, steps, h_start, h_w, KH, NCOL: tl.constexpr, BLOCK: tl.constexpr):
        # one source row of one tile: its output row in tmp, BLOCK values at a time
        job = tl.program_id(0).to(tl.int64)
        # the job's tile: the last whose first job (column 12) is at most `job` (Triton's jit functions can call
        # only module-level ones, so this search is written in each kernel)
        lo = 0
        hi = n_tiles
        for _ in range(steps):
            mid = (lo + hi) // 2
            ok = tl.load(table + mid * NCOL + 12) <= job
            lo = tl.where(ok, mid, lo)
            hi = tl.where(ok, hi, mid)
        row = table + lo.to(tl.int64) * NCOL
        W = tl.load(row + 1)
        ow = tl.load(row + 3)
        r = job - tl.load(row + 12)
        y = tl.load(row + 5) + r
        taps = tl.load(row + 15)
        src_row = tl.load(row + 0) + y * W * 3
        dst_row = tl.load(row + 7) + r * ow * 3
        first = tl.load(row + 14)
        for e0 in range(0, ow * 3, BLOCK):
            e = e0 + tl.arange(0, BLOCK)
            inside = e < ow * 3
            xx = e // 3
            c = e - xx * 3
            coef = first + xx
            a = tl.load(h_start + coef, mask=inside, other=0).to(tl.int64)
            base = src_row + c
            acc = tl.full([BLOCK], 1 << 21, tl.int32)
            for k in range(taps):
                w = tl.load(h_w + coef * KH + k, mask=inside, other=0)
                v = tl.load(src + base + (a + k) * 3, mask=inside & (w != 0), other=0)
                acc += v.to(tl.int32) * w
            v8 = tl.minimum(tl.maximum(acc >> 22, 0), 255)
            tl.store(tmp + dst_row + e, v8.to(tl.uint8), mask=inside)

    @triton.jit
    def vertical(tmp, out, table, n_tiles, steps, v_start, v_w, KV, S, NCOL: tl.constexpr, BLOCK: tl.constexpr):
        # one output row of one tile, from its rows in tmp, BLOCK values at a time
        job = tl.program_id(0).to(tl.int64)
        lo = 0  # the job's tile, as in horizontal (column 13: the tile's first output row)
        hi = n_tiles
        for _ in range(steps):
            mid = (lo + hi) // 2
            ok = tl.load(table + mid * NCOL + 13) <= job
            lo = tl.where(ok, mid, lo)
            hi = tl.where(ok, hi, mid)
        row = table + lo.to(tl.int64) * NCOL
        ow = tl.load(row + 3)
        yy = job - tl.load(row + 13)
        a = tl.load(v_start + job).to(tl.int64) - tl.load(row + 5)
        taps = tl.load(row + 16)
        tmp_row = tl.load(row + 7)
        x0 = tl.load(row + 9)
        mirror = tl.load(row + 11)
        flip = (mirror & 1) != 0
        y = tl.load(row + 10) + yy
        y = tl.where((mirror & 2) != 0, S - 1 - y, y)
        dst_row = tl.load(row + 8) + y * S * 3
        for e0 in range(0, ow * 3, BLOCK):
            e = e0 + tl.arange(0, BLOCK)
            inside = e < ow * 3
            base = tmp_row + e
            acc = tl.full([BLOCK], 1 << 21, tl.int32)
            for k in range(taps):
                w = tl.load(v_w + job * KV + k)
                v = tl.load(tmp + base + (a + k) * ow * 3, mask=inside & (w != 0), other=0)
                acc += v.to(tl.int32) * w
            v8 = tl.minimum(tl.maximum(acc >> 22, 0), 255)
            xx = e // 3
            c = e - xx * 3
            col = x0 + xx
            col = tl.where(flip, S - 1 - col, col)
            tl.store(out + dst_row + col * 3 + c, v8.to(tl.uint8), mask=inside)

    _KERNELS = (coeffs, horizontal, vertical)
    return _KERNELS
