"""DALI decode settings: where the loader starts (`START`), how it adapts while training (`OnlineTuner`), and the
older start-up measurement (`tune_decoders`, kept for explicit use; no longer on the default path).

Issue 14 measured (H200, 2026-11-30, benchmarks/RESULTS.md) that the setting that decodes fastest with no consumer
(three pipelines) is not the one that trains fastest: with ResNet-50 one pipeline trained 3-4% faster than three
(its decode work slows the training step less), with ResNet-18 two or three pipelines won (one leaves the step
waiting). A start-up measurement on the loader alone cannot see that, and it cost 6-7 s before the first batch.
So the loader starts at once with `START` (the ResNet-50 winner: least interference with the step) and the
`OnlineTuner` climbs a ladder of more decode capacity only while the training loop actually waits for data,
keeping a rung only when the step time per batch improves; it keeps watching, so a consumer that becomes faster
later (smaller model, eval) makes it climb again.

The start-up measurement's original rationale follows.

On the H200 the settings matter more than anything else in the pipeline: DALI's default hardware-decoder share
and thread count lose up to half the throughput, and the best values move with the CPU count, the image mix and
the model sharing the GPU. So rather than guess, the loader decodes a few real batches of the dataset under each
candidate setting (bounded: about a second each) and keeps the fastest. The candidates are the ones that won
somewhere in benchmarks/RESULTS.md; the full table of what was tried is reported in `loader.stats()["info"]`.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import numpy as np

__all__ = ["DecodeSettings", "CANDIDATES", "START", "LADDER", "OnlineTuner", "tune_decoders"]


@dataclass(frozen=True)
class DecodeSettings:
    hw_decoder_load: float
    num_threads: int
    pipelines: int


# Measured winners on an H200 (benchmarks/RESULTS.md): the hardware decoder taking everything with few CPU
# threads, or 90% of it with more threads; two or three pipelines side by side.
CANDIDATES = (
    DecodeSettings(1.0, 2, 2),
    DecodeSettings(1.0, 2, 3),
    DecodeSettings(0.9, 4, 2),
    DecodeSettings(0.9, 4, 3),
)


# Rungs of decode capacity, measured on an H200 with no consumer (img/s, CPU cores): 10.5k (1.9), 14.8k (2.8),
# 16.9k (3.6), 18.2k (5.1). The first is where the loader starts: one pipeline trained ResNet-50 fastest (4,110
# img/s vs 4,079 with 0.9:4 in the same run: equal within noise) and the next two rungs only ADD a pipeline of the
# same kind, which costs one build and no teardown (switches that rebuilt pipelines stalled training ~1.5 s each).
# (1.0, 2, 2) trained ResNet-18 fastest in both rounds; (0.9, 4, 3) is for consumers that barely compute.
START = DecodeSettings(1.0, 2, 1)
LADDER = (START, DecodeSettings(1.0, 2, 2), DecodeSettings(1.0, 2, 3), DecodeSettings(0.9, 4, 3))


class OnlineTuner:
    """Adapt the decode settings to the training loop from what the loop observes, one step at a time.

    Feed it, after every batch the consumer took, `observe(wait_s, step_s)`: `wait_s` = seconds the consumer
    blocked waiting for that batch, `step_s` = seconds from asking for that batch to asking for the next one
    (wait + the user's step). It returns new `DecodeSettings` when the loader should switch (apply them, then keep
    calling observe), else None. Decisions are made per window of `window` steps, after `settle` steps that follow
    every switch (pipelines warming up) are ignored:
      - waiting more than `wait_high` of the window's time, and a rung above exists  -> climb one rung;
      - after a climb, if the step time per batch did not improve by more than `tolerance` -> go back down and
        remember that rung as no better (it is retried only after the wait rises above what it was);
      - at a rung above the start with waits below `wait_low` for `probe_every` windows -> probe one rung down
        (a slower consumer may now train faster with less decode work); kept only if not slower by `tolerance`.
    `history` lists every decision (for `Loader.stats()["info"]`).
    """

    def __init__(self, ladder=LADDER, start: int = 0, *, window: int = 16, settle: int = 4, wait_high: float = 0.05,
                 wait_low: float = 0.01, tolerance: float = 0.02, probe_every: int = 8, max_threads: int | None = None):
        if not ladder:
            raise ValueError("the ladder needs at least one setting")
        if window < 2 or settle < 0 or probe_every < 1:
            raise ValueError(f"window must be >= 2, settle >= 0, probe_every >= 1 (got {window}, {settle}, "
                             f"{probe_every})")
        if not 0 <= wait_low <= wait_high < 1 or not 0 <= tolerance < 1:
            raise ValueError(f"need 0 <= wait_low <= wait_high < 1 and 0 <= tolerance < 1 (got {wait_low}, "
                             f"{wait_high}, {tolerance})")
        rungs = [r for r in ladder if max_threads is None or r.num_threads * r.pipelines <= max(max_threads, 2)]
        self.ladder = tuple(rungs or ladder[:1])
        self.level = min(max(int(start), 0), len(self.ladder) - 1)
        self.window, self.settle = int(window), int(settle)
        self.wait_high, self.wait_low, self.tolerance = wait_high, wait_low, tolerance
        self.probe_every = int(probe_every)
        self.history: list[dict] = []
        self._skip = self.settle
        self._waits: list[float] = []
        self._steps: list[float] = []
        self._trial = None  # (previous level, its step time per batch, its wait fraction) while a switch is on trial
        self._step_at = {}  # level -> last measured step time per batch
        self._no_better: dict[int, float] = {}  # level -> wait fraction at which climbing to it did not pay
        self._quiet = 0
        self._observed = 0

    @property
    def current(self) -> DecodeSettings:
        return self.ladder[self.level]

    def observe(self, wait_s: float, step_s: float) -> DecodeSettings | None:
        self._observed += 1
        if self._skip > 0:
            self._skip -= 1
            return None
        self._waits.append(max(0.0, float(wait_s)))
        self._steps.append(max(float(step_s), float(wait_s), 1e-9))
        if len(self._steps) < self.window:
            return None
        # the median step is robust to the odd slow step (a checkpoint, a log line); the wait share is not a median
        step = sorted(self._steps)[len(self._steps) // 2]
        wait = sum(self._waits) / sum(self._steps)
        self._waits, self._steps = [], []
        return self._decide(step, wait)

    def _decide(self, step: float, wait: float) -> DecodeSettings | None:
        level = self.level
        self._step_at[level] = step
        if self._trial is not None:
            prev, prev_step, prev_wait = self._trial
            self._trial = None
            climbed = prev < level
            # a climb must pay by more than the tolerance; a probe down may be slower by half of it at most (a tie
            # goes to less decode work: fewer CPU threads, less GPU work inside the training step)
            ok = step < prev_step * (1 - self.tolerance) if climbed else step <= prev_step * (1 + self.tolerance / 2)
            if not ok:
                if climbed:
                    self._no_better[level] = prev_wait
                return self._switch(prev, step, wait, "reverted")
            if climbed:
                self._no_better.pop(level, None)
            self._log("kept", step, wait)
        up = level + 1
        if wait > self.wait_high and up < len(self.ladder) and wait > self._no_better.get(up, -1.0) * 1.5:
            self._quiet = 0
            self._trial = (level, step, wait)
            return self._switch(up, step, wait, "climb")
        if wait < self.wait_low and level > 0:
            self._quiet += 1
            if self._quiet >= self.probe_every:
                self._quiet = 0
                self._trial = (level, step, wait)
                return self._switch(level - 1, step, wait, "probe down")
        else:
            self._quiet = 0
        return None

    def refused(self, in_use: DecodeSettings) -> None:
        """The loader could not apply the last switch (a pipeline failed to build, ...) and still runs `in_use`:
        go back to it and never propose the refused rung again."""
        refused = self.level
        self.level = self.ladder.index(in_use) if in_use in self.ladder else 0
        self._no_better[refused] = float("inf")
        self._trial = None
        self._log("refused by the loader", self._step_at.get(refused, 0.0), 0.0)

    def _switch(self, level: int, step: float, wait: float, why: str) -> DecodeSettings:
        self.level = level
        self._skip = self.settle
        self._log(why, step, wait)
        return self.current

    def _log(self, why: str, step: float, wait: float) -> None:
        c = self.current
        self.history.append({"after_steps": self._observed, "decision": why, "step_ms": round(step * 1e3, 2),
                             "wait_fraction": round(wait, 4), "now": [c.hw_decoder_load, c.num_threads, c.pipelines]})


def _throughput(decoders, batches) -> float:
    """Images/s of `decoders` working side by side over `batches` (list of (samples, windows)), one thread each."""
    todo = list(range(len(batches)))
    lock = threading.Lock()
    errors: list[BaseException] = []

    def work(dec):
        while True:
            with lock:
                if not todo:
                    return
                i = todo.pop()
            try:
                dec(*batches[i])
            except BaseException as e:  # noqa: BLE001 - reported below: a failing setting is not chosen
                errors.append(e)
                return

    for dec in decoders:  # warm-up: first runs allocate and initialise the decoders
        dec(*batches[0])
    _sync()
    t0 = time.perf_counter()
    threads = [threading.Thread(target=work, args=(d,)) for d in decoders]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    _sync()
    if errors:
        raise errors[0]
    return sum(len(b[0]) for b in batches) / (time.perf_counter() - t0)


def _sync() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def tune_decoders(make_decoder, batches, candidates=CANDIDATES, cpu_count: int | None = None):
    """Measure each candidate on `batches` and return (best settings, its decoders, table of results).

    `make_decoder(hw_decoder_load, num_threads)` builds one decoder. Decoders of losing candidates are closed.
    Candidates needing more CPU threads than the machine has are skipped.
    """
    table, best = [], None
    for c in candidates:
        if cpu_count is not None and c.num_threads * c.pipelines > max(2, cpu_count):
            continue
        decoders = []
        try:
            decoders = [make_decoder(c.hw_decoder_load, c.num_threads) for _ in range(c.pipelines)]
            rate = _throughput(decoders, batches)
        except Exception as e:  # noqa: BLE001 - a setting DALI refuses here is simply not chosen
            table.append({**c.__dict__, "images_per_s": None, "error": f"{type(e).__name__}: {e}"[:200]})
            for d in decoders:
                d.close()
            continue
        table.append({**c.__dict__, "images_per_s": round(rate, 1)})
        if best is None or rate > best[1]:
            if best is not None:
                for d in best[2]:
                    d.close()
            best = (c, rate, decoders)
        else:
            for d in decoders:
                d.close()
    if best is None:
        raise RuntimeError(f"no decode setting worked on this machine: {table}")
    return best[0], best[2], table


def sample_batches(dataset, widths, heights, batch_size: int, count: int, seed: int, train: bool, image_size: int):
    """`count` batches of real samples (read plainly: this runs once) with their crop windows."""
    from fastfeed.decode import crop_windows

    n = len(dataset)
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        ids = rng.choice(n, size=min(batch_size, n), replace=n < batch_size)
        samples = [np.frombuffer(dataset.read(int(i)), dtype=np.uint8) for i in ids]
        windows = crop_windows(widths[ids], heights[ids], ids, seed=seed, epoch=0, train=train,
                               image_size=image_size)
        out.append((samples, windows))
    return out
