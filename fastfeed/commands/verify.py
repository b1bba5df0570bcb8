"""`fastfeed verify OUT [--quick]`: integrity checks (+ full decode unless --quick); exit 1 naming each bad sample,
2 when the folder cannot be opened as a dataset at all."""
from __future__ import annotations

import argparse
import sys

__all__ = ["configure", "run"]


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("path", help="a packed dataset folder")
    p.add_argument("--workers", type=int, default=None, help="decode threads (default: the cores this process may use)")
    p.add_argument("--quick", action="store_true",
                   help="no decode: manifest, table checksum, offsets/indexes/labels cross-checked, per-sample "
                        "checksums")
    p.add_argument("--no-decode", action="store_true", help="same as --quick (kept for older scripts)")


def run(args: argparse.Namespace) -> int:
    from fastfeed.pack import verify
    from fastfeed.types import DatasetError

    quick = bool(args.quick or args.no_decode)
    try:
        report = verify(args.path, workers=args.workers, quick=quick)
    except DatasetError as e:
        print(f"fastfeed verify: error: {e}", file=sys.stderr)
        return 2
    for err in report.errors[:50]:
        print(f"CORRUPT {err}", file=sys.stderr)
    if len(report.errors) > 50:
        print(f"... and {len(report.errors) - 50} more", file=sys.stderr)
    for note in report.notes:
        print(f"note: {note}")
    status = "OK" if report.ok else f"FAILED ({len(report.errors)} problem(s))"
    print(f"verify {args.path}: {report.num_samples} samples, {report.num_files} file(s), "
          f"{'quick' if quick else 'full'}: {', '.join(report.checked)}: {status}")
    return 0 if report.ok else 1
