"""Measure one loader: warm-up, then a fixed number of steps, timing the wait for data and the whole step.

Loader-agnostic: anything iterable over (images, labels) works (`fastfeed.Loader`, the torch baseline, a list);
`set_epoch(e)`, `stats()` and `close()` are used when present. A loader whose epoch ends mid-run is re-iterated
(with `set_epoch`), and the time that takes counts as data wait, because a training loop would wait too.

Timing per step i (host clock, `time.perf_counter`):
    wait_i = time blocked in next(iterator)           (data wait)
    step_i = wait_i + time in consumer(images, labels) (the consumer synchronises the device before returning)
    wall   = sum(step_i);  wait_fraction = sum(wait_i) / wall  (in [0, 1] by construction)
Because every consumer step ends with a device synchronise, GPU work the loader queued asynchronously is paid for
inside the step that consumes it, never hidden; see fastfeed/bench/consumers.py.
"""
from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from fastfeed.bench.sysmon import SysMonitor

__all__ = ["LoaderResult", "run_loader", "run_compute_only", "percentiles", "still_tuning", "RESULT_KEYS"]

RESULT_KEYS = ("name", "steps", "samples", "wall_s", "samples_per_s", "step_s", "wait_s", "wait_fraction",
               "host", "gpu", "gpu_error", "loader_stats", "per_step")
PERCENTILE_KEYS = ("p50", "p90", "p99", "mean")


def percentiles(values: list[float]) -> dict[str, float]:
    """p50/p90/p99 (linear interpolation, like numpy's default) and mean."""
    if not values:
        raise ValueError("no values")
    xs = sorted(values)

    def q(p: float) -> float:
        pos = (len(xs) - 1) * p
        lo, hi = math.floor(pos), math.ceil(pos)
        return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)

    return {"p50": q(0.50), "p90": q(0.90), "p99": q(0.99), "mean": sum(xs) / len(xs)}


@dataclass
class LoaderResult:
    name: str
    step_s: list[float] = field(default_factory=list)
    wait_s: list[float] = field(default_factory=list)
    samples: list[int] = field(default_factory=list)
    monitor: dict = field(default_factory=dict)
    loader_stats: dict | None = None
    warmup_steps: int = 0  # untimed steps taken (more than asked while the loader was still tuning itself)

    def to_dict(self) -> dict:
        wall = sum(self.step_s)
        n = sum(self.samples)
        d = {
            "name": self.name,
            "steps": len(self.step_s),
            "samples": n,
            "wall_s": wall,
            "samples_per_s": n / wall if wall > 0 else 0.0,
            "step_s": percentiles(self.step_s),
            "wait_s": {**percentiles(self.wait_s), "total": sum(self.wait_s)},
            "wait_fraction": min(1.0, sum(self.wait_s) / wall) if wall > 0 else 0.0,
            "host": self.monitor.get("host"),
            "gpu": self.monitor.get("gpu"),
            "gpu_error": self.monitor.get("gpu_error"),
            "loader_stats": self.loader_stats,
            "per_step": {"step_s": list(self.step_s), "wait_s": list(self.wait_s), "samples": list(self.samples)},
        }
        assert tuple(d) == RESULT_KEYS  # the JSON schema is a promise to scripts; changing it bumps the version
        return d


def _batch_len(labels) -> int:
    try:
        return len(labels)
    except TypeError:
        return int(labels.shape[0])


def _images_and_labels(batch) -> tuple:
    """(images, labels) of a batch: a pair as it is; a dict batch (fields, detection) by its "images" and "labels"
    (a detection batch's labels are per box: the samples are counted by the images)."""
    if isinstance(batch, dict):
        return batch["images"], batch.get("labels")
    return batch


class _Epochs:
    """Endless iteration over a per-epoch iterable, calling set_epoch at every new epoch."""

    def __init__(self, loader: Iterable):
        self.loader = loader
        self.epoch = 0
        self._start()

    def _start(self) -> None:
        if hasattr(self.loader, "set_epoch"):
            self.loader.set_epoch(self.epoch)
        self._it = iter(self.loader)
        self._yielded = 0

    def next(self):
        while True:
            try:
                item = next(self._it)
                self._yielded += 1
                return item
            except StopIteration:
                if self._yielded == 0:
                    raise RuntimeError("the loader yielded no batch in a whole epoch (fewer samples than one "
                                       "batch? training drops the last partial batch)") from None
                self.epoch += 1
                self._start()


def run_loader(loader: Iterable, consumer: Callable, *, name: str, steps: int = 50, warmup: int = 10,
               gpu_index: int | None = None, progress: bool = True, monitor_interval: float = 0.1,
               max_seconds: float | None = None, max_warmup: int | None = None) -> LoaderResult:
    """Run `warmup` untimed steps then `steps` timed ones; returns per-step timings and resource use.

    max_seconds: stop the timed steps early once this much wall time has passed (at least one step always runs),
    so a benchmark can ask for "as many steps as fit in 40 s" on machines of any speed; `steps` is then the cap.
    max_warmup: while the loader is still tuning itself on the loop (`still_tuning`), warm up beyond `warmup`, up to
    this many untimed steps in all; None: `warmup` exactly. `LoaderResult.warmup_steps` says how many were taken.
    """
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    if warmup < 0:
        raise ValueError(f"warmup must be >= 0, got {warmup}")
    if max_warmup is not None and max_warmup < 0:
        raise ValueError(f"max_warmup must be >= 0, got {max_warmup}")
    if max_seconds is not None and not max_seconds > 0:
        raise ValueError(f"max_seconds must be > 0, got {max_seconds}")
    from tqdm import tqdm

    res = LoaderResult(name=name)
    epochs = _Epochs(loader)
    bar = tqdm(total=warmup + steps, desc=f"{name}", unit="step", disable=not progress, leave=False,
               dynamic_ncols=True)
    try:
        limit = max(warmup, max_warmup or 0)
        while res.warmup_steps < warmup or res.warmup_steps < limit and still_tuning(loader):
            images, labels = _images_and_labels(epochs.next())
            consumer(images, labels)
            res.warmup_steps += 1
            if res.warmup_steps > warmup:  # the loader was still tuning: the bar grows with the warm-up
                bar.total += 1
            bar.update(1)
        stats0 = loader.stats() if hasattr(loader, "stats") else None
        mon = SysMonitor(interval=monitor_interval, gpu_index=gpu_index).start()
        try:
            perf = time.perf_counter
            deadline = perf() + max_seconds if max_seconds is not None else math.inf
            for _ in range(steps):
                t0 = perf()
                images, labels = _images_and_labels(epochs.next())
                t1 = perf()
                consumer(images, labels)
                t2 = perf()
                res.wait_s.append(t1 - t0)
                res.step_s.append(t2 - t0)
                res.samples.append(_batch_len(images))
                bar.update(1)
                bar.set_postfix_str(f"{res.samples[-1] / max(t2 - t0, 1e-9):,.0f} samples/s", refresh=False)
                if t2 >= deadline:
                    break
        finally:
            mon.stop()
        res.monitor = mon.result()
        if hasattr(loader, "stats"):
            res.loader_stats = _stats_delta(stats0, loader.stats())
    finally:
        bar.close()
    return res


def still_tuning(loader) -> bool:
    """Whether `loader` says it is still tuning itself on the loop: a fastfeed.Loader whose pipeline tuner or hybrid
    CPU-share climber has a try in flight or waiting (`stats()["info"]["tuning_settled"]`). Steps timed meanwhile
    measure a loader in the middle of changing, and a short run can be mostly such steps (docs/design/tuning.md)."""
    stats = getattr(loader, "stats", None)
    if not callable(stats):
        return False
    return ((stats() or {}).get("info") or {}).get("tuning_settled") is False


def _stats_delta(before: dict | None, after: dict | None) -> dict | None:
    """Loader stats for the timed steps only, when the loader uses fastfeed.loader.stats snapshots; else as given."""
    if after is None:
        return None
    if before and "stages" in after and "stages" in before:
        from fastfeed.loader.stats import snapshot_delta

        return snapshot_delta(after, before)
    return after


def run_compute_only(consumer: Callable, batch, *, steps: int, warmup: int) -> list[float]:
    """Per-step seconds of the consumer on a resident batch: the ceiling with a perfect loader."""
    images, labels = batch
    for _ in range(warmup):
        consumer(images, labels)
    out = []
    for _ in range(steps):
        t0 = time.perf_counter()
        consumer(images, labels)
        out.append(time.perf_counter() - t0)
    return out
