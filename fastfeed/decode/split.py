"""CPU decode, GPU normalise: for a CUDA device, a CPU decoder writes uint8 HWC batches into page-locked memory;
they are copied to the GPU asynchronously (a quarter of the bytes of float32) and flipped-normalised-laid out there
by one table lookup on torch's current stream.

Why: decoding on the GPU costs the training step more than the decode itself on small images. The GPU decoder
launches work for every image from threads of the training process, and with 64-px thumbnails a ResNet-50 step is
short enough that those launches delay its own (docs/design/decoders.md#auto). Here the GPU sees one copy and
a few kernels per batch, and no decoder thread makes a CUDA call.

Exactness: the lookup table is the CPU path's (`lut.make_lut`: the output dtype's value of (v/255 - mean)/std for
every v and channel), so a batch normalised here is bit-identical to the same uint8 batch normalised on the CPU.
"""
from __future__ import annotations

import torch

from fastfeed.decode.base import DecodeResult

__all__ = ["NormalizeOnDevice"]


class NormalizeOnDevice:
    """Wraps a CPU decoder that returns uint8 [N, 3, S, S] batches with NHWC memory (channels_last) in page-locked
    memory; returns them on `device` as `dtype`, normalised with `mean`/`std` (0-1 units) unless dtype is uint8,
    NCHW or (channels_last=True) NHWC memory."""

    def __init__(self, inner, device, *, dtype, mean, std, channels_last: bool):
        from fastfeed.decode.lut import make_lut

        self._inner = inner
        self.device = torch.device(device)
        self.dtype = dtype
        self.channels_last = bool(channels_last)
        self._lut = None
        if dtype != torch.uint8:
            name = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16"}[dtype]
            lut = torch.from_numpy(make_lut(name, mean, std).copy())
            if dtype != torch.float32:  # the table holds the 16-bit floats' bit patterns
                lut = lut.view(torch.int16).view(dtype)
            self._lut = lut.reshape(-1).to(self.device)  # [3 * 256]: channel c's table at c * 256
            self._offset = (torch.arange(3, dtype=torch.int32) * 256).to(self.device)

    def __call__(self, samples, windows) -> DecodeResult:
        res = self._inner(samples, windows)
        hwc = res.images.permute(0, 2, 3, 1)  # the inner decoder's NHWC memory, as [N, S, S, 3]
        if not hwc.is_contiguous():
            raise RuntimeError("NormalizeOnDevice needs a decoder that writes NHWC (channels_last) batches")
        x = hwc.to(self.device, non_blocking=hwc.is_pinned())
        if self._lut is not None:
            x = self._lut[x.int() + self._offset]  # [N, S, S, 3] of dtype, one gather
        out = x.permute(0, 3, 1, 2)  # NCHW view of NHWC memory
        if not self.channels_last:
            out = out.contiguous()
        return DecodeResult(out, res.replaced)

    def close(self) -> None:
        self._inner.close()
