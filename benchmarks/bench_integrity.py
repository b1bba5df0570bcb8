"""Cost of the Loader's per-sample checksum check (`fastfeed.formats.integrity.bad_checksums`) on real ~117 KB
JPEGs, in one run: hashing in Python (python-xxhash, what the check did before) against comparing the digests the
ring's reader threads computed (`PrefetchRing(digests=True)`, what the Loader does now), with a memcpy of the same
bytes as the baseline (what the ring already does once per byte).

    python benchmarks/bench_integrity.py [--images 512] [--batch 256] [--repeat 20] [--seconds 3] [--period-ms 20]

1. Time of the check alone, per sample and per batch (the consumer-side thread runs it).
2. The check beside a GIL-bound thread (the training loop at its worst: it never gives the GIL up by itself), one
   batch due per period as in the Loader: how long the check of a batch takes there. python-xxhash releases the
   GIL around each buffer over 64 KB, so it needs the GIL back once per sample, and beside such a thread each of
   those waits for the interpreter's switch interval (5 ms) and then takes the GIL from it (a late launch); the
   native digests need it once per batch.
3. The ring's read throughput (warm page cache) with the reader threads hashing and without.
"""
from __future__ import annotations

import argparse
import os
import tempfile
import threading
import time

import numpy as np


def _beside_spinner(seconds: float, check_batch, period: float) -> list:
    """A GIL-bound thread (the training loop at its worst: it never gives the GIL up by itself) runs for `seconds`
    while this thread checks one batch every `period` s, as the Loader does. Returns each check's duration."""
    stop, checks = threading.Event(), []

    def spin():
        while not stop.is_set():
            pass

    t = threading.Thread(target=spin)
    t.start()
    due = time.perf_counter()
    end = due + seconds
    while (now := time.perf_counter()) < end:
        if now >= due:
            check_batch()
            checks.append(time.perf_counter() - now)
            due += period
        time.sleep(max(0.0, min(due, end) - time.perf_counter()))
    stop.set()
    t.join()
    return checks


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--images", type=int, default=512)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--seconds", type=float, default=3.0, help="per GIL-contention run")
    ap.add_argument("--period-ms", type=float, default=20.0,
                    help="one batch checked this often (20 ms: ~13k img/s at batch 256, the H200 loader's rate)")
    a = ap.parse_args()

    import fastfeed
    from fastfeed.demo_data import make_dataset
    from fastfeed.formats.integrity import bad_checksums
    from fastfeed.pack import PackOptions, pack
    from fastfeed.loader.ring import PrefetchRing

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
                      f"of {a.batch}" + ("" if fn is run_native else f", {buf.nbytes / dt / 1e9:6.2f} GB/s"))

            print(f"2. beside a GIL-bound thread ({a.seconds:g} s each, one batch due every {a.period_ms:g} ms)")
            one_idx, one_views = batches[0]
            for name, fn in (("python xxhash", lambda: bad_checksums(ds, one_idx, one_views)),
                             ("native digests", lambda: bad_checksums(ds, one_idx, one_views, digests=digests[0]))):
                checks = _beside_spinner(a.seconds, fn, a.period_ms / 1e3)
                print(f"   {name:18s}: check per batch mean {1e3 * np.mean(checks):8.3f} ms, median "
                      f"{1e3 * np.median(checks):8.3f} ms, max "
                      f"{1e3 * max(checks):6.1f} ms ({len(checks)} of {a.seconds * 1e3 / a.period_ms:.0f} batches due)")

            print("3. ring read throughput, warm page cache (best of 7 runs of 4 epochs each, off and on interleaved)")
            for threads in (2, 4):
                rings = {on: PrefetchRing(ext, a.batch, num_threads=threads, num_slots=4, pin_memory=False,
                                          digests=on) for on in (False, True)}
                best = {False: float("inf"), True: float("inf")}
                try:
                    for _ in range(7):
                        for on, ring in rings.items():
                            t0 = time.perf_counter()
                            for _ in range(4):
                                ring.start(np.arange(n))
                                while (b := ring.next_batch()) is not None:
                                    b.release()
                            best[on] = min(best[on], (time.perf_counter() - t0) / 4)
                    st = rings[True].stats()
                finally:
                    for ring in rings.values():
                        ring.close()
                ms_per_mb = 1e3 * st["digest_seconds"] / (st["bytes_read"] / 1e6)
                print(f"   {threads} threads: digests off {buf.nbytes / best[False] / 1e9:6.2f} GB/s, on "
                      f"{buf.nbytes / best[True] / 1e9:6.2f} GB/s "
                      f"(hashing: {ms_per_mb:.3f} ms of a reader thread per MB)")


if __name__ == "__main__":
    main()
