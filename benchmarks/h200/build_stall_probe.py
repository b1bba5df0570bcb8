"""Why a training step stalls while the Loader builds a decode pipeline: the GIL, or the device?

Fifteenth session (benchmarks/RESULTS.md): in 6 of 26 ResNet-18 rows a third pipeline was tried inside the 150 timed
steps, and those rows ran 17-22% slow (median step unchanged, p99 up to 143 ms). A pipeline is built in a decode
worker thread (fastfeed/epoch.py), so the training thread waits only if the build holds the GIL, or if its CUDA
calls (context set-up, nvJPEG's hardware decoder, page-locked and device allocations) hold the driver or the device
the step needs. This probe tells them apart. A training loop runs on resident data; at --build-at steps, another
thread builds a DaliDecoder as the Loader would and decodes --decodes batches of real JPEGs with it; meanwhile a
ticker thread sleeps 1 ms at a time. A first decoder is built and run before, untimed, as the Loader's first pipeline
is before its first batch. Reported:
  - each step's time (synchronised), the median and the steps during the build and the first decodes;
  - the ticker's longest gap during each phase: a gap as long as the stall means the GIL was held;
    a long step with a short ticker gap means the driver or the device held the step.

    python3 benchmarks/h200/build_stall_probe.py --model resnet18 --json OUT.json
    python3 benchmarks/h200/build_stall_probe.py --device cpu --model resnet18 --batch-size 32 --image-size 64
    python3 benchmarks/h200/build_stall_probe.py --model resnet18 --part decoder    (one part's build: PartPipeline)

On the dev box (DALI's CPU backend, results/cpu-build-stall-devbox-2026-12-01p.txt; the first runs before the
untimed first run was added, and on simpler images than demo_data's) a build took 7-18 ms and only the process's first
DALI run was slow (428-471 ms, the ticker waiting up to 91-156 ms; the next runs 25-47 ms, a second pipeline's first
run 35 ms; on demo_data's images 51-72 ms). On the H200 (stage35.sh, sixteenth session; RESULTS.md) a GPU pipeline's
build held the GIL throughout, 450-575 ms beside ResNet-18/-50 (220-250 ms on an idle GPU), with DALI's pools filled
first (--prealloc-mb) or without the hardware decoder (--hw-decoder-load 0) alike; its first decodes held neither.
DaliDecoder now builds and runs its pipelines through libdali's C API with the GIL released (decode/dali_capi.py);
`--binding python` builds the decoders of the timed phases the old way, for the comparison in one run.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time

import numpy as np
import torch


def jpegs(n: int, seed: int = 0) -> tuple[list[np.ndarray], list[tuple[int, int]]]:
    """n ImageNet-like JPEGs (fastfeed.demo_data's, the images `make demo` and tools/make_dataset.py write)."""
    from fastfeed import demo_data as dd

    dd._init_worker()  # its source photos and grain texture
    out, sizes = [], []
    for i in range(n):
        data, size, _ = dd._render(seed, i, progressive=False)
        out.append(np.frombuffer(data, dtype=np.uint8))
        sizes.append(size)
    return out, sizes


class PartPipeline:
    """A DALI pipeline of one part of DaliDecoder's (`--part`), built only, to tell which operator's construction the
    build's time goes to: "decoder" (fn.decoders.image, mixed on a GPU), "post" (resize and crop_mirror_normalize
    on the device's images), "empty" (an external source alone: the pipeline's own set-up)."""

    def __init__(self, part: str, *, device_id, batch_size: int, threads: int, image_size: int, hw: dict):
        from nvidia.dali import fn, pipeline_def, types

        gpu = device_id is not None

        @pipeline_def(batch_size=batch_size, num_threads=threads, device_id=device_id, prefetch_queue_depth=1,
                      exec_dynamic=True)
        def pipe():
            if part == "decoder":
                raw = fn.external_source(name="raw", dtype=types.UINT8, ndim=1)
                return fn.decoders.image(raw, device="mixed" if gpu else "cpu", output_type=types.RGB,
                                         jpeg_fancy_upsampling=True, **(hw if gpu else {}))
            images = fn.external_source(name="images", dtype=types.UINT8, ndim=3, layout="HWC",
                                        device="gpu" if gpu else "cpu")
            if part == "empty":
                return images
            images = fn.resize(images, size=[image_size, image_size], interp_type=types.INTERP_LINEAR,
                               antialias=True)
            return fn.crop_mirror_normalize(images, dtype=types.FLOAT16, output_layout="HWC")

        self.pipe = pipe()
        self.pipe.build()

    def close(self):
        self.pipe = None


class Ticker(threading.Thread):
    """Sleeps 1 ms at a time and records (time, gap) after each sleep."""

    def __init__(self):
        super().__init__(daemon=True)
        self.gaps: list[tuple[float, float]] = []
        self.stop = False

    def run(self):
        last = time.perf_counter()
        while not self.stop:
            time.sleep(0.001)
            now = time.perf_counter()
            self.gaps.append((now, now - last))
            last = now

    def longest(self, t0: float, t1: float) -> float:
        return max((g for t, g in self.gaps if t0 <= t <= t1), default=0.0)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda")
    p.add_argument("--model", default="resnet18", help="a fastfeed.bench consumer: none, resnet18, resnet50, ...")
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--steps", type=int, default=120)
    p.add_argument("--build-at", default="40,80", help="steps at which a decoder is built (comma-separated)")
    p.add_argument("--decodes", type=int, default=3, help="batches each new decoder decodes after its build")
    p.add_argument("--threads", type=int, default=2, help="the decoder's DALI threads")
    p.add_argument("--prealloc-mb", default="0,0",
                   help="DEVICE,PINNED: MB DALI's pools hold before the loop (nvidia.dali.backend.Preallocate*), so "
                        "that the builds and first decodes take their memory from the pools, not from the driver")
    p.add_argument("--hw-decoder-load", type=float, default=None, help="the decoders' (default: DaliDecoder's)")
    p.add_argument("--part", choices=("full", "decoder", "post", "empty"), default="full",
                   help="build DaliDecoder's whole pipeline and decode with it (full), or one part only, built and "
                        "not run (PartPipeline)")
    p.add_argument("--binding", choices=("capi", "python"), default="capi",
                   help="the built decoders' pipelines through libdali's C API (DaliDecoder now) or DALI's Python "
                        "binding (DaliDecoder until 2026-12-01: benchmarks/dali_binding.py); --part full only")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)

    from fastfeed.bench.consumers import make_consumer, synthetic_batch
    from fastfeed.decode.crop import crop_windows
    from fastfeed.decode.dali import DaliDecoder

    Built = DaliDecoder
    if args.binding == "python":
        sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        from dali_binding import BindingDecoder as Built
    device = torch.device(args.device)
    if device.type == "cuda" and device.index is None:  # set_device() and Stream() want the index
        device = torch.device("cuda", torch.cuda.current_device())
    device_id = (device.index or 0) if device.type == "cuda" else None
    step = make_consumer(args.model, device)
    batch = synthetic_batch(args.batch_size, args.image_size, device)
    samples, sizes = jpegs(args.batch_size)
    windows = crop_windows([s[0] for s in sizes], [s[1] for s in sizes], np.arange(len(sizes)), seed=0, epoch=0,
                           train=True, image_size=args.image_size)
    # The Loader's first pipeline, built and run before the first batch: the process's first DALI build and run
    # (imports, thread pools: 430-470 ms for the first run on the dev box) are paid here, untimed, as a Loader does.
    hw = {} if args.hw_decoder_load is None else {"hw_decoder_load": args.hw_decoder_load}
    free0 = torch.cuda.mem_get_info(device)[0] if device.type == "cuda" else 0
    first = DaliDecoder(device_id=device_id, image_size=args.image_size, dtype=torch.float16,
                        batch_size=args.batch_size, num_threads=args.threads, on_error="skip", **hw)
    first(samples, windows)
    first_mb = ((free0 - torch.cuda.mem_get_info(device)[0]) / 2**20) if device.type == "cuda" else 0.0
    print(f"the first decoder's build and first batch took {first_mb:.0f} MB of device memory")
    dev_mb, pinned_mb = (int(x) for x in args.prealloc_mb.split(","))
    if dev_mb or pinned_mb:
        from nvidia.dali import backend as dali_backend

        if dev_mb and device.type == "cuda":
            dali_backend.PreallocateDeviceMemory(dev_mb << 20, device_id)
        if pinned_mb:
            dali_backend.PreallocatePinnedMemory(pinned_mb << 20)
    free = lambda: torch.cuda.mem_get_info(device)[0] if device.type == "cuda" else 0  # noqa: E731
    for _ in range(5):
        step(*batch)

    ticker = Ticker()
    ticker.start()
    phases: list[dict] = []
    decoders = []

    def build_and_decode():
        # as a Loader's decode worker (fastfeed/epoch.py): the device set, its own stream, not the training one
        stream = None
        if device.type == "cuda":
            torch.cuda.set_device(device)
            stream = torch.cuda.Stream(device=device)
        t0 = time.perf_counter()
        if args.part == "full":
            d = Built(device_id=device_id, image_size=args.image_size, dtype=torch.float16,
                            batch_size=args.batch_size, num_threads=args.threads, on_error="skip", **hw)
        else:
            d = PartPipeline(args.part, device_id=device_id, batch_size=args.batch_size, threads=args.threads,
                             image_size=args.image_size, hw=hw)
        t1 = time.perf_counter()
        free_before = free()
        ends = []
        for _ in range(args.decodes if args.part == "full" else 0):
            if stream is not None:
                with torch.cuda.stream(stream):
                    d(samples, windows)
                stream.synchronize()
            else:
                d(samples, windows)
            ends.append(time.perf_counter())
        decoders.append(d)
        phases.append({"build": (t0, t1), "decodes": [(a, b) for a, b in zip([t1] + ends[:-1], ends)],
                       "device_mb_taken_by_decodes": (free_before - free()) / 2**20})

    build_at = {int(x) for x in args.build_at.split(",") if x}
    times, workers, k = [], [], 0
    # the loop runs on until every build and decode is over, so that each overlaps steps
    while k < args.steps or any(w.is_alive() for w in workers):
        if k in build_at:
            workers.append(threading.Thread(target=build_and_decode))
            workers[-1].start()
        t0 = time.perf_counter()
        step(*batch)
        times.append((t0, time.perf_counter()))
        k += 1
    for w in workers:
        w.join()
    ticker.stop = True
    for d in decoders + [first]:
        d.close()

    def steps_in(t0, t1):
        return [b - a for a, b in times if a < t1 and b > t0]

    median = statistics.median(b - a for a, b in times)
    first = min((ph["build"][0] for ph in phases), default=times[-1][1])
    idle = ticker.longest(times[0][0], first)
    report = {"args": vars(args), "median_step_s": median, "steps_s": [b - a for a, b in times],
              "longest_ticker_gap_before_builds_s": idle, "first_decoder_device_mb": first_mb,
              "phases": []}
    print(f"{args.model} on {device}: median step {median * 1e3:.1f} ms over {len(times)} steps; the ticker's "
          f"longest gap before the first build {idle * 1e3:.1f} ms")
    for i, ph in enumerate(sorted(phases, key=lambda ph: ph["build"][0])):
        parts = [("build", *ph["build"])] + [(f"decode {j + 1}", a, b) for j, (a, b) in enumerate(ph["decodes"])]
        rows = []
        for name, a, b in parts:
            during = steps_in(a, b)
            rows.append({"phase": name, "seconds": b - a, "longest_ticker_gap_s": ticker.longest(a, b),
                         "steps_s": during})
            steps = (f"{len(during)} steps meanwhile, median {statistics.median(during) * 1e3:.1f} ms, longest "
                     f"{max(during) * 1e3:.1f}" if during else "no step meanwhile")
            print(f"  decoder {i + 1} {name:9s} {(b - a) * 1e3:7.1f} ms: ticker's longest gap "
                  f"{ticker.longest(a, b) * 1e3:6.1f} ms; {steps}")
        report["phases"].append(rows)
        print(f"  decoder {i + 1}: its decodes took {ph['device_mb_taken_by_decodes']:.0f} MB more device memory "
              "from the driver (torch.cuda.mem_get_info)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
