"""ultralytics' RandomHSV: each pixel to HSV in floats, the hue turned by its gain on the circle, saturation and
value scaled and clipped, back to RGB, rounded. In floats rather than through uint8 HSV lookup tables (ultralytics:
OpenCV's 180-step hue): no hue quantisation, so a gain of 1 changes nothing; the result is colorsys' to rounding.

Three implementations of colorsys' arithmetic: `apply_hsv_inplace`, one numba pass over an image on the CPU (the GIL
released, so the renderer's threads run it at once; `finish`, the renderer's last pass, is it fused with the flip
and the output layout; back to RGB without choosing among colorsys' six sectors, see `_hsv_pixel`); `finish_nhwc`,
one Triton pass over a uint8 NHWC batch on the GPU that also normalises and writes the Loader's dtype and layout
(the GPU path's last pass: it shares the GPU with the training step, and torch's form below makes some twenty
passes over the batch; `apply_hsv_nhwc` is it in place);
`apply_hsv_torch`, any device, torch operations. All three in float32; they agree
with colorsys' float64 to a level, and with each other but for a level at a rounding tie.
"""
from __future__ import annotations

import numpy as np

from fastfeed.decode.numba_import import import_numba

numba = import_numba()

__all__ = ["apply_hsv_inplace", "apply_hsv_nhwc", "apply_hsv_torch", "finish", "finish_nhwc"]

_F = np.float32
_INV255 = _F(1.0 / 255.0)


# Written without branches (selects only) and with numpy's error model (no division checks), so that LLVM
# vectorises the loops that inline it: colorsys' arithmetic in float32, the GPU path's precision (twice the lanes of
# float64). The hue stays in sixths of the circle throughout, and each output channel is v - v*s*clamp(min(k, 4 - k))
# with k = (n + hue) mod 6, colorsys' six sectors without selecting among them (1.7x faster on one core than
# picking p, q, t per sector; the same values but for a level at a rounding tie). _FAST lets LLVM fuse a multiply and
# an add into one FMA (12% faster again; a level apart at a tie for 1 value in 2 million).
_FAST = {"contract"}


@numba.njit(nogil=True, cache=True, error_model="numpy", inline="always", fastmath=_FAST)
def _hsv_pixel(r8, g8, b8, gh, gs, gv):
    one, zero, six = _F(1.0), _F(0.0), _F(6.0)
    r = _F(r8) * _INV255
    g = _F(g8) * _INV255
    b = _F(b8) * _INV255
    mx = max(r, max(g, b))
    d = mx - min(r, min(g, b))
    coloured = d > zero
    dd = d if coloured else one
    s = d / (mx if coloured else one) if coloured else zero
    # colorsys.rgb_to_hsv's hue (times 6), its three cases selected before dividing: two divisions, not six
    num = g - b if mx == r else (b - r if mx == g else r - g)
    h6 = num / dd + (zero if mx == r else (_F(2.0) if mx == g else _F(4.0)))
    h6 = h6 + six if h6 < zero else h6
    h6 = h6 * gh if coloured else zero  # gains lie in [0, 2]: one wrap at most
    h6 = h6 - six if h6 >= six else h6
    s = min(s * gs, one)
    v = min(mx * gv, one)
    vs = v * s
    return (_hsv_channel(_F(5.0), h6, v, vs), _hsv_channel(_F(3.0), h6, v, vs), _hsv_channel(one, h6, v, vs))


@numba.njit(nogil=True, cache=True, error_model="numpy", inline="always", fastmath=_FAST)
def _hsv_channel(n, h6, v, vs):
    """One output level of colorsys.hsv_to_rgb: channel offset `n` (5 red, 3 green, 1 blue), hue in sixths `h6`,
    value `v`, value times saturation `vs`."""
    six, one, zero = _F(6.0), _F(1.0), _F(0.0)
    k = n + h6
    k = k - six if k >= six else k
    c = v - vs * max(zero, min(one, min(k, _F(4.0) - k)))
    return np.uint8(np.int32(c * _F(255.0) + _F(0.5)))


@numba.njit(nogil=True, cache=True, error_model="numpy", fastmath=_FAST)
def _hsv_flat(px, gh, gs, gv):
    for x in range(px.shape[0] // 3):
        px[3 * x], px[3 * x + 1], px[3 * x + 2] = _hsv_pixel(px[3 * x], px[3 * x + 1], px[3 * x + 2], gh, gs, gv)


@numba.njit(nogil=True, cache=True, error_model="numpy", fastmath=_FAST)
def _finish(px, out, w, gh, gs, gv, apply, flip, flipud, planar):
    """px: an RGBX image, flat [h * w * 4]; out: flat [3 * h * w], three planes or interleaved pixels; columns
    mirrored when `flip`, rows when `flipud`, the gains applied when `apply`. Each case has an inner loop of its own
    and a mirrored row is reversed first as whole pixels (uint32): so every inner loop vectorises."""
    px32 = px.view(np.uint32)
    tmp32 = np.empty(w, np.uint32)
    tmp = tmp32.view(np.uint8)
    h = px32.shape[0] // w
    for y in range(h):
        o = y * w
        q = (h - 1 - y) * w if flipud else o  # where the row goes
        if flip:
            row32 = px32[o:o + w]
            for x in range(w):
                tmp32[x] = row32[w - 1 - x]
            src = tmp
        else:
            src = px[4 * o:4 * (o + w)]
        if planar:
            n = px32.shape[0]
            d0, d1, d2 = out[q:q + w], out[n + q:n + q + w], out[2 * n + q:2 * n + q + w]
            if apply:
                for x in range(w):
                    d0[x], d1[x], d2[x] = _hsv_pixel(src[4 * x], src[4 * x + 1], src[4 * x + 2], gh, gs, gv)
            else:
                for x in range(w):
                    d0[x], d1[x], d2[x] = src[4 * x], src[4 * x + 1], src[4 * x + 2]
        else:
            d = out[3 * q:3 * (q + w)]
            if apply:
                for x in range(w):
                    d[3 * x], d[3 * x + 1], d[3 * x + 2] = _hsv_pixel(src[4 * x], src[4 * x + 1], src[4 * x + 2],
                                                                      gh, gs, gv)
            else:
                for x in range(w):
                    d[3 * x], d[3 * x + 1], d[3 * x + 2] = src[4 * x], src[4 * x + 1], src[4 * x + 2]


def _check_rgb(rgb: np.ndarray) -> None:
    if rgb.dtype != np.uint8 or rgb.ndim != 3 or rgb.shape[2] != 3 or not rgb.flags.c_contiguous:
        raise ValueError(f"need a C-contiguous uint8 [h, w, 3] array, got {rgb.dtype} {rgb.shape}")


def apply_hsv_inplace(rgb: np.ndarray, gains) -> None:
    """RandomHSV with gains (hue, saturation, value) on a C-contiguous uint8 [h, w, 3] RGB array, in place."""
    _check_rgb(rgb)
    gh, gs, gv = (np.float32(g) for g in gains)
    _hsv_flat(rgb.reshape(-1), gh, gs, gv)


def finish(rgbx: np.ndarray, out: np.ndarray, gains, flip: bool, planar: bool, flipud: bool = False) -> None:
    """The CPU renderer's last pass: `out` = the C-contiguous uint8 [h, w, 4] RGBX canvas as RGB, mirrored left to
    right when `flip` and top to bottom when `flipud`, RandomHSV with `gains` applied (None: no change), written
    planar (uint8 [3, h, w]) or interleaved (uint8 [h, w, 3]), C-contiguous."""
    if rgbx.dtype != np.uint8 or rgbx.ndim != 3 or rgbx.shape[2] != 4 or not rgbx.flags.c_contiguous:
        raise ValueError(f"need a C-contiguous uint8 [h, w, 4] canvas, got {rgbx.dtype} {rgbx.shape}")
    h, w = rgbx.shape[:2]
    shape = (3, h, w) if planar else (h, w, 3)
    if out.dtype != np.uint8 or out.shape != shape or not out.flags.c_contiguous:
        raise ValueError(f"need a C-contiguous uint8 {list(shape)} output, got {out.dtype} {out.shape}")
    apply = gains is not None and bool((np.asarray(gains) != 1).any())
    gh, gs, gv = (np.float32(g) for g in (gains if apply else (1, 1, 1)))
    _finish(rgbx.reshape(-1), out.reshape(-1), w, gh, gs, gv, apply, bool(flip), bool(flipud), bool(planar))


def apply_hsv_torch(images, gains):
    """RandomHSV on a uint8 [B, 3, H, W] batch (any device) with per-image gains float [B, 3] (hue, saturation,
    value): a new uint8 batch."""
    import torch

    x = images.float() / 255
    r, g, b = x.unbind(1)
    mx, mn = x.amax(1), x.amin(1)
    d = mx - mn
    safe = torch.where(d > 0, d, torch.ones_like(d))
    h = torch.where(mx == r, (g - b) / safe, torch.where(mx == g, (b - r) / safe + 2, (r - g) / safe + 4)) / 6
    h = torch.where(d > 0, h.remainder(1.0), torch.zeros_like(h))
    s = torch.where(d > 0, d / torch.where(mx > 0, mx, torch.ones_like(mx)), torch.zeros_like(d))
    gh, gs, gv = (gains.to(x.device, torch.float32)[:, i].view(-1, 1, 1) for i in range(3))
    h = (h * gh).remainder(1.0)
    s = (s * gs).clamp(max=1.0)
    v = (mx * gv).clamp(max=1.0)
    i = (h * 6).floor()
    f = h * 6 - i
    p, q, t = v * (1 - s), v * (1 - s * f), v * (1 - s * (1 - f))
    i = i.long().remainder(6)
    # colorsys.hsv_to_rgb's six sectors as one gather: per sector, which of (v, p, q, t) each channel takes
    order = torch.tensor([[0, 3, 1], [2, 0, 1], [1, 0, 3], [1, 2, 0], [3, 1, 0], [0, 1, 2]], device=x.device)
    parts = torch.stack((v, p, q, t), 1)  # [B, 4, H, W]
    pick = order[i].permute(0, 3, 1, 2)  # [B, 3, H, W]
    out = parts.gather(1, pick)
    return (out * 255 + 0.5).floor().clamp(0, 255).to(torch.uint8)


def apply_hsv_nhwc(images, gains) -> None:
    """RandomHSV in place on a contiguous uint8 [B, H, W, 3] batch on a CUDA device (or on the CPU under Triton's
    interpreter, TRITON_INTERPRET=1), with per-image gains [B, 3] (hue, saturation, value): apply_hsv_torch's
    float32 arithmetic, one pass (`finish_nhwc` writing over its input)."""
    finish_nhwc(images, gains, out=images.permute(0, 3, 1, 2))


def finish_nhwc(images, gains, *, out, mean=None, std=None):
    """The GPU path's last pass over a contiguous uint8 [B, H, W, 3] batch on a CUDA device (or on the CPU under
    Triton's interpreter): RandomHSV with per-image `gains` [B, 3] (None: none), then, when `mean` and `std` (float32
    [3], in 0..255 units) are given, (value - mean) / std, written into `out` [B, 3, H, W] (any dtype the values
    cast to, any strides: NCHW or channels_last memory; it may be the input's own memory seen as NCHW). One read
    and one write of the batch, where torch's operations make a float32 copy per step; the same values as
    `(apply_hsv_torch(x).float() - mean) / std` cast to out's dtype (IEEE division; rounding to nearest even)."""
    import torch

    if images.dtype != torch.uint8 or images.dim() != 4 or images.shape[3] != 3 or not images.is_contiguous():
        raise ValueError(f"need a contiguous uint8 [B, H, W, 3] batch, got {images.dtype} {tuple(images.shape)}")
    B, H, W, _ = images.shape
    if tuple(out.shape) != (B, 3, H, W) or out.device != images.device:
        raise ValueError(f"need an output [B, 3, H, W] = {[B, 3, H, W]} on {images.device}")
    if out.stride(3) * W != out.stride(2):
        raise ValueError("the output's rows must be whole (NCHW or channels_last memory)")
    hsv = gains is not None
    if hsv:
        g = torch.as_tensor(gains, dtype=torch.float32)
        if g.shape != (B, 3):
            raise ValueError(f"need gains [{B}, 3], got {tuple(g.shape)}")
        if g.device != images.device:  # page-locked, so the copy does not wait for the batch's kernels
            g = g.pin_memory().to(images.device, non_blocking=True) if images.is_cuda else g.to(images.device)
    else:
        g = images  # not read
    norm = mean is not None
    m = [float(v) for v in (mean if norm else (0, 0, 0))]
    d = [float(v) for v in (std if norm else (1, 1, 1))]
    n = H * W
    _kernel()[(B, -(-n // _BLOCK))](images, out, g, n, out.stride(0), out.stride(1), out.stride(3), *m, *d,
                                    HSV=hsv, NORM=norm, BLOCK=_BLOCK)
    return out


_BLOCK = 1024
_KERNEL = None


def _kernel():
    """The Triton kernel, defined on first use (TRITON_INTERPRET is read when it is defined)."""
    global _KERNEL
    if _KERNEL is not None:
        return _KERNEL
    import triton
    import triton.language as tl

    @triton.jit
    def finish(px, out, gains, n, sb, sc, sp, m0, m1, m2, d0, d1, d2, HSV: tl.constexpr, NORM: tl.constexpr,
               BLOCK: tl.constexpr):
        b = tl.program_id(0).to(tl.int64)
        p = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        inside = p < n
        at = px + (b * n + p) * 3
        r8 = tl.load(at, mask=inside, other=0).to(tl.float32)
        g8 = tl.load(at + 1, mask=inside, other=0).to(tl.float32)
        b8 = tl.load(at + 2, mask=inside, other=0).to(tl.float32)
        if HSV:
            r, g, bl = r8 / 255.0, g8 / 255.0, b8 / 255.0
            gh = tl.load(gains + b * 3)
            gs = tl.load(gains + b * 3 + 1)
            gv = tl.load(gains + b * 3 + 2)
            mx = tl.maximum(r, tl.maximum(g, bl))
            dd = mx - tl.minimum(r, tl.minimum(g, bl))
            coloured = dd > 0
            safe = tl.where(coloured, dd, 1.0)
            h = tl.where(mx == r, (g - bl) / safe, tl.where(mx == g, (bl - r) / safe + 2.0, (r - g) / safe + 4.0))
            h = h / 6.0
            h = tl.where(coloured, h - tl.floor(h), 0.0)
            s = tl.where(coloured, dd / tl.where(mx > 0, mx, 1.0), 0.0)
            h = h * gh
            h = h - tl.floor(h)
            s = tl.minimum(s * gs, 1.0)
            v = tl.minimum(mx * gv, 1.0)
            i = tl.floor(h * 6.0)
            f = h * 6.0 - i
            sector = i.to(tl.int32) % 6
            pp = v * (1.0 - s)
            q = v * (1.0 - s * f)
            t = v * (1.0 - s * (1.0 - f))
            # colorsys.hsv_to_rgb's six sectors: which of (v, p, q, t) each channel takes
            ro = tl.where((sector == 0) | (sector == 5), v, tl.where(sector == 1, q, tl.where(sector == 4, t, pp)))
            go = tl.where(sector == 0, t, tl.where((sector == 1) | (sector == 2), v, tl.where(sector == 3, q, pp)))
            bo = tl.where((sector == 0) | (sector == 1), pp, tl.where(sector == 2, t,
                                                                      tl.where((sector == 3) | (sector == 4), v, q)))
            r8 = tl.minimum(tl.maximum(tl.floor(ro * 255.0 + 0.5), 0.0), 255.0)
            g8 = tl.minimum(tl.maximum(tl.floor(go * 255.0 + 0.5), 0.0), 255.0)
            b8 = tl.minimum(tl.maximum(tl.floor(bo * 255.0 + 0.5), 0.0), 255.0)
        if NORM:
            r8, g8, b8 = tl.math.div_rn(r8 - m0, d0), tl.math.div_rn(g8 - m1, d1), tl.math.div_rn(b8 - m2, d2)
        # Three stores written out: Triton's compiler takes no loop over a tuple of tensors (its interpreter does).
        o = out + b * sb + p * sp
        tl.store(o, r8.to(out.dtype.element_ty), mask=inside)
        tl.store(o + sc, g8.to(out.dtype.element_ty), mask=inside)
        tl.store(o + 2 * sc, b8.to(out.dtype.element_ty), mask=inside)

    _KERNEL = finish
    return _KERNEL
