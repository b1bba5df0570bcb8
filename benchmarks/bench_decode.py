"""img/s of the CPU decoders (cpu-pil with and without JPEG draft, cpu-dali) on the same JPEGs in one run.

`--rounds N` repeats the rows N times, interleaved; cpu-pil also runs with its window decode off ("whole", every image
decoded by PIL whole: decode/cpu.py `_REGION_DECODE`) and with one pool task per image
("per-image tasks": decode/cpu.py `TASKS_PER_THREAD`) for side-by-side baselines.

    python benchmarks/bench_decode.py [--images DIR] [--num 256] [--batch 64] [--threads 2] [--size 224] [--eval]

Without --images it renders a demo folder with fastfeed.demo_data (ImageNet-like JPEGs) under /tmp. Records are
read into memory first, so only decoding + crop/resize/normalize is timed. One warm-up batch per decoder.
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np


def _load(folder: Path, num: int):
    from PIL import Image

    paths = sorted(p for p in folder.rglob("*") if p.suffix.lower() in (".jpg", ".jpeg", ".png"))[:num]
    if not paths:
        raise SystemExit(f"no images under {folder}")
    data = [np.fromfile(p, dtype=np.uint8) for p in paths]
    sizes = [Image.open(p).size for p in paths]
    return data, np.array([s[0] for s in sizes]), np.array([s[1] for s in sizes])


def main(argv=None) -> int:
    import torch

    from fastfeed.decode import crop_windows, make_decoder

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--images", type=Path)
    ap.add_argument("--num", type=int, default=256)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--eval", action="store_true", help="eval transform instead of RandomResizedCrop")
    ap.add_argument("--rounds", type=int, default=1)
    a = ap.parse_args(argv)
    folder = a.images
    if folder is None:
        from fastfeed.demo_data import make_dataset

        folder = Path("/tmp/fastfeed-bench-decode")
        make_dataset(folder, num_images=a.num, num_classes=4, seed=0)
    data, W, H = _load(folder, a.num)
    n = len(data)
    print(f"{n} images from {folder}, batch {a.batch}, {a.threads} threads, S={a.size}, "
          f"{'eval' if a.eval else 'train RRC'}, mean {np.mean([len(d) for d in data]) / 1e3:.0f} KB")
    import fastfeed.decode.cpu as C

    window_decode, tasks_per_thread = C._REGION_DECODE, C.TASKS_PER_THREAD
    configs = [("cpu-pil", {"draft": True}), ("cpu-pil", {"draft": True, "whole": True}),
               ("cpu-pil", {"draft": True, "per_image": True}), ("cpu-pil", {"draft": False}), ("cpu-dali", {})]
    print(f"{'decoder':<28}{'img/s':>10}")
    for kind, extra in configs * a.rounds:
        extra = dict(extra)
        C._REGION_DECODE = None if extra.pop("whole", False) else window_decode
        per_image = extra.pop("per_image", False)
        C.TASKS_PER_THREAD = a.num if per_image else tasks_per_thread  # a.num: one image per task
        dec = make_decoder(kind, device="cpu", image_size=a.size, dtype=torch.float16, batch_size=a.batch,
                           num_threads=a.threads, **extra)
        batches = [list(range(i, min(i + a.batch, n))) for i in range(0, n, a.batch)]
        win = [crop_windows(W[b], H[b], np.asarray(b), seed=0, epoch=0, train=not a.eval, image_size=a.size)
               for b in batches]
        dec([data[i] for i in batches[0]], win[0])  # warm-up: numba compile, DALI allocations
        t0 = time.perf_counter()
        for b, w in zip(batches, win):
            dec([data[i] for i in b], w)
        dt = time.perf_counter() - t0
        dec.close()
        label = kind + ("" if not extra else f" draft={extra['draft']}")
        label += " whole" if C._REGION_DECODE is None else ""
        label += " per-image tasks" if per_image else ""
        print(f"{label:<28}{n / dt:>10.0f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
