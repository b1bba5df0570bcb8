"""The GPU time a detection batch costs, kernel by kernel: the Loader on the GPU path, alone, under torch.profiler.
CUPTI sees every kernel and copy of the process, DALI's and fastfeed's, whatever stream or thread launched it. This is
the loader's share of a training GPU (what YOLO training's gap to its resident ceiling is made of), and, when the GPU
is what limits the loader, its rate.

    python3 benchmarks/gpu/detect_kernels.py PACKED [--batches 40] [--warmup 60] [--mode train|val]
                                                   [--dtype float16|uint8] [--kwargs JSON] [--label TEXT]

float16 is bench_detect.py's output (the loader-alone tables), uint8 what YOLO training takes (yolo_train.py).

Prints the rate without the profiler (the same batches' wall time), the summed kernel time a batch, the time a batch
at least one kernel runs (overlapping kernels counted once), and the kernels that take most of it.
"""
from __future__ import annotations

import argparse
import json
import time
from collections import defaultdict

import torch

import fastfeed


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("packed")
    p.add_argument("--batches", type=int, default=40)
    p.add_argument("--warmup", type=int, default=60)
    p.add_argument("--mode", choices=("train", "val"), default="train")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--dtype", choices=("float16", "uint8"), default="float16")
    p.add_argument("--kwargs", default="{}", help="more Loader arguments, as JSON")
    p.add_argument("--label", default="")
    p.add_argument("--device", default="cuda", help="cpu: only to try the script (no kernels to count)")
    a = p.parse_args()
    loader = fastfeed.Loader(a.packed, task="detect", batch_size=a.batch, image_size=640, device=a.device,
                             dtype=getattr(torch, a.dtype), train=a.mode == "train", **json.loads(a.kwargs))
    it = _endless(loader)
    for _ in range(a.warmup):
        next(it)
    sync = torch.cuda.synchronize if a.device != "cpu" else (lambda: None)
    sync()
    t0 = time.perf_counter()
    for _ in range(a.batches):
        next(it)
    sync()
    rate = a.batches * a.batch / (time.perf_counter() - t0)
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(a.batches):
            next(it)
        sync()
    per, spans = defaultdict(float), []
    from torch.autograd import DeviceType

    for e in prof.events():
        if e.device_type == DeviceType.CUDA:
            per[e.name] += e.time_range.elapsed_us()
            spans.append((e.time_range.start, e.time_range.end))
    busy, end = 0.0, float("-inf")
    for s, e in sorted(spans):  # the union of the kernels' intervals
        if e > end:
            busy += e - max(s, end)
            end = e
    total = sum(per.values())
    tag = f"{a.label} " if a.label else ""
    print(f"{tag}{a.mode}: {rate:.0f} img/s without the profiler; GPU a batch of {a.batch}: kernels "
          f"{total / a.batches / 1000:.2f} ms summed, {busy / a.batches / 1000:.2f} ms busy "
          f"(decoder={loader.settings.decoder}, pipelines={loader.settings.pipelines})", flush=True)
    for name, us in sorted(per.items(), key=lambda kv: -kv[1])[:12]:
        print(f"{tag}  {us / a.batches / 1000:7.3f} ms  {name[:110]}", flush=True)
    loader.close()


def _endless(loader):
    while True:
        yield from loader


if __name__ == "__main__":
    main()
