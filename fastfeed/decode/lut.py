"""The lookup table that normalises uint8 pixels, shared by every path that normalises decoded uint8 images: the
numba kernels of the CPU decoders (decode/kernels.py) and the GPU gather after a CPU decode (decode/split.py).

Its own module, without numba: a decoder that normalises on the GPU needs the table, not the kernels, and importing
numba costs a few tenths of a second of the time to the first batch.
"""
from __future__ import annotations

import numpy as np

__all__ = ["make_lut", "numpy_view"]


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
