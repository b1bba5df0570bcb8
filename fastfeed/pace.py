"""`ConsumerPace`: when the training loop takes each batch, and how long it waited for it, recorded where it takes
them (`EpochRun.next`).

The hybrid decoder (decode/hybrid.py) tunes its CPU share on it and the pipeline tuner (fastfeed/pipelines.py) its
pipeline count: the loop's period — the interval between two takes — is the number the user cares about. An interval
includes the loop's wait for data, so when the loader is the bottleneck the period is the loader's own, and the wait
says so; the gap at an epoch boundary is never counted (`start`).
"""
from __future__ import annotations

import threading
import time
from collections import deque

__all__ = ["ConsumerPace", "PACE_HISTORY"]

PACE_HISTORY = 64  # intervals kept: more than any measurement window needs


class ConsumerPace:
    def __init__(self, clock=time.perf_counter):
        self._clock = clock
        self._lock = threading.Lock()
        self._last: float | None = None
        self.ticks = 0  # batches taken so far, over every iteration
        # (tick that ended it, seconds, of which the loop waited for the batch)
        self._gaps: deque[tuple[int, float, float]] = deque(maxlen=PACE_HISTORY)

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

    def intervals_since(self, tick: int) -> list[float]:
        """The intervals that ended after `tick` batches had been taken (oldest first, at most PACE_HISTORY)."""
        with self._lock:
            return [gap for t, gap, _ in self._gaps if t > tick]

    def steps_since(self, tick: int) -> list[tuple[float, float]]:
        """(interval, wait) of the intervals that ended after `tick` batches had been taken, oldest first."""
        with self._lock:
            return [(gap, wait) for t, gap, wait in self._gaps if t > tick]
