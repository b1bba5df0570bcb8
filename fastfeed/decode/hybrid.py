"""Hybrid decode: each batch split between a CPU decoder and the GPU decoder, which run side by side.

Decoding on the GPU costs the training step that shares it more than the decode's own time (launches from decoder
threads of the training process, decode kernels beside the model's and NCCL's), while most training hosts leave CPU
cores idle: every image the CPU decodes is one the training GPU does not. How many go to the CPU (the first ones of
each batch) is the Loader's `tuning.climber.ShareClimber`, shared by all its pipelines.

Exactness: the CPU part decodes with libjpeg-turbo (exact), the GPU part within the decode contract's tolerance
(decode/dali_graph.py, chroma_mode); both are normalised with the same constants. Corrupt records: the parts always
raise (`on_error="raise"`), and this class applies the batch's policy over the whole batch, so a bad record is
replaced by the next good one of the *batch* (decode/base.py), as on every other path, and its label follows.
"""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext

import torch

from fastfeed.decode.base import CorruptSampleError, DecodeResult, apply_replacements, replaced_list, resolve_errors
from fastfeed.tuning.climber import START_SHARE

__all__ = ["HybridDecoder"]


class HybridDecoder:
    """cpu: a decoder that returns batches on `device` (NormalizeOnDevice around DALI's CPU backend); gpu: one that
    decodes on it (DaliDecoder). Both built with on_error="raise", the same image_size, dtype, layout and
    normalisation. climber: the Loader's ShareClimber (fastfeed/tuning/climber.py); None: every batch splits at
    START_SHARE."""

    def __init__(self, cpu, gpu, *, device, climber=None, on_error: str = "skip"):
        self._cpu, self._gpu = cpu, gpu
        self.device = torch.device(device)
        self._climber = climber
        self.on_error = on_error
        self.cpu_images = 0  # decoded by each part so far (stats: the split actually used)
        self.gpu_images = 0
        # One thread runs the CPU part while the calling thread runs the GPU part.
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="fastfeed-hybrid-cpu")

    def split(self, n: int) -> int:
        """How many of a batch of n go to the CPU (the first ones)."""
        share = self._climber.current() if self._climber is not None else START_SHARE
        return int(round(n * share))

    def __call__(self, samples, windows) -> DecodeResult:
        n = len(samples)
        if n != len(windows):
            raise ValueError(f"{n} samples but {len(windows)} windows")
        k = self.split(n)
        stream = torch.cuda.current_stream(self.device) if self.device.type == "cuda" else None
        cpu_pos, gpu_pos = list(range(k)), list(range(k, n))
        future = self._pool.submit(self._part, self._cpu, samples, windows, cpu_pos, stream) if k else None
        try:
            gpu = self._part(self._gpu, samples, windows, gpu_pos, stream) if k < n else None
        finally:
            # Always wait: the CPU part reads the samples in place, and the caller frees them when this returns.
            cpu = future.result() if future is not None else None
        self.cpu_images += len(cpu[1]) if cpu is not None else 0
        self.gpu_images += len(gpu[1]) if gpu is not None else 0
        return self._merge(n, [p for p in (cpu, gpu) if p is not None])

    @staticmethod
    def _part(decoder, samples, windows, positions, stream):
        """Decode `positions` of the batch: (images of the good ones, the good positions, {bad position: (code,
        detail)}). A corrupt record is dropped and the rest decoded again (rare: corrupt data)."""
        bad: dict[int, tuple[str, str]] = {}
        good = list(positions)
        images = None
        with torch.cuda.stream(stream) if stream is not None else nullcontext():
            while good:
                try:
                    images = decoder([samples[i] for i in good], windows.take(good)).images
                    break
                except CorruptSampleError as e:
                    if not e.positions:
                        raise
                    for p, code, detail in zip(e.positions, e.codes, e.details):
                        bad[good[p]] = (code, detail)
                    good = [i for i in good if i not in bad]
        return images, good, bad

    def _merge(self, n: int, parts) -> DecodeResult:
        bad: dict[int, tuple[str, str]] = {}
        for _, _, part_bad in parts:
            bad.update(part_bad)
        repl = resolve_errors(bad, n, self.on_error)  # raises under "raise", or when no record of the batch is good
        if len(parts) == 1 and not bad:  # one part decoded the whole batch: its tensor is the batch
            return DecodeResult(parts[0][0], [])
        first = next(p[0] for p in parts if p[0] is not None)
        fmt = torch.channels_last if first.is_contiguous(memory_format=torch.channels_last) and not \
            first.is_contiguous() else torch.contiguous_format
        out = torch.empty((n,) + tuple(first.shape[1:]), dtype=first.dtype, device=first.device, memory_format=fmt)
        for images, good, _ in parts:
            if images is None:
                continue
            if len(good) == good[-1] - good[0] + 1:  # consecutive: a slice copy
                out[good[0]:good[-1] + 1] = images
            else:
                out[torch.as_tensor(good, device=out.device)] = images
        apply_replacements(out, repl)
        return DecodeResult(out, replaced_list(bad))

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        self._cpu.close()
        self._gpu.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

