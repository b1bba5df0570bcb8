"""The verdict rules of `fastfeed profile` at their thresholds, on constructed summaries (tests/test_profile.py runs
them on real scripts)."""
from __future__ import annotations

from fastfeed.profile.rules import BATCH_CHANGE, DATA_WAIT_SHARE, LOW_GPU_UTIL_PCT, against_baseline, verdict


def summary(data=0.0, comm=0.0, gpu_idle=None, util=None, cores=16, loaders=(), **facts) -> dict:
    rest = 1.0 - data - comm
    return {"share": {"data": data, "h2d": 0.0, "forward+other": rest / 2, "backward": rest / 2, "optimizer": 0.0,
                      "comm": comm},
            "data_gpu_idle_share": gpu_idle, "h2d_pageable_share": 1.0, "gpu": {} if gpu_idle is not None else None,
            "machine": {"host": {"cpu_count": cores, "cpu_cores_busy": 1.0},
                        "gpu": None if util is None else {"util_mean_pct": util}},
            "facts": {"dataloaders": list(loaders), "world_size": 1, "ddp": [], **facts}}


def families(s: dict) -> list[str]:
    return [f["family"] for f in verdict(s, [s])]


def test_data_supply_starts_at_its_threshold():
    assert families(summary(data=DATA_WAIT_SHARE + 0.01)) == ["data supply"]
    assert families(summary(data=DATA_WAIT_SHARE - 0.01)) == ["compute"]


def test_on_a_gpu_the_wait_that_counts_is_the_gpus_idle_time():
    # 60% of the wall clock in next(), but the GPU was busy with the previous step's kernels for all but 5%:
    # the trap of timing an asynchronous GPU on the CPU's clock.
    assert families(summary(data=0.6, gpu_idle=0.05, util=95)) == ["compute"]
    assert families(summary(data=0.6, gpu_idle=0.4, util=55)) == ["data supply"]


def test_the_advice_names_the_missing_workers_first():
    dl = {"num_workers": 2, "pin_memory": True, "batch_size": 64, "dataset": "ImageFolder", "sampler": "X"}
    (f,) = verdict(summary(data=0.5, cores=16, loaders=[dl]), [summary()])
    assert f["advice"].startswith("raise num_workers from 2 to 15")
    (f,) = verdict(summary(data=0.5, cores=4, loaders=[dict(dl, num_workers=3)]), [summary()])
    assert f["advice"].startswith("pack the dataset")


def test_launch_bound_needs_an_idle_gpu_and_no_data_wait():
    assert families(summary(util=LOW_GPU_UTIL_PCT - 20, gpu_idle=0.01)) == ["compute efficiency"]
    assert families(summary(util=LOW_GPU_UTIL_PCT + 20, gpu_idle=0.01)) == ["compute"]


def test_a_compiled_model_is_not_told_to_compile():
    (plain,) = verdict(summary(util=LOW_GPU_UTIL_PCT - 20, gpu_idle=0.01), [summary()])
    (compiled,) = verdict(summary(util=LOW_GPU_UTIL_PCT - 20, gpu_idle=0.01, compiled=True), [summary()])
    assert plain["advice"].startswith("torch.compile the model")
    assert "torch.compile the model" not in compiled["advice"] and "reduce-overhead" in compiled["advice"]
    (plain,) = verdict(summary(), [summary()])
    (compiled,) = verdict(summary(compiled=True), [summary()])
    assert "torch.compile" in plain["advice"] and "torch.compile" not in compiled["advice"]


def test_framework_findings():
    assert "framework configuration" in families(summary(data_parallel=True))
    ddp = [{"find_unused_parameters": True, "all_used": True}]
    assert "framework configuration" in families(summary(ddp=ddp))
    assert families(summary(ddp=[{"find_unused_parameters": True, "all_used": False}])) == ["compute"]


def test_fp32_on_a_gpu_without_autocast():
    s = summary(gpu_idle=0.01, util=95, param_dtype="float32")
    assert families(s) == ["compute efficiency"]
    assert "autocast" in verdict(s, [s])[0]["advice"]
    assert families(summary(gpu_idle=0.01, util=95, param_dtype="float32", autocast="bfloat16")) == ["compute"]
    assert families(summary(param_dtype="float32")) == ["compute"]  # no GPU: not judged


def report(lr: float, per_rank: list[int]) -> dict:
    return {"processes": [{"samples_per_step": b, "facts": {"lr": lr}} for b in per_rank]}


def test_the_learning_rate_against_the_baseline():
    base = report(0.1, [256])
    (f,) = against_baseline(report(0.1, [256] * 8), base)  # 8x the global batch, the same learning rate
    assert f["family"] == "framework configuration" and "the linear rule: 0.8 here" in f["advice"]
    assert against_baseline(report(0.8, [256] * 8), base) == []  # scaled with it
    assert against_baseline(report(0.1, [256, 256 * (BATCH_CHANGE - 1) * 0.9]), base) == []  # under the change
    assert against_baseline(report(0.1, [64]), base)  # a quarter of the batch: the same rule, downwards
    assert against_baseline(report(0.1, [256] * 8), {"processes": []}) == []  # nothing to compare with


# `nvidia-smi topo -m` of an 8-GPU NVLink host and of a 4-GPU PCIe one (its header coloured, as a terminal shows it).
NVLINK_TOPO = """\x1b[4mGPU0\tGPU1\tGPU2\tGPU3\tGPU4\tGPU5\tGPU6\tGPU7\tNIC0\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\x1b[0m
GPU0\t X \tNV18\tNV18\tNV18\tNV18\tNV18\tNV18\tNV18\tPXB\t0-55,112-167\t0\t\tN/A
GPU1\tNV18\t X \tNV18\tNV18\tNV18\tNV18\tNV18\tNV18\tSYS\t0-55,112-167\t0\t\tN/A
GPU2\tNV18\tNV18\t X \tNV18\tNV18\tNV18\tNV18\tNV18\tSYS\t0-55,112-167\t0\t\tN/A
GPU3\tNV18\tNV18\tNV18\t X \tNV18\tNV18\tNV18\tNV18\tSYS\t0-55,112-167\t0\t\tN/A
GPU4\tNV18\tNV18\tNV18\tNV18\t X \tNV18\tNV18\tNV18\tSYS\t56-111,168-223\t1\t\tN/A
GPU5\tNV18\tNV18\tNV18\tNV18\tNV18\t X \tNV18\tNV18\tSYS\t56-111,168-223\t1\t\tN/A
GPU6\tNV18\tNV18\tNV18\tNV18\tNV18\tNV18\t X \tNV18\tSYS\t56-111,168-223\t1\t\tN/A
GPU7\tNV18\tNV18\tNV18\tNV18\tNV18\tNV18\tNV18\t X \tSYS\t56-111,168-223\t1\t\tN/A
NIC0\tPXB\tSYS\tSYS\tSYS\tSYS\tSYS\tSYS\tSYS\t X \t\t\t\t

Legend:

  X    = Self
  SYS  = Connection traversing PCIe as well as the SMP interconnect between NUMA nodes (e.g., QPI/UPI)
  NV#  = Connection traversing a bonded set of # NVLinks
"""
PCIE_TOPO = """\tGPU0\tGPU1\tGPU2\tGPU3\tCPU Affinity\tNUMA Affinity
GPU0\t X \tPHB\tSYS\tSYS\t0-15\t0
GPU1\tPHB\t X \tSYS\tSYS\t0-15\t0
GPU2\tSYS\tSYS\t X \tPHB\t16-31\t1
GPU3\tSYS\tSYS\tPHB\t X \t16-31\t1
"""


def test_gpu_links_from_nvidia_smi_topo_and_the_communication_finding_says_them():
    from fastfeed.profile.rules import communication
    from fastfeed.profile.topology import describe_links, parse_topology

    nv, pcie = parse_topology(NVLINK_TOPO), parse_topology(PCIE_TOPO)
    assert nv == {"gpus": 8, "links": ["NV18"]} and pcie == {"gpus": 4, "links": ["PHB", "SYS"]}
    assert "every pair linked by NVLink" in describe_links(nv)
    assert "no NVLink" in describe_links(pcie) and "SYS (PCIe and the link between NUMA nodes)" in describe_links(pcie)
    assert parse_topology("GPU0\tCPU Affinity\nGPU0\t X \t0-7\n") is None  # one GPU: nothing to say
    assert parse_topology("NVIDIA-SMI has failed") is None
    p = {"share": {"comm": 0.4}, "facts": {"gpu_links": pcie}}
    found = communication(p, [p])
    assert any("no NVLink" in e for e in found["evidence"]) and "talk over PCIe" in found["advice"]
    p["facts"] = {"gpu_links": nv}
    assert "talk over PCIe" not in communication(p, [p])["advice"]
