"""Issue 14: which nvJPEG a process decodes with, the chroma mode fastfeed picks from it, and what that does to the
loader's rate on large photos.

    python3 benchmarks/h200/nvjpeg_probe.py --first torchvision --data /tmp/ffbench/phone-wds
    python3 benchmarks/h200/nvjpeg_probe.py --first dali --data /tmp/ffbench/phone-wds

--first torchvision imports torchvision before the Loader (as a training script that builds a torchvision model
does: its bundled nvJPEG is then the process's); --first dali builds the Loader first (DALI's own nvJPEG is loaded).
Prints the nvJPEG libraries mapped and their version at each point, the decoders' chroma mode, the time to the first
batch and the loader's rate alone (decoder="dali", --batches batches after the first).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--first", choices=("torchvision", "dali"), required=True)
    p.add_argument("--data", required=True)
    p.add_argument("--batches", type=int, default=8)
    p.add_argument("--json", default=None)
    args = p.parse_args()

    import torch

    from fastfeed.decode.nvjpeg import mapped_nvjpeg, nvjpeg_version

    points = []

    def point(label):
        points.append({"at": label, "mapped": mapped_nvjpeg(), "version": nvjpeg_version()})
        print(f"[nvjpeg {args.first}-first] {label}: {points[-1]['version']} {points[-1]['mapped']}", flush=True)

    torch.ones(1, device="cuda").sum().item()
    point("torch + CUDA")
    if args.first == "torchvision":
        import torchvision  # noqa: F401

        point("import torchvision")
    import fastfeed

    t0 = time.perf_counter()
    loader = fastfeed.Loader(args.data, batch_size=256, train=True, image_size=224, device="cuda",
                             dtype=torch.float16, channels_last=True, decoder="dali")
    it = iter(loader)
    next(it)
    torch.cuda.synchronize()
    first = time.perf_counter() - t0
    chroma = sorted({d.chroma for d in loader._decoders})
    point("Loader built, first batch")
    t1 = time.perf_counter()
    n = 0
    for _ in range(args.batches):
        try:
            x, _ = next(it)
        except StopIteration:
            it = iter(loader)
            x, _ = next(it)
        n += x.shape[0]
    torch.cuda.synchronize()
    rate = n / (time.perf_counter() - t1)
    loader.close()
    if args.first == "dali":
        import torchvision  # noqa: F401

        point("import torchvision after")
    res = {"first": args.first, "data": args.data, "chroma": chroma, "first_batch_s": first, "images_per_s": rate,
           "points": points, "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "gpu": torch.cuda.get_device_name(0)}
    print(f"[nvjpeg {args.first}-first] chroma {chroma}: first batch {first:.2f} s, alone {rate:,.0f} img/s",
          flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
