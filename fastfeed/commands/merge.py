"""`fastfeed merge OUT`: join OUT/part-NNNNN (from `pack --num-parts K --part i`) into one dataset."""
from __future__ import annotations

import argparse
import sys

__all__ = ["configure", "run"]


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("out", help="the OUT folder given to every `fastfeed pack --num-parts K --part i`")


def run(args: argparse.Namespace) -> int:
    from fastfeed.pack import PackError, merge

    try:
        m = merge(args.out)
    except (PackError, ValueError, OSError) as e:
        print(f"fastfeed merge: error: {e}", file=sys.stderr)
        return 2
    print(f"merged {len(m.extra['merged_from'])} parts: {m.num_samples} samples, {len(m.shards)} file(s), "
          f"{m.rejected} rejected -> {args.out}")
    return 0
