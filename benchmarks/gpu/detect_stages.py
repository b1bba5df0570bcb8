"""Where a detection batch's time goes: the DetectDecoder called directly (decode, geometry, render, to the device)
at 1..N threads, against the Loader's own rate on the same data. A decoder much faster than the Loader points at the
Loader's per-batch path; a decoder that stops scaling with threads points at the GIL.

    python3 benchmarks/gpu/detect_stages.py PACKED [--device cuda] [--batch 64] [--threads 1,4,8]
"""
from __future__ import annotations

import argparse
import time

import numpy as np
import torch

import fastfeed
from fastfeed.detect import DetectAugment
from fastfeed.detect.decoder import DetectDecoder, DetectRequest
from fastfeed.formats import read_targets


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("packed")
    p.add_argument("--device", default="cuda")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--threads", default="1,4,8")
    p.add_argument("--batches", type=int, default=6)
    a = p.parse_args()
    ds = fastfeed.open_dataset(a.packed)
    targets = read_targets(ds)
    sync = torch.cuda.synchronize if a.device == "cuda" else (lambda: None)
    batches = [np.arange(k * a.batch, (k + 1) * a.batch) % len(ds) for k in range(a.batches + 1)]
    data = [[ds.read(int(i)) for i in ids] for ids in batches]
    for n in (int(v) for v in a.threads.split(",")):
        dec = DetectDecoder(targets=targets, widths=ds.widths, heights=ds.heights, image_size=640,
                            augment=DetectAugment(), train=True, seed=0, epochs=None, device=a.device,
                            dtype=torch.float16, channels_last=False, mean=(0, 0, 0), std=(1, 1, 1), num_threads=n,
                            on_error="skip")
        dec(data[0], DetectRequest(batches[0], 0))
        sync()
        t0 = time.perf_counter()
        for ids, samples in zip(batches[1:], data[1:]):
            dec(samples, DetectRequest(ids, 1))
        sync()
        ms = (time.perf_counter() - t0) / a.batches * 1000
        print(f"DetectDecoder, {n} threads: {ms:.0f} ms a batch of {a.batch} = {a.batch / ms * 1000:.0f} img/s")
        dec.close()
    loader = fastfeed.Loader(a.packed, batch_size=a.batch, image_size=640, device=a.device, dtype=torch.float16)
    it = iter(loader)
    for _ in range(3):
        next(it)
    sync()
    t0 = time.perf_counter()
    for _ in range(a.batches):
        next(it)
    sync()
    ms = (time.perf_counter() - t0) / a.batches * 1000
    print(f"Loader ({loader.settings.decode_threads} threads): {ms:.0f} ms a batch = {a.batch / ms * 1000:.0f} img/s")
    loader.close()


if __name__ == "__main__":
    main()
