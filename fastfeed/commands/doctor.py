"""`fastfeed doctor [DATASET]`: one line per check, OK / WARN / FAIL with the fix; exit 1 when any check fails."""
from __future__ import annotations

import argparse
import sys


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("dataset", metavar="DATASET", nargs="?", default=None,
                   help="a packed dataset or an image folder to check (optional)")
    p.add_argument("--num-threads", type=int, default=None, help="threads you plan to request, checked against CPUs")
    p.add_argument("--json", action="store_true", help="print the checks as JSON (schema_version, ok, checks)")


def run(args: argparse.Namespace) -> int:
    from fastfeed.doctor.checks import FAIL, format_checks, run_checks, to_json

    if args.num_threads is not None and args.num_threads < 1:
        print("fastfeed doctor: --num-threads must be >= 1", file=sys.stderr)
        return 2
    checks = run_checks(args.dataset, args.num_threads)
    print(to_json(checks) if args.json else format_checks(checks))
    return 1 if any(c.status == FAIL for c in checks) else 0
