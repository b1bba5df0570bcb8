"""The time to the first batch: from `fastfeed.Loader(...)` to the first batch on the GPU, in a fresh process.

    python3 benchmarks/gpu/first_batch.py --data /tmp/ffbench/phone-wds --loaders 1 --batches 1 --json $OUT/fb.json

CUDA is initialised before the clock starts, as a training script has done by the time it builds its loader. Times,
in this order and each in the same process: opening the dataset; building the native ring without and with
page-locking its arena; then `--loaders` Loaders with their defaults, one after another (the first with the ring
page-locked as the Loader does it, the second with the ring left pageable, then again), each from the constructor
call to the first batch on the GPU, then `--batches` more batches with nothing consuming them (the loader alone).
The first Loader of a process pays for loading DALI's and nvJPEG's libraries: the number a training job sees; later
ones show the Loader's own share. Each Loader's row also gives the device memory in use after its batches (the whole
device's, while it is alive).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def loader_row(path, batch_size, batches, pin: bool, image_size: int = 224) -> dict:
    import fastfeed
    import fastfeed.loader.loader as L  # the module whose name the Loader builds its ring through
    from fastfeed.loader.ring import PrefetchRing

    original = L.PrefetchRing
    if not pin:
        L.PrefetchRing = lambda *a, **k: PrefetchRing(*a, **{**k, "pin_memory": False})
    try:
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        loader = fastfeed.Loader(path, batch_size=batch_size, train=True, image_size=image_size, device="cuda",
                                 dtype=torch.float16, channels_last=True)
        built = time.perf_counter() - t0
        it = iter(loader)
        next(it)
        torch.cuda.synchronize()
        first = time.perf_counter() - t0
        t1 = time.perf_counter()
        n = 0
        for _ in range(batches):
            x, _ = next(it)
            n += x.shape[0]
        torch.cuda.synchronize()
        rate = n / (time.perf_counter() - t1)
        free, total = torch.cuda.mem_get_info()
        info = loader.stats().get("info", {})
        loader.close()
    finally:
        L.PrefetchRing = original
    return {"pinned_ring": pin, "constructor_s": built, "first_batch_s": first, "images_per_s": rate,
            "ring_pinned_reported": info.get("pinned"), "device_used_gib": (total - free) / 2**30,
            "preallocate": info.get("preallocate")}


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--data", required=True)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--batches", type=int, default=8)
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--loaders", type=int, default=4, help="Loaders built one after another (pinned ring first)")
    p.add_argument("--json", default=None)
    args = p.parse_args()
    from fastfeed.constants import DEFAULT_DALI_PIPELINES
    from fastfeed.datasets import open_dataset
    from fastfeed.loader.ring import PrefetchRing
    from fastfeed.loader.settings import DEFAULT_PREFETCH

    torch.cuda.init()
    ds, t_open = timed(lambda: open_dataset(args.data))
    ext = ds.extents()
    slots = DEFAULT_PREFETCH + 2 * DEFAULT_DALI_PIPELINES
    res = {"data": args.data, "samples": len(ds), "mean_sample_bytes": float(ext.size.mean()), "open_s": t_open,
           "ring_slots": slots}
    for pin in (False, True):
        ring, t = timed(lambda: PrefetchRing(ext, args.batch_size, num_slots=slots, pin_memory=pin))
        res[f"ring_build_s_pin_{pin}"] = t
        res["ring_arena_bytes"] = ring.slot_bytes * ring.num_slots
        ring.close()
        del ring
    res["image_size"] = args.image_size
    res["loader"] = [loader_row(args.data, args.batch_size, args.batches, pin, args.image_size)
                     for pin in (True, False, True, False)[:args.loaders]]
    res["date"] = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    res["gpu"] = torch.cuda.get_device_name(0)
    print(json.dumps(res, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
