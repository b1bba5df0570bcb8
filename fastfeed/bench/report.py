"""The bench report: one JSON document with stable keys, and the table printed at the end of a run.

JSON document (schema_version 1; keys never renamed or removed without bumping BENCH_SCHEMA_VERSION):
    schema_version, fastfeed_version, created_unix
    config:     the run's options (dataset, images, batch_size, image_size, decoder, device, dtype, ...)
    machine:    {cpu_count, torch_version, cuda_device (name or null)}
    consumer:   {name, compute_only_step_s: {p50,p90,p99,mean} | null, compute_only_samples_per_s | null}
    loaders:    {name: LoaderResult (fastfeed/bench/runner.py RESULT_KEYS)}: "fastfeed" and, with --compare, "torch"
    comparison: {baseline, source, samples_per_s_ratio, step_s_p50_ratio, error} | null: with --compare; `source`
                is what the baseline read (the packed dataset, or --images DIR); ratios are null and `error` says
                why when the baseline failed
    verdict:    [str]: one sentence per loader: how far below the resident-data ceiling it trains, where the gap
                goes (data wait / the loader's work slowing the step / the model), what to change next
    attribution: {name: {below_ceiling, wait_share, slowed_share, model_share}} | null (fastfeed/bench/verdict.py;
                null without a consumer)
    errors:     {name: "ExceptionType: message"} for loaders that failed (their results are absent from `loaders`)
    notes:      [str]: adjustments the run made (e.g. a batch size clamped to a small dataset)
Each loader result: steps, samples, wall_s, samples_per_s, step_s/wait_s {p50,p90,p99,mean(,total)},
wait_fraction in [0, 1], host {cpu_cores_busy, cpu_count, system_cpu_busy_frac, iowait_frac, rss_peak_bytes},
gpu {util_mean_pct, util_max_pct, power_mean_w, power_max_w, sm_clock_mean_mhz, samples, and where NVML reports them
power_limit_w, sm_clock_max_mhz} | null, gpu_error, loader_stats, per_step.
"""
from __future__ import annotations

import json
import os
import time

from fastfeed.bench.verdict import attribute, bottleneck, loader_verdict
from fastfeed.world import usable_cpus

__all__ = ["BENCH_SCHEMA_VERSION", "REPORT_KEYS", "build_report", "format_table", "settings_lines", "verdicts",
           "write_json"]

BENCH_SCHEMA_VERSION = 1
REPORT_KEYS = ("schema_version", "fastfeed_version", "created_unix", "config", "machine", "consumer", "loaders",
               "comparison", "verdict", "attribution", "errors", "notes")


def _machine(device: str | None) -> dict:
    import torch

    cuda = None
    if device and str(device).startswith("cuda") and torch.cuda.is_available():
        cuda = torch.cuda.get_device_name(torch.device(device))
    cpus = usable_cpus()
    return {"cpu_count": cpus, "torch_version": torch.__version__, "cuda_device": cuda}


def _has_gpu() -> bool:
    import torch

    return torch.cuda.is_available()


def verdicts(loaders: dict[str, dict], ceiling_samples_per_s: float | None,
             consumer: str | None = None, gpu: bool = True) -> list[str]:
    """One sentence per loader: how far below the resident-data ceiling it trains, why, and what to change next."""
    out = []
    for name, r in loaders.items():
        if consumer == "none":
            out.append(f"{name}: {r['samples_per_s']:,.1f} samples/s with no training step (pure loader "
                       f"throughput: the most a step can get from it); {bottleneck(r, gpu)}.")
        else:
            out.append(loader_verdict(name, r, ceiling_samples_per_s, gpu))
    return out


def _info(r: dict) -> dict:
    return (r.get("loader_stats") or {}).get("info") or {}


def settings_lines(loaders: dict[str, dict]) -> list[str]:
    """The settings each fastfeed loader ran with (from `loader.stats()["info"]`)."""
    lines = []
    for name, r in loaders.items():
        info = _info(r)
        if not info:
            continue
        keys = ["decoder", "device", "num_threads", "pipelines", "reader_threads", "prefetch", "pinned"]
        if info.get("decoder") == "dali":
            keys.insert(4, "hw_decoder_load")  # meaningful for the GPU decoder only
        parts = [f"{k}={info[k]}" for k in keys if k in info]
        if "pipeline_history" in (r.get("loader_stats") or {}):  # the tuner's last count (tuning/pipelines.py)
            span = f"{info.get('pipeline_floor', info.get('pipelines'))} to {info.get('pipeline_limit')}"
            gpu = info.get("gpu_pipelines")  # auto's "cpu-dali": its last pipelines decode on the GPU (settings.py)
            on_gpu = f", {gpu} on the GPU" if gpu else ""
            parts = [p + f" (tuned, {span}{on_gpu})" if p.startswith("pipelines=") else p
                     for p in parts]
        lines.append(f"{name} settings: {' '.join(parts)}")
    return lines


def build_report(config: dict, loaders: dict[str, dict], consumer: str, compute_only_step_s: dict | None,
                 batch_size: int, errors: dict[str, str] | None = None, notes: list[str] | None = None,
                 baseline_source: str | None = None) -> dict:
    from fastfeed.constants import __version__

    errors = dict(errors or {})
    comparison = None
    if "fastfeed" in loaders and ("torch" in loaders or "torch" in errors):
        ff, tb = loaders["fastfeed"], loaders.get("torch")
        comparison = {
            "baseline": "torch",
            "source": baseline_source,
            "samples_per_s_ratio": ff["samples_per_s"] / tb["samples_per_s"] if tb and tb["samples_per_s"] else None,
            "step_s_p50_ratio": tb["step_s"]["p50"] / ff["step_s"]["p50"] if tb and ff["step_s"]["p50"] else None,
            "error": errors.get("torch"),
        }
    p50 = compute_only_step_s["p50"] if compute_only_step_s else None
    ceiling = batch_size / p50 if p50 else None
    attribution = None
    if ceiling and consumer != "none":
        attribution = {name: attribute(r["samples_per_s"], r["wait_fraction"], ceiling)
                       for name, r in loaders.items() if r["samples_per_s"] > 0}
    report = {
        "schema_version": BENCH_SCHEMA_VERSION,
        "fastfeed_version": __version__,
        "created_unix": time.time(),
        "config": config,
        "machine": _machine(config.get("device")),
        "consumer": {
            "name": consumer,
            "compute_only_step_s": compute_only_step_s,
            "compute_only_samples_per_s": ceiling,
        },
        "loaders": loaders,
        "comparison": comparison,
        "verdict": verdicts(loaders, ceiling, consumer, gpu=_has_gpu()),
        "attribution": attribution,
        "errors": errors,
        "notes": list(notes or ()),
    }
    return report


def write_json(report: dict, path: str | os.PathLike) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(report, f, indent=2, sort_keys=False, allow_nan=False)
        f.write("\n")
    os.replace(tmp, path)


def _fmt(v, spec: str, none: str = "-") -> str:
    return none if v is None else format(v, spec)


def format_table(report: dict) -> str:
    """A fixed-width table, one column per loader, then the comparison and the verdicts."""
    loaders = report["loaders"]
    names = list(loaders)
    rows: list[tuple[str, list[str]]] = []

    def row(label, fn):
        rows.append((label, [fn(loaders[n]) for n in names]))

    row("samples/s", lambda r: f"{r['samples_per_s']:,.1f}")
    row("samples (steps)", lambda r: f"{r['samples']} ({r['steps']})")
    row("s/step p50", lambda r: f"{r['step_s']['p50']:.4f}")
    row("s/step p90", lambda r: f"{r['step_s']['p90']:.4f}")
    row("s/step p99", lambda r: f"{r['step_s']['p99']:.4f}")
    row("data wait", lambda r: f"{100 * r['wait_fraction']:.1f}%")
    row("wait p50/p99 (ms)", lambda r: f"{1e3 * r['wait_s']['p50']:.1f}/{1e3 * r['wait_s']['p99']:.1f}")
    row("GPU util (mean)", lambda r: _fmt(r["gpu"] and r["gpu"]["util_mean_pct"], ".0f") + ("%" if r["gpu"] else ""))
    row("GPU power (mean W)", lambda r: _fmt(r["gpu"] and r["gpu"]["power_mean_w"], ".0f"))
    row("CPU cores busy", lambda r: f"{r['host']['cpu_cores_busy']:.2f} / {r['host']['cpu_count']}")
    row("machine CPU / iowait", lambda r: _fmt(r["host"]["system_cpu_busy_frac"], ".0%") + " / "
        + _fmt(r["host"]["iowait_frac"], ".1%"))
    row("peak memory (PSS)", lambda r: f"{r['host']['rss_peak_bytes'] / 2**20:,.0f} MiB")
    attribution = report.get("attribution") or {}
    if attribution:
        def split(name: str) -> str:
            a = attribution.get(name)
            return "-" if a is None else (f"{100 * a['wait_share']:.0f}/{100 * a['slowed_share']:.0f}/"
                                          f"{100 * a['model_share']:.0f}%")

        rows.append(("below ceiling", [_fmt(attribution.get(n) and 100 * attribution[n]["below_ceiling"], ".1f")
                                       + ("%" if attribution.get(n) else "") for n in names]))
        rows.append(("wait/slowed/model", [split(n) for n in names]))

    w0 = max(len(label) for label, _ in rows)
    widths = [max(len(n), *(len(vals[i]) for _, vals in rows)) for i, n in enumerate(names)]
    cfg = report.get("config") or {}
    lines = [f"batch {cfg.get('batch_size')}, {cfg.get('image_size')} px, {cfg.get('dtype')}, "
             f"{'train' if cfg.get('train', True) else 'eval'} transform, device {cfg.get('device')}, "
             f"consumer {report['consumer']['name']}"]
    lines.append("  ".join([" " * w0] + [n.rjust(w) for n, w in zip(names, widths)]))
    lines.append("-" * len(lines[1]))
    for label, vals in rows:
        lines.append("  ".join([label.ljust(w0)] + [v.rjust(w) for v, w in zip(vals, widths)]))
    cons = report["consumer"]
    if cons["compute_only_step_s"]:
        lines.append(f"consumer {cons['name']} on resident data: {cons['compute_only_step_s']['p50']:.4f} s/step p50"
                     f" ({cons['compute_only_samples_per_s']:,.1f} samples/s ceiling)")
    lines.extend(settings_lines(loaders))
    cmp = report["comparison"]
    if cmp and cmp["samples_per_s_ratio"] is not None:
        lines.append(f"fastfeed / torch throughput: {cmp['samples_per_s_ratio']:.2f}x")
    if cmp and cmp.get("source"):
        lines.append(f"torch baseline read: {cmp['source']}")
    lines.extend(report["verdict"])
    for name, err in (report.get("errors") or {}).items():
        lines.append(f"{name}: FAILED, not measured: {err}")
    lines.extend(f"note: {n}" for n in report.get("notes") or ())
    return "\n".join(lines)
