"""Per-stage counters and timers, cheap enough to leave on in production.

`StageStats` is shared by the loader (one per `Loader`, exposed through `loader.stats()`) and by `fastfeed bench`.

    stats = StageStats()
    with stats.timed("decode"):          # perf_counter around the block, plus an NVTX range when CUDA is present
        ...
    stats.record("read", seconds, n=64)  # a duration measured elsewhere (e.g. by the native ring)
    stats.add("samples", 64)             # plain counters ("samples", "bytes_read", "batches" by convention)
    stats.skip("decode_error", key="n01440764/x.JPEG")
    stats.set_info("num_threads", 6)     # the settings in use, to show with the numbers
    stats.snapshot()                     # JSON-serialisable dict, see SNAPSHOT_KEYS
    stats.summary_line(since=prev)       # one line for the per-epoch `log_every` log (delta against `prev`)

Cost: an uncontended `threading.Lock` is taken only for the few dict updates after a block ends (never while the
timed block runs), so threads of a decode pool can share one object; `timed()` costs well under a microsecond
without NVTX. Whether NVTX ranges are emitted is decided once, in the constructor: `torch.cuda.nvtx` calls into
the CUDA runtime and must not be looked up per call.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["StageStats", "format_summary", "snapshot_delta", "DEFAULT_STAGES", "SNAPSHOT_SCHEMA_VERSION",
           "SNAPSHOT_KEYS", "STAGE_KEYS", "MAX_SKIP_EXAMPLES"]

DEFAULT_STAGES = ("read", "decode", "wait", "h2d")
SNAPSHOT_SCHEMA_VERSION = 1
SNAPSHOT_KEYS = ("schema_version", "elapsed_s", "stages", "counters", "skipped", "info")
STAGE_KEYS = ("count", "seconds", "max_s", "mean_ms")
MAX_SKIP_EXAMPLES = 32  # bounded: a dataset with a million bad files must not grow memory without bound

_perf = time.perf_counter


def _cuda_nvtx():
    """Return `torch.cuda.nvtx` when CUDA is usable here, else None (torch itself is optional for this module)."""
    try:
        import torch
    except ImportError:
        return None
    try:
        if not torch.cuda.is_available():
            return None
        return torch.cuda.nvtx
    except Exception:  # a broken driver makes is_available() raise on some builds: no NVTX then, but keep working
        return None


class _Timed:
    """Context manager returned by `StageStats.timed`: a class with __slots__ is ~3x cheaper than a generator.
    After the block, `seconds` is what it recorded."""

    __slots__ = ("_stats", "_stage", "_n", "_t0", "seconds")

    def __init__(self, stats: StageStats, stage: str, n: int):
        self._stats = stats
        self._stage = stage
        self._n = n

    def __enter__(self):
        nvtx = self._stats._nvtx
        if nvtx is not None:
            nvtx.range_push(self._stats._nvtx_prefix + self._stage)
        self._t0 = _perf()
        return self

    def __exit__(self, exc_type, exc, tb):
        dt = self.seconds = _perf() - self._t0
        nvtx = self._stats._nvtx
        if nvtx is not None:
            nvtx.range_pop()
        self._stats.record(self._stage, dt, self._n)
        return False


class StageStats:
    """Counters and wall-clock timers per named stage.

    Args:
        stages: stage names listed first in snapshots and summaries (others are accepted and appended as seen).
        nvtx: emit NVTX ranges around `timed()` blocks. None (default) = when `torch.cuda.is_available()`,
            decided once here.
        nvtx_prefix: prefix of every NVTX range name, so an `nsys` timeline groups fastfeed's stages.
    """

    def __init__(self, stages: Iterable[str] = DEFAULT_STAGES, *, nvtx: bool | None = None,
                 nvtx_prefix: str = "fastfeed/"):
        self._lock = threading.Lock()
        self._order = list(dict.fromkeys(stages))
        # stage -> [count, seconds, max_seconds]; lists are mutated in place under the lock
        self._stages: dict[str, list] = {s: [0, 0.0, 0.0] for s in self._order}
        self._counters: dict[str, int] = {}
        self._skip_reasons: dict[str, int] = {}
        self._skip_examples: list[dict[str, str]] = []
        self._info: dict[str, Any] = {}
        self._t_start = _perf()
        self._nvtx_prefix = nvtx_prefix
        if nvtx is None:
            self._nvtx = _cuda_nvtx()
        elif nvtx:
            self._nvtx = _cuda_nvtx()
            if self._nvtx is None:
                raise RuntimeError("nvtx=True but CUDA is not available; pass nvtx=None to decide automatically")
        else:
            self._nvtx = None

    @property
    def nvtx_enabled(self) -> bool:
        return self._nvtx is not None

    # ---------------------------------------------------------------- recording (hot path)
    def timed(self, stage: str, n: int = 1) -> _Timed:
        """Time a block as one occurrence of `stage` covering `n` items (e.g. samples in a batch)."""
        return _Timed(self, stage, n)

    def record(self, stage: str, seconds: float, n: int = 1) -> None:
        """Add a duration measured elsewhere (native ring, CUDA events) to `stage`."""
        with self._lock:
            s = self._stages.get(stage)
            if s is None:
                s = self._stages[stage] = [0, 0.0, 0.0]
                self._order.append(stage)
            s[0] += n
            s[1] += seconds
            if seconds > s[2]:
                s[2] = seconds

    def add(self, name: str, n: int = 1) -> None:
        """Increment counter `name` by `n` (e.g. "samples", "bytes_read", "batches")."""
        with self._lock:
            self._counters[name] = self._counters.get(name, 0) + n

    def skip(self, reason: str, key: str | None = None, n: int = 1, file: str | None = None) -> None:
        """Count `n` skipped samples for `reason`; the first MAX_SKIP_EXAMPLES keys (with their data file, where
        given) are kept as examples."""
        with self._lock:
            self._skip_reasons[reason] = self._skip_reasons.get(reason, 0) + n
            if key is not None and len(self._skip_examples) < MAX_SKIP_EXAMPLES:
                example = {"key": str(key), "reason": reason}
                if file is not None:
                    example["file"] = str(file)
                self._skip_examples.append(example)

    def set_info(self, name: str, value: Any) -> None:
        """Attach a JSON-serialisable fact (an auto-tuned thread count, the decoder chosen) to snapshots."""
        with self._lock:
            self._info[name] = value

    def reset(self) -> None:
        """Zero every timer, counter and skip; `info` is kept (it describes the configuration, not a period)."""
        with self._lock:
            self._stages = {s: [0, 0.0, 0.0] for s in self._order}
            self._counters = {}
            self._skip_reasons = {}
            self._skip_examples = []
            self._t_start = _perf()

    # ---------------------------------------------------------------- reading
    def snapshot(self) -> dict:
        """A JSON-serialisable copy: {schema_version, elapsed_s, stages: {name: {count, seconds, max_s, mean_ms}},
        counters: {name: int}, skipped: {total, by_reason: {reason: int}, examples: [{key, reason}]}, info}."""
        with self._lock:
            stages = {k: list(v) for k, v in self._stages.items()}
            order = list(self._order)
            counters = dict(self._counters)
            reasons = dict(self._skip_reasons)
            examples = [dict(e) for e in self._skip_examples]
            info = dict(self._info)
            elapsed = _perf() - self._t_start
        return {
            "schema_version": SNAPSHOT_SCHEMA_VERSION,
            "elapsed_s": elapsed,
            "stages": {
                name: {
                    "count": int(stages[name][0]),
                    "seconds": float(stages[name][1]),
                    "max_s": float(stages[name][2]),
                    "mean_ms": 1e3 * stages[name][1] / stages[name][0] if stages[name][0] else 0.0,
                }
                for name in order
            },
            "counters": counters,
            "skipped": {"total": sum(reasons.values()), "by_reason": reasons, "examples": examples},
            "info": info,
        }

    def summary_line(self, since: Mapping | None = None) -> str:
        """One log line; with `since` (an earlier snapshot) it describes only the period after it."""
        return format_summary(self.snapshot(), since)


def snapshot_delta(now: Mapping, before: Mapping | None) -> dict:
    """The activity between two snapshots (timers and counters subtracted; max_s and info from `now`)."""
    if not before:
        return dict(now)
    stages = {}
    for name, s in now["stages"].items():
        b = before["stages"].get(name, {"count": 0, "seconds": 0.0})
        count, secs = s["count"] - b["count"], s["seconds"] - b["seconds"]
        stages[name] = {"count": count, "seconds": secs, "max_s": s["max_s"],
                        "mean_ms": 1e3 * secs / count if count else 0.0}
    counters = {k: v - before["counters"].get(k, 0) for k, v in now["counters"].items()}
    reasons = {k: v - before["skipped"]["by_reason"].get(k, 0) for k, v in now["skipped"]["by_reason"].items()}
    reasons = {k: v for k, v in reasons.items() if v}
    return {**now, "elapsed_s": now["elapsed_s"] - before["elapsed_s"], "stages": stages, "counters": counters,
            "skipped": {"total": sum(reasons.values()), "by_reason": reasons, "examples": []}}


def _human_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000.0
    raise AssertionError("unreachable")


def format_summary(snap: Mapping, since: Mapping | None = None) -> str:
    """Render a snapshot (or the delta between two) as one line: throughput, time per stage, bytes, skips."""
    d = snapshot_delta(snap, since)
    elapsed = max(d["elapsed_s"], 1e-9)
    parts = []
    samples = d["counters"].get("samples")
    if samples is not None:
        parts.append(f"{samples} samples in {elapsed:.1f}s ({samples / elapsed:,.0f}/s)")
    else:
        parts.append(f"{elapsed:.1f}s")
    stage_txt = " ".join(f"{name} {s['seconds']:.2f}s" for name, s in d["stages"].items() if s["count"])
    if stage_txt:
        parts.append(stage_txt)
    if d["counters"].get("bytes_read"):
        parts.append(f"read {_human_bytes(d['counters']['bytes_read'])}")
    if d["skipped"]["total"]:
        why = ", ".join(f"{k}: {v}" for k, v in sorted(d["skipped"]["by_reason"].items()))
        parts.append(f"skipped {d['skipped']['total']} ({why})")
    return " | ".join(parts)
