"""Where the GPU detection path's ceiling is (benchmarks/README.md, "Detection batches"): the same images decoded by
DALI alone, whole, as the detection path decodes them, at P pipelines (threads, each with its own decoder and CUDA
stream, as the Loader runs them) and batch sizes; then GpuDetectDecoder called the same way, with the time each of
its steps held a thread. DALI alone far above the decoder's rate clears the hardware decoder; the steps' shares then
say which one sets the rate.

    python3 benchmarks/gpu/detect_ceiling.py PACKED [--seconds 8] [--pipelines 1,2,4] [--batches 64,256]

PACKED: bench_detect.py's packed set (its `prepare_data`).
"""
from __future__ import annotations

import argparse
import collections
import threading
import time

import numpy as np
import torch

import fastfeed
from fastfeed.decode.dali import DaliDecoder
from fastfeed.detect import DetectAugment
from fastfeed.detect import decoder as detect_decoder
from fastfeed.detect.decoder import DetectRequest
from fastfeed.detect.gpu import GpuDetectDecoder
from fastfeed.formats import read_targets


def in_threads(pipelines: int, seconds: float, make, step, on_start=lambda: None) -> tuple[float, list]:
    """img/s of `pipelines` threads, each calling step(its own make(), k) on its own CUDA stream for `seconds` after
    two untimed calls (on_start() runs when the timed calls start); step returns the images it produced."""
    made = [make() for _ in range(pipelines)]
    streams = [torch.cuda.Stream() for _ in range(pipelines)]
    counts = [0] * pipelines
    start, stop = threading.Barrier(pipelines + 1), threading.Event()

    def work(i: int) -> None:
        try:
            run(i)
        except BaseException:
            start.abort()  # the main thread's wait ends in BrokenBarrierError, not a hang
            stop.set()
            raise

    def run(i: int) -> None:
        with torch.cuda.stream(streams[i]):
            for k in range(2):
                step(made[i], k)
            streams[i].synchronize()
            start.wait()
            k = 2
            while not stop.is_set():
                counts[i] += step(made[i], k)
                streams[i].synchronize()
                k += 1

    threads = [threading.Thread(target=work, args=(i,)) for i in range(pipelines)]
    for t in threads:
        t.start()
    start.wait()
    on_start()
    t0 = time.perf_counter()
    time.sleep(seconds)
    stop.set()
    for t in threads:
        t.join()
    return sum(counts) / (time.perf_counter() - t0), made


def say(line: str) -> None:
    print(time.strftime("%H:%M:%S"), line, flush=True)  # to line up with `nvidia-smi dmon -o T`


class StepClock:
    """Wall seconds each named step of a GpuDetectDecoder held its caller's thread, summed over threads."""

    def __init__(self):
        self.seconds = collections.Counter()
        self.lock = threading.Lock()

    def wrap(self, name: str, fn):
        def timed(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                with self.lock:
                    self.seconds[name] += time.perf_counter() - t0
        return timed


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("packed")
    p.add_argument("--seconds", type=float, default=8)
    p.add_argument("--pipelines", default="1,2,4")
    p.add_argument("--batches", default="64,256")
    p.add_argument("--threads", type=int, default=2, help="DALI's CPU threads per pipeline (the Loader's default)")
    p.add_argument("--hw", type=float, default=0.9, help="hardware decoder's share (the Loader's default)")
    a = p.parse_args()
    ds = fastfeed.open_dataset(a.packed)
    targets = read_targets(ds)
    biggest = max(int(b) for b in a.batches.split(","))
    order = np.random.default_rng(0).permutation(len(ds))
    pool = [np.frombuffer(ds.read(int(i)), np.uint8) for i in order[:max(4 * biggest, 512)]]
    ids_pool = order[:len(pool)]

    def batch_of(size: int, k: int):
        at = (k * size) % (len(pool) - size)
        return pool[at:at + size], ids_pool[at:at + size]

    say(f"{len(pool)} images in memory, {sum(len(s) for s in pool) / len(pool) / 1e3:.0f} kB each on average; "
          f"DALI {a.threads} threads a pipeline, hw_decoder_load {a.hw}")
    for size in (int(b) for b in a.batches.split(",")):
        for n in (int(v) for v in a.pipelines.split(",")):
            def make():
                return DaliDecoder(device_id=0, batch_size=size, num_threads=a.threads, hw_decoder_load=a.hw,
                                   whole_images=True, on_error="skip")

            def step(dec, k):
                samples, _ = batch_of(size, k)
                dec.decode_whole(samples)
                return len(samples)

            r, made = in_threads(n, a.seconds, make, step)
            for d in made:
                d.close()
            say(f"DALI whole decode only, batch {size}, {n} pipelines: {r:8.0f} img/s")

    clock = StepClock()
    original_plan = detect_decoder.plan_batch
    detect_decoder.plan_batch = clock.wrap("plan_batch", original_plan)
    for n in (int(v) for v in a.pipelines.split(",")):
        def make():
            dec = GpuDetectDecoder(targets=targets, widths=ds.widths, heights=ds.heights, image_size=640,
                                   augment=DetectAugment(), train=True, seed=0, epochs=None, device="cuda",
                                   dtype=torch.float16, channels_last=False, mean=(0, 0, 0), std=(1, 1, 1),
                                   num_threads=a.threads, on_error="skip", batch_size=64, hw_decoder_load=a.hw)
            for name in ("_decode_all", "_render", "_boxes", "_to_device"):
                setattr(dec, name, clock.wrap(name, getattr(dec, name)))
            return dec

        def step(dec, k):
            samples, ids = batch_of(64, k)
            dec(samples, DetectRequest(ids, 1))
            return len(samples)

        r, made = in_threads(n, a.seconds, make, step, on_start=clock.seconds.clear)
        wall = a.seconds * n
        for d in made:
            d.close()
        shares = ", ".join(f"{k} {v / wall:.0%}" for k, v in clock.seconds.most_common())
        say(f"GpuDetectDecoder, batch 64, {n} pipelines: {r:8.0f} img/s; threads' time: {shares}")
    detect_decoder.plan_batch = original_plan


if __name__ == "__main__":
    main()
