"""Issue 14: where fastfeed loses to DALI's reader on 12-MP photos (0.70x alone since the third session), taken apart.

    python3 benchmarks/h200/phone_probe.py --images /tmp/ffbench/phone-images --data /tmp/ffbench/phone-wds

Each row decodes the same 12-MP JPEGs, held in memory (no reading, no ring), into 224-px float16 crops on GPU 0, except
the last two (the Loader through its ring, and DALI's file reader from disk). Every batch ends with a device
synchronise; `--warmup` batches first, then `--batches` timed ones (img/s over them, and the median batch's rate).
Rows (--rows):
  ours               fastfeed's DaliDecoder at its defaults: whole-image decode, ROI resize (chroma "full"),
                     hw_decoder_load 1.0, 2 threads
  ours-t4            the same at hw_decoder_load 0.9 and 4 threads (DALI's best setting for these photos; the
                     Loader's default for large photos since this probe)
  ours-plain         ROI decode (decoders.image_slice), plain chroma: what decoding only the window gains
  ours-x2            two DaliDecoders in two threads, one batch each at a time (the Loader's two pipelines);
                     ours-x2-t4: the same at hw 0.9 and 4 threads
  fused              external_source -> decoders.image_random_crop -> resize -> crop_mirror_normalize: DALI's own
                     op chain fed like ours (prefetch 1), crops drawn by DALI; fused-t4: hw 0.9, 4 threads;
                     fused-p2: DALI's prefetch queue of 2 fed two batches ahead (DALI's reader's depth)
  loader             fastfeed.Loader(decoder="dali") on the packed set, alone (its defaults for these photos);
                     loader-p1: one pipeline; loader-p1-nocheck: one pipeline, checksums not verified
  dali-file          benchmarks/dali_reference.py's file reader, hw 0.9, 4 threads (the best row of earlier runs)
If "ours" is as fast as "fused", the op chain is not the gap; if "loader" is much slower than "ours-x2", the ring is.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from fastfeed.decode.crop import crop_windows  # noqa: E402
from fastfeed.decode.dali import DaliDecoder  # noqa: E402

B = 256
DEV = 0  # None with --cpu: DALI's CPU backend, a smoke run of the script on a machine without a GPU


def sync() -> None:
    if DEV is not None:
        torch.cuda.synchronize()


def log(msg: str) -> None:
    print(f"[phone {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def load(images: Path, n: int):
    from PIL import Image

    paths = sorted(p for p in images.rglob("*") if p.suffix.lower() in (".jpg", ".jpeg"))[:n]
    data, W, H = [], [], []
    for p in paths:
        data.append(np.fromfile(p, dtype=np.uint8))
        with Image.open(p) as im:
            W.append(im.size[0])
            H.append(im.size[1])
    return data, np.array(W), np.array(H)


CURRENT = [""]  # the row being measured
STEADY: dict = {}  # row -> img/s at the median batch time (what a long epoch sees: no epoch starts)


def timed(run_batch, warmup: int, batches: int) -> float:
    """img/s over the timed batches; each batch is synchronised, and the median batch's rate is kept in STEADY (a
    Loader starts an epoch every len(dataset) / B batches here, far more often than in training)."""
    for i in range(warmup):
        run_batch(i)
    sync()
    t0 = time.perf_counter()
    times = []
    for i in range(warmup, warmup + batches):
        t = time.perf_counter()
        run_batch(i)
        sync()
        times.append(time.perf_counter() - t)
    STEADY[CURRENT[0]] = B / float(np.median(times))
    return batches * B / (time.perf_counter() - t0)


def batch_of(data, W, H, i):
    n = len(data)
    idx = [(i * B + j) % n for j in range(B)]
    win = crop_windows(W[idx], H[idx], np.array(idx) + i * n, seed=0, epoch=0, train=True, image_size=224)
    return [data[k] for k in idx], win


def ours(data, W, H, args, **kw):
    dec = DaliDecoder(device_id=DEV, dtype=torch.float16, channels_last=True, batch_size=B, **kw)
    try:
        return timed(lambda i: dec(*batch_of(data, W, H, i)), args.warmup, args.batches)
    finally:
        dec.close()


def ours_threads(data, W, H, args, k=2, **kw):
    decs = [DaliDecoder(device_id=DEV, dtype=torch.float16, channels_last=True, batch_size=B, **kw)
            for _ in range(k)]

    def work(j, count):
        for i in range(j, count, k):
            decs[j](*batch_of(data, W, H, i))
        sync()

    def go(count):
        ts = [threading.Thread(target=work, args=(j, count)) for j in range(k)]
        [t.start() for t in ts]
        [t.join() for t in ts]

    go(args.warmup)
    t0 = time.perf_counter()
    go(args.batches)
    rate = args.batches * B / (time.perf_counter() - t0)
    for d in decs:
        d.close()
    return rate


def fused(data, W, H, args, prefetch=1, hw=1.0, threads=2):
    from nvidia.dali import fn, pipeline_def, types

    from dali_reference import MEAN, STD

    @pipeline_def(batch_size=B, num_threads=threads, device_id=DEV, prefetch_queue_depth=prefetch, exec_dynamic=True)
    def pipe():
        raw = fn.external_source(name="raw", no_copy=True, dtype=types.UINT8, ndim=1)
        gpu = {"device": "mixed", "hw_decoder_load": hw} if DEV is not None else {"device": "cpu"}
        img = fn.decoders.image_random_crop(raw, **gpu, output_type=types.RGB, random_area=[0.08, 1.0],
                                            random_aspect_ratio=[3 / 4, 4 / 3], num_attempts=10)
        img = fn.resize(img, resize_x=224, resize_y=224, antialias=True)
        return fn.crop_mirror_normalize(img, dtype=types.FLOAT16, output_layout="HWC", mean=MEAN, std=STD,
                                        mirror=fn.random.coin_flip(probability=0.5))

    p = pipe()
    p.build()
    fed = [0]

    def feed_to(i):  # keep the queue `prefetch` batches ahead; no_copy: the arrays in `data` outlive the run
        while fed[0] <= i + prefetch - 1:
            p.feed_input("raw", batch_of(data, W, H, fed[0])[0])
            fed[0] += 1

    def one(i):
        feed_to(i)
        (out,) = p.run()
        out.as_tensor()

    try:
        return timed(one, args.warmup, args.batches)
    finally:
        del p


def loader_alone(args, **kw):
    import fastfeed

    gpu = DEV is not None
    loader = fastfeed.Loader(args.data, batch_size=B, train=True, image_size=224, device="cuda" if gpu else "cpu",
                             dtype=torch.float16, channels_last=True, decoder="dali" if gpu else "cpu-dali", **kw)
    it = iter(loader)

    def one(i):
        nonlocal it
        try:
            next(it)
        except StopIteration:
            it = iter(loader)
            next(it)

    try:
        return timed(one, args.warmup, args.batches)
    finally:
        loader.close()


def dali_file(args):
    from dali_reference import build_pipeline

    p = build_pipeline("file", str(args.images), batch_size=B, num_threads=4, device_id=DEV, hw_decoder_load=0.9)
    try:
        return timed(lambda i: p.run(), args.warmup, args.batches)
    finally:
        del p


def main() -> int:
    global DEV, B
    ap = argparse.ArgumentParser()
    ap.add_argument("--images", type=Path, required=True)
    ap.add_argument("--data", required=True)
    ap.add_argument("--num", type=int, default=768, help="photos held in memory")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--batches", type=int, default=8)
    ap.add_argument("--rows", default="ours,ours-t4,ours-plain,ours-x2,fused,fused-t4,fused-p2,loader,dali-file")
    ap.add_argument("--json", default=None)
    ap.add_argument("--batch-size", type=int, default=B)
    ap.add_argument("--cpu", action="store_true", help="smoke run on DALI's CPU backend (no GPU)")
    args = ap.parse_args()
    B = args.batch_size
    if args.cpu:
        DEV = None
    data, W, H = load(args.images, args.num)
    log(f"{len(data)} photos, {sum(d.size for d in data) / len(data) / 1e6:.1f} MB, "
        f"median {int(np.median(W))}x{int(np.median(H))}")
    rows = {
        "ours": lambda: ours(data, W, H, args),
        "ours-t4": lambda: ours(data, W, H, args, hw_decoder_load=0.9, num_threads=4),
        "ours-x2": lambda: ours_threads(data, W, H, args),
        "fused": lambda: fused(data, W, H, args),
        "fused-t4": lambda: fused(data, W, H, args, hw=0.9, threads=4),
        "fused-p2": lambda: fused(data, W, H, args, prefetch=2),
        "ours-x2-t4": lambda: ours_threads(data, W, H, args, hw_decoder_load=0.9, num_threads=4),
        "loader": lambda: loader_alone(args),
        "loader-p1": lambda: loader_alone(args, pipelines=1),
        "loader-p1-nocheck": lambda: loader_alone(args, pipelines=1, verify_checksums=False),
        "dali-file": lambda: dali_file(args),
    }
    res = {"date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "batch_size": B, "rows": {},
           "gpu": torch.cuda.get_device_name(0) if DEV is not None else "cpu"}
    for name in args.rows.split(","):
        if name == "ours-plain":
            os.environ["FASTFEED_DALI_CHROMA"] = "plain"
            fn_ = rows["ours"]
        else:
            os.environ.pop("FASTFEED_DALI_CHROMA", None)
            fn_ = rows[name]
        CURRENT[0] = name
        try:
            rate = fn_()
        except Exception as e:  # a row that fails is reported, the others still run
            log(f"{name}: failed: {type(e).__name__}: {str(e)[:300]}")
            continue
        res["rows"][name] = rate
        if name in STEADY:
            res.setdefault("median_batch_rows", {})[name] = STEADY[name]
        log(f"{name:18s} {rate:8,.0f} img/s   (median batch: {STEADY.get(name, float('nan')):8,.0f} img/s)")
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
