"""`PipelineTuner`: how many decode pipelines of a GPU Loader work side by side, tuned on the training loop.

Why: the pipeline count that trains fastest is not the one that feeds fastest. A pipeline more feeds faster but shares
the GPU with the training step and can slow it: a loop light enough to wait for data gains, a heavy one loses. Only
the loop shows which it is.

How: the Loader starts with `settings.pipelines` (one: each is built before the first batch, loader/settings.py) and
measures the loop's period and its wait for data (tuning/pace.py) over MEASURE_INTERVALS batches. Each change is a
try, compared with the count it left (the mean of its last BASE_MEASUREMENTS measurements). Fewer pipelines are the
prior — they hold less of the GPU, its memory and the host's cores:
- one pipeline more when the loop waits GROW_WAIT of its period or more, kept only when the period shortens by
  GROW_GAIN — on a second measurement, when the first does not show it (a new pipeline's first measurement can read
  slow, and judged on it alone a loop that gains from the pipeline may lose it); so it climbs while a pipeline more
  pays, up to `limit` (the next try right after one paid while the loop still waits, without giving the turn to the
  climber between them);
- one fewer when the loop barely waits (under SHRINK_WAIT), down to `floor` — but after a pipeline more paid, every
  REVISIT_BATCHES instead (the extra one may now slow the step more than it feeds it); kept unless the period
  lengthens by SHRINK_TOLERANCE.
A lost try holds the next try the same way for HOLD_BATCHES, twice as long after each further loss (a try that
starves the loop costs it ~40 slow batches). A change costs nothing but a new pipeline's one-time build: a pipeline
dropped stays built, parked, and one taken back is warm. The build goes through libdali's C API (decode/dali_capi.py)
and runs beside the training step; DALI's Python binding would hold the GIL throughout it and stall the step
(docs/design/dali-capi.md). A pipeline is built only while the device has memory to spare (`room_for_a_pipeline`):
the model comes first. The measurements behind each rule: docs/design/tuning.md#pipeline-count.

Why the wait gates the tries: the period alone cannot tell a loop fed too slowly from one whose step is slow, and
trying a pipeline more on a loop that does not wait costs that loop the try (a slower step for ~40 batches every
HOLD_BATCHES). The hybrid decoder's climber (tuning/climber.py) tunes its CPU share on the same period: the two take
turns (`ConsumerPace.claim`), and neither measures across the other's change.
"""
from __future__ import annotations

import threading

__all__ = ["PipelineTuner", "room_for_a_pipeline", "GROW_WAIT", "SHRINK_WAIT", "GROW_GAIN", "SHRINK_TOLERANCE",
           "MEASURE_INTERVALS", "HOLD_BATCHES", "MAX_HOLD_BATCHES", "REVISIT_BATCHES", "BASE_MEASUREMENTS",
           "MIN_FREE_BYTES", "MIN_FREE_SHARE"]

# A loop waiting this share of its period or more: try a pipeline more. Low, because a loop that waits a few percent
# can still train faster beside one more (docs/design/tuning.md#pipeline-count).
GROW_WAIT = 0.05
SHRINK_WAIT = 0.02  # it waits less than this: try one fewer
GROW_GAIN = 0.03  # keep a pipeline more only when it shortens the period by this share
SHRINK_TOLERANCE = 0.01  # keep one fewer unless the period lengthens by more than this share
MEASURE_INTERVALS = 32  # intervals of the loop per measurement
HOLD_BATCHES = 500  # after a lost try: none the same way for this many batches, twice as many after each one more
MAX_HOLD_BATCHES = 8 * HOLD_BATCHES  # (a try that starves the loop costs it ~40 slow batches)
REVISIT_BATCHES = 2 * HOLD_BATCHES  # after a pipeline more paid: try one fewer this many batches later
BASE_MEASUREMENTS = 4  # a try is compared with the mean of this many measurements of the count it left
STALL = 8.0  # an interval this many times the measurement's mean is a stall (evaluation, a checkpoint), not a step
_HISTORY = 64  # measurements kept for stats and tests
# A pipeline is built only while the device has this much memory free (both): a DALI pipeline takes some hundreds of
# MB of it, and a model that fills its GPU must not meet an out-of-memory error because the loader grew beside it.
MIN_FREE_BYTES = 2 << 30
MIN_FREE_SHARE = 0.1


class PipelineTuner:
    """The number of pipelines a Loader runs, `floor` to `limit`, starting at `start`, tuned on the loop's pace (module
    docstring). `settle`: batches already read or decoded when the count changes (the ring's slots); the loop's
    intervals count toward a measurement only after those are taken. `current()` is called by the consumer at each
    batch."""

    def __init__(self, pace, *, start: int, limit: int, settle: int, floor: int | None = None):
        floor = start if floor is None else int(floor)
        if not 1 <= floor <= start <= limit:
            raise ValueError(f"pipelines: start {start} must be in [floor {floor}, limit {limit}], floor >= 1")
        self._pace = pace
        self.floor, self.start, self.limit = floor, int(start), int(limit)
        self._settle = int(settle)
        self._lock = threading.Lock()
        self.count = self.start
        self._base, self._base_periods = self.start, []  # the count kept and its last periods
        self._base_at = pace.changed_at  # the loader's last change (pace.changed_at) when they were measured
        self._mark = pace.ticks
        self._since = pace.ticks  # when the base was last kept or defended against a try of one fewer
        # The base was a pipeline more that paid: the loop stopped waiting because of it, so that is no reason to
        # try one fewer (the wait would come back only once the batches decoded ahead ran out, after the try was
        # measured, and the count would swing back and forth); every REVISIT_BATCHES instead.
        self._grown = False
        # per way (+1: a pipeline more, -1: one fewer): no try that way before this tick, and how long the next
        # lost try that way holds (a lost try of one fewer must not keep a waiting loop from one more)
        self._hold_until = {1: pace.ticks, -1: pace.ticks}
        self._hold = {1: HOLD_BATCHES, -1: HOLD_BATCHES}
        self._want: int | None = None  # the count the rules asked for at the last measurement of the base
        self.history: list[tuple[int, float, float]] = []  # (count, period s, wait share) per measurement
        self._second_look = False  # the try of a pipeline more being measured is in its second window

    @property
    def settled(self) -> bool:
        """Whether the count is decided for now: no try in flight, and the last measurement of the count kept asked
        for no change (none pays, or the next try is held). A benchmark warms up until then (fastfeed bench): a
        measurement taken while the tuner is still trying is of a loader in the middle of changing."""
        with self._lock:
            return self.limit == self.floor or self.count == self._base == self._want

    def current(self) -> int:
        with self._lock:
            if self.limit > self.floor:
                # a whole number of bursts (one batch from each pipeline): see _stalled
                n = MEASURE_INTERVALS - MEASURE_INTERVALS % self.count
                steps = self._pace.measurement(self._mark, self._settle)
                if len(steps) >= n:
                    if _stalled(steps[:n]):
                        self._mark = self._pace.ticks  # measure again, once the batches decoded meanwhile are taken
                    else:
                        self._measured(steps[:n])
            return self.count

    def _measured(self, steps: list[tuple[float, float]]) -> None:
        total = sum(gap for gap, _ in steps)
        period = total / len(steps)
        wait = sum(w for _, w in steps) / total if total > 0 else 0.0
        self.history.append((self.count, period, wait))
        del self.history[:-_HISTORY]
        ticks = self._pace.ticks
        if self.count != self._base:  # a try: keep it or go back
            kept = self._pays(self._base, self.count, period)
            way = 1 if self.count > self._base else -1
            if way > 0 and not kept and not self._second_look:
                # A pipeline more is measured a second time before it is dropped, and judged on that: its first
                # measurement read slow where the later ones did not (module docstring).
                self._second_look = True
                self._set(self.count)
                return
            self._second_look = False
            if kept:
                self._grown = way > 0
                self._base, self._base_periods = self.count, []
                self._since, self._hold[way] = ticks, HOLD_BATCHES
            else:  # each lost try holds the next one that way twice as long as the last
                self._hold_until[way] = ticks + self._hold[way]
                self._hold[way] = min(2 * self._hold[way], MAX_HOLD_BATCHES)
                if way < 0:
                    self._since = ticks  # the base defended itself: revisit it later
            self._want = None  # decided once the count kept is measured again
            if kept and way > 0 and wait >= GROW_WAIT and self.count < self.limit:
                # The loop still waits beside the pipeline more that paid: try the next one now, keeping the turn,
                # with this measurement as the new count's base. Handing the turn to the climber between the two
                # tries slowed the climb (docs/design/tuning.md#pipeline-count).
                self._base_periods = [period]
                self._pace.extend(self)
                self._set(self.count + 1)
                return
            self._set(self._base)
            self._pace.release(self, undone=not kept)
            return
        if self._base_at != self._pace.changed_at:  # the loader changed since (the hybrid's climber): start over
            self._base_periods, self._base_at = [], self._pace.changed_at
        self._base_periods = (self._base_periods + [period])[-BASE_MEASUREMENTS:]
        count = self.count
        fewer = wait < SHRINK_WAIT and not self._grown or self._grown and ticks - self._since >= REVISIT_BATCHES
        if count > self.floor and fewer and ticks >= self._hold_until[-1]:
            want = count - 1
        elif wait >= GROW_WAIT and count < self.limit and ticks >= self._hold_until[1]:
            want = count + 1
        else:
            want = count
        self._want = want
        # a try waits while the climber's is measured (fastfeed/tuning/pace.py): measure this count again meanwhile
        if want == count:
            self._pace.withdraw(self)
        self._set(want if want == count or self._pace.claim(self) else count)

    def _pays(self, base: int, count: int, period: float) -> bool:
        """Whether a try of `count` pipelines instead of `base` measured `period` is kept: one more only when it
        shortens the period by GROW_GAIN, one fewer unless it lengthens it by SHRINK_TOLERANCE. The base's period is
        the mean of its last BASE_MEASUREMENTS measurements: one alone is off by ~0.5% in a training loop."""
        base_period = sum(self._base_periods) / len(self._base_periods)
        if count > base:
            return period < base_period * (1 - GROW_GAIN)
        return period <= base_period * (1 + SHRINK_TOLERANCE)

    def _set(self, count: int) -> None:
        """Run `count` pipelines from now; the next measurement starts after the batches in flight (settle)."""
        self.count = count
        self._mark = self._pace.ticks


def _stalled(steps: list[tuple[float, float]]) -> bool:
    """Whether the (interval, wait) pairs hold a stall (evaluation, a checkpoint): such a measurement is not the
    loop's period, and is taken again. Why not drop the stall alone, or a trimmed mean (tuning/climber.py drops the
    longest eighth): pipelines finish batches side by side, so a data-bound loop takes them in bursts — short
    intervals, then one long — and trimming the long ones overstates the loader's rate
    (docs/design/tuning.md#pipeline-count). For the same reason a measurement spans a whole number of bursts (a
    multiple of the pipeline count): 32 intervals in bursts of 3 hold 10 or 11 long ones, a 6% error, and one
    interval dropped leaves 31 in bursts of 2, a 3% error: as much as a pipeline must gain."""
    mean = sum(gap for gap, _ in steps) / len(steps)
    return any(gap > STALL * mean for gap, _ in steps)


def room_for_a_pipeline(free_bytes: int, total_bytes: int) -> bool:
    """Whether a device with `free_bytes` of `total_bytes` free may get one more decode pipeline."""
    return free_bytes >= MIN_FREE_BYTES and free_bytes >= MIN_FREE_SHARE * total_bytes
