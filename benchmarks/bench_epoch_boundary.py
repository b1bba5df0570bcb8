"""The loader alone over several short epochs: what an epoch boundary costs (fourteenth session).

    python benchmarks/bench_epoch_boundary.py DATASET [--batch 64] [--decoder cpu-dali] [--size 224] [--epochs 6]

A training Loader reads on into the next epoch (NOTE [Reading on into the next epoch] in fastfeed/loader.py). Prints
images/s over `--epochs` epochs after one untimed epoch, and the time the first batch of each epoch took against the
median batch: a boundary that drains the decode pipelines shows as first batches ~2x the median. To compare two trees,
run it once per tree with that tree first on PYTHONPATH (each with its own native build), interleaved.
"""
from __future__ import annotations

import argparse
import statistics
import time

import fastfeed


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("dataset")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--decoder", default="cpu-dali")
    p.add_argument("--size", type=int, default=224)
    p.add_argument("--epochs", type=int, default=6)
    p.add_argument("--device", default="cpu")
    a = p.parse_args(argv)
    with fastfeed.Loader(a.dataset, batch_size=a.batch, device=a.device, train=True, decoder=a.decoder,
                         image_size=a.size) as loader:
        for _ in loader:  # one untimed epoch: decoders built, caches warm
            pass
        times, firsts, n = [], [], 0
        t0 = last = time.perf_counter()
        for _ in range(a.epochs):
            for i, (_, labels) in enumerate(loader):
                now = time.perf_counter()
                (firsts if i == 0 else times).append(now - last)
                last, n = now, n + len(labels)
        dt = time.perf_counter() - t0
        print(f"{fastfeed.__file__}: {n / dt:,.0f} img/s, {len(loader)} batches an epoch; batch median "
              f"{statistics.median(times) * 1e3:.1f} ms, first of each epoch (ms): "
              + " ".join(f"{x * 1e3:.0f}" for x in firsts))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
