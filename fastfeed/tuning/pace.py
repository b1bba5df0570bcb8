"""`ConsumerPace`: when the training loop takes each batch, and how long it waited for it, recorded where it takes
them (`EpochRun.next`).

The hybrid decoder's climber (tuning/climber.py) tunes its CPU share on it and the pipeline tuner
(tuning/pipelines.py) its pipeline count: the loop's period — the interval between two takes — is the number the
user cares about. An interval includes the loop's wait for data, so when the loader is the bottleneck the period is
the loader's own, and the wait says so; the gap at an epoch boundary is never counted (`start`).

Two tuners change the loader on one pace, so the pace also keeps them out of each other's measurements. A try — a
change measured against the configuration it left — must be the only change in its measurement: a tuner takes the
pace's one try (`claim`) before it changes anything and gives it back (`release`) when it kept or undid the change;
the other tuner meanwhile stays where it is (and measures it). A try and its undoing move `changed_at`, and every
measurement starts after it (`measurement`), so none spans the other tuner's change: a tuner measuring across the
other's change credits or blames its own try for it, and keeps or undoes the wrong thing
(docs/design/tuning.md#turns). A tuner that was refused the try gets the next one (`claim` serves them in turn,
`withdraw` when it no longer asks), so neither starves the other while it climbs.
"""
from __future__ import annotations

import threading
import time
from collections import deque
from contextlib import contextmanager

__all__ = ["ConsumerPace", "PACE_HISTORY"]

PACE_HISTORY = 64  # intervals kept: more than any measurement window needs
# A tuner refused the try is served first for this many batches (it asks again at each measurement, every ~40).
CLAIM_QUEUE_BATCHES = 128


class ConsumerPace:
    def __init__(self, clock=time.perf_counter):
        self._clock = clock
        self._lock = threading.Lock()
        self._last: float | None = None
        self.ticks = 0  # batches taken so far, over every iteration
        # (tick that ended it, seconds, of which the loop waited for the batch)
        self._gaps: deque[tuple[int, float, float]] = deque(maxlen=PACE_HISTORY)
        self.changed_at = 0  # tick of the last change of the loader by any tuner
        self._owner = None  # the tuner whose try is measured now
        self._queue: list[list] = []  # [tuner, tick it last asked]: refused the try, served in turn
        self._builds = 0  # parts of the loader being built now (`building`)

    def start(self) -> None:
        """A new iteration: the time until its first batch is start-up, not a step of the loop."""
        with self._lock:
            self._last = None

    def tick(self, wait: float = 0.0) -> None:
        """The loop took a batch, after waiting `wait` seconds for it."""
        now = self._clock()
        with self._lock:
            self.ticks += 1
            if self._last is not None:
                self._gaps.append((self.ticks, now - self._last, wait))
            self._last = now

    def steps_since(self, tick: int) -> list[tuple[float, float]]:
        """(interval, wait) of the intervals that ended after `tick` batches had been taken, oldest first (at most
        PACE_HISTORY)."""
        with self._lock:
            return [(gap, wait) for t, gap, wait in self._gaps if t > tick]

    def intervals_since(self, tick: int) -> list[float]:
        """The intervals alone (`steps_since`)."""
        return [gap for gap, _ in self.steps_since(tick)]

    def measurement(self, mark: int, settle: int) -> list[tuple[float, float]]:
        """(interval, wait) a tuner may measure: those after its own last change (`mark`) and after the last change
        by any tuner or build (`changed_at`), once the `settle` batches read or decoded before that change are taken;
        none while a part of the loader is being built (`building`)."""
        with self._lock:
            if self._builds:
                return []
            start = max(mark, self.changed_at) + settle
        return self.steps_since(start)

    def claim(self, tuner) -> bool:
        """Take the one try for `tuner` (True), unless another tuner holds it or was refused before and still asks:
        then `tuner` waits its turn (False) and must not change anything."""
        with self._lock:
            self._queue = [q for q in self._queue if self.ticks - q[1] <= CLAIM_QUEUE_BATCHES]
            if self._owner is tuner:
                return True
            if self._owner is None and (not self._queue or self._queue[0][0] is tuner):
                self._queue = [q for q in self._queue if q[0] is not tuner]
                self._owner, self.changed_at = tuner, self.ticks
                return True
            for q in self._queue:
                if q[0] is tuner:
                    q[1] = self.ticks
                    break
            else:
                self._queue.append([tuner, self.ticks])
            return False

    def withdraw(self, tuner) -> None:
        """`tuner` no longer asks for the try (it measured again and wants no change): the other need not wait."""
        with self._lock:
            self._queue = [q for q in self._queue if q[0] is not tuner]

    def extend(self, tuner) -> None:
        """`tuner`, holding the try, changes the loader again within it (a pipeline more, right after one paid while
        the loop still waits): measurements start after this change too."""
        with self._lock:
            if self._owner is tuner:
                self.changed_at = self.ticks

    @contextmanager
    def building(self):
        """The loader builds a part it was changed to use (a new decode pipeline) inside this block: no measurement
        is taken meanwhile, and every one starts after it. Why: a build takes up to a second while the other
        pipelines feed the loop, so a try measured across it reads the new count slower than it is and is lost, and a
        short loop could even be measured before the new pipeline had decoded anything (docs/design/tuning.md#turns)."""
        with self._lock:
            self._builds += 1
        try:
            yield
        finally:
            with self._lock:
                self._builds -= 1
                self.changed_at = self.ticks

    def release(self, tuner, undone: bool) -> None:
        """`tuner`'s try is over: kept, or `undone` (a change again: measurements start after it)."""
        with self._lock:
            if self._owner is tuner:
                self._owner = None
                if undone:
                    self.changed_at = self.ticks
