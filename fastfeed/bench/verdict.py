"""The bench verdict: how far a loader's training step is from the resident-data ceiling, and why.

The ceiling is the consumer run on a batch already on the device (`runner.run_compute_only`): the step a perfect
loader would give. Per sample (so partial batches count right), a measured step splits exactly into

    data wait     time blocked in next(): the loader did not keep up
    slowed step   time in the consumer beyond the ceiling: the loader's own work (decode threads taking the
                  model's cores, GPU decode kernels and copies sharing the device) made the same step slower
    model         the ceiling itself (or the consumer time, when noise makes it shorter than the ceiling)

A low data-wait share alone does not mean "the loader keeps up": a DataLoader whose workers take the CPU from the
training process can wait a few percent of the time and still train far below the ceiling. Advice names only
`fastfeed bench` flags (tests check every `--flag` mentioned against the parser) and `fastfeed pack` commands.
"""
from __future__ import annotations

__all__ = ["AT_CEILING", "INPUT_BOUND", "attribute", "bottleneck", "loader_verdict", "slowdown_advice"]

AT_CEILING = 0.05  # within this fraction of the ceiling's throughput the model bounds the step (run-to-run noise)
INPUT_BOUND = 0.10  # data-wait share above which a loader without a ceiling to compare with is called input-bound
_SATURATED = 0.85  # share of the usable cores above which a loader is called CPU-bound


def attribute(samples_per_s: float, wait_fraction: float, ceiling_samples_per_s: float) -> dict:
    """Split the measured time per sample into data wait, slowed step and model; shares sum to 1.

    Returns {below_ceiling, wait_share, slowed_share, model_share}: `below_ceiling` = 1 - measured / ceiling
    throughput (negative when the run beat the ceiling measurement, which is noise).
    """
    if not samples_per_s > 0 or not ceiling_samples_per_s > 0:
        raise ValueError(f"throughputs must be > 0, got {samples_per_s} and {ceiling_samples_per_s}")
    wait = min(max(wait_fraction, 0.0), 1.0)
    ceiling_share = samples_per_s / ceiling_samples_per_s  # ceiling time per sample / measured time per sample
    model = min(ceiling_share, 1.0 - wait)
    return {"below_ceiling": 1.0 - ceiling_share, "wait_share": wait, "slowed_share": 1.0 - wait - model,
            "model_share": model}


def _info(r: dict) -> dict:
    return (r.get("loader_stats") or {}).get("info") or {}


def bottleneck(r: dict, gpu: bool = True) -> str:
    """Why a loader cannot deliver faster, from its resource use and stage timers, with the one change to try.

    gpu: whether this machine has a CUDA GPU; without one, advice to decode on it is left out.
    """
    host = r.get("host") or {}
    info = _info(r)
    stages = (r.get("loader_stats") or {}).get("stages") or {}
    busy, cpus = host.get("cpu_cores_busy") or 0.0, host.get("cpu_count") or 1
    iowait, machine = host.get("iowait_frac"), host.get("system_cpu_busy_frac")
    wall = r.get("wall_s") or 0.0
    read_wait = (stages.get("read_wait") or {}).get("seconds", 0.0)
    fastfeed = bool(info)
    # Storage is blamed only on evidence: for fastfeed its own ring timer (decode threads waiting for reads); for
    # a loader without stage timers the machine's iowait, which counts every process's I/O, so it is named as such.
    if fastfeed and wall > 0 and read_wait > 0.25 * wall:
        io = f", machine iowait {iowait:.0%}" if iowait else ""
        return (f"reads lag decoding ({read_wait:.1f} s of {wall:.1f} s waiting for the ring{io}): raise "
                f"--reader-threads (now {info.get('reader_threads')}) or move the data to faster storage")
    if not fastfeed and iowait is not None and iowait > 0.20:
        return (f"storage-bound (machine iowait {iowait:.0%}): put the images on local SSD or let the page cache "
                "warm, or pack them (`fastfeed pack`) for large sequential reads")
    if busy >= _SATURATED * cpus:
        if not fastfeed:
            return (f"CPU-bound ({busy:.1f} of {cpus} cores busy in PIL decode + transforms): "
                    + ("fastfeed.Loader decodes on the GPU with --device cuda" if gpu else
                       "give the job more cores"))
        if info.get("decoder") == "dali":
            return (f"CPU-bound ({busy:.1f} of {cpus} cores busy): raise --hw-decoder-load (now "
                    f"{info.get('hw_decoder_load')}) to move more JPEGs onto the GPU's hardware decoder")
        on_gpu = "decode on the GPU (--device cuda --decoder dali), " if gpu else ""
        return (f"CPU-bound ({busy:.1f} of {cpus} cores busy decoding on the CPU): {on_gpu}give the job more cores, "
                "or pack smaller images (`fastfeed pack --max-side 512`)")
    if machine is not None and machine > 0.90:
        return (f"other processes hold the CPU (machine {machine:.0%} busy, this loader {busy:.1f} of {cpus} "
                "cores): numbers are low; measure again on an idle machine")
    if not fastfeed:
        return f"only {busy:.1f} of {cpus} cores busy: raise --torch-workers"
    tried = _pipelines_tried_beyond(r)
    if tried and info.get("decoder") in ("dali", "hybrid") and str(info.get("device", "")).startswith("cuda"):
        # More pipelines were tried on this loop and did not pay: neither cores nor pipelines are what is short, so
        # "raise --pipelines" would send the user after what the tuner already measured. What is left is the GPU's
        # JPEG decode itself (the hardware decoder limits photos of a few MP for DALI's own reader too:
        # docs/design/decoders.md#hw-decoder-load).
        return (f"the GPU's JPEG decode is the limit (the pipeline tuner tried {tried} pipelines, no faster than "
                f"{info.get('pipelines')}; {busy:.1f} of {cpus} cores busy): for photos much larger than the "
                "training crop, pack them downscaled (`fastfeed pack --max-side 512`); or a lower --hw-decoder-load "
                f"(now {info.get('hw_decoder_load')}) moves JPEGs from the hardware decoder to DALI's CUDA decoder")
    return (f"only {busy:.1f} of {cpus} cores busy: raise --num-threads (now {info.get('num_threads')}), "
            f"--pipelines (now {info.get('pipelines')}) or --prefetch (now {info.get('prefetch')})")


def _pipelines_tried_beyond(r: dict) -> int | None:
    """The most pipelines the Loader's tuner tried, when that is more than it settled on (its history: (count, period,
    wait) per measurement, fastfeed/tuning/pipelines.py); None when it did not try more or did not settle."""
    stats = r.get("loader_stats") or {}
    info = stats.get("info") or {}
    history, now = stats.get("pipeline_history") or [], info.get("pipelines")
    if not info.get("tuning_settled") or not isinstance(now, int) or not history:
        return None
    most = max(int(h[0]) for h in history)
    return most if most > now else None


def slowdown_advice(r: dict, gpu: bool = True) -> str:
    """What to try when the loader keeps up but its own work makes the training step slower."""
    info = _info(r)
    host = r.get("host") or {}
    busy, cpus = host.get("cpu_cores_busy") or 0.0, host.get("cpu_count") or 1
    if not info:
        other = ", or fastfeed.Loader with GPU decode" if gpu else ""
        return (f"its worker processes and host-to-device copies compete with the training process ({busy:.1f} of "
                f"{cpus} cores busy): try fewer --torch-workers{other}")
    device = str(info.get("device", ""))
    if info.get("decoder") == "dali" and device.startswith("cuda"):
        return (f"its GPU decode shares the device with the model: try fewer --pipelines (now "
                f"{info.get('pipelines')}) or a higher --hw-decoder-load (now {info.get('hw_decoder_load')}), "
                "which moves work from the GPU's cores to its hardware JPEG decoder")
    threads = info.get("num_threads")
    if info.get("decoder") == "hybrid":
        return (f"its decode work shares the machine with the model ({busy:.1f} of {cpus} cores busy): the CPU "
                "share is tuned on the step while it runs (a few hundred steps; stats() counts cpu_decoded and "
                f"gpu_decoded), so measure longer, or try --decoder dali (GPU decode only) or fewer --num-threads "
                f"(now {threads})")
    fewer = f"try fewer --num-threads (now {threads}), or " if isinstance(threads, int) and threads > 1 else ""
    where = "give the job more cores" if device.startswith("cpu") or not gpu else "--decoder dali to decode on the GPU"
    return f"its decode threads take CPU from the model ({busy:.1f} of {cpus} cores busy): {fewer}{where}"


def loader_verdict(name: str, r: dict, ceiling_samples_per_s: float | None, gpu: bool = True) -> str:
    """One sentence: the measured rate against the ceiling, where the gap goes, and what to change next."""
    rate = r["samples_per_s"]
    wf = r["wait_fraction"]
    if not ceiling_samples_per_s:
        s = f"{name}: data-wait {100 * wf:.0f}%"
        if wf > INPUT_BOUND:
            return s + f": the loader can't keep up; {bottleneck(r, gpu)}."
        return s + " (no resident-data ceiling measured, so a slowed step cannot be ruled out)."
    if not rate > 0:
        return f"{name}: no samples measured."
    a = attribute(rate, wf, ceiling_samples_per_s)
    head = (f"{name}: {rate:,.1f} samples/s, {_pct(a['below_ceiling'])} below the resident-data ceiling "
            f"({ceiling_samples_per_s:,.1f} samples/s)") if a["below_ceiling"] > 0 else \
        f"{name}: {rate:,.1f} samples/s, at the resident-data ceiling ({ceiling_samples_per_s:,.1f} samples/s)"
    split = (f"; of the step: data wait {_pct(a['wait_share'])}, loader work slowing the step "
             f"{_pct(a['slowed_share'])}, model {_pct(a['model_share'])}")
    if a["below_ceiling"] <= AT_CEILING:
        return (head + split + ": compute-bound, the model sets the pace; a faster loader will not speed this "
                "step up.")
    if a["wait_share"] >= a["slowed_share"]:
        why = bottleneck(r, gpu)
        caveat = "" if "other processes" in why else _contention(r)
        return head + split + f": input-bound, the loader can't keep up; {why}{caveat}."
    return (head + split + f": the loader keeps up (data wait {_pct(a['wait_share'])}) but its own work slows the "
            f"step; {slowdown_advice(r, gpu)}{_contention(r)}.")


def _contention(r: dict) -> str:
    """A caveat when other processes kept the machine busy: the ceiling was measured at another moment."""
    host = r.get("host") or {}
    machine, busy, cpus = host.get("system_cpu_busy_frac"), host.get("cpu_cores_busy") or 0.0, host.get("cpu_count")
    if machine is None or not cpus or machine <= 0.90 or busy >= _SATURATED * cpus:
        return ""
    return (f" (the machine was {machine:.0%} busy but this run used {busy:.1f} of {cpus} cores: other processes "
            "took the rest, so part of the gap is theirs; measure again on an idle machine)")


def _pct(x: float) -> str:
    return f"{100 * x:.0f}%" if abs(x) >= 0.01 else f"{100 * x:.1f}%"
