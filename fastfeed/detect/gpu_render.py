"""The GPU renderer: an axis-aligned `BatchGeometry` executed on decoded images that are already on the device.

It computes what the CPU renderer (render.py + resample.py) computes, to the bit: per tile, Pillow's antialiased
bilinear resize of the tile's source rectangle into its destination rectangle (mirrored when the output is
flipped), in Pillow's fixed point. The coefficients are Pillow's own (resample.py `_coeffs`, on the CPU: a few
hundred bytes per output row); two Triton kernels apply them over every tile of the batch at once:
  1. horizontal: for each tile, each source row its vertical filter reads -> a uint8 row of the tile's output width;
  2. vertical: each output row of each tile from those rows -> its place in the [B, S, S, 3] canvas.
So a batch decoded on the GPU differs from the CPU path only by its decoder (within the decode contract), and the
boxes, which never see pixels, are the same. Rotated or sheared tiles are the CPU renderer's (settings.py routes
such an augmentation there).

Triton kernels run on CPU tensors under TRITON_INTERPRET=1, which is how the tests check them without a GPU.
"""
from __future__ import annotations

import numpy as np
import torch

from fastfeed.decode.numba_import import import_numba
from fastfeed.detect.geometry import BatchGeometry
from fastfeed.detect.resample import _coeffs

numba = import_numba()

__all__ = ["render_batch", "plan_tiles"]

# Columns of the per-tile table the kernels read (int64): where its source is, its sizes, where its rows go.
_IMG_OFF, _SRC_W, _OW, _FIRST, _TMP_OFF, _H_OFF, _V_OFF, _OUT, _X0, _Y0, _FLIP = range(11)
_NCOL = 11
_BLOCK = 256


@numba.njit(nogil=True, cache=True)
def _plan(src_w, src_h, boxes, out_w, out_h):
    """Per tile (source size, source box in its pixels, output size): Pillow's coefficients of both passes, flat,
    and the rows the horizontal pass makes. Returns (h_start, h_weights [sum ow, kh], v_start, v_weights
    [sum oh, kv], first source row, row count, kh, kv)."""
    T = len(src_w)
    kh = kv = 1
    for t in range(T):
        kh = max(kh, int(np.ceil(max((boxes[t, 2] - boxes[t, 0]) / out_w[t], 1.0))) * 2 + 1)
        kv = max(kv, int(np.ceil(max((boxes[t, 3] - boxes[t, 1]) / out_h[t], 1.0))) * 2 + 1)
    h_start = np.zeros(out_w.sum(), np.int32)
    h_w = np.zeros((out_w.sum(), kh), np.int32)
    v_start = np.zeros(out_h.sum(), np.int32)
    v_w = np.zeros((out_h.sum(), kv), np.int32)
    first = np.zeros(T, np.int64)
    rows = np.zeros(T, np.int64)
    ho = vo = 0
    for t in range(T):
        ow, oh = out_w[t], out_h[t]
        hb, hk = _coeffs(src_w[t], boxes[t, 0], boxes[t, 2], ow)
        vb, vk = _coeffs(src_h[t], boxes[t, 1], boxes[t, 3], oh)
        h_start[ho:ho + ow] = hb[:, 0]
        h_w[ho:ho + ow, :hk.shape[1]] = hk
        v_start[vo:vo + oh] = vb[:, 0]
        v_w[vo:vo + oh, :vk.shape[1]] = vk
        first[t] = vb[0, 0]
        rows[t] = vb[oh - 1, 0] + vb[oh - 1, 1] - vb[0, 0]
        ho += ow
        vo += oh
    return h_start, h_w, v_start, v_w, first, rows, kh, kv


class TilePlan:
    """What the kernels of one batch read, on the host: `table` int64 [T, 11] (see the column names above), the
    coefficients, and the job lists (tile, row) of both passes."""

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
        box = g.src_rect[k, t] * np.stack([fx, fy, fx, fy], axis=1)
        X0, Y0, X1, Y1 = (rect[k, t, i] for i in range(4))
        ow, oh = (X1 - X0).astype(np.int64), (Y1 - Y0).astype(np.int64)
        h_start, h_w, v_start, v_w, first, rows, self.kh, self.kv = _plan(
            W.astype(np.int64), H.astype(np.int64), np.ascontiguousarray(box), ow, oh)
        tmp_size = rows * ow * 3
        table = np.empty((len(k), _NCOL), np.int64)
        table[:, _IMG_OFF] = image_off[src]
        table[:, _SRC_W] = W
        table[:, _OW] = ow
        table[:, _FIRST] = first
        table[:, _TMP_OFF] = np.cumsum(tmp_size) - tmp_size
        table[:, _H_OFF] = np.cumsum(ow) - ow
        table[:, _V_OFF] = np.cumsum(oh) - oh
        table[:, _OUT] = k * S * S * 3
        table[:, _X0], table[:, _Y0] = X0, Y0
        table[:, _FLIP] = g.flip[k]
        self.table = table
        self.tmp_bytes = int(tmp_size.sum())
        self.max_row = int(ow.max() * 3) if len(k) else 0
        tiles = np.arange(len(k), dtype=np.int32)
        # (tile, row) jobs: pass 1 makes `rows` tmp rows per tile, pass 2 `oh` output rows
        self.jobs1 = np.stack([np.repeat(tiles, rows), _ranges(rows)], axis=1).astype(np.int32)
        self.jobs2 = np.stack([np.repeat(tiles, oh), _ranges(oh)], axis=1).astype(np.int32)
        self.coeffs = (h_start, h_w, v_start, v_w)


def _ranges(counts: np.ndarray) -> np.ndarray:
    """0..c-1 for each count c, concatenated."""
    total = int(counts.sum())
    starts = np.repeat(np.cumsum(counts) - counts, counts)
    return np.arange(total, dtype=np.int64) - starts


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
    h_start, h_w, v_start, v_w = plan.coeffs
    ints = np.concatenate([h_start, h_w.ravel(), v_start, v_w.ravel(), plan.jobs1.ravel(), plan.jobs2.ravel()])
    host = torch.from_numpy(ints)
    table = torch.from_numpy(plan.table)
    if dev.type == "cuda":
        host, table = host.pin_memory().to(dev, non_blocking=True), table.pin_memory().to(dev, non_blocking=True)
    parts, at = [], 0
    for n in (len(h_start), h_w.size, len(v_start), v_w.size, plan.jobs1.size, plan.jobs2.size):
        parts.append(host[at:at + n])
        at += n
    hs, hw, vs, vw, jobs1, jobs2 = parts
    tmp = torch.empty(max(plan.tmp_bytes, 1), dtype=torch.uint8, device=dev)
    kernels = _kernels()
    blocks = triton_cdiv(plan.max_row, _BLOCK)
    kernels[0][(len(plan.jobs1), blocks)](flat, tmp, table, hs, hw, jobs1, plan.kh, BLOCK=_BLOCK)
    kernels[1][(len(plan.jobs2), blocks)](tmp, out, table, vs, vw, jobs2, plan.kv, S, BLOCK=_BLOCK)
    return out


def triton_cdiv(a: int, b: int) -> int:
    return -(-a // b)


_KERNELS = None


def _kernels():
    """The two Triton kernels, defined on first use (importing Triton costs a second; TRITON_INTERPRET is read when
    they are defined)."""
    global _KERNELS
    if _KERNELS is not None:
        return _KERNELS
    import triton
    import triton.language as tl

    @triton.jit
    def horizontal(src, tmp, table, h_start, h_w, jobs, KH, BLOCK: tl.constexpr):
        job = tl.program_id(0)
        t = tl.load(jobs + 2 * job)
        r = tl.load(jobs + 2 * job + 1).to(tl.int64)
        row = table + t.to(tl.int64) * 11
        W = tl.load(row + 1)
        ow = tl.load(row + 2)
        y = tl.load(row + 3) + r
        e = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        inside = e < ow * 3
        xx = e // 3
        c = e - xx * 3
        coef = tl.load(row + 5) + xx
        a = tl.load(h_start + coef, mask=inside, other=0).to(tl.int64)
        base = tl.load(row + 0) + y * W * 3 + c
        acc = tl.full([BLOCK], 1 << 21, tl.int32)
        for k in range(KH):
            w = tl.load(h_w + coef * KH + k, mask=inside, other=0)
            ok = inside & (w != 0)
            v = tl.load(src + base + (a + k) * 3, mask=ok, other=0)
            acc += v.to(tl.int32) * w
        v8 = tl.minimum(tl.maximum(acc >> 22, 0), 255)
        tl.store(tmp + tl.load(row + 4) + r * ow * 3 + e, v8.to(tl.uint8), mask=inside)

    @triton.jit
    def vertical(tmp, out, table, v_start, v_w, jobs, KV, S, BLOCK: tl.constexpr):
        job = tl.program_id(0)
        t = tl.load(jobs + 2 * job)
        yy = tl.load(jobs + 2 * job + 1).to(tl.int64)
        row = table + t.to(tl.int64) * 11
        ow = tl.load(row + 2)
        coef = tl.load(row + 6) + yy
        a = tl.load(v_start + coef).to(tl.int64) - tl.load(row + 3)
        e = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        inside = e < ow * 3
        base = tl.load(row + 4) + e
        acc = tl.full([BLOCK], 1 << 21, tl.int32)
        for k in range(KV):
            w = tl.load(v_w + coef * KV + k)
            v = tl.load(tmp + base + (a + k) * ow * 3, mask=inside & (w != 0), other=0)
            acc += v.to(tl.int32) * w
        v8 = tl.minimum(tl.maximum(acc >> 22, 0), 255)
        xx = e // 3
        c = e - xx * 3
        col = tl.load(row + 8) + xx
        col = tl.where(tl.load(row + 10) != 0, S - 1 - col, col)
        dst = tl.load(row + 7) + ((tl.load(row + 9) + yy) * S + col) * 3 + c
        tl.store(out + dst, v8.to(tl.uint8), mask=inside)

    _KERNELS = (horizontal, vertical)
    return _KERNELS
