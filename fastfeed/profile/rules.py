"""The verdict of `fastfeed profile`: small rules, each with its threshold, each returning a finding (family, what
it saw, the one change to make next) or None. `verdict` runs them all; the findings come most telling first.

Families: data supply, communication, compute efficiency, framework configuration. A run with no finding is
compute-bound: its step is the model's own work, and the way forward is a faster model step, not a faster loader.
"""
from __future__ import annotations

import os

from fastfeed.profile.topology import describe_links

__all__ = ["verdict", "against_baseline", "RULES", "DATA_WAIT_SHARE", "COMM_SHARE", "LOW_GPU_UTIL_PCT",
           "BATCH_CHANGE"]

# The step share spent waiting for data above which the input pipeline is what limits the step. Below it the wait
# is mostly the first batches of the window and the queue's jitter.
DATA_WAIT_SHARE = 0.10
# The step share in collectives called from Python above which communication deserves a look (issue 45's 20%).
COMM_SHARE = 0.20
# A GPU busy less than this share of the time while the step does not wait for data: launch-bound or CPU-bound.
LOW_GPU_UTIL_PCT = 60.0
# A global batch this many times larger or smaller than the baseline's is a change the learning rate should follow
# (the linear scaling rule); within it, batch sizes that differ by a last partial batch are the same run.
BATCH_CHANGE = 1.5


def _finding(family: str, title: str, evidence: list[str], advice: str, weight: float) -> dict:
    return {"family": family, "title": title, "evidence": evidence, "advice": advice, "weight": weight}


def _wait_share(p: dict) -> float:
    """The data wait that costs the step: on a GPU the time the GPU sat idle for it (a wall-clock wait can hide
    behind kernels still running), else the wall-clock wait."""
    if p["data_gpu_idle_share"] is not None:
        return p["data_gpu_idle_share"]
    return p["share"]["data"]


def data_supply(p: dict, procs: list[dict]) -> dict | None:
    wait = _wait_share(p)
    if wait <= DATA_WAIT_SHARE:
        return None
    host = ((p.get("machine") or {}).get("host") or {})
    cores = host.get("cpu_count") or os.cpu_count() or 1
    ranks = max(1, len(procs))
    evidence = [f"the step waits for its batch {100 * wait:.0f}% of the time (threshold {100 * DATA_WAIT_SHARE:.0f}%)"]
    if host.get("cpu_cores_busy") is not None:
        evidence.append(f"{host['cpu_cores_busy']:.1f} of {cores} cores busy, loader workers included")
    if host.get("iowait_frac"):
        evidence.append(f"I/O wait {100 * host['iowait_frac']:.0f}% of the machine's CPU time")
    loaders = p["facts"].get("dataloaders") or []
    advice = ("pack the dataset (`fastfeed pack SRC OUT`) and read it with `fastfeed.Loader(OUT, ...)`: sequential "
              "shards, native read-ahead into pinned memory, decode on the GPU; `fastfeed bench OUT --compare torch` "
              "measures the gain on your data first")
    if loaders:
        dl = loaders[0]
        evidence.append(f"DataLoader: num_workers={dl['num_workers']}, pin_memory={dl['pin_memory']}, "
                        f"batch_size={dl['batch_size']}, dataset {dl['dataset']}")
        share = max(1, cores // ranks)
        if dl["num_workers"] < share - 1:
            advice = (f"raise num_workers from {dl['num_workers']} to {share - 1} (this rank's share of {cores} "
                      f"cores, one left for the training loop); then, if it still waits, " + advice)
        elif p["gpu"] is not None and not dl["pin_memory"] and p["h2d_pageable_share"] > 0.5:
            advice = "set pin_memory=True (copies from pageable memory are synchronous and slower); then " + advice
    return _finding("data supply", "the GPU waits for data" if p["gpu"] else "the step waits for data",
                    evidence, advice, wait)


def communication(p: dict, procs: list[dict]) -> dict | None:
    share = p["share"]["comm"]
    if share <= COMM_SHARE:
        return None
    evidence = [f"{100 * share:.0f}% of the step in collectives: torch.distributed calls, and DDP's gradient "
                f"all-reduce where backward waited for it (threshold {100 * COMM_SHARE:.0f}%)"]
    links = next((q["facts"].get("gpu_links") for q in procs if q["facts"].get("gpu_links")), None)
    if links:
        evidence.append(describe_links(links))
        where = ("" if all(lk.startswith("NV") for lk in links["links"]) else
                 "; these GPUs talk over PCIe: on a host with NVLink the same all-reduce is several times faster")
    else:
        where = "; `nvidia-smi topo -m` shows whether the GPUs talk over NVLink or PCIe"
    return _finding("communication", "collectives take a large share of the step", evidence,
                    "let DDP overlap the gradient all-reduce with backward (no manual all_reduce of gradients), "
                    "raise bucket_cap_mb, or reduce what is sent (bf16 gradients, compression hooks)" + where, share)


def data_parallel(p: dict, procs: list[dict]) -> dict | None:
    if not p["facts"].get("data_parallel"):
        return None
    return _finding("framework configuration", "torch.nn.DataParallel is in use",
                    ["DataParallel runs one process for all GPUs: one Python thread feeds them all, and it scatters "
                     "the batch and gathers the outputs every step"],
                    "use DistributedDataParallel, one process per GPU (`torchrun --nproc-per-node N train.py`)", 0.5)


def unused_parameters(p: dict, procs: list[dict]) -> dict | None:
    flagged = [d for d in p["facts"].get("ddp", []) if d.get("find_unused_parameters") and d.get("all_used")]
    if not flagged:
        return None
    return _finding("framework configuration", "find_unused_parameters=True, and no parameter went unused",
                    ["DistributedDataParallel walks the autograd graph after every forward to find unused "
                     "parameters; every parameter got a gradient in every measured step"],
                    "construct DistributedDataParallel with find_unused_parameters=False", 0.3)


def no_distributed_sampler(p: dict, procs: list[dict]) -> dict | None:
    world = p["facts"].get("world_size", 1)
    if world <= 1:
        return None
    plain = [d for d in p["facts"].get("dataloaders", [])
             if d["sampler"] in ("RandomSampler", "SequentialSampler") and d.get("dataset_len")]
    if not plain:
        return None
    d = plain[0]
    return _finding("framework configuration", "every rank reads the whole dataset",
                    [f"world size {world}, and a DataLoader over {d['dataset']} ({d['dataset_len']} samples) samples "
                     f"with a {d['sampler']}, not a DistributedSampler: each rank trains on every sample"],
                    "give the DataLoader sampler=DistributedSampler(dataset) (and call set_epoch each epoch), or use "
                    "fastfeed.Loader, which gives each rank its share", 0.4)


def launch_bound(p: dict, procs: list[dict]) -> dict | None:
    gpu = ((p.get("machine") or {}).get("gpu") or {})
    util = gpu.get("util_mean_pct")
    if util is None or util >= LOW_GPU_UTIL_PCT or _wait_share(p) > DATA_WAIT_SHARE:
        return None
    return _finding("compute efficiency", "the GPU is idle between kernels",
                    [f"GPU busy {util:.0f}% of the time (below {LOW_GPU_UTIL_PCT:.0f}%) while the step barely waits "
                     "for data: the CPU cannot launch kernels fast enough, or works between them"],
                    ("the model is compiled already: try mode='reduce-overhead' (CUDA graphs: one launch a step), "
                     if p["facts"].get("compiled") else
                     "torch.compile the model (fewer, larger kernels; mode='reduce-overhead' adds CUDA graphs), ")
                    + "raise the batch size, move per-step Python work off the loop", 0.3)


def full_precision(p: dict, procs: list[dict]) -> dict | None:
    """fp32 parameters and no autocast region on a GPU: every matrix product runs in fp32 (TF32 at best) where bf16
    tensor cores do it several times faster. Judged only when the model's own work is most of the step."""
    if p["gpu"] is None or p["facts"].get("autocast") or p["facts"].get("param_dtype") != "float32":
        return None
    model = p["share"]["forward+other"] + p["share"]["backward"]
    if model < 0.5:
        return None
    return _finding("compute efficiency", "the model computes in fp32",
                    [f"parameters in float32 and no torch.autocast region in the measured steps; forward and backward "
                     f"are {100 * model:.0f}% of the step"],
                    "run forward and loss under torch.autocast('cuda', dtype=torch.bfloat16) (no GradScaler needed "
                    "for bf16), then measure again with --baseline", 0.35)


def compute_bound(p: dict, procs: list[dict]) -> dict:
    parts = p["share"]
    top = max(("forward+other", "backward", "optimizer"), key=lambda k: parts[k])
    compiled = "" if p["facts"].get("compiled") else "torch.compile, "
    advice = (f"the input pipeline keeps up: speed up the model's step (bf16 autocast, channels_last, {compiled}"
              "a larger batch), not the loader")
    return _finding("compute", "the step is the model's own work",
                    [f"data wait {100 * _wait_share(p):.0f}% of the step (threshold {100 * DATA_WAIT_SHARE:.0f}%); "
                     f"the largest part is {top} ({100 * parts[top]:.0f}%)"], advice, 0.0)


RULES = (data_supply, communication, data_parallel, unused_parameters, no_distributed_sampler, launch_bound,
         full_precision)


def verdict(slowest: dict, procs: list[dict]) -> list[dict]:
    """The findings for the run (judged on its slowest rank, which every other rank waits for), heaviest first;
    "compute" when no rule fires."""
    found = [f for rule in RULES if (f := rule(slowest, procs)) is not None]
    found.sort(key=lambda f: -f["weight"])
    return found or [compute_bound(slowest, procs)]


def _global_batch(summary: dict) -> tuple[float | None, float | None, int]:
    """(global batch per step, peak learning rate, processes) of a report (report.summarize's)."""
    procs = summary.get("processes") or []
    per_rank = [p.get("samples_per_step") for p in procs]
    lrs = [p["facts"].get("lr") for p in procs if p.get("facts")]
    if not procs or not all(per_rank) or not lrs or lrs[0] is None:
        return None, None, len(procs)
    return float(sum(per_rank)), float(lrs[0]), len(procs)


def against_baseline(summary: dict, baseline: dict) -> list[dict]:
    """Findings only a comparison shows: the global batch changed by BATCH_CHANGE or more (more ranks, a larger
    per-rank batch) and the learning rate stayed where it was, where the linear scaling rule scales it with the
    batch."""
    batch, lr, ranks = _global_batch(summary)
    base_batch, base_lr, base_ranks = _global_batch(baseline)
    if None in (batch, lr, base_batch, base_lr) or base_lr <= 0:
        return []
    ratio = batch / base_batch
    if 1 / BATCH_CHANGE < ratio < BATCH_CHANGE or abs(lr / base_lr - 1) > 0.01:
        return []
    return [_finding(
        "framework configuration", "the learning rate did not follow the global batch",
        [f"global batch {base_batch:g} ({base_ranks} process(es)) in the baseline, {batch:g} ({ranks}) now: "
         f"{ratio:.2g}x", f"peak learning rate {lr:g} in both runs"],
        f"scale the learning rate with the global batch (the linear rule: {lr * ratio:g} here), with a few epochs "
        f"of warm-up when it grows; or keep the global batch ({base_batch:g}) by changing the per-rank batch",
        0.5)]
