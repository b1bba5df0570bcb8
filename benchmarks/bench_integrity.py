"""Cost of the Loader's per-sample checksum check (`fastfeed.formats.integrity.bad_checksums`) on real ~117 KB
JPEGs, in one run: hashing in Python (python-xxhash, what the check did before) against comparing the digests the
ring's reader threads computed (`PrefetchRing(digests=True)`, what the Loader does now), with a memcpy of the same
bytes as the baseline (what the ring already does once per byte).

    python benchmarks/bench_integrity.py [--images 512] [--batch 256] [--repeat 20] [--seconds 3] [--period-ms 20]

1. Time of the check alone, per sample and per batch (the consumer-side thread runs it).
2. What it does to a training thread: a Python thread stands in for the training loop (GIL-bound steps of ~0.1 ms,
   as kernel launches are) while a loader thread checks one batch per period, as the Loader does; its steps/s
   (turned into ms of training lost per batch) and its slowest steps are compared with no check running. This is
   the cost that shows up in training: late kernel launches.
3. The ring's read throughput (warm page cache) with the reader threads hashing and without.
"""
from __future__ import annotations

import argparse
import os
import tempfile
import threading
import time

import numpy as np


def _train_steps(stop: threading.Event, out: list) -> None:
    """GIL-bound work in ~0.1 ms steps (a training loop launching kernels); records each step's duration."""
    def step():
        x = 0
        for i in range(1000):
            x += i & 7
        return x

    while not stop.is_set():
        t0 = time.perf_counter()
        step()
        out.append(time.perf_counter() - t0)


def _contend(seconds: float, check_batch, period: float) -> dict:
    """The training stand-in for `seconds` while a loader thread checks one batch every `period` s (or nothing)."""
    stop, steps, checks = threading.Event(), [], []

    def loader():
        due = time.perf_counter()
        while not stop.is_set():
            t0 = time.perf_counter()
            check_batch()
            checks.append(time.perf_counter() - t0)
            due += period
            time.sleep(max(0.0, due - time.perf_counter()))

    threads = [threading.Thread(target=_train_steps, args=(stop, steps))]
    if check_batch is not None:
        threads.append(threading.Thread(target=loader))
    for t in threads:
        t.start()
    time.sleep(seconds)
    stop.set()
    for t in threads:
        t.join()
    s = np.asarray(steps[1:])
    return dict(steps_per_s=len(s) / seconds, p99_ms=1e3 * np.percentile(s, 99), max_ms=1e3 * s.max(),
                check_ms=1e3 * float(np.median(checks)) if checks else 0.0, batches=len(checks))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--images", type=int, default=512)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--seconds", type=float, default=3.0, help="per training-thread contention run")
    ap.add_argument("--period-ms", type=float, default=20.0,
                    help="one batch checked this often (20 ms: ~13k img/s at batch 256, the H200 loader's rate)")
    a = ap.parse_args()

    import fastfeed
    from fastfeed.demo_data import make_dataset
    from fastfeed.formats.integrity import bad_checksums
    from fastfeed.pack import PackOptions, pack
    from fastfeed.ring import PrefetchRing

    with tempfile.TemporaryDirectory() as tmp:
        make_dataset(os.path.join(tmp, "src"), num_images=a.images, num_classes=4, seed=0, workers=os.cpu_count())
        pack(os.path.join(tmp, "src"), os.path.join(tmp, "ds"), PackOptions(jpeg_mode="keep"))
        with fastfeed.open_dataset(os.path.join(tmp, "ds")) as ds:
            n = len(ds)
            ext = ds.extents()
            sizes = ext.size.astype(np.int64)
            # One contiguous buffer with per-sample views, as the ring hands batches to the epoch; the digests of
            # each batch as the ring's reader threads computed them.
            offs = np.concatenate([[0], np.cumsum(sizes)[:-1]])
            buf = np.empty(int(sizes.sum()), dtype=np.uint8)
            for i in range(n):
                buf[offs[i] : offs[i] + sizes[i]] = np.frombuffer(ds.read(i), dtype=np.uint8)
            views = [buf[o : o + s] for o, s in zip(offs.tolist(), sizes.tolist())]
            digests = []
            with PrefetchRing(ext, a.batch, num_threads=2, num_slots=2, pin_memory=False, digests=True) as ring:
                ring.start(np.arange(n))
                while (b := ring.next_batch()) is not None:
                    with b:
                        digests.append(b.digests)
            batches = [(np.arange(s, min(s + a.batch, n)), views[s : s + a.batch]) for s in range(0, n, a.batch)]
            dst = np.empty_like(buf)

            def run_python():
                for idx, vs in batches:
                    assert bad_checksums(ds, idx, vs) == []

            def run_native():
                for (idx, vs), d in zip(batches, digests):
                    assert bad_checksums(ds, idx, vs, digests=d) == []

            def run_copy():
                for idx, vs in batches:
                    for v, o, s in zip(vs, offs[idx].tolist(), sizes[idx].tolist()):
                        dst[o : o + s] = v

            print(f"{n} samples, mean {sizes.mean() / 1e3:.0f} KB, batches of {a.batch}, {os.cpu_count()} CPUs")
            print("1. the check alone (consumer side)")
            for name, fn in (("memcpy (baseline)", run_copy), ("python xxhash", run_python),
                             ("native digests", run_native)):
                fn()
                t0 = time.perf_counter()
                for _ in range(a.repeat):
                    fn()
                dt = (time.perf_counter() - t0) / a.repeat
                print(f"   {name:18s}: {dt / n * 1e6:7.2f} us/sample, {dt / n * a.batch * 1e3:7.3f} ms per batch "
                      f"of {a.batch}, {buf.nbytes / dt / 1e9:6.2f} GB/s")

            print(f"2. a GIL-bound training thread ({a.seconds:.0f} s each) while a loader thread checks one batch "
                  f"every {a.period_ms:.0f} ms")
            one_idx, one_views = batches[0]
            check_python = lambda: bad_checksums(ds, one_idx, one_views)  # noqa: E731
            check_native = lambda: bad_checksums(ds, one_idx, one_views, digests=digests[0])  # noqa: E731
            base = None
            for name, fn in (("no check", None), ("python xxhash", check_python), ("native digests", check_native)):
                r = _contend(a.seconds, fn, a.period_ms / 1e3)
                base = base or r["steps_per_s"]
                lost = 1e3 * (1 - r["steps_per_s"] / base) * a.period_ms / 1e3 if r["batches"] else 0.0
                print(f"   {name:18s}: {r['steps_per_s']:6.0f} steps/s ({lost:+.2f} ms of training per batch), "
                      f"step p99 {r['p99_ms']:.2f} ms, max {r['max_ms']:.1f} ms; check {r['check_ms']:.3f} ms per "
                      f"batch (median, {r['batches']} batches)")

            print("3. ring read throughput, warm page cache, best of 5 epochs")
            for threads in (2, 4):
                for on in (False, True):
                    best = float("inf")
                    with PrefetchRing(ext, a.batch, num_threads=threads, num_slots=4, pin_memory=False,
                                      digests=on) as ring:
                        for _ in range(5):
                            t0 = time.perf_counter()
                            ring.start(np.arange(n))
                            while (b := ring.next_batch()) is not None:
                                b.release()
                            best = min(best, time.perf_counter() - t0)
                        st = ring.stats()
                    print(f"   {threads} threads, digests {'on ' if on else 'off'}: {buf.nbytes / best / 1e9:6.2f} GB/s"
                          f" (hashing {1e3 * st['digest_seconds'] / (st['bytes_read'] / 1e6):.3f} ms of a reader "
                          f"thread per MB)")


if __name__ == "__main__":
    main()
