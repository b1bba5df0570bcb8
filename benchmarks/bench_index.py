"""`fastfeed index` against `tar -tf` plus `sha256sum` over the same shards, same run.

    python benchmarks/bench_index.py [--workdir DIR] [--num-images 4000] [--per-shard 1000] [--rounds 3] [--json F]

Data: `fastfeed.demo_data.make_dataset` JPEGs (ImageNet-like, 300-800 px), each written with a caption, a JSON
object and a class by webdataset's own `ShardWriter` (the layout img2dataset writes). The baseline is what anyone
would run to list and checksum those shards: `tar -tf` and `sha256sum` over every shard, one after the other,
timed as one. fastfeed's index does both and more: it groups the members into samples, hashes every member (xxh3),
checks every image as pack does (header, end marker and, unless `--no-scan-check`, the JPEG scan check) and
writes the table, the DALI indexes and the manifest. Page cache warm for all (each shard read once before timing);
best of `--rounds`. The issue's target: index at >= 0.7x the baseline's speed.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

DEFAULT_WORKDIR = Path(os.environ.get("TMPDIR", "/tmp")) / "fastfeed-bench" / "bench-index"


def prepare(workdir: Path, num_images: int, per_shard: int) -> Path:
    import webdataset as wds

    from fastfeed.demo_data import make_dataset

    shards = workdir / f"shards-{num_images}-{per_shard}"
    if shards.exists() and len(list(shards.glob("*.tar"))) == -(-num_images // per_shard):
        return shards
    photos = make_dataset(workdir / "photos", num_images=num_images, num_classes=10, seed=0)
    files = sorted(photos.rglob("*.jpg"))[:num_images]
    shards.mkdir(parents=True, exist_ok=True)
    with wds.ShardWriter(str(shards / "shard-%06d.tar"), maxcount=per_shard, verbose=0) as sink:
        for i, f in enumerate(files):
            sink.write({"__key__": f"{i:08d}", "jpg": f.read_bytes(), "txt": f"a photo of {f.parent.name}",
                        "json": {"source": f.name, "i": i}, "cls": int(f.parent.name.split("_")[-1])})
    return shards


def baseline_s(tars: list[Path]) -> float:
    t0 = time.perf_counter()
    for t in tars:
        subprocess.run(["tar", "-tf", str(t)], check=True, stdout=subprocess.DEVNULL)
    subprocess.run(["sha256sum", *map(str, tars)], check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - t0


def index_s(shards: Path, out: Path, scan_check: bool) -> float:
    from fastfeed.pack.index import index_shards

    shutil.rmtree(out, ignore_errors=True)
    t0 = time.perf_counter()
    index_shards(str(shards), str(out), scan_check=scan_check)
    return time.perf_counter() - t0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--workdir", type=Path, default=DEFAULT_WORKDIR)
    p.add_argument("--num-images", type=int, default=4000)
    p.add_argument("--per-shard", type=int, default=1000)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--json", default=None)
    args = p.parse_args()
    shards = prepare(args.workdir, args.num_images, args.per_shard)
    tars = sorted(shards.glob("*.tar"))
    total = sum(t.stat().st_size for t in tars)
    for t in tars:  # warm the page cache
        t.read_bytes()
    best = {"tar -tf + sha256sum": min(baseline_s(tars) for _ in range(args.rounds))}
    for scan in (True, False):
        name = "fastfeed index" + ("" if scan else " --no-scan-check")
        best[name] = min(index_s(shards, args.workdir / "out", scan) for _ in range(args.rounds))
    base = best["tar -tf + sha256sum"]
    print(f"{len(tars)} shards, {args.num_images} samples, {total / 1e6:.0f} MB, {os.cpu_count()} cores")
    for name, s in best.items():
        print(f"  {name:32s} {s:6.2f} s  {total / 1e6 / s:7.0f} MB/s  {base / s:5.2f}x the baseline's speed")
    if args.json:
        Path(args.json).write_text(json.dumps({"bytes": total, "samples": args.num_images, "shards": len(tars),
                                               "cores": os.cpu_count(), "seconds": best}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
