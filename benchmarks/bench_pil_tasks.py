"""img/s of fastfeed.Loader's pillow-simd path with a few images per pool task (decode/cpu.py TASKS_PER_THREAD)
against one image per task, in one process, interleaved: the thirteenth session's A/B.

    python benchmarks/bench_pil_tasks.py PACKED_DIR [--size 224] [--rounds 3] [--seconds 8]

Each row builds a Loader(device="cpu", decoder="cpu-pil", batch_size=64, train=True), takes 8 batches untimed, then
times `--seconds`.
"""
from __future__ import annotations

import argparse


def _rate(path: str, size: int, tasks_per_thread: int, seconds: float) -> float:
    import fastfeed
    import fastfeed.decode.cpu as C
    from fastfeed.bench.runner import run_loader

    C.TASKS_PER_THREAD = tasks_per_thread  # read at every batch
    with fastfeed.Loader(path, batch_size=64, train=True, image_size=size, device="cpu", decoder="cpu-pil") as L:
        res = run_loader(L, lambda images, labels: None, name="cpu-pil", steps=1 << 30, warmup=8,
                         max_seconds=seconds, progress=False)
    return res.to_dict()["samples_per_s"]


def main(argv=None) -> int:
    import torch

    import fastfeed.decode.cpu as C

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("packed")
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=8.0)
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    chunked = C.TASKS_PER_THREAD
    for r in range(a.rounds):
        x = _rate(a.packed, a.size, chunked, a.seconds)
        y = _rate(a.packed, a.size, 1 << 30, a.seconds)  # step 1: one image per task
        print(f"{a.packed} S={a.size} round {r + 1}: {chunked} tasks per thread {x:,.0f} img/s, one image per task "
              f"{y:,.0f} img/s, ratio {x / y:.2f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
