"""Cost of the Loader's per-sample checksum check (`fastfeed.formats.integrity.bad_checksums`) on real ~110 KB
JPEGs, next to a memcpy of the same bytes as the baseline (what the ring already does once per byte).

    python benchmarks/bench_integrity.py [--images 512] [--batch 256] [--repeat 20]

Prints µs per sample and GB/s for both. Budget: the H200 path decodes ~18k img/s x 110 KB = 2 GB/s, i.e. ~55 µs per
sample of one process's time; the check must stay under 2% of the Loader's throughput.
"""
from __future__ import annotations

import argparse
import os
import tempfile
import time

import numpy as np


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--images", type=int, default=512)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--repeat", type=int, default=20)
    a = ap.parse_args()

    import fastfeed
    from fastfeed.demo_data import make_dataset
    from fastfeed.formats.integrity import bad_checksums
    from fastfeed.pack import PackOptions, pack

    with tempfile.TemporaryDirectory() as tmp:
        make_dataset(os.path.join(tmp, "src"), num_images=a.images, num_classes=4, seed=0, workers=os.cpu_count())
        pack(os.path.join(tmp, "src"), os.path.join(tmp, "ds"), PackOptions(jpeg_mode="keep"))
        with fastfeed.open_dataset(os.path.join(tmp, "ds")) as ds:
            n = len(ds)
            # One contiguous buffer with per-sample views, as the ring hands batches to the epoch.
            sizes = ds.sizes.astype(np.int64)
            offs = np.concatenate([[0], np.cumsum(sizes)[:-1]])
            buf = np.empty(int(sizes.sum()), dtype=np.uint8)
            for i in range(n):
                buf[offs[i] : offs[i] + sizes[i]] = np.frombuffer(ds.read(i), dtype=np.uint8)
            views = [buf[o : o + s] for o, s in zip(offs.tolist(), sizes.tolist())]
            batches = [(np.arange(s, min(s + a.batch, n)), views[s : s + a.batch]) for s in range(0, n, a.batch)]
            dst = np.empty_like(buf)

            def run_check():
                for idx, vs in batches:
                    assert bad_checksums(ds, idx, vs) == []

            def run_copy():
                for idx, vs in batches:
                    for v, o, s in zip(vs, offs[idx].tolist(), sizes[idx].tolist()):
                        dst[o : o + s] = v

            for name, fn in (("memcpy (baseline)", run_copy), ("bad_checksums", run_check)):
                fn()
                t0 = time.perf_counter()
                for _ in range(a.repeat):
                    fn()
                dt = (time.perf_counter() - t0) / a.repeat
                print(f"{name:18s}: {dt / n * 1e6:7.2f} us/sample, {buf.nbytes / dt / 1e9:6.2f} GB/s "
                      f"({n} samples, mean {sizes.mean() / 1e3:.0f} KB)")


if __name__ == "__main__":
    main()
