"""The GIL a DALI decoder's calling thread holds per batch: what a fastfeed decode worker takes from the training
thread of the same process (on the GPU the training thread cannot launch kernels while a worker holds the GIL:
benchmarks/RESULTS.md, the sixth session's step profile). Two ways of doing each step, side by side in one run, on
real demo JPEGs (~117 KB, DALI's CPU backend, uint8 batches as decode/split.py's CPU part produces them):

    python benchmarks/bench_decoder_gil.py [--images 512] [--batch 256] [--repeat 30] [--seconds 2]

1. Feeding a batch (the encoded bytes and the crop windows): the bytes as a list of numpy views (`feed_input`
   checks the list in Python, sample by sample) vs one `TensorListCPU` of `TensorCPU` views (what `DaliDecoder`
   feeds now), each built and fed. Calling thread's CPU time.
2. Copying a decoded CPU batch out of DALI into a tensor allocated once (as torch's pinned-memory cache gives
   the GPU path one): `feed_ndarray` (DALI's `copy_to_external`, which holds the GIL) vs a numpy view of DALI's
   batch copied by torch (which releases it; what `DaliDecoder` does now). Calling thread's CPU time, and the
   progress of a GIL-bound thread beside a thread doing only these copies (1.00: the copy never held the GIL; two
   cores are enough for both threads).
3. A whole decoder call, the calling thread's CPU time: `DaliDecoder` as it was (the list and DALI's copy) vs now.
   DALI's own threads decode; what the calling thread spends is Python, DALI's bindings and the copy (into a new
   tensor per batch, as for device="cpu": its pages are faulted in during the copy, under the GIL before).
"""
from __future__ import annotations

import argparse
import os
import tempfile
import threading
import time

import numpy as np


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


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--images", type=int, default=512)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--repeat", type=int, default=30)
    ap.add_argument("--seconds", type=float, default=2.0, help="per GIL-bound loop measurement")
    a = ap.parse_args()

    import torch
    from nvidia.dali.plugin.pytorch import feed_ndarray

    import fastfeed
    from fastfeed.decode import crop_windows
    from fastfeed.decode.dali import DaliDecoder
    from fastfeed.demo_data import make_dataset
    from fastfeed.pack import PackOptions, pack

    class ListFeedDecoder(DaliDecoder):
        """DaliDecoder as it was before 2026-12-01: raw bytes fed as a list, the batch copied out by DALI."""

        def _feed(self, samples, windows):
            feed = super()._feed(samples, windows)
            feed["raw"] = list(samples)
            return feed

        def _to_torch(self, out):
            tensor = out.as_tensor()
            images = torch.empty(tuple(tensor.shape()), dtype=torch.uint8)
            feed_ndarray(tensor, images)
            return images

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
        now, before = DaliDecoder(**kw), ListFeedDecoder(**kw)
        print(f"{n} samples of {sizes.mean() / 1e3:.0f} KB, DALI CPU backend, {os.cpu_count()} CPUs")

        print("1. feeding a batch (calling thread CPU per batch; the pipeline runs between feeds)")
        for name, dec in (("list of numpy views (before)", before), ("TensorListCPU of views (now)", now)):
            pipe = dec._pipe

            def feed_and_run(dec=dec, pipe=pipe):
                t0 = time.thread_time()
                feed = dec._feed(samples, windows)  # builds the raw input and the window arrays
                for key, value in feed.items():
                    pipe.feed_input(key, value)
                spent = time.thread_time() - t0
                pipe.run()
                return spent

            feed_and_run()
            ms = 1e3 * float(np.median([feed_and_run() for _ in range(a.repeat)]))
            print(f"   {name:32s}: {ms:6.3f} ms")

        print("2. copying a decoded uint8 batch out of DALI")
        out = now._run(samples, windows)
        tensor = out.as_tensor()
        dst = torch.empty(tuple(tensor.shape()), dtype=torch.uint8)
        rows = (("feed_ndarray (before)", lambda: feed_ndarray(tensor, dst)),
                ("numpy view + torch copy_ (now)", lambda: dst.copy_(torch.from_numpy(np.asarray(tensor)))))
        for name, fn in rows:
            ms = thread_ms(fn, a.repeat)
            print(f"   {name:32s}: {ms:6.3f} ms of the calling thread ({dst.nbytes / 1e6:.0f} MB), a GIL-bound "
                  f"thread beside it runs at {spinner_progress(a.seconds, fn):.2f} of its speed alone")
        del out, tensor

        print("3. a whole decoder call (calling thread CPU per batch)")
        for name, dec in (("before", before), ("now", now)):
            dec(samples, windows)
            print(f"   {name:32s}: {thread_ms(lambda dec=dec: dec(samples, windows), a.repeat):6.3f} ms")
        now.close()
        before.close()


if __name__ == "__main__":
    main()
