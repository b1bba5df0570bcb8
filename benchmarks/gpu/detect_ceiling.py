"""Where the GPU detection path's ceiling is (benchmarks/README.md, "Detection batches"): the same images decoded by
DALI alone, whole, as the detection path decodes them, at P pipelines (threads, each with its own decoder and CUDA
stream, as the Loader runs them) and batch sizes; then GpuDetectDecoder called the same way, with the time each of
its steps held a thread. DALI alone far above the decoder's rate clears the hardware decoder; the steps' shares then
say which one sets the rate.

    python3 benchmarks/gpu/detect_ceiling.py PACKED [--seconds 8] [--pipelines 4] [--batches 64]
        [--variants fused,before,...]

PACKED: bench_detect.py's packed set (its `prepare_data`).
"""
from __future__ import annotations

import argparse
import collections
import sys
import threading
import time
import types

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
            for k in range(4):
                step(made[i], k)
            streams[i].synchronize()
            start.wait()
            k = 4
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
    """Wall and thread-CPU seconds each named step of a GpuDetectDecoder held its caller's thread, summed over
    threads: a step whose wall time far exceeds its CPU time waited (for the GPU, or to take the GIL back)."""

    def __init__(self):
        self.wall, self.cpu = collections.Counter(), collections.Counter()
        self.lock = threading.Lock()

    def clear(self) -> None:
        self.wall.clear()
        self.cpu.clear()

    def wrap(self, name: str, fn):
        def timed(*args, **kwargs):
            t0, c0 = time.perf_counter(), time.thread_time()
            try:
                return fn(*args, **kwargs)
            finally:
                with self.lock:
                    self.wall[name] += time.perf_counter() - t0
                    self.cpu[name] += time.thread_time() - c0
        return timed

    def shares(self, wall: float) -> str:
        return ", ".join(f"{k} {v / wall:.0%} ({self.cpu[k] / wall:.0%} CPU)" for k, v in self.wall.most_common())


def to_device_before(self, pixels, hsv_gains=None):
    """DetectDecoder._to_device as it was at 28d4167: the HSV pass in place, then torch's normalisation (a float32
    copy per operation; mean and std copied to the device each batch, which waits for the batch's kernels)."""
    from fastfeed.detect.hsv import apply_hsv_nhwc

    t = pixels
    if hsv_gains is not None:
        apply_hsv_nhwc(t, torch.from_numpy(hsv_gains))
    t = t.permute(0, 3, 1, 2)
    if self.dtype != torch.uint8:
        t = ((t.float() - self._mean.to(t.device)) / self._std.to(t.device)).to(self.dtype)
    return t.contiguous()


# name -> (pipelines, switch interval in seconds or None, the old last pass or not)
VARIANTS = {"fused": (4, None, False), "before": (4, None, True), "fused-switch-1ms": (4, 0.001, False),
            "fused-switch-0.2ms": (4, 0.0002, False), "fused-6": (6, None, False)}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("packed")
    p.add_argument("--seconds", type=float, default=8)
    p.add_argument("--pipelines", default="4", help="for DALI alone")
    p.add_argument("--batches", default="64", help="for DALI alone")
    p.add_argument("--threads", type=int, default=2, help="DALI's CPU threads per pipeline (the Loader's default)")
    p.add_argument("--hw", type=float, default=0.9, help="hardware decoder's share (the Loader's default)")
    p.add_argument("--variants", default="fused,before,fused,before,fused-switch-1ms,fused-switch-0.2ms,fused-6",
                   help=f"GpuDetectDecoder variants, in order: {', '.join(VARIANTS)}")
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
    default_switch = sys.getswitchinterval()
    for name in a.variants.split(","):
        n, switch, before = VARIANTS[name]

        def make():
            dec = GpuDetectDecoder(targets=targets, widths=ds.widths, heights=ds.heights, image_size=640,
                                   augment=DetectAugment(), train=True, seed=0, epochs=None, device="cuda",
                                   dtype=torch.float16, channels_last=False, mean=(0, 0, 0), std=(1, 1, 1),
                                   num_threads=a.threads, on_error="skip", batch_size=64, hw_decoder_load=a.hw)
            if before:
                dec._to_device = types.MethodType(to_device_before, dec)
            for step in ("_decode_all", "_render", "_boxes", "_to_device"):
                setattr(dec, step, clock.wrap(step, getattr(dec, step)))
            return dec

        def step(dec, k):
            samples, ids = batch_of(64, k)
            dec(samples, DetectRequest(ids, 1))
            return len(samples)

        sys.setswitchinterval(switch or default_switch)
        r, made = in_threads(n, a.seconds, make, step, on_start=clock.clear)
        sys.setswitchinterval(default_switch)
        for d in made:
            d.close()
        say(f"GpuDetectDecoder {name}, batch 64, {n} pipelines: {r:8.0f} img/s; threads' time: "
            f"{clock.shares(a.seconds * n)}")
    detect_decoder.plan_batch = original_plan


if __name__ == "__main__":
    main()
