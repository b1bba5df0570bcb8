"""images/s of `fastfeed.Loader` on the CPU from an S3-compatible server: first epoch (cold cache) vs cached vs local.

    python benchmarks/bench_remote.py [--workdir DIR] [--num-images 2000] [--shard-size 16MB] [--batch 64]
                                      [--decoder cpu] [--rounds 2] [--order global|shard] [--json FILE]

Data: `fastfeed.demo_data.make_dataset` JPEGs (~120 KB) packed by the real CLI into WORKDIR/wds, uploaded with
`fastfeed.pack.remote.upload_dataset` to moto's S3 server, started here as a separate process on 127.0.0.1 (so
the server's CPU is not the loader's GIL; on this 2-core machine it still competes for the cores). The server
keeps objects in memory: the numbers are a loopback store, an upper bound for a real one; what they show is the
cost fastfeed adds (download, sha256, rename) and that a cached epoch runs at local speed.

Each round, one after the other: local folder; URL with an empty cache; URL with the cache kept. The first epoch
streams (shards fetched in the epoch's order, `parallel` at a time, while it runs). "end-to-end" = (construction +
one epoch), the figure a user sees for the first epoch; "epoch" = the iteration alone; "first batch" = from the
Loader() call to the first batch in hand. Train mode, RandomResizedCrop 224 + flip, float32 on the CPU, shuffle,
every sample once (drop_last False).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

DEFAULT_WORKDIR = Path(os.environ.get("TMPDIR", "/tmp")) / "fastfeed-bench" / "bench-remote"  # data, kept between runs


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start_moto(port: int) -> subprocess.Popen:
    exe = os.path.join(os.path.dirname(sys.executable), "moto_server")
    proc = subprocess.Popen([exe, "-H", "127.0.0.1", "-p", str(port)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return proc
        except OSError:
            time.sleep(0.2)
    proc.kill()
    raise RuntimeError("moto_server did not start within 30 s")


def _epoch(path, args, cache_dir=None) -> dict:
    import torch

    import fastfeed

    if cache_dir is not None:
        os.environ["FASTFEED_CACHE"] = str(cache_dir)
    cpu0 = time.process_time()
    t0 = time.perf_counter()
    loader = fastfeed.Loader(str(path), batch_size=args.batch, train=True, image_size=224, device="cpu",
                             decoder=args.decoder, dtype=torch.float32, shuffle=True, drop_last=False,
                             order=args.order)
    t1 = time.perf_counter()
    n = 0
    first = None
    for images, _ in loader:
        n += images.shape[0]
        if first is None:
            first = time.perf_counter() - t0
    t2 = time.perf_counter()
    stats = loader.dataset.cache_stats() if hasattr(loader.dataset, "cache_stats") else {}
    stats["fetch"] = getattr(loader.dataset, "fetch", None)
    loader.close()
    return {"images": n, "first_batch_s": first, "setup_s": t1 - t0, "epoch_s": t2 - t1,
            "end_to_end_img_s": n / (t2 - t0), "epoch_img_s": n / (t2 - t1), "cpu_s": time.process_time() - cpu0,
            "cache": stats}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workdir", type=Path, default=DEFAULT_WORKDIR)
    ap.add_argument("--num-images", type=int, default=2000)
    ap.add_argument("--shard-size", default="16MB")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--decoder", default="cpu")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--order", choices=("global", "shard"), default="global")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()

    from fastfeed.demo_data import make_dataset

    images = make_dataset(args.workdir / "images", num_images=args.num_images, num_classes=10, seed=0, workers=2)
    packed = args.workdir / "wds"
    if not (packed / "fastfeed.json").exists():
        subprocess.run([sys.executable, "-m", "fastfeed.cli", "pack", str(images), str(packed), "--quiet",
                        "--shard-size", args.shard_size], check=True)
    port = _free_port()
    env = {"AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}", "AWS_ACCESS_KEY_ID": "bench",
           "AWS_SECRET_ACCESS_KEY": "bench", "AWS_DEFAULT_REGION": "us-east-1"}
    os.environ.update(env)
    server = _start_moto(port)
    try:
        import s3fs

        from fastfeed.pack.remote import upload_dataset

        s3fs.S3FileSystem().mkdir("bench")
        url = "s3://bench/wds"
        t0 = time.perf_counter()
        upload_dataset(str(packed), url)
        upload_s = time.perf_counter() - t0
        total = sum(f.stat().st_size for f in packed.iterdir() if f.is_file())
        cache = args.workdir / "cache"
        rows = []
        for r in range(args.rounds):
            rows.append({"round": r, "kind": "local", **_epoch(packed, args)})
            shutil.rmtree(cache, ignore_errors=True)
            rows.append({"round": r, "kind": "remote, first epoch (empty cache)", **_epoch(url, args, cache)})
            rows.append({"round": r, "kind": "remote, cached", **_epoch(url, args, cache)})
            for row in rows[-3:]:
                print(f"round {r} {row['kind']:<36} first batch {row['first_batch_s']:5.2f} s  "
                      f"epoch {row['epoch_s']:6.2f} s  "
                      f"end-to-end {row['end_to_end_img_s']:7.0f} img/s  epoch {row['epoch_img_s']:7.0f} img/s  "
                      f"img/CPU-s {row['images'] / row['cpu_s']:5.0f}  downloads {row['cache'].get('downloads', '-')}",
                      flush=True)
    finally:
        server.terminate()
        server.wait(timeout=30)
    report = {"order": args.order, "date": time.strftime("%Y-%m-%d"), "images": args.num_images, "dataset_bytes": total,
              "upload_s": upload_s, "upload_MB_s": total / 1e6 / upload_s, "rows": rows, "load": os.getloadavg(),
              "argv": sys.argv[1:]}
    print(f"upload {total / 1e6:.0f} MB in {upload_s:.2f} s ({total / 1e6 / upload_s:.0f} MB/s); "
          f"load average {os.getloadavg()[0]:.1f}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
