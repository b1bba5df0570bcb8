"""The means of one step's tables (train_table.py JSON, one per process) and the ratio benchmarks/README.md quotes.

    python3 benchmarks/gpu/summary.py --row ff-default --baseline dali-file --guard 0.97 $OUT/table-train-*.json

For every consumer: the img/s of `--row` in each table, and of the baseline (the best row whose name starts with
`--baseline` in each table: "dali" takes DALI's better reader); their means over the tables and the ratio of the
means. With --guard, exit status 1 when a consumer's ratio is under it (the table's guard, benchmarks/README.md).
"""
from __future__ import annotations

import argparse
import gzip
import json
import sys
from pathlib import Path


def load(path: Path) -> dict:
    raw = path.read_bytes()
    return json.loads(gzip.decompress(raw) if path.suffix == ".gz" else raw)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("tables", nargs="+", type=Path)
    p.add_argument("--row", default="ff-default")
    p.add_argument("--baseline", default="dali-file")
    p.add_argument("--guard", type=float, default=None)
    a = p.parse_args(argv)
    ours: dict[str, list[float]] = {}
    theirs: dict[str, list[float]] = {}
    for path in a.tables:
        for consumer, entry in load(path).get("consumers", {}).items():
            rows = entry.get("rows", {})
            if a.row in rows:
                ours.setdefault(consumer, []).append(rows[a.row]["samples_per_s"])
            base = [r["samples_per_s"] for name, r in rows.items() if name.startswith(a.baseline)]
            if base:
                theirs.setdefault(consumer, []).append(max(base))
    status = 0
    for consumer in sorted(set(ours) | set(theirs)):
        x, y = ours.get(consumer, []), theirs.get(consumer, [])
        line = (f"{consumer}: {a.row} {', '.join(f'{v:,.0f}' for v in x) or '-'}; "
                f"{a.baseline} {', '.join(f'{v:,.0f}' for v in y) or '-'}")
        if x and y:
            mx, my = sum(x) / len(x), sum(y) / len(y)
            ratio = mx / my
            line += f"; means {mx:,.0f} / {my:,.0f} = {ratio:.3f}x over {len(x)} / {len(y)} tables"
            if a.guard is not None:
                ok = ratio >= a.guard
                line += f"; guard >= {a.guard}: {'ok' if ok else 'BELOW'}"
                status |= 0 if ok else 1
        print(line)
    return status


if __name__ == "__main__":
    sys.exit(main())
