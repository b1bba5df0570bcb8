"""The bench report: one JSON document with stable keys, and the table printed at the end of a run.

JSON document (schema_version 1; keys never renamed or removed without bumping BENCH_SCHEMA_VERSION):
    schema_version, fastfeed_version, created_unix
    config:     the run's options (dataset, images, batch_size, image_size, decoder, device, dtype, ...)
    machine:    {cpu_count, torch_version, cuda_device (name or null)}
    consumer:   {name, compute_only_step_s: {p50,p90,p99,mean} | null, compute_only_samples_per_s | null}
    loaders:    {name: LoaderResult (fastfeed/bench/runner.py RESULT_KEYS)}: "fastfeed" and, with --compare, "torch"
    comparison: {baseline, samples_per_s_ratio, step_s_p50_ratio} | null
    verdict:    [str]: one sentence per loader answering "is the device waiting for data, and what could it gain?"
Each loader result: steps, samples, wall_s, samples_per_s, step_s/wait_s {p50,p90,p99,mean(,total)},
wait_fraction in [0, 1], host {cpu_cores_busy, cpu_count, system_cpu_busy_frac, iowait_frac, rss_peak_bytes},
gpu {util_mean_pct, util_max_pct, power_mean_w, power_max_w, samples} | null, gpu_error, loader_stats, per_step.
"""
from __future__ import annotations

import json
import os
import time

__all__ = ["BENCH_SCHEMA_VERSION", "REPORT_KEYS", "build_report", "format_table", "settings_lines", "verdicts",
           "write_json"]

BENCH_SCHEMA_VERSION = 1
REPORT_KEYS = ("schema_version", "fastfeed_version", "created_unix", "config", "machine", "consumer", "loaders",
               "comparison", "verdict")


def _machine(device: str | None) -> dict:
    import torch

    cuda = None
    if device and str(device).startswith("cuda") and torch.cuda.is_available():
        cuda = torch.cuda.get_device_name(torch.device(device))
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {"cpu_count": cpus, "torch_version": torch.__version__, "cuda_device": cuda}


_INPUT_BOUND = 0.10  # data-wait share above which the step is called input-bound
_SATURATED = 0.85  # share of the usable cores above which a loader is called CPU-bound


def _info(r: dict) -> dict:
    return (r.get("loader_stats") or {}).get("info") or {}


def _bottleneck(r: dict) -> str:
    """Where a loader's time goes, from its resource use and stage timers, with the one change to try next."""
    host = r.get("host") or {}
    info = _info(r)
    stages = (r.get("loader_stats") or {}).get("stages") or {}
    busy, cpus = host.get("cpu_cores_busy") or 0.0, host.get("cpu_count") or 1
    iowait, machine = host.get("iowait_frac"), host.get("system_cpu_busy_frac")
    wall = r.get("wall_s") or 0.0
    read_wait = (stages.get("read_wait") or {}).get("seconds", 0.0)
    fastfeed = bool(info)
    if iowait is not None and iowait > 0.20:
        more = f" or raise reader_threads (now {info['reader_threads']})" if "reader_threads" in info else ""
        return (f"storage-bound (iowait {iowait:.0%}): put the dataset on local SSD or let the page cache warm"
                f"{more}")
    if fastfeed and wall > 0 and read_wait > 0.25 * wall:
        return (f"reads lag decoding ({read_wait:.1f} s of {wall:.1f} s waiting for the ring): raise reader_threads "
                f"(now {info.get('reader_threads')}) or move the data to faster storage")
    if busy >= _SATURATED * cpus:
        if not fastfeed:
            return (f"CPU-bound ({busy:.1f} of {cpus} cores busy in PIL decode + transforms): pack the folder "
                    "(`fastfeed pack`) and use fastfeed.Loader")
        if info.get("decoder") == "dali":
            return (f"CPU-bound ({busy:.1f} of {cpus} cores busy): raise hw_decoder_load (now "
                    f"{info.get('hw_decoder_load')}) to move more JPEGs onto the GPU's hardware decoder")
        return (f"CPU-bound ({busy:.1f} of {cpus} cores busy decoding on the CPU): decode on the GPU "
                "(device='cuda', decoder='dali'), give the job more cores, or pack smaller images "
                "(`fastfeed pack --max-side 512`)")
    if machine is not None and machine > 0.90:
        return (f"other processes hold the CPU (machine {machine:.0%} busy, this loader {busy:.1f} of {cpus} "
                "cores): numbers are low; measure again on an idle machine")
    if not fastfeed:
        return f"only {busy:.1f} of {cpus} cores busy: raise --torch-workers"
    return (f"only {busy:.1f} of {cpus} cores busy: raise num_threads (now {info.get('num_threads')}), "
            f"pipelines (now {info.get('pipelines')}) or prefetch (now {info.get('prefetch')})")


def verdicts(loaders: dict[str, dict], compute_step_p50: float | None, consumer: str | None = None) -> list[str]:
    """One sentence per loader: is the step waiting for data, what it could gain, and what to change next."""
    out = []
    for name, r in loaders.items():
        wf = r["wait_fraction"]
        if consumer == "none" or (consumer is None and not compute_step_p50):
            out.append(f"{name}: {r['samples_per_s']:,.0f} samples/s with no training step (pure loader "
                       f"throughput: the most a step can get from it); {_bottleneck(r)}.")
            continue
        s = f"{name}: data-wait {100 * wf:.0f}%"
        if wf > _INPUT_BOUND:
            s += ": the loader can't keep up"
            if compute_step_p50 and compute_step_p50 > 0:
                gain = r["step_s"]["p50"] / compute_step_p50
                s += (f"; with resident data the step would be {gain:.2f}x faster (p50 {r['step_s']['p50'] * 1e3:.1f}"
                      f" ms vs {compute_step_p50 * 1e3:.1f} ms)")
            s += f"; {_bottleneck(r)}."
        else:
            s += ": compute-bound, the loader keeps up; a faster loader will not speed this step up."
        out.append(s)
    return out


def settings_lines(loaders: dict[str, dict]) -> list[str]:
    """The settings each fastfeed loader ran with (from `loader.stats()["info"]`), and its autotune table."""
    lines = []
    for name, r in loaders.items():
        info = _info(r)
        if not info:
            continue
        keys = ["decoder", "device", "num_threads", "pipelines", "reader_threads", "prefetch", "pinned"]
        if info.get("decoder") == "dali":
            keys.insert(4, "hw_decoder_load")  # meaningful for the GPU decoder only
        parts = [f"{k}={info[k]}" for k in keys if k in info]
        lines.append(f"{name} settings: {' '.join(parts)}")
        table = info.get("autotune")
        if table:
            chosen = (info.get("hw_decoder_load"), info.get("num_threads"), info.get("pipelines"))
            for row in table:
                rate = row.get("images_per_s")
                what = f"{rate:,.0f} img/s" if rate is not None else f"failed: {row.get('error')}"
                mark = "  <- chosen" if (row.get("hw_decoder_load"), row.get("num_threads"),
                                          row.get("pipelines")) == chosen else ""
                lines.append(f"  autotune hw_decoder_load={row.get('hw_decoder_load')} "
                             f"num_threads={row.get('num_threads')} pipelines={row.get('pipelines')}: {what}{mark}")
    return lines


def build_report(config: dict, loaders: dict[str, dict], consumer: str,
                 compute_only_step_s: dict | None, batch_size: int) -> dict:
    from fastfeed import __version__

    comparison = None
    if "fastfeed" in loaders and "torch" in loaders:
        ff, tb = loaders["fastfeed"], loaders["torch"]
        comparison = {
            "baseline": "torch",
            "samples_per_s_ratio": ff["samples_per_s"] / tb["samples_per_s"] if tb["samples_per_s"] else None,
            "step_s_p50_ratio": tb["step_s"]["p50"] / ff["step_s"]["p50"] if ff["step_s"]["p50"] else None,
        }
    p50 = compute_only_step_s["p50"] if compute_only_step_s else None
    report = {
        "schema_version": BENCH_SCHEMA_VERSION,
        "fastfeed_version": __version__,
        "created_unix": time.time(),
        "config": config,
        "machine": _machine(config.get("device")),
        "consumer": {
            "name": consumer,
            "compute_only_step_s": compute_only_step_s,
            "compute_only_samples_per_s": batch_size / p50 if p50 else None,
        },
        "loaders": loaders,
        "comparison": comparison,
        "verdict": verdicts(loaders, p50, consumer),
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

    w0 = max(len(label) for label, _ in rows)
    widths = [max(len(n), *(len(vals[i]) for _, vals in rows)) for i, n in enumerate(names)]
    lines = ["  ".join([" " * w0] + [n.rjust(w) for n, w in zip(names, widths)])]
    lines.append("-" * len(lines[0]))
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
    lines.extend(report["verdict"])
    return "\n".join(lines)
