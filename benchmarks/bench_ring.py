"""Prefetch ring throughput against its ceiling and against plain Python, in one run.

    python benchmarks/bench_ring.py                      # generates a tar of ~110 KB samples
    python benchmarks/bench_ring.py --dataset data/sample-wds

Warm page cache (bytes/s, best of --repeats): the ring (consumer takes each batch, makes the sample views and
releases it; also with `digests=True`, the reader threads hashing every sample as the Loader's ring does) vs one
single-threaded memcpy of the same bytes (the ceiling) vs a Python f.seek/f.read loop.
Targets on the 2-core dev machine: ring >= 70% of memcpy and >= 3x the Python loop.
Cold cache (posix_fadvise DONTNEED on every file first): random reads as samples/s with 1 and 32 reads in flight
(1 and 32 producer threads; every batch is split across all threads).
"""
from __future__ import annotations

import argparse
import io
import os
import sys
import tarfile
import time

import numpy as np

from fastfeed.loader.ring import PrefetchRing
from fastfeed.types import Extents


def make_tar(path: str, num_samples: int, mean_bytes: int, seed: int) -> Extents:
    rng = np.random.default_rng(seed)
    sizes = rng.integers(int(mean_bytes * 0.6), int(mean_bytes * 1.4), num_samples)
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
        for i, n in enumerate(sizes):
            info = tarfile.TarInfo(f"{i:08d}.jpg")
            info.size = int(n)
            tar.addfile(info, io.BytesIO(rng.integers(0, 256, int(n), dtype=np.uint8).tobytes()))
    with tarfile.open(path) as tar:
        members = tar.getmembers()
    return Extents([path], np.zeros(len(members), np.int32), np.array([m.offset_data for m in members], np.int64),
                   np.array([m.size for m in members], np.int64))


def read_all(ext: Extents, order: np.ndarray) -> None:
    for p in ext.paths:
        with open(p, "rb") as f:
            while f.read(1 << 24):
                pass


def drop_cache(ext: Extents) -> None:
    for p in ext.paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def time_memcpy(ext: Extents, order: np.ndarray, epochs: int) -> float:
    total = int(ext.size[order].sum())
    src = np.random.default_rng(0).integers(0, 256, total, dtype=np.uint8)
    dst = np.empty_like(src)
    np.copyto(dst, src)  # fault the pages in first
    t0 = time.perf_counter()
    for _ in range(epochs):
        np.copyto(dst, src)
    return time.perf_counter() - t0


def time_python(ext: Extents, order: np.ndarray, epochs: int, batch_size: int) -> float:
    """batch_size > 0 keeps each batch's bytes objects until the batch is complete, as a loader must;
    batch_size == 0 drops every read at once (malloc hands back the same cache-hot block each time)."""
    files = [open(p, "rb", buffering=0) for p in ext.paths]
    fi, off, size = ext.file_index.tolist(), ext.offset.tolist(), ext.size.tolist()
    try:
        t0 = time.perf_counter()
        for _ in range(epochs):
            batch = []
            for i in order.tolist():
                f = files[fi[i]]
                f.seek(off[i])
                batch.append(f.read(size[i]))
                if len(batch) >= batch_size:
                    batch = []
        return time.perf_counter() - t0
    finally:
        for f in files:
            f.close()


def time_ring(ext: Extents, order: np.ndarray, epochs: int, batch_size: int, threads: int, slots: int,
              digests: bool = False) -> float:
    with PrefetchRing(ext, batch_size, num_threads=threads, num_slots=slots, pin_memory=False,
                      digests=digests) as ring:
        t0 = time.perf_counter()
        for _ in range(epochs):
            ring.start(order)
            while (b := ring.next_batch()) is not None:
                b.samples()
                b.release()
        return time.perf_counter() - t0


def best(fn, repeats: int, *args) -> float:
    return min(fn(*args) for _ in range(repeats))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dataset", help="a packed fastfeed dataset (default: generate a tar)")
    ap.add_argument("--num-samples", type=int, default=2000)
    ap.add_argument("--mean-bytes", type=int, default=110_000)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--threads", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--slots", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--epochs", type=int, default=3, help="passes per timed run")
    ap.add_argument("--cold-samples", type=int, default=400)
    args = ap.parse_args(argv)

    if args.dataset:
        from fastfeed.datasets import open_dataset

        with open_dataset(args.dataset) as ds:
            ext = ds.extents()
        where = args.dataset
    else:
        tmp = os.path.join(os.environ.get("TMPDIR", "/tmp"), "fastfeed-bench")
        os.makedirs(tmp, exist_ok=True)
        where = os.path.join(tmp, f"bench-ring-{args.num_samples}x{args.mean_bytes}.tar")
        if not os.path.exists(where):
            make_tar(where + ".part", args.num_samples, args.mean_bytes, seed=0)
            os.replace(where + ".part", where)
        with tarfile.open(where) as tar:
            members = tar.getmembers()
        ext = Extents([where], np.zeros(len(members), np.int32),
                      np.array([m.offset_data for m in members], np.int64), np.array([m.size for m in members]))
    rng = np.random.default_rng(1)
    order = rng.permutation(len(ext))
    total = int(ext.size[order].sum())
    print(f"{where}: {len(order)} samples, mean {total / len(order) / 1e3:.1f} KB, {total / 1e6:.0f} MB per pass; "
          f"{os.cpu_count()} CPUs")

    read_all(ext, order)  # warm the page cache
    e, bs = args.epochs, args.batch_size
    volume = total * e
    mem = volume / best(time_memcpy, args.repeats, ext, order, e)
    pyl = volume / best(time_python, args.repeats, ext, order, e, bs)
    pyl0 = volume / best(time_python, args.repeats, ext, order, e, 0)
    print(f"warm  memcpy (1 thread, ceiling)        {mem / 1e9:7.2f} GB/s")
    print(f"warm  python seek/read loop, batches    {pyl / 1e9:7.2f} GB/s   (baseline)")
    print(f"warm  python seek/read, each read dropped {pyl0 / 1e9:5.2f} GB/s   (cache-hot destination)")
    for t in args.threads:
        r = volume / best(time_ring, args.repeats, ext, order, e, bs, t, args.slots)
        print(f"warm  ring {t:2d} threads batch {bs:3d}         {r / 1e9:7.2f} GB/s  "
              f"= {100 * r / mem:5.1f}% of memcpy, {r / pyl:5.2f}x python batches")
        # the Loader's ring when it verifies checksums: the reader threads also hash each sample (xxh3_64)
        r = volume / best(time_ring, args.repeats, ext, order, e, bs, t, args.slots, True)
        print(f"warm  ring {t:2d} threads + digests          {r / 1e9:7.2f} GB/s  "
              f"= {100 * r / mem:5.1f}% of memcpy, {r / pyl:5.2f}x python batches")

    cold = order[: args.cold_samples]
    for t in (1, 32):
        drop_cache(ext)
        s = time_ring(ext, cold, 1, max(args.batch_size, 32), t, args.slots)
        print(f"cold  random reads, {t:2d} in flight        {len(cold) / s:9.0f} samples/s "
              f"({int(ext.size[cold].sum()) / s / 1e6:.0f} MB/s)")
    drop_cache(ext)
    s = time_python(ext, cold, 1, args.batch_size)
    print(f"cold  python seek/read loop (1 in flight) {len(cold) / s:7.0f} samples/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
