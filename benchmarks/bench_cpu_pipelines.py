"""img/s of fastfeed.Loader with DALI's CPU backend on the CPU: its default two pipelines (settings.py) against one
pipeline with all the threads (`pipelines=1`), in one process, interleaved: the thirteenth session's A/B.

    python benchmarks/bench_cpu_pipelines.py PACKED_DIR [--size 64] [--rounds 2] [--seconds 8]

Each row builds a Loader(device="cpu", decoder="cpu-dali", batch_size=64, train=True), takes 8 batches untimed, then
times `--seconds`.
"""
from __future__ import annotations

import argparse


def _rate(path: str, size: int, seconds: float, **kw):
    import fastfeed
    from fastfeed.bench.runner import run_loader

    with fastfeed.Loader(path, batch_size=64, train=True, image_size=size, device="cpu", decoder="cpu-dali",
                         **kw) as L:
        res = run_loader(L, lambda images, labels: None, name="cpu-dali", steps=1 << 30, warmup=8,
                         max_seconds=seconds, progress=False)
        return res.to_dict()["samples_per_s"], f"{L.settings.pipelines} x {L.settings.decode_threads} threads"


def main(argv=None) -> int:
    import torch

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("packed")
    ap.add_argument("--size", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--seconds", type=float, default=8.0)
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    for r in range(a.rounds):
        x, xs = _rate(a.packed, a.size, a.seconds)
        y, ys = _rate(a.packed, a.size, a.seconds, pipelines=1)
        print(f"{a.packed} S={a.size} round {r + 1}: defaults ({xs}) {x:,.0f} img/s, pipelines=1 ({ys}) {y:,.0f} "
              f"img/s, ratio {x / y:.2f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
