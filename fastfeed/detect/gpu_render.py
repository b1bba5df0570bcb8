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
_ALIGN = 4  # int32s: 16 bytes


@numba.njit(nogil=True, cache=True)
def _plan(W, H, boxes, ow, oh, image_off, out_at, X0, Y0, flip):
    """Everything the kernels read, for tiles of source size (W, H), source box (source pixels), output size
    (ow, oh) at (X0, Y0) of output `out_at` (element offset), mirrored where `flip`: the tile table int64 [T, 11],
    and one int32 buffer holding, in order, each from a multiple of _ALIGN, Pillow's coefficients of both passes
    (h_start [sum ow], h_weights [sum ow, kh], v_start [sum oh], v_weights [sum oh, kv]) and the (tile, row) jobs
    of both passes (pass 1 makes the source rows the vertical filter reads, pass 2 the output rows). Returns
    (table, ints, the sections' starts (and the end), their lengths, kh, kv, tmp bytes)."""
    T = len(W)
    kh = kv = 1
    for t in range(T):
        kh = max(kh, int(np.ceil(max((boxes[t, 2] - boxes[t, 0]) / ow[t], 1.0))) * 2 + 1)
        kv = max(kv, int(np.ceil(max((boxes[t, 3] - boxes[t, 1]) / oh[t], 1.0))) * 2 + 1)
    sw, sh = ow.sum(), oh.sum()
    table = np.empty((T, _NCOL), np.int64)
    vcoef = []
    rows_of = np.empty(T, np.int64)
    for t in range(T):
        vb, vk = _coeffs(H[t], boxes[t, 1], boxes[t, 3], oh[t])
        vcoef.append((vb, vk))
        table[t, _FIRST] = vb[0, 0]
        rows_of[t] = vb[oh[t] - 1, 0] + vb[oh[t] - 1, 1] - vb[0, 0]
    rows_total = rows_of.sum()
    lens = np.array([sw, sw * kh, sh, sh * kv, 2 * rows_total, 2 * sh], np.int64)
    # Each section starts on 16 bytes: Triton compiles a kernel per alignment of its pointers, so unaligned starts
    # would cost a compilation for each new combination met.
    at = np.zeros(7, np.int64)
    for i in range(6):
        at[i + 1] = (at[i] + lens[i] + _ALIGN - 1) // _ALIGN * _ALIGN
    ints = np.zeros(at[6], np.int32)
    end = at[:6] + lens
    h_start, h_w = ints[at[0]:end[0]], ints[at[1]:end[1]].reshape(sw, kh)
    v_start, v_w = ints[at[2]:end[2]], ints[at[3]:end[3]].reshape(sh, kv)
    jobs1, jobs2 = ints[at[4]:end[4]].reshape(rows_total, 2), ints[at[5]:end[5]].reshape(sh, 2)
    ho = vo = j1 = 0
    tmp = 0
    for t in range(T):
        hb, hk = _coeffs(W[t], boxes[t, 0], boxes[t, 2], ow[t])
        vb, vk = vcoef[t]
        h_start[ho:ho + ow[t]] = hb[:, 0]
        h_w[ho:ho + ow[t], :hk.shape[1]] = hk
        v_start[vo:vo + oh[t]] = vb[:, 0]
        v_w[vo:vo + oh[t], :vk.shape[1]] = vk
        rows = rows_of[t]
        for r in range(rows):
            jobs1[j1 + r, 0], jobs1[j1 + r, 1] = t, r
        for r in range(oh[t]):
            jobs2[vo + r, 0], jobs2[vo + r, 1] = t, r
        table[t, _IMG_OFF], table[t, _SRC_W], table[t, _OW] = image_off[t], W[t], ow[t]
        table[t, _TMP_OFF], table[t, _H_OFF], table[t, _V_OFF] = tmp, ho, vo
        table[t, _OUT], table[t, _X0], table[t, _Y0], table[t, _FLIP] = out_at[t], X0[t], Y0[t], flip[t]
        tmp += rows * ow[t] * 3
        j1 += rows
        ho += ow[t]
        vo += oh[t]
    return table, ints, at, lens, kh, kv, tmp


class TilePlan:
    """What the kernels of one batch read, on the host: `table` int64 [T, 11] (see the column names above), and
    `ints` int32, the coefficients and the (tile, row) job lists of both passes (`sections` their (start, length))."""

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
        ow = self.ow = X1 - X0
        self.table, self.ints, at, lens, self.kh, self.kv, self.tmp_bytes = _plan(
            W, H, box, ow, Y1 - Y0, image_off[src], k * S * S * 3, X0, Y0, g.flip[k].astype(np.int64))
        self.sections = tuple((int(a), int(n)) for a, n in zip(at, lens))
        self.max_row = int(ow.max() * 3) if len(k) else 0


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
    host, table = torch.from_numpy(plan.ints), torch.from_numpy(plan.table)
    if dev.type == "cuda":
        host, table = host.pin_memory().to(dev, non_blocking=True), table.pin_memory().to(dev, non_blocking=True)
    hs, hw, vs, vw, jobs1, jobs2 = (host[a:a + n] for a, n in plan.sections)
    tmp = torch.empty(max(plan.tmp_bytes, 1), dtype=torch.uint8, device=dev)
    kernels = _kernels()
    blocks = triton_cdiv(plan.max_row, _BLOCK)
    kernels[0][(len(jobs1) // 2, blocks)](flat, tmp, table, hs, hw, jobs1, plan.kh, BLOCK=_BLOCK)
    kernels[1][(len(jobs2) // 2, blocks)](tmp, out, table, vs, vw, jobs2, plan.kv, S, BLOCK=_BLOCK)
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
