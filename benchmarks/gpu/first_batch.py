"""Issue 14: where the time to the first batch goes on large photos, and what pinning the ring buys.

    python3 benchmarks/h200/first_batch.py --data /tmp/ffbench/phone-wds --json $OUT/first-batch.json

Times, in this order and each in the same process: opening the dataset; building the native ring (its arena is
prefaulted in the constructor) without and with page-locking; then fastfeed.Loader with its defaults, and the same
Loader with the ring left pageable, each from the constructor call to the first batch on the GPU, then --batches
more batches with nothing consuming them (the loader alone). --prealloc grows DALI's memory pools for the first
Loader of the process, before its constructor or in a thread beside it (nineteenth session: the ~2.5-MP photos' first
Loader waits ~1 s between its constructor and the first batch, a later one 0.3 s; DALI's pools live as long as the
process). --decoder-args adds arguments to every GPU ("mixed") DALI image decoder the process defines, as JSON; the
values "max_w", "max_h" and "max_rgb" (the largest width, height, and width x height x 3 in the dataset's table) are
resolved first (twenty-first session: do nvJPEG's preallocation hints or paddings sized from the table shorten the
large photos' first run?); --no-preallocate runs the Loader without the hint it now sets itself for large photos;
--no-prime without the ring's read of epoch 0 during the decoders' build (twenty-second session: the 12-MP photos'
first batch is ~1.5 GB, read only once the constructor had built the first GPU pipeline, ~1.8 s).
Each Loader's row also gives the device memory in use after its batches (the whole device's, while it is alive).
"""
from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def loader_row(path, batch_size, batches, pin: bool, image_size: int = 224, prealloc=None, mode="none") -> dict:
    import fastfeed
    import fastfeed.loader as L
    from fastfeed.ring import PrefetchRing

    original = L.PrefetchRing
    if not pin:
        L.PrefetchRing = lambda *a, **k: PrefetchRing(*a, **{**k, "pin_memory": False})
    try:
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        pre_s, worker = None, None
        if mode == "before":
            prealloc()
            pre_s = time.perf_counter() - t0
        elif mode == "parallel":
            worker = threading.Thread(target=prealloc)
            worker.start()
        loader = fastfeed.Loader(path, batch_size=batch_size, train=True, image_size=image_size, device="cuda",
                                 dtype=torch.float16, channels_last=True)
        built = time.perf_counter() - t0
        it = iter(loader)
        next(it)
        torch.cuda.synchronize()
        first = time.perf_counter() - t0
        if worker is not None:
            worker.join()
            pre_s = time.perf_counter() - t0
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
            "ring_pinned_reported": info.get("pinned"), "prealloc": mode, "prealloc_done_s": pre_s,
            "device_used_gib": (total - free) / 2**30, "preallocate": info.get("preallocate")}


def patch_decoders(extra: dict, ds) -> dict:
    """Every GPU image decoder defined from here on gets `extra` (names resolved from the table); returns them."""
    import functools

    import numpy as np
    from nvidia.dali import fn

    w, h = np.asarray(ds.widths, np.int64), np.asarray(ds.heights, np.int64)
    named = {"max_w": int(w.max()), "max_h": int(h.max()), "max_rgb": int((w * h).max() * 3)}
    extra = {k: named.get(v, v) for k, v in extra.items()}
    if extra:
        for name in ("image", "image_slice"):
            original = getattr(fn.decoders, name)

            def wrapped(*a, _original=original, **k):
                return _original(*a, **({**k, **extra} if k.get("device") == "mixed" else k))

            setattr(fn.decoders, name, functools.wraps(original)(wrapped))
    return extra


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--data", required=True)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--batches", type=int, default=8)
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--prealloc", choices=("none", "before", "parallel"), default="none",
                   help="before the first Loader: DALI's memory pools grown (--pinned-mb, --device-mb) first, or in a "
                        "thread beside its constructor (does the first run on large images wait on their growth?)")
    p.add_argument("--pinned-mb", type=int, default=1024)
    p.add_argument("--device-mb", type=int, default=4096)
    p.add_argument("--decoder-args", default="{}",
                   help='JSON, e.g. {"preallocate_width_hint": "max_w", "preallocate_height_hint": "max_h"}')
    p.add_argument("--no-preallocate", action="store_true",
                   help="the Loader's settings without `preallocate` (fastfeed/settings.py): the side before it")
    p.add_argument("--no-prime", action="store_true",
                   help="the Loader's ring started at the first iteration, as before NOTE [Reading before the first "
                        "iteration] (fastfeed/loader.py): the side before it")
    p.add_argument("--loaders", type=int, default=4, help="Loaders built one after another (pinned ring first)")
    p.add_argument("--json", default=None)
    args = p.parse_args()
    from fastfeed.formats import open_dataset
    from fastfeed.ring import PrefetchRing
    from fastfeed.settings import DEFAULT_PREFETCH
    from fastfeed.constants import DEFAULT_DALI_PIPELINES

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
    res["decoder_args"] = patch_decoders(json.loads(args.decoder_args), ds)
    if args.no_preallocate:
        import fastfeed.loader as L

        resolve = L.resolve_settings
        L.resolve_settings = lambda **kw: resolve(**kw).replace(preallocate=None)
    res["no_preallocate"] = args.no_preallocate
    if args.no_prime:
        import fastfeed.loader as L

        L.Loader._prime = lambda self: None
    res["no_prime"] = args.no_prime

    def prealloc():
        import nvidia.dali.backend as b

        b.PreallocatePinnedMemory(args.pinned_mb << 20)
        b.PreallocateDeviceMemory(args.device_mb << 20, 0)

    res["loader"] = [loader_row(args.data, args.batch_size, args.batches, pin, args.image_size, prealloc,
                                args.prealloc if i == 0 else "none")
                     for i, pin in enumerate((True, False, True, False)[:args.loaders])]
    res["date"] = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    res["gpu"] = torch.cuda.get_device_name(0)
    print(json.dumps(res, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
