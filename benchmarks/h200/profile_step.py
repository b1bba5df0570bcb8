"""Issue 14, "profile before guessing": where a training step's GPU time goes with each loader, from torch.profiler
(CUPTI) timelines summarised on the device (the H200 host has no nsys; CUPTI records every kernel of the process,
DALI's included).

    python3 benchmarks/h200/profile_step.py --data /tmp/ffbench/base-wds --images /tmp/ffbench/base-images \
        --consumer resnet18 --steps 12 --json $OUT/profile.json

Loop per loader: `next()` (annotated "wait"), then the consumer's step, which ends with a device synchronise
(annotated "compute"). Per compute window, medians over the profiled steps:
  window      the compute window (ms)
  train_busy  union of kernel time on the training stream (the stream the ceiling's kernels run on)
  train_idle  window - train_busy: the training stream starved (kernels not launched yet: host/GIL) or queued
  loader_gpu  union of kernel time on every other stream (the loader's decode, resize, normalise)
  overlap     loader kernels running at the same time as training kernels (they share the SMs)
  memcpy      union of copy time on all streams
"Ceiling" is the same step on a resident synthetic batch: a loader's cost to the step is its row minus the ceiling's.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE.parent.parent))

from fastfeed.bench.consumers import make_consumer, synthetic_batch  # noqa: E402


def union(intervals):
    """Total length of the union of (start, end) intervals."""
    total, end = 0.0, -1.0
    for s, e in sorted(intervals):
        if e <= end:
            continue
        total += e - max(s, end)
        end = e
    return total


def clip(intervals, lo, hi):
    return [(max(s, lo), min(e, hi)) for s, e in intervals if e > lo and s < hi]


def intersect_len(a, b):
    """Length of (union of a) ∩ (union of b)."""
    return union(a) + union(b) - union(a + b)


def summarise(trace_path: str, train_stream: int | None):
    ev = json.loads(Path(trace_path).read_text())["traceEvents"]
    kernels = [e for e in ev if e.get("cat") == "kernel" and "dur" in e]
    copies = [e for e in ev if e.get("cat") in ("gpu_memcpy", "gpu_memset") and "dur" in e]
    windows = [(e["ts"], e["ts"] + e["dur"]) for e in ev if e.get("name") == "compute" and "dur" in e
               and e.get("cat") in ("user_annotation", "cpu_op")]
    by_stream = {}
    for k in kernels:
        by_stream.setdefault(k["args"].get("stream"), []).append(k)
    if train_stream is None and by_stream:
        train_stream = max(by_stream, key=lambda s: sum(k["dur"] for k in by_stream[s]))
    train = [(k["ts"], k["ts"] + k["dur"]) for k in by_stream.get(train_stream, [])]
    other = [(k["ts"], k["ts"] + k["dur"]) for s, ks in by_stream.items() if s != train_stream for k in ks]
    cp = [(c["ts"], c["ts"] + c["dur"]) for c in copies]
    rows = []
    for lo, hi in windows:
        t, o = clip(train, lo, hi), clip(other, lo, hi)
        rows.append(dict(window=(hi - lo) / 1e3, train_busy=union(t) / 1e3, loader_gpu=union(o) / 1e3,
                         overlap=intersect_len(t, o) / 1e3, memcpy=union(clip(cp, lo, hi)) / 1e3))
    for r in rows:
        r["train_idle"] = r["window"] - r["train_busy"]
    med = {k: statistics.median(r[k] for r in rows) for k in rows[0]} if rows else {}
    top = {}
    for s, ks in by_stream.items():
        if s == train_stream:
            continue
        for k in ks:
            top[k["name"][:80]] = top.get(k["name"][:80], 0.0) + k["dur"] / 1e3
    n = max(len(windows), 1)
    top = sorted(((v / n, name) for name, v in top.items()), reverse=True)[:8]
    return train_stream, med, top, {str(s): len(ks) for s, ks in by_stream.items()}


def profile(name, batches, consumer, steps, warmup, train_stream=None, keep_trace=None):
    """batches: an iterator of (images, labels). Returns the summary dict; keep_trace: a .json.gz path to keep the
    whole timeline (CPU ops, Python threads' CUDA calls, kernels) for reading offline."""
    from torch.profiler import ProfilerActivity, profile as tprofile, record_function

    for _ in range(warmup):
        consumer(*next(batches))
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    t0 = time.perf_counter()
    with tprofile(activities=acts) as prof:
        for _ in range(steps):
            with record_function("wait"):
                b = next(batches)
            with record_function("compute"):
                consumer(*b)
    wall = time.perf_counter() - t0
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "trace.json")
        prof.export_chrome_trace(path)
        stream, med, top, counts = summarise(path, train_stream)
        if keep_trace:
            import gzip
            import shutil

            with open(path, "rb") as src, gzip.open(keep_trace, "wb", compresslevel=6) as dst:
                shutil.copyfileobj(src, dst)
    out = dict(name=name, steps=steps, wall_s=wall, train_stream=stream, median_ms=med,
               top_loader_kernels_ms_per_step=top, kernels_per_stream=counts)
    print(f"{name:28s} " + "  ".join(f"{k} {v:6.2f}" for k, v in med.items())
          + f"   ({wall / steps * 1e3:.1f} ms/step)", flush=True)
    for ms, kname in top[:5]:
        print(f"    {ms:6.2f} ms/step  {kname}")
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", required=True)
    p.add_argument("--images", required=True)
    p.add_argument("--consumer", default="resnet18")
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--rows", default="ceiling,ff,dali", help="of ceiling, ff, ff-gpu, ff-pin, dali, dali4 (see below)")
    p.add_argument("--json", default=None)
    p.add_argument("--trace-dir", default=None, help="keep each row's timeline here as <consumer>-<row>.json.gz")
    a = p.parse_args(argv)

    def keep(row):
        if not a.trace_dir:
            return None
        Path(a.trace_dir).mkdir(parents=True, exist_ok=True)
        return str(Path(a.trace_dir) / f"{a.consumer}-{row}.json.gz")

    import fastfeed

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    bs = a.batch_size
    consumer = make_consumer(a.consumer, dev)
    report = {"consumer": a.consumer, "rows": []}
    train_stream = None
    rows = a.rows.split(",")
    if "ceiling" in rows:
        synth = synthetic_batch(bs, 224, dev, torch.float16 if dev == "cuda" else torch.float32)

        def resident():
            while True:
                yield synth

        r = profile("ceiling", resident(), consumer, a.steps, a.warmup, keep_trace=keep("ceiling"))
        train_stream = r["train_stream"]
        report["rows"].append(r)

    def epochs(make):
        loader = make()
        try:
            while True:
                yield from loader
        finally:
            loader.close()

    def ff(**kw):
        return lambda: fastfeed.Loader(a.data, batch_size=bs, train=True, device=dev, channels_last=True, **kw,
                                       dtype=torch.float16 if dev == "cuda" else torch.float32)

    def pinned(make):
        """`make` with the settings' pinned_input on (settings.py turns it on for photos of 4 MP or more)."""
        def build():
            import fastfeed.settings as FS
            saved, FS._default_pinned_input = FS._default_pinned_input, lambda images: True
            try:
                return make()
            finally:
                FS._default_pinned_input = saved
        return build

    def dali(hw, threads):
        def make():
            from dali_reference import DaliReference

            return DaliReference("file", a.images, batch_size=bs, num_threads=threads, device_id=0,
                                 hw_decoder_load=hw, image_size=224)
        return make

    # ff: the defaults (on a GPU host with 8+ cores per rank, the hybrid decoder); ff-gpu: decoder="dali" (all on the
    # GPU); dali: DALI's file reader, hw 1.0 and 2 threads; dali4: hw 0.9 and 4 threads (its best row on ResNet-50).
    # ff-pin: the defaults with DALI reading the ring's page-locked slots in place (twelfth session: ResNet-18's step
    # 19% longer that way on ImageNet-like photos, not explained).
    makers = {"ff": ("fastfeed default", ff()), "ff-gpu": ("fastfeed decoder=dali", ff(decoder="dali")),
              "ff-pin": ("fastfeed default, pinned_input", pinned(ff())),
              "dali": ("dali-file hw1.0 t2", dali(1.0, 2)), "dali4": ("dali-file hw0.9 t4", dali(0.9, 4))}
    for row in rows:
        if row == "ceiling" or (row.startswith("dali") and dev != "cuda"):
            continue
        label, make = makers[row]
        report["rows"].append(profile(label, epochs(make), consumer, a.steps, a.warmup, train_stream,
                                      keep_trace=keep(row)))
    if a.json:
        Path(a.json).write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
