"""Hybrid decode: each batch split between a CPU decoder and the GPU decoder, which run side by side.

Why: decoding on the GPU costs the training step that shares it more than the decode's own time (launches from
decoder threads of the training process, decode kernels beside the model's and NCCL's: benchmarks/RESULTS.md),
while most training hosts leave CPU cores idle. Every image the CPU decodes is one the training GPU does not.

How many go to the CPU is tuned online on what the user measures: the training loop's period (the interval between
two batches it takes, fastfeed/pace.py). `ShareClimber` hill-climbs the CPU share of every batch: it measures the
period at the current share, tries a share one STEP higher or lower, keeps a change that shortens the period by
more than CLIMB_EPS, and when neither side does, stays a while and then looks again — so it keeps following the
loop when the model, batch or GPU load changes. It takes turns with the pipeline tuner (fastfeed/pace.py: one try
at a time, no measurement across the other's change). Why not a model of rates: measured on an H200, filling the loop's
time with CPU decode made ResNet-50 5% faster but ResNet-18 14% slower (CPU decode beside a launch-bound step
slows the step itself), and only the loop's own period shows that. All pipelines of a Loader share one climber.

Why small steps from the GPU alone: the loop's period at every fixed share, measured on an H200 with 32 cores
(benchmarks/results/gpu-h200x2-2026-11-30f-share-sweep.json.gz), is flat for ResNet-50 from 1/8 to 3/4 (all within 2%,
4-5% faster than the GPU alone) and falls off a cliff for ResNet-18 above 3/8 (the CPU part cannot keep up: 1/2 is
36% slower). A probe a quarter away costs a ResNet-18 loop a third of its speed while it lasts. With 16 cores even
1/8 slowed ResNet-18 by 14% (benchmarks/results/gpu-h200-2026-11-30g-r2-table-r50.json): a climber started at 1/8
moved to 1/4 on a noisy comparison and never tried 0 again (19% slower than the GPU alone). Starting at 0, every
CPU share has to earn its place; replayed on the measured steps (tests/test_hybrid.py), steps of 1/8 from 0 come
within 1.5-2.5% of the best fixed share on both models with 32 cores and stay at 0 with 16.

Why a first share is measured twice: on one H200 with 16 cores every share slowed ResNet-18 (1/8 by 3%, 1/4 by 7%:
the mean steps of timed rows, fifteenth session) while its 32-batch windows spread by 3-5%, and judged on one window
of the GPU alone the climber kept 1/8 or 1/4 in 5 of 20 runs (9,683-10,190 img/s against 10,177-10,678 on the GPU
alone, benchmarks/RESULTS.md). So a share that looks faster than one window of the GPU alone is measured again after
the GPU alone is, and kept only when the mean of its two windows beats theirs by CLIMB_EPS. Replayed in
tests/test_hybrid.py, a share that costs 3% is kept in 0-3 of 40 runs instead of 4-13, and ResNet-50 with a 1% gain
per step still finds its 3/8 (22 of 24 runs, 23 before); on the H200, 15 runs of ResNet-18 and -50 since all ended
on the GPU alone. Later steps are judged on one window, as before.

Why a quarter under DDP (DDP_START_SHARE, chosen by settings.py for a rank of a job with world_size > 1 that has
DDP_START_MIN_CORES cores of its own, as measured; a rank with fewer cores starts at 0, its CPU part may not keep up
with a quarter): there the GPU decode also competes with NCCL's all-reduce and every step waits for the slower rank,
so a CPU share pays more and the periods vary more. On two H200s (16 cores per rank, benchmarks/RESULTS.md, seventh
session), ResNet-50 trained at 7,493 / 7,751 / 7,872 img/s at fixed shares 0 / 1/4 / 1/2, but a climber started at
0 stayed there (share 0.02; 7,342-7,458): its one probe, 1/8, did not beat the noise by CLIMB_EPS. Started at 1/4 it
settled near 3/8 (7,630-7,807, DALI's reader 7,578 in the same run). ResNet-18 was as fast from 1/4 as at 0
(14,953-15,665 vs 14,966 img/s).

Exactness: the CPU part decodes with libjpeg-turbo (exact), the GPU part within the decode contract's tolerance
(decode/dali.py, chroma_mode); both are normalised with the same constants. Corrupt records: the parts always
raise (`on_error="raise"`), and this class applies the batch's policy over the whole batch, so a bad record is
replaced by the next good one of the *batch* (decode/base.py), as on every other path, and its label follows.
"""
from __future__ import annotations

import threading
import weakref
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext

import torch

from fastfeed.decode.base import CorruptSampleError, DecodeResult, apply_replacements, replaced_list, resolve_errors

__all__ = ["HybridDecoder", "ShareClimber", "climber_for", "climber_of", "START_SHARE", "DDP_START_SHARE",
           "DDP_START_MIN_CORES"]

START_SHARE = 0.0  # one process (see the module docstring)
DDP_START_SHARE = 0.25  # a rank of a distributed job with DDP_START_MIN_CORES cores or more
DDP_START_MIN_CORES = 16
STEP = 1 / 8  # also the grid of shares
# A change is kept only when it shortens the period by more than this share. The steps are coarse on purpose: on an
# H200 a ResNet-50 step varies by 5-25% from one batch to the next, and the whole gain from CPU decode was ~5%.
CLIMB_EPS = 0.01
MEASURE_INTERVALS = 32  # intervals of the loop per measurement: their mean without the longest eighth
HOLD_BATCHES = 500  # when no neighbour is faster: stay this long before probing again,
# twice as long after each further look that finds none faster: a probe can cost a third of the loop's speed while
# it lasts (one pipeline at 1/2 on ResNet-50: 76 ms against 57), and a settled loop need not pay it every 500 batches
MAX_HOLD_BATCHES = 8 * HOLD_BATCHES
_HISTORY = 256  # measurements kept for stats and tests


class ShareClimber:
    """The CPU share of each batch, hill-climbed on the loop's period (see the module docstring). `settle`: batches
    already decoded or in the decoders when the share changes (the Loader's read-ahead: prefetch + 2 x pipelines);
    the loop's intervals count toward a measurement only after those are taken."""

    def __init__(self, pace, *, settle: int, start: float = START_SHARE):
        self._pace = pace
        self._settle = int(settle)
        self._lock = threading.Lock()
        self.share = float(start)
        self._base, self._base_period = self.share, None  # the best share so far and its period
        self._dir, self._tried = 1, 0  # the direction that last helped; neighbours of the base tried so far
        self._hold = HOLD_BATCHES  # the next stay when no neighbour is faster
        self._waited = False  # the last try waited for the pipeline tuner's
        # a first share that looked faster than the GPU alone, and its window, while both are measured again
        self._confirming: float | None = None
        self._confirming_period = 0.0
        self._mark = pace.ticks  # measurements use the intervals after mark + settle
        self.history: list[tuple[float, float]] = []  # (share, period) of the last measurements, for stats and tests

    @property
    def settled(self) -> bool:
        """Whether it holds its share after a look that found no better neighbour (until the hold ends and it looks
        again); False while it measures or probes. What `fastfeed bench` warms up for, with the pipeline tuner's."""
        with self._lock:
            return self.share == self._base and self._mark > self._pace.ticks

    def current(self) -> float:
        with self._lock:
            gaps = [gap for gap, _ in self._pace.measurement(self._mark, self._settle)]
            if len(gaps) >= MEASURE_INTERVALS:
                self._measured(_robust_mean(gaps[:MEASURE_INTERVALS]))
            return self.share

    def _measured(self, period: float) -> None:
        self.history.append((self.share, period))
        del self.history[:-_HISTORY]
        trying = self.share != self._base
        if self._confirming is not None and not trying:  # the GPU alone again, between a first share's windows
            self._base_period = (self._base_period + period) / 2
            self._pace.extend(self)
            self._set(self._confirming)
            return
        if self._confirming is not None:  # the first share's second window: both against both
            period = (period + self._confirming_period) / 2
            self._confirming = None
        elif trying and self._base == 0.0 and period < self._base_period * (1 - CLIMB_EPS):
            # A first share for the CPU, faster than one window of the GPU alone: measure the GPU alone and this
            # share once more, still holding the turn, and judge the mean of each's two windows (module docstring,
            # "Why a first share is measured twice").
            self._confirming, self._confirming_period = self.share, period
            self._pace.extend(self)
            self._set(self._base)
            return
        if self._base_period is None or not trying:  # the base (re)measured: try a neighbour
            self._base_period = period
            if not self._waited:  # (after waiting for the try, the neighbours not yet tried)
                self._tried = 0
        elif period < self._base_period * (1 - CLIMB_EPS):  # faster: the new base, keep going that way
            self._dir = 1 if self.share > self._base else -1
            self._base, self._base_period, self._tried = self.share, period, 0
            self._hold = HOLD_BATCHES
        else:  # not faster: the next neighbour
            self._tried += 1
        if trying:  # that try is over; the pipeline tuner may have the next one
            self._pace.release(self, undone=self.share != self._base)
        neighbours = self._neighbours()
        self._waited = False
        if self._tried < len(neighbours):
            # a try waits while the pipeline tuner's is measured (fastfeed/pace.py): measure the base again meanwhile
            self._waited = not self._pace.claim(self)
            self._set(self._base if self._waited else neighbours[self._tried])
        else:  # no neighbour is faster: stay, then measure the base again and look around (the loop may change)
            self._pace.withdraw(self)
            self._set(self._base, at=self._pace.ticks + self._hold)
            self._hold = min(2 * self._hold, MAX_HOLD_BATCHES)

    def _neighbours(self) -> list[float]:
        """The shares one step from the base, in [0, 1], the direction that last helped first."""
        out = [self._base + self._dir * STEP, self._base - self._dir * STEP]
        return [x for x in out if -1e-9 <= x <= 1 + 1e-9]

    def _set(self, share: float, at: int | None = None) -> None:
        self.share = min(1.0, max(0.0, round(share / STEP) * STEP))
        self._mark = self._pace.ticks if at is None else at


def _robust_mean(gaps: list[float]) -> float:
    """The mean without the longest eighth: one evaluation or checkpoint step does not decide a measurement."""
    kept = sorted(gaps)[: max(1, len(gaps) - len(gaps) // 8)]
    return sum(kept) / len(kept)


_climbers: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
_climbers_lock = threading.Lock()


def climber_of(pace) -> ShareClimber | None:
    """The climber tuning on `pace`, if a hybrid decoder made one."""
    with _climbers_lock:
        return _climbers.get(pace)


def climber_for(pace, settle: int, start: float = START_SHARE) -> ShareClimber:
    """The one climber of a Loader (of its pace): every pipeline's hybrid decoder uses the same share."""
    with _climbers_lock:
        c = _climbers.get(pace)
        if c is None:
            c = _climbers[pace] = ShareClimber(pace, settle=settle, start=start)
        return c


class HybridDecoder:
    """cpu: a decoder that returns batches on `device` (NormalizeOnDevice around DALI's CPU backend); gpu: one that
    decodes on it (DaliDecoder). Both built with on_error="raise", the same image_size, dtype, layout and
    normalisation. climber: the Loader's ShareClimber (`climber_for`); None: every batch splits at START_SHARE."""

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

