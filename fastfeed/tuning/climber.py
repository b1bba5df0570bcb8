"""`ShareClimber`: the hybrid decoder's CPU share, hill-climbed on the training loop's period.

The loop's period (the interval between two batches it takes, `pace.ConsumerPace`) is what the user cares about, so
the climber measures it at the current share, tries a share one STEP higher or lower, keeps a change that shortens the
period by more than CLIMB_EPS, and when neither side does, holds a while and then looks again: it follows the loop when
the model, batch or GPU load changes. It takes turns with the pipeline tuner (`pace.ConsumerPace.claim`). No model of
rates: CPU decode beside a launch-bound step slows the step itself, and only the loop's own period shows that.

It starts from the GPU alone (small steps, since a probe far from a good share can cost a small model a third of its
speed while it lasts), a first share off the GPU must win on two measurements against two (the windows are about as
noisy as the gain), and a rank of a distributed job with many cores starts at a quarter (there the GPU decode also
competes with the all-reduce). The measurements behind each rule: docs/design/tuning.md#cpu-share.
"""
from __future__ import annotations

import threading

__all__ = ["ShareClimber", "START_SHARE", "DDP_START_SHARE", "DDP_START_MIN_CORES", "STEP", "CLIMB_EPS"]

START_SHARE = 0.0  # one process (see the module docstring)
DDP_START_SHARE = 0.25  # a rank of a distributed job with DDP_START_MIN_CORES cores or more
DDP_START_MIN_CORES = 16
STEP = 1 / 8  # also the grid of shares
# A change is kept only when it shortens the period by more than this share. The steps are coarse on purpose: a
# training step varies more from one batch to the next than CPU decode can gain (docs/design/tuning.md#cpu-share).
CLIMB_EPS = 0.01
MEASURE_INTERVALS = 32  # intervals of the loop per measurement: their mean without the longest eighth
HOLD_BATCHES = 500  # when no neighbour is faster: stay this long before probing again,
# twice as long after each further look that finds none faster: a probe can cost a third of the loop's speed while
# it lasts, and a settled loop need not pay it every 500 batches
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
            # share once more, still holding the turn, and judge the mean of each's two windows (module docstring:
            # one window each is about as noisy as the gain).
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
            # a try waits while the pipeline tuner's is measured (tuning/pace.py): measure the base again meanwhile
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
