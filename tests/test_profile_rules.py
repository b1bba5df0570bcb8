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
