"""`PipelineTuner`: how many decode pipelines of a GPU Loader work side by side, tuned on the training loop.

Why: the pipeline count that trains fastest is not the one that feeds fastest. On an H200 with 16 cores two
pipelines trained ResNet-18 and -50 fastest (three slowed the step they share the GPU with: ResNet-50 12.6% below its
ceiling against 10.4%), while the loader alone, or a loop light enough to wait for data, ran 23% faster with three
(14.2k -> 17.5k img/s, benchmarks/RESULTS.md, eighth session). A loop is either: only the loop shows which.

How: the Loader starts with `settings.pipelines` (the count that trained fastest) and measures the loop's period and
its wait for data (fastfeed/pace.py) over MEASURE_INTERVALS batches. A loop that waits GROW_WAIT of its period or
more is fed too slowly: the tuner tries one pipeline more, and keeps it only when the period shortens by GROW_GAIN;
so it climbs while a pipeline more pays, up to `limit`. Above the start it tries one fewer when the loop stops
waiting (the model got heavier), and every HOLD_BATCHES anyway (the extra pipelines may now slow the step more than
they feed it), and keeps it unless the period lengthens by SHRINK_TOLERANCE. After a rejected try it holds
HOLD_BATCHES before looking again. A loop that waits little and runs at the start count — the training runs
measured — never sees a change; that is the point: the tuner must not cost a training loop what an earlier tuner did
(its switches rebuilt pipelines and stalled the step ~1.5 s; RESULTS.md, 2026-11-30). Here a change costs nothing
but a new pipeline's one-time build: a pipeline dropped stays built, parked, and one taken back is warm. A pipeline
is built only while the device has memory to spare (`room_for_a_pipeline`): the model comes first.

Why the wait gates the tries: the period alone cannot tell a loop fed too slowly from one whose step is slow, and
trying a pipeline more on a loop that does not wait costs that loop the try (a slower step for ~40 batches every
HOLD_BATCHES). The hybrid decoder's climber (decode/hybrid.py) tunes on the same period; both keep only changes that
shorten it, so their measurements may overlap but neither keeps what makes the loop slower.
"""
from __future__ import annotations

import threading

__all__ = ["PipelineTuner", "room_for_a_pipeline", "GROW_WAIT", "SHRINK_WAIT", "GROW_GAIN", "SHRINK_TOLERANCE",
           "MEASURE_INTERVALS", "HOLD_BATCHES", "MIN_FREE_BYTES", "MIN_FREE_SHARE"]

GROW_WAIT = 0.2  # the loop waits this share of its period or more: try a pipeline more
SHRINK_WAIT = 0.02  # it waits less than this with pipelines beyond the start: try one fewer
GROW_GAIN = 0.05  # keep a pipeline more only when it shortens the period by this share (noise: 2-4% per measurement)
SHRINK_TOLERANCE = 0.01  # keep one fewer unless the period lengthens by more than this share
MEASURE_INTERVALS = 32  # intervals of the loop per measurement
HOLD_BATCHES = 500  # after a rejected try: stay this long before trying again
STALL = 8.0  # an interval this many times the measurement's mean is a stall (evaluation, a checkpoint), not a step
_HISTORY = 64  # measurements kept for stats and tests
# A pipeline is built only while the device has this much memory free (both): a DALI pipeline takes some hundreds of
# MB of it, and a model that fills its GPU must not meet an out-of-memory error because the loader grew beside it.
MIN_FREE_BYTES = 2 << 30
MIN_FREE_SHARE = 0.1


class PipelineTuner:
    """The number of pipelines a Loader runs, `start` to `limit`, tuned on the loop's pace (module docstring).
    `settle`: batches already read or decoded when the count changes (the ring's slots); the loop's intervals count
    toward a measurement only after those are taken. `current()` is called by the consumer at each batch."""

    def __init__(self, pace, *, start: int, limit: int, settle: int):
        if not 1 <= start <= limit:
            raise ValueError(f"pipelines: start {start} must be in [1, limit {limit}]")
        self._pace = pace
        self.start, self.limit = int(start), int(limit)
        self._settle = int(settle)
        self._lock = threading.Lock()
        self.count = self.start
        self._base, self._base_period = self.start, None  # the count kept and its last period
        self._mark = pace.ticks
        self._changed = pace.ticks  # when the count last changed
        self.history: list[tuple[int, float, float]] = []  # (count, period s, wait share) per measurement

    def current(self) -> int:
        with self._lock:
            if self.limit > self.start:
                # a whole number of bursts (one batch from each pipeline): see _without_stalls
                n = MEASURE_INTERVALS - MEASURE_INTERVALS % self.count
                steps = self._pace.steps_since(self._mark + self._settle)
                if len(steps) >= n:
                    self._measured(steps[:n])
            return self.count

    def _measured(self, steps: list[tuple[float, float]]) -> None:
        steps = _without_stalls(steps)
        total = sum(gap for gap, _ in steps)
        period = total / len(steps)
        wait = sum(w for _, w in steps) / total if total > 0 else 0.0
        self.history.append((self.count, period, wait))
        del self.history[:-_HISTORY]
        if self.count != self._base:  # a try: keep it or go back
            more = self.count > self._base
            kept = period < self._base_period * (1 - GROW_GAIN) if more else \
                period <= self._base_period * (1 + SHRINK_TOLERANCE)
            if kept:
                self._base, self._base_period = self.count, period
                self._set(self.count)
            else:
                self._set(self._base, hold=True)
            return
        self._base_period = period
        if wait >= GROW_WAIT and self.count < self.limit:
            self._set(self.count + 1)
        elif self.count > self.start and (wait < SHRINK_WAIT or self._pace.ticks - self._changed >= HOLD_BATCHES):
            self._set(self.count - 1)
        else:
            self._set(self.count)

    def _set(self, count: int, hold: bool = False) -> None:
        if count != self.count:
            self._changed = self._pace.ticks
        self.count = count
        self._mark = self._pace.ticks + (HOLD_BATCHES if hold else 0)


def _without_stalls(steps: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The (interval, wait) pairs but the stalls. Why not a trimmed mean (decode/hybrid.py drops the longest
    eighth): pipelines finish batches side by side, so a data-bound loop takes them in bursts — short intervals,
    then one long — and trimming the long ones measured the loader alone at 22-34k img/s when it ran 18k (H200).
    For the same reason a measurement spans a multiple of the pipeline count: 32 intervals in bursts of 3 hold 10
    or 11 long ones, a 6% error, more than a pipeline must gain."""
    mean = sum(gap for gap, _ in steps) / len(steps)
    kept = [s for s in steps if s[0] <= STALL * mean]
    return kept or steps


def room_for_a_pipeline(free_bytes: int, total_bytes: int) -> bool:
    """Whether a device with `free_bytes` of `total_bytes` free may get one more decode pipeline."""
    return free_bytes >= MIN_FREE_BYTES and free_bytes >= MIN_FREE_SHARE * total_bytes
