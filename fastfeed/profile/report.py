"""The profiled processes' records (probe.py) as one report: per-step attribution, throughput, the machine, the
verdict (rules.py), and the comparison with a baseline report (`--baseline before.json`)."""
from __future__ import annotations

import glob
import json
import os
import statistics

from fastfeed.profile.rules import verdict
from fastfeed.profile.topology import describe_links

__all__ = ["load_records", "record_files", "summarize", "format_report", "PARTS"]

# The parts of a step, in the table's order; "other" (forward, loss, logging, ...) is the step minus the rest.
PARTS = ("data", "h2d", "forward+other", "backward", "optimizer", "comm")


def record_files(folder: str) -> list[str]:
    """The process reports in `folder` (probe.py writes one per process)."""
    return sorted(glob.glob(os.path.join(folder, "proc-*.json")))


def load_records(folder: str) -> list[dict]:
    """Every process report in `folder` that measured at least one step (DataLoader workers and launchers write
    empty ones)."""
    out = []
    for path in record_files(folder):
        with open(path) as f:
            rep = json.load(f)
        if rep.get("records"):
            out.append(rep)
    return out


def _process_summary(rep: dict) -> dict:
    recs = rep["records"]
    n = len(recs)
    step = [r["step_s"] for r in recs]
    total = sum(step) or 1e-12
    parts = {"data": sum(r["data_s"] for r in recs), "h2d": sum(r["h2d_s"] for r in recs),
             "backward": sum(r["backward_s"] for r in recs), "optimizer": sum(r["optimizer_s"] for r in recs),
             "comm": sum(r["comm_s"] for r in recs)}
    parts["forward+other"] = max(0.0, total - sum(parts.values()))
    per_step = []  # each step cut into PARTS (seconds), for the timeline (timeline.py)
    for r in recs:
        one = {"data": r["data_s"], "h2d": r["h2d_s"], "backward": r["backward_s"], "optimizer": r["optimizer_s"],
               "comm": r["comm_s"]}
        one["forward+other"] = max(0.0, r["step_s"] - sum(one.values()))
        per_step.append(one)
    samples = sum(r["samples"] for r in recs)
    gpu = rep.get("gpu")
    data_gpu_idle = None
    if gpu is not None:
        data_gpu_idle = sum(v.get("data", 0.0) for v in gpu["per_step"].values())
    facts = rep["facts"]
    return {
        "pid": rep["pid"], "rank": facts.get("rank", 0), "steps": n, "step_boundary": rep["step_boundary"],
        "s_per_step": total / n, "s_per_step_median": statistics.median(step),
        "samples_per_s": samples / total if samples else None,
        "samples_per_step": samples / n if samples else None,
        "share": {k: parts[k] / total for k in PARTS},
        # DDP's buckets from launch to completion, mostly under backward: what of it backward waited for is "comm"
        "ddp_comm_share": sum(r.get("ddp_comm_s", 0.0) for r in recs) / total,
        "data_gpu_idle_share": None if data_gpu_idle is None else data_gpu_idle / total,
        "h2d_bytes_per_step": sum(r["h2d_bytes"] for r in recs) / n,
        "h2d_pageable_share": (sum(r["h2d_pageable_bytes"] for r in recs) / max(1, sum(r["h2d_bytes"] for r in recs))),
        "facts": facts, "machine": rep.get("machine"), "gpu": gpu, "overhead": rep.get("overhead"),
        "per_step": per_step, "left_out": rep.get("left_out", []),
    }


def summarize(reports: list[dict]) -> dict:
    """One summary for the run: each process's, and the run's (the slowest rank's step: the others wait for it)."""
    procs = sorted((_process_summary(r) for r in reports), key=lambda p: p["rank"])
    if not procs:
        return {"processes": [], "run": None, "verdict": []}
    slowest = max(procs, key=lambda p: p["s_per_step"])
    rates = [p["samples_per_s"] for p in procs if p["samples_per_s"]]
    run = {"ranks": len(procs), "s_per_step": slowest["s_per_step"],
           "samples_per_s": sum(rates) if rates else None, "share": slowest["share"],
           "ddp_comm_share": slowest["ddp_comm_share"],
           "data_gpu_idle_share": slowest["data_gpu_idle_share"], "machine": slowest["machine"],
           "overhead_share": max((p["overhead"] or {}).get("share_of_step", 0.0) for p in procs)}
    return {"processes": procs, "run": run, "verdict": verdict(slowest, procs)}


def _pct(x) -> str:
    return "-" if x is None else f"{100 * x:5.1f}%"


def _how_it_ended(summary: dict) -> str | None:
    """The command's end, when it was not a success: its status, the signal that killed it, who stopped it."""
    ended = summary.get("exit") or {}  # absent in a report of --report DIR
    if not ended.get("status"):
        return None
    if ended.get("signal"):
        text = f"the command was killed by {ended['signal']}, exit status {ended['status']}"
    else:
        text = f"the command exited with status {ended['status']}"
    if ended.get("stopped_by"):
        text += " after " + ("the timeout stopped it" if ended["stopped_by"] == "timeout"
                             else f"{ended['stopped_by']} stopped it")
    return text


def format_report(summary: dict, baseline: dict | None = None) -> str:
    run = summary["run"]
    ended = _how_it_ended(summary)
    if run is None:
        why = ended or ("the script ended before the warm-up did, or never took a batch from a DataLoader or "
                        "fastfeed Loader")
        return f"fastfeed profile: no step was measured ({why})"
    lines = [f"fastfeed profile: {summary['processes'][0]['steps']} steps measured on {run['ranks']} process(es), "
             f"steps end at each {summary['processes'][0]['step_boundary']} step"]
    if ended:
        lines.append(f"  ({ended}; the table covers the steps measured before)")
    left = summary["processes"][0]["left_out"]
    if left:
        lines.append(f"  ({len(left)} step(s) left out and measured again: each also took batches with autograd off, "
                     f"{sum(s['eval_batches'] for s in left)} in all (an evaluation pass), and took "
                     f"{sum(s['step_s'] for s in left):.2f} s)")
    base = baseline["run"] if baseline else None

    def row(name, value, fmt, base_value=None):
        text = f"  {name:28s} {fmt(value):>12s}"
        if base is not None and base_value is not None and value is not None:
            text += f"   baseline {fmt(base_value):>12s}   {_delta(value, base_value)}"
        return text

    def b(key, sub=None):
        if base is None:
            return None
        v = base.get(key)
        return v.get(sub) if (sub and isinstance(v, dict)) else v

    lines.append(row("samples/s", run["samples_per_s"], lambda v: "-" if v is None else f"{v:,.1f}",
                     b("samples_per_s")))
    lines.append(row("s/step", run["s_per_step"], lambda v: f"{v:.4f}", b("s_per_step")))
    for part in PARTS:
        lines.append(row(f"  {part}", run["share"][part], _pct, b("share", part)))
    if run.get("ddp_comm_share"):
        lines.append(row("DDP's gradient all-reduce", run["ddp_comm_share"], _pct, b("ddp_comm_share")))
        lines.append(f"  {'':28s} (its busy time; only what backward waited for at its end counts as comm above)")
    if run["data_gpu_idle_share"] is not None:
        lines.append(row("GPU idle waiting for data", run["data_gpu_idle_share"], _pct, b("data_gpu_idle_share")))
    m = run.get("machine") or {}
    host = m.get("host") or {}
    if host:
        lines.append(row("CPU cores busy (with workers)", host.get("cpu_cores_busy"),
                         lambda v: f"{v:.1f} of {host.get('cpu_count')}"))
        lines.append(row("I/O wait", host.get("iowait_frac"), _pct))
        lines.append(row("host memory peak", host.get("rss_peak_bytes"), lambda v: f"{v / 2**30:.2f} GiB"))
    gpu = m.get("gpu") or {}
    if gpu:
        lines.append(row("GPU utilisation", gpu.get("util_mean_pct"), lambda v: f"{v:.0f}%"))
        limit = gpu.get("power_limit_w")
        lines.append(row("GPU power", gpu.get("power_mean_w"),
                         lambda v: f"{v:.0f} W" + (f" of {limit:.0f}" if limit else "")))
        if gpu.get("sm_clock_mean_mhz") is not None:
            top = gpu.get("sm_clock_max_mhz")
            lines.append(row("SM clock", gpu["sm_clock_mean_mhz"],
                             lambda v: f"{v:,.0f} MHz" + (f" of {top:,.0f}" if top else "")))
    links = next((p["facts"].get("gpu_links") for p in summary["processes"] if p["facts"].get("gpu_links")), None)
    if links:
        lines.append(f"  {'GPU links':28s} {describe_links(links)}")
    peak = [p["gpu"]["memory_peak_bytes"] for p in summary["processes"] if p.get("gpu")]
    if peak:
        lines.append(row("CUDA memory peak", max(peak), lambda v: f"{v / 2**30:.2f} GiB"))
    lines.append(f"  (the profiler's own cost: about {_pct(run['overhead_share']).strip()} of the step)")
    lines.append("")
    for finding in summary["verdict"]:
        lines.append(f"{finding['family']}: {finding['title']}")
        for e in finding["evidence"]:
            lines.append(f"    evidence: {e}")
        lines.append(f"    next: {finding['advice']}")
    return "\n".join(lines)


def _delta(value, base_value) -> str:
    if not base_value:
        return ""
    return f"{100 * (value - base_value) / abs(base_value):+.1f}%"
