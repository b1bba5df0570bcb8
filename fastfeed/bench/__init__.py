"""`fastfeed bench`: measure a loader's throughput and data wait, attribute the step time, compare with torch.

    runner.py         warm-up + fixed steps of any (images, labels) iterable; the timing rules
    consumers.py      simulated training steps (none / resnet18 / resnet50), synchronised per step
    torch_baseline.py the DataLoader + PIL baseline over a packed dataset or an ImageFolder tree (make_torch_loader),
                      reused by benchmarks/
    sysmon.py         CPU, iowait, memory and NVML GPU sampling in a background thread
    session.py        one run: loaders x consumer -> report
    verdict.py        the step against the resident-data ceiling: data wait / slowed step / model, and the advice
    report.py         JSON schema (BENCH_SCHEMA_VERSION) and the final table
    plot.py           throughput and wait-distribution PNG
"""
from __future__ import annotations

__all__ = ["BenchConfig", "run_bench", "make_torch_loader", "run_loader"]


def __getattr__(name: str):
    # lazy: `fastfeed.bench` must be importable without torch for the CLI's help text
    if name in ("BenchConfig", "run_bench"):
        from fastfeed.bench import session

        return getattr(session, name)
    if name == "make_torch_loader":
        from fastfeed.bench.torch_baseline import make_torch_loader

        return make_torch_loader
    if name == "run_loader":
        from fastfeed.bench.runner import run_loader

        return run_loader
    raise AttributeError(f"module 'fastfeed.bench' has no attribute {name!r}")
