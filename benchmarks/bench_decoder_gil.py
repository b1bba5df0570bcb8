"""The GIL a DALI decoder takes from the other threads of its process: DALI's Python binding (how DaliDecoder ran
its pipelines until 2026-12-01: benchmarks/dali_binding.py) against libdali's C API called through ctypes (how it runs
them now: fastfeed/decode/dali_capi.py). On the GPU the training thread cannot launch kernels while a decode worker
holds the GIL (benchmarks/RESULTS.md: the sixth and sixteenth sessions). The same graph, the same real demo JPEGs
(~117 KB), DALI's CPU backend, uint8 batches as decode/split.py's CPU part produces them; both ways in one run:

    python benchmarks/bench_decoder_gil.py [--images 512] [--batch 256] [--repeat 20] [--seconds 2]

1. Building a pipeline: its wall time, and the longest a thread that sleeps 1 ms at a time was kept waiting
   meanwhile (as long as the build: the build held the GIL throughout).
2. A whole decoder call: the calling thread's CPU time (DALI's own threads decode), and how fast a GIL-bound thread
   runs beside a thread that only decodes, relative to running alone (1.00: the decoder never held the GIL; the
   dev box's two cores are shared by DALI's threads, the decoding thread and the GIL-bound one, so read the two
   ways against each other, not against 1.00).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def thread_ms(fn, repeat: int) -> float:
    """Median CPU time of this thread per call of fn, ms."""
    times = []
    for _ in range(repeat):
        t0 = time.thread_time()
        fn()
        times.append(time.thread_time() - t0)
    return 1e3 * float(np.median(times))


def spinner_progress(seconds: float, work) -> float:
    """Iterations of a GIL-bound loop while another thread repeats `work`, relative to the loop alone."""

    def spin(duration: float) -> int:
        n, end = 0, time.perf_counter() + duration
        while time.perf_counter() < end:
            n += 1
        return n

    alone = spin(seconds)
    stop = threading.Event()

    def loop():
        while not stop.is_set():
            work()

    t = threading.Thread(target=loop)
    t.start()
    beside = spin(seconds)
    stop.set()
    t.join()
    return beside / alone


def longest_wait_during(fn) -> tuple[float, float]:
    """(seconds fn took, the longest a 1 ms sleeper in another thread was kept waiting meanwhile)."""
    gaps, stop = [], threading.Event()

    def tick():
        last = time.perf_counter()
        while not stop.is_set():
            time.sleep(0.001)
            now = time.perf_counter()
            gaps.append(now - last)
            last = now

    t = threading.Thread(target=tick)
    t.start()
    time.sleep(0.02)
    t0 = time.perf_counter()
    result = fn()
    took = time.perf_counter() - t0
    stop.set()
    t.join()
    return took, max(gaps), result


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--images", type=int, default=512)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--seconds", type=float, default=2.0, help="per GIL-bound loop measurement")
    a = ap.parse_args()

    import torch
    from dali_binding import BindingDecoder

    import fastfeed
    from fastfeed.decode import crop_windows
    from fastfeed.decode.dali import DaliDecoder
    from fastfeed.demo_data import make_dataset
    from fastfeed.pack import PackOptions, pack

    with tempfile.TemporaryDirectory() as tmp:
        make_dataset(os.path.join(tmp, "src"), num_images=a.images, num_classes=4, seed=0, workers=os.cpu_count())
        pack(os.path.join(tmp, "src"), os.path.join(tmp, "ds"), PackOptions(jpeg_mode="keep"))
        with fastfeed.open_dataset(os.path.join(tmp, "ds")) as ds:
            n = min(a.batch, len(ds))
            ids = np.arange(n)
            # One contiguous buffer with per-sample views, as the ring hands a batch to a decode worker.
            data = [np.frombuffer(ds.read(i), dtype=np.uint8) for i in range(n)]
            sizes = np.array([len(d) for d in data])
            offs = np.concatenate([[0], np.cumsum(sizes)[:-1]])
            buf = np.concatenate(data)
            samples = [buf[o:o + s] for o, s in zip(offs.tolist(), sizes.tolist())]
            windows = crop_windows(ds.widths[ids], ds.heights[ids], ids, seed=0, epoch=0, train=True, image_size=224)

    kw = dict(device_id=None, dtype=torch.uint8, channels_last=True, batch_size=n, num_threads=2)
    ways = (("DALI's Python binding (before)", BindingDecoder), ("libdali's C API via ctypes (now)", DaliDecoder))
    print(f"{n} samples of {sizes.mean() / 1e3:.0f} KB, DALI CPU backend, {os.cpu_count()} CPUs")
    DaliDecoder(**kw)(samples, windows)  # the process's first DALI build and run, for neither way
    print("1. building a pipeline (median of 5): wall ms, the 1 ms sleeper's longest wait ms")
    decoders = {}
    for name, cls in ways:
        runs = [longest_wait_during(lambda cls=cls: cls(**kw)) for _ in range(5)]
        decoders[name] = runs[-1][2]
        print(f"   {name:34s}: {1e3 * statistics.median(r[0] for r in runs):7.1f} "
              f"{1e3 * statistics.median(r[1] for r in runs):7.1f}")
    print("2. a whole decoder call: calling thread CPU ms per batch; a GIL-bound thread's speed beside it")
    for name, dec in decoders.items():
        dec(samples, windows)
        ms = thread_ms(lambda dec=dec: dec(samples, windows), a.repeat)
        print(f"   {name:34s}: {ms:7.2f} ms, {spinner_progress(a.seconds, lambda dec=dec: dec(samples, windows)):.2f}")
    for dec in decoders.values():
        dec.close()


if __name__ == "__main__":
    main()
