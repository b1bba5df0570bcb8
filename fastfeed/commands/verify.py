"""`fastfeed verify OUT`: checksums + full decode of every image; exit 1 naming each bad sample."""
from __future__ import annotations

import argparse
import sys

__all__ = ["configure", "run"]


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("path", help="a packed dataset folder")
    p.add_argument("--workers", type=int, default=None, help="decode threads (default: all cores)")
    p.add_argument("--no-decode", action="store_true", help="only check file checksums")


def run(args: argparse.Namespace) -> int:
    from fastfeed.pack import verify
    from fastfeed.types import DatasetError

    try:
        report = verify(args.path, workers=args.workers, decode=not args.no_decode)
    except DatasetError as e:
        print(f"fastfeed verify: error: {e}", file=sys.stderr)
        return 2
    for err in report.errors[:50]:
        print(f"CORRUPT {err}", file=sys.stderr)
    if len(report.errors) > 50:
        print(f"... and {len(report.errors) - 50} more", file=sys.stderr)
    what = "checksums" if args.no_decode else "checksums and full decode"
    status = "OK" if report.ok else f"FAILED ({len(report.errors)} problem(s))"
    print(f"verify {args.path}: {report.num_samples} samples, {report.num_files} file(s), {what}: {status}")
    return 0 if report.ok else 1
