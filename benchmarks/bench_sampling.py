#!/usr/bin/env python3
"""Time `fastfeed.sampling.plan_epoch` on a large dataset, with numpy's bare permutation as the baseline.

    python benchmarks/bench_sampling.py [--n 10000000] [--repeats 3]

Target (issue 5): 10 million samples planned in well under a second. Prints the best of --repeats runs.
"""
from __future__ import annotations

import argparse
import time

import numpy as np

from fastfeed.sampling import plan_epoch
from fastfeed.world import World


def best_of(repeats: int, fn) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=10_000_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--samples-per-shard", type=int, default=5000)
    args = parser.parse_args()
    n, r = args.n, args.repeats
    shard_of = np.arange(n) // args.samples_per_shard
    common = dict(seed=0, epoch=1, batch_size=256, drop_last=False)
    state = plan_epoch(n, world=World(0, 8, 0), **common).state(1000)

    rows = [
        ("baseline: numpy default_rng(...).permutation(n)",
         lambda: np.random.default_rng(np.random.SeedSequence([0, 1])).permutation(n)),
        ("plan_epoch global, W=1", lambda: plan_epoch(n, world=World(0, 1, 0), **common)),
        ("plan_epoch global, W=8", lambda: plan_epoch(n, world=World(3, 8, 3), **common)),
        ("plan_epoch global, resume W=8 -> W=6", lambda: plan_epoch(n, world=World(2, 6, 2), resume=state, **common)),
        (f"plan_epoch shard ({args.samples_per_shard}/shard, K=4), W=8",
         lambda: plan_epoch(n, world=World(3, 8, 3), order="shard", shard_of=shard_of, **common)),
    ]
    print(f"n = {n:,} samples, best of {r}")
    for name, fn in rows:
        print(f"  {name:<55s} {best_of(r, fn):7.3f} s")


if __name__ == "__main__":
    main()
