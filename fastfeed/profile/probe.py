"""What `fastfeed profile` installs inside the profiled training process: a `Probe`, which holds the measured window
(warm-up, measured steps, then continue or stop) and each step's parts, and the hooks that report to it (hooks.py,
which says what each part is).

A step ends at each optimizer step (torch's global optimizer hooks: every optimizer of every framework), or, in a
loop without an optimizer, at each batch the data iterator hands out; the rest of a step (forward, loss, logging)
is the step minus its timed parts. A step that also took batches with autograd off (an evaluation pass between two
optimizer steps: Lightning's validation loop, a script's `torch.no_grad()` loop) is not a training step: it is left
out of the window, counted in `left_out`, and another step is measured in its place; else its evaluation would be
charged to one training step's data and forward. A SIGTERM during the window (`fastfeed profile --timeout`, a
scheduler) writes the steps measured so far before the process dies of it, as it would have.
On a GPU each boundary also records a CUDA event, and the window ends with one synchronise: the GPU's own time
between the events says how long the GPU sat idle while the CPU waited for data (a wall-clock wait can be hidden by
kernels still running from the step before) and how busy it was in each part.

Each process writes `$FASTFEED_PROFILE_DIR/proc-<pid>.json` when the window ends (or at exit, if the script ends
first); `fastfeed profile` reads them (fastfeed/profile/report.py).
"""
from __future__ import annotations

import atexit
import json
import os
import sys
import threading
import time

__all__ = ["install", "Probe"]

ENV_DIR = "FASTFEED_PROFILE_DIR"
ENV_OPTIONS = "FASTFEED_PROFILE_OPTIONS"  # JSON: warmup, steps, then
# The measured window: steps left out first, steps measured, and what the script does after it.
DEFAULT_WARMUP = 5
DEFAULT_STEPS = 20
THEN = ("continue", "stop")


class Probe:
    """The hooks' state: one per process, installed once."""

    def __init__(self, out_dir: str, warmup: int = DEFAULT_WARMUP, steps: int = DEFAULT_STEPS, then: str = THEN[0]):
        self.out_dir, self.warmup, self.steps, self.then = out_dir, warmup, steps, then
        self.main_thread = threading.get_ident()
        self.records: list[dict] = []  # one per measured step
        self.facts: dict = {"dataloaders": [], "data_parallel": False, "ddp": [], "world_size": 1, "rank": 0,
                            "autocast": None}
        self.step_index = 0  # steps ended so far (warm-up included)
        self.by_optimizer = False  # an optimizer step was seen: steps end there, not at each batch
        self.done = False
        self._cur = self._new_step()
        self._t_step = time.perf_counter()
        self._gpu = None  # torch.cuda when the script uses a GPU
        self._events: list = []  # (step index, kind, start event, end event) in the window
        self._monitor = None
        self._t_window = None
        self._depth = 0  # nested timed regions (a DataLoader next inside a wrapper's next): the outermost counts
        self.ddp_modules: list = []  # weak references, in the order the facts list them
        self.comm_spans: list = []  # (launch, completion) perf_counter times of DDP's buckets since the last backward
        self.left_out: list[dict] = []  # measured-window steps that also ran an evaluation pass (module docstring)
        self._sigterm_set = False  # our SIGTERM handler is installed (during the window only)

    @staticmethod
    def _new_step() -> dict:
        return {"data_s": 0.0, "h2d_s": 0.0, "h2d_bytes": 0, "h2d_pageable_bytes": 0, "backward_s": 0.0,
                "optimizer_s": 0.0, "comm_s": 0.0, "ddp_comm_s": 0.0, "batches": 0, "samples": 0,
                "eval_batches": 0}

    # ---- the window -------------------------------------------------------------------------------------------

    @property
    def measuring(self) -> bool:
        return not self.done and self.step_index >= self.warmup

    def end_step(self) -> None:
        now = time.perf_counter()
        if self.measuring:
            if self._t_window is None:  # the first measured step began at the previous boundary
                self._start_window(self._t_step)
            rec = dict(self._cur, step_s=now - self._t_step, index=self.step_index)
            if 0 < rec["eval_batches"] < rec["batches"]:  # training and evaluation batches: not a training step
                self.left_out.append({k: rec[k] for k in ("index", "step_s", "batches", "eval_batches")})
                self._events = [e for e in self._events if e[0] != len(self.records)]
            else:
                self.records.append(rec)
        self.step_index += 1
        self._cur = self._new_step()
        self._t_step = now
        if self.step_index == self.warmup and self._gpu is not None:
            self._gpu.synchronize()  # warm-up's queued work is not the window's
            self._t_step = time.perf_counter()
        if self.measuring and len(self.records) >= self.steps:
            self.finish()
            if self.then == "stop":
                raise SystemExit(0)

    def _start_window(self, t0: float) -> None:
        from fastfeed.bench.sysmon import SysMonitor

        self._t_window = t0
        self._catch_sigterm()
        gpu_index = self._gpu.current_device() if self._gpu is not None else None
        try:
            self._monitor = SysMonitor(interval=0.05, gpu_index=gpu_index).start()
        except Exception:  # noqa: BLE001 - the machine numbers are a bonus; the step table does not need them
            self._monitor = None

    def finish(self) -> None:
        """Write this process's report (once)."""
        if self.done:
            return
        self.done = True
        self._release_sigterm()
        machine = None
        if self._monitor is not None:
            self._monitor.stop()
            machine = self._monitor.result()
        gpu = self._gpu_summary()
        if gpu is not None and self.facts["world_size"] > 1 and self.facts["rank"] == 0:
            from fastfeed.profile.topology import gpu_links

            self.facts["gpu_links"] = gpu_links()  # the communication finding says how the GPUs talk
        # Called from the optimizer's post-step hook: the step's gradients are still there (zero_grad comes later).
        for fact, ref in zip(self.facts["ddp"], self.ddp_modules):
            module = ref()
            if module is not None:
                fact["all_used"] = all(p.grad is not None for p in module.parameters() if p.requires_grad)
        report = {"pid": os.getpid(), "argv": sys.argv, "warmup": self.warmup, "steps_wanted": self.steps,
                  "step_boundary": "optimizer" if self.by_optimizer else "batch", "records": self.records,
                  "left_out": self.left_out,
                  "facts": self.facts, "machine": machine, "gpu": gpu, "overhead": _overhead_estimate(self)}
        os.makedirs(self.out_dir, exist_ok=True)
        path = os.path.join(self.out_dir, f"proc-{os.getpid()}.json")
        with open(path + ".tmp", "w") as f:
            json.dump(report, f)
        os.replace(path + ".tmp", path)

    # ---- timed regions ----------------------------------------------------------------------------------------

    def timed(self, kind: str, fn, *args, **kwargs):
        """fn(*args, **kwargs), its wall time added to the current step's `kind` (outermost region only)."""
        if self._depth or threading.get_ident() != self.main_thread:
            return fn(*args, **kwargs)
        self._depth += 1
        ev = self._event_pair() if self.measuring else None
        t0 = time.perf_counter()
        try:
            if ev:
                ev[0].record()
            return fn(*args, **kwargs)
        finally:
            self._cur[f"{kind}_s"] += time.perf_counter() - t0
            if ev:
                ev[1].record()
                self._events.append((len(self.records), kind, ev[0], ev[1]))
            self._depth -= 1

    def backward(self, fn, *args, **kwargs):
        """A backward pass, timed; DDP's buckets completed in it (comm_spans) then say how long it waited for them
        at its end: that exposed part is communication, not backward."""
        self.comm_spans = []
        t0 = time.perf_counter()
        try:
            return self.timed("backward", fn, *args, **kwargs)
        finally:
            spans, self.comm_spans = self.comm_spans, []
            if spans and self.measuring and not self._depth and threading.get_ident() == self.main_thread:
                end = time.perf_counter()
                ready = max(a for a, _ in spans)  # the last bucket's gradients were computed then
                exposed = max(0.0, min(end, max(b for _, b in spans)) - ready)
                exposed = min(exposed, self._cur["backward_s"])
                self._cur["backward_s"] -= exposed
                self._cur["comm_s"] += exposed
                self._cur["ddp_comm_s"] += _union(spans, t0)

    def _event_pair(self):
        if self._gpu is None:
            return None
        return self._gpu.Event(enable_timing=True), self._gpu.Event(enable_timing=True)

    def _gpu_summary(self) -> dict | None:
        """Per measured step, the GPU time between each region's events: for "data", how long the GPU was idle
        while the CPU waited (the events bracket no kernel of the script's)."""
        if self._gpu is None:
            return None
        self._gpu.synchronize()
        per_step: dict[int, dict[str, float]] = {}
        for i, kind, a, b in self._events:
            try:
                ms = a.elapsed_time(b)
            except RuntimeError:
                continue
            d = per_step.setdefault(i, {})
            d[kind] = d.get(kind, 0.0) + ms / 1e3
        mem = self._gpu.max_memory_allocated()
        return {"per_step": {str(k): v for k, v in per_step.items()}, "memory_peak_bytes": int(mem),
                "device": self._gpu.get_device_name()}

    def _catch_sigterm(self) -> None:
        """For the window: SIGTERM writes the report, then kills the process as the default action would. Only
        where nothing else handles SIGTERM (a framework's own handler is left alone), from the main thread."""
        import signal

        if threading.get_ident() != threading.main_thread().ident:
            return
        try:
            if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
                return
            signal.signal(signal.SIGTERM, self._on_sigterm)
            self._sigterm_set = True
        except (ValueError, OSError):  # not the main interpreter's main thread
            pass

    def _release_sigterm(self) -> None:
        import signal

        if self._sigterm_set and signal.getsignal(signal.SIGTERM) == self._on_sigterm:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
        self._sigterm_set = False

    def _on_sigterm(self, signum, frame) -> None:
        import signal

        self.finish()
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)  # the death the sender asked for, exit status 128 + 15

    def note_batch(self, batch, grad: bool = True) -> None:
        self._cur["batches"] += 1
        if not grad:
            self._cur["eval_batches"] += 1
        n = _batch_len(batch)
        if n:
            self._cur["samples"] += n

    def use_gpu(self, cuda) -> None:
        if self._gpu is None:
            self._gpu = cuda


_PROBE: Probe | None = None


def install(out_dir: str | None = None, **options) -> Probe | None:
    """Install the hooks in this process (once); options default from $FASTFEED_PROFILE_OPTIONS."""
    global _PROBE
    if _PROBE is not None:
        return _PROBE
    out_dir = out_dir or os.environ.get(ENV_DIR)
    if not out_dir:
        return None
    opts = json.loads(os.environ.get(ENV_OPTIONS, "{}"))
    opts.update(options)
    probe = Probe(out_dir, warmup=int(opts.get("warmup", DEFAULT_WARMUP)), steps=int(opts.get("steps", DEFAULT_STEPS)),
                  then=opts.get("then", THEN[0]))
    _PROBE = probe
    from fastfeed.profile.hooks import patch_torch

    patch_torch(probe)
    atexit.register(probe.finish)
    return probe


def _union(spans, start: float) -> float:
    """The length of the union of the (a, b) intervals, from `start` on."""
    total, end = 0.0, start
    for a, b in sorted(spans):
        a = max(a, end)
        if b > a:
            total += b - a
            end = b
    return total


def _batch_len(batch) -> int:
    import torch

    if isinstance(batch, torch.Tensor):
        return int(batch.shape[0]) if batch.dim() else 0
    if isinstance(batch, (list, tuple)) and batch:
        return _batch_len(batch[0])
    if isinstance(batch, dict) and batch:
        if "images" in batch:
            return _batch_len(batch["images"])
        # the first value that counts samples: a collate_fn may put names or other lists first
        return next((n for n in map(_batch_len, batch.values()) if n), 0)
    return 0


def _overhead_estimate(probe: Probe) -> dict:
    """What the hooks cost per step: one timed region's bookkeeping (`Probe.timed` around nothing, CUDA events
    left out), measured here, times the regions the measured steps went through."""
    n = 2000
    saved, probe._cur = probe._cur, Probe._new_step()
    done, probe.done = probe.done, True  # not measuring: no CUDA events, no records
    try:
        t0 = time.perf_counter()
        for _ in range(n):
            probe.timed("data", _nothing)
        per_region = (time.perf_counter() - t0) / n
    finally:
        probe._cur, probe.done = saved, done
    regions = sum(r["batches"] for r in probe.records) * 2 + 4 * len(probe.records)
    step_total = sum(r["step_s"] for r in probe.records) or 1.0
    return {"per_region_s": per_region, "share_of_step": per_region * regions / step_total}


def _nothing() -> None:
    return None
