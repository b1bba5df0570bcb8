"""`ConsumerPace`: how often the training loop takes a batch, measured where it takes them (`EpochRun.next`).

The hybrid decoder (decode/hybrid.py) sizes its CPU share from it: a pipeline has `pipelines` steps of the loop to
decode one batch, and whatever of that time the CPU can fill is decode work the training GPU does not do.

The period is the median of the last PACE_WINDOW intervals between two takes. An interval includes the loop's wait
for data, so when the loader is the bottleneck the period is the loader's own; the median ignores the odd long
step (evaluation, a checkpoint) and the gap at an epoch boundary is never counted (`start`).
"""
from __future__ import annotations

import statistics
import threading
import time
from collections import deque

__all__ = ["ConsumerPace", "PACE_WINDOW", "PACE_MIN_INTERVALS"]

PACE_WINDOW = 16
PACE_MIN_INTERVALS = 4  # fewer than this: no period yet


class ConsumerPace:
    def __init__(self, clock=time.perf_counter):
        self._clock = clock
        self._lock = threading.Lock()
        self._last: float | None = None
        self._gaps: deque[float] = deque(maxlen=PACE_WINDOW)

    def start(self) -> None:
        """A new iteration: the time until its first batch is start-up, not a step of the loop."""
        with self._lock:
            self._last = None

    def tick(self) -> None:
        """The loop took a batch."""
        now = self._clock()
        with self._lock:
            if self._last is not None:
                self._gaps.append(now - self._last)
            self._last = now

    def period(self) -> float | None:
        """Seconds between two takes (median of the recent ones), or None before PACE_MIN_INTERVALS of them."""
        with self._lock:
            if len(self._gaps) < PACE_MIN_INTERVALS:
                return None
            return statistics.median(self._gaps)
