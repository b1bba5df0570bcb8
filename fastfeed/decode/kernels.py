"""Numba kernels and lookup tables shared by the CPU decoders (pillow-simd and DALI's CPU backend).

A decoded, resized uint8 HWC image becomes one batch slot in a single pass: flip, normalize through a [3, 256]
lookup table of the output dtype's bit patterns (exact; float16/bfloat16 need no float16 support in numba) and
write CHW or HWC. No PIL here: the DALI path imports this module without pulling PIL in.
"""
from __future__ import annotations

import numpy as np

from fastfeed.decode.numba_import import import_numba

numba = import_numba()

__all__ = ["emit_chw", "emit_hwc", "make_lut", "numpy_view"]


@numba.njit(nogil=True, cache=True)
def emit_chw(src, lut, flip, out):
    S0, S1 = src.shape[0], src.shape[1]
    for c in range(3):
        for y in range(S0):
            for x in range(S1):
                sx = S1 - 1 - x if flip else x
                out[c, y, x] = lut[c, src[y, sx, c]]


@numba.njit(nogil=True, cache=True)
def emit_hwc(src, lut, flip, out):
    S0, S1 = src.shape[0], src.shape[1]
    for y in range(S0):
        for x in range(S1):
            sx = S1 - 1 - x if flip else x
            for c in range(3):
                out[y, x, c] = lut[c, src[y, sx, c]]


def make_lut(dtype_name: str, mean, std) -> np.ndarray:
    """[3, 256] table: uint8 value -> normalized value of channel c, as the output dtype's bits."""
    import torch

    v = np.arange(256, dtype=np.float64) / 255.0
    if dtype_name == "uint8":
        return np.repeat(np.arange(256, dtype=np.uint8)[None, :], 3, axis=0)
    vals = np.stack([(v - m) / s for m, s in zip(mean, std)]).astype(np.float32)
    t = torch.from_numpy(vals).to(getattr(torch, dtype_name))
    if dtype_name == "float32":
        return t.numpy()
    return t.view(torch.int16).numpy().view(np.uint16)  # bit patterns; numba copies them verbatim


def numpy_view(t):
    """A numpy view of a torch tensor of any supported dtype (16-bit floats as uint16 bit patterns)."""
    import torch

    if t.dtype in (torch.float16, torch.bfloat16):
        return t.view(torch.int16).numpy().view(np.uint16)
    return t.numpy()
