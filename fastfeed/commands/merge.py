"""`fastfeed merge OUT`: join OUT/part-NNNNN (from `pack --num-parts K --part i`) into one dataset; OUT may be an
fsspec URL (fastfeed/pack/remote.py `merge_any`)."""
from __future__ import annotations

import argparse
import sys

__all__ = ["configure", "run"]


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("out", help="the OUT folder or URL given to every `fastfeed pack --num-parts K --part i`")
    p.add_argument("--staging", default=None,
                   help="when OUT is a URL: local folder to merge in before uploading (default: a temp folder)")


def run(args: argparse.Namespace) -> int:
    from fastfeed.pack import PackError
    from fastfeed.pack.remote import merge_any

    try:
        m, num_parts = merge_any(args.out, staging=args.staging)
    except (PackError, ValueError, OSError) as e:
        print(f"fastfeed merge: error: {e}", file=sys.stderr)
        return 2
    print(f"merged {num_parts} parts: {m.num_samples} samples, {len(m.shards)} file(s), "
          f"{m.rejected} rejected -> {args.out}")
    return 0
