"""Numba kernels shared by the CPU decoders (pillow-simd and DALI's CPU backend).

A decoded, resized uint8 HWC image becomes one batch slot in a single pass: flip, normalize through a [3, 256]
lookup table of the output dtype's bit patterns (decode/lut.py; exact, and float16/bfloat16 need no float16 support
in numba) and write CHW or HWC. No PIL here: the DALI path imports this module without pulling PIL in.
"""
from __future__ import annotations

from fastfeed.decode.numba_import import import_numba

numba = import_numba()

__all__ = ["emit_chw", "emit_hwc"]


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
