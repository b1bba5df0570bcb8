"""Hybrid decode: each batch split between a CPU decoder and the GPU decoder, which run side by side.

Why: decoding on the GPU costs the training step that shares it more than the decode's own time (launches from
decoder threads of the training process, decode kernels beside the model's and NCCL's: benchmarks/RESULTS.md),
while most training hosts leave CPU cores idle. Every image the CPU decodes is one the training GPU does not.

How many go to the CPU (`plan_split`) is decided per batch from three measurements: the CPU and the GPU part's
seconds per image (moving averages of their wall times) and the training loop's pace (`fastfeed.pace`):
  - fill: a pipeline has `pipelines` steps of the loop to deliver its next batch; the CPU takes as many images as
    fit in FILL_MARGIN of that time. When the loop is slower than the loader, this moves decode work off the GPU
    and nothing waits.
  - balance: the share that makes both parts end together, the split with the highest throughput. When the
    loader is the bottleneck (the loop waits, its pace is the loader's own), fill shrinks below balance and
    balance holds.
The larger of the two wins, so the split follows the consumer: a change of model, batch or GPU load moves it
within a few batches. Until both rates are measured the CPU takes START_SHARE of each batch.

Exactness: the CPU part decodes with libjpeg-turbo (exact), the GPU part within the decode contract's tolerance
(decode/dali.py, chroma_mode); both are normalised with the same constants. Corrupt records: the parts always
raise (`on_error="raise"`), and this class applies the batch's policy over the whole batch, so a bad record is
replaced by the next good one of the *batch* (decode/base.py), as on every other path, and its label follows.
"""
from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext

import torch

from fastfeed.decode.base import CorruptSampleError, DecodeResult, apply_replacements, replaced_list, resolve_errors

__all__ = ["HybridDecoder", "plan_split", "START_SHARE", "FILL_MARGIN"]

START_SHARE = 0.25
# The CPU part may take this share of a pipeline's time budget: what is left absorbs step-to-step jitter.
FILL_MARGIN = 0.8
# A part's time updates its rate only when it decoded at least this share of the batch: a tiny part's wall time is
# its fixed overhead, not a rate.
_MIN_MEASURED_SHARE = 1 / 16
_EMA = 0.3  # weight of the newest measurement


def plan_split(n: int, cpu_s: float | None, gpu_s: float | None, period_s: float | None, pipelines: int) -> int:
    """The number of a batch's `n` images the CPU decodes (the first ones), from the CPU and GPU parts' seconds per
    image and the loop's seconds per batch (None: not measured yet). See the module docstring."""
    if cpu_s is None or gpu_s is None:
        return int(round(n * START_SHARE))
    balance = n * gpu_s / (cpu_s + gpu_s)
    fill = FILL_MARGIN * pipelines * period_s / cpu_s if period_s else 0.0
    return int(min(n, max(balance, fill)))


class _Rate:
    """Moving average of seconds per image."""

    def __init__(self):
        self.value: float | None = None

    def update(self, seconds: float, images: int) -> None:
        x = seconds / images
        self.value = x if self.value is None else (1 - _EMA) * self.value + _EMA * x


class HybridDecoder:
    """cpu: a decoder that returns batches on `device` (NormalizeOnDevice around DALI's CPU backend); gpu: one that
    decodes on it (DaliDecoder). Both built with on_error="raise", the same image_size, dtype, layout and
    normalisation. pace: the Loader's ConsumerPace (None: balance only). pipelines: how many of these decode
    batches side by side (each has `pipelines` steps of the loop per batch)."""

    def __init__(self, cpu, gpu, *, device, pipelines: int = 1, pace=None, on_error: str = "skip"):
        self._cpu, self._gpu = cpu, gpu
        self.device = torch.device(device)
        self._pipelines = int(pipelines)
        self._pace = pace
        self.on_error = on_error
        self._cpu_rate, self._gpu_rate = _Rate(), _Rate()
        self.cpu_images = 0  # decoded by each part so far (stats: the split actually used)
        self.gpu_images = 0
        # One thread runs the CPU part while the calling thread runs the GPU part.
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="fastfeed-hybrid-cpu")

    def split(self, n: int) -> int:
        period = self._pace.period() if self._pace is not None else None
        return plan_split(n, self._cpu_rate.value, self._gpu_rate.value, period, self._pipelines)

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
        parts = [p for p in (cpu, gpu) if p is not None]
        self._learn(n, cpu, gpu)
        return self._merge(n, parts)

    @staticmethod
    def _part(decoder, samples, windows, positions, stream):
        """Decode `positions` of the batch: (images of the good ones, the good positions, {bad position: (code,
        detail)}, seconds). A corrupt record is dropped and the rest decoded again (rare: corrupt data)."""
        t0 = time.perf_counter()
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
        return images, good, bad, time.perf_counter() - t0

    def _learn(self, n: int, cpu, gpu) -> None:
        for part, rate in ((cpu, self._cpu_rate), (gpu, self._gpu_rate)):
            if part is not None and len(part[1]) >= max(1, n * _MIN_MEASURED_SHARE):
                rate.update(part[3], len(part[1]))
        self.cpu_images += len(cpu[1]) if cpu is not None else 0
        self.gpu_images += len(gpu[1]) if gpu is not None else 0

    def _merge(self, n: int, parts) -> DecodeResult:
        bad: dict[int, tuple[str, str]] = {}
        for _, _, part_bad, _ in parts:
            bad.update(part_bad)
        repl = resolve_errors(bad, n, self.on_error)  # raises under "raise", or when no record of the batch is good
        first = next(p[0] for p in parts if p[0] is not None)
        fmt = torch.channels_last if first.is_contiguous(memory_format=torch.channels_last) and not \
            first.is_contiguous() else torch.contiguous_format
        out = torch.empty((n,) + tuple(first.shape[1:]), dtype=first.dtype, device=first.device, memory_format=fmt)
        for images, good, _, _ in parts:
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

