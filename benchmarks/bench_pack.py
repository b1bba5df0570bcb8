"""Pack speed side by side, one run, one tree: `tar -cf`, fastfeed pack, the native writer, and the peers' writers.

    python benchmarks/bench_pack.py --src /tmp/tree [--images 8000] [--repeat 3] [--peers-python /tmp/peers/bin/python]

Tools (each writes shards of --shard-size from the same listing; MB/s = source image bytes / wall seconds):
  tar            `tar -cf OUT -C SRC .`                (no checksum, no fsync: the reference, not a competitor)
  pack           fastfeed.pack.pack(--jpeg keep)       (`fastfeed pack`: the native writer + validation, wds_native,
                                                        with the JPEG scan check: the default)
  pack-nocheck   the same with --no-scan-check         (header probe, trim, conversions; no entropy-decoding pass)
  pack-py        the same with the Python writer        (pack as on main before 2026-11-30: Python reads + sha256)
  native         fastfeed.pack.native.write_shards     (native reads, framing, xxh3 per sample, sha256; no validation)
  native+check   the same with pack/validate.check_image run on each image through the writer's check hook
  mds            MosaicML Streaming MDSWriter          ({'jpg': bytes, 'cls': int}, no compression, no hashes)
  litdata        litdata.optimize(num_workers=--workers)
  wds            webdataset.ShardWriter                ({'__key__', 'jpg', 'cls'})
Peers run under --peers-python (a private venv with mosaicml-streaming, litdata, webdataset; skipped when absent).

Method: the tree is read once first (warm page cache: a CPU comparison, not a disk one); the tools run round-robin
`--repeat` times (interleaved, so a noisy neighbour hits all of them), each round after `sync` so no tool pays for
the previous one's dirty pages; each tool times itself after its imports (interpreter start and imports excluded).
fastfeed's writers fsync every shard and hash it (sha256), tar and the peers do neither: conservative for fastfeed.
Reports the median and the spread (min-max) per tool, the ratio to tar within each round, and CPU seconds per GB
(the tool's process tree, its threads and worker processes, after its imports): on a shared machine wall time
follows the CPU share a tool gets, CPU time does not.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

PEERS = ("mds", "litdata", "wds")
TOOLS = ("tar", "pack-py", "pack", "pack-nocheck", "native", "native+check") + PEERS


def _listing(src: str) -> list[tuple[str, int]]:
    """(path, label) in the order pack uses (scan_source: sorted classes, sorted files)."""
    from fastfeed.pack.sources import scan_source

    s = scan_source(src, "auto")
    return [(e.path, e.label) for e in s.entries]


# ---- one tool, in its own process (`--one TOOL`): prints {"seconds": ...} ----------------------------------------

def _start() -> tuple[float, float]:
    return time.perf_counter(), _self_cpu()


def _stop(t: tuple[float, float]) -> tuple[float, float]:
    """(wall, CPU) seconds since _start(): the work only, after the tool's imports."""
    return time.perf_counter() - t[0], _self_cpu() - t[1]


def _run_one(tool: str, src: str, out: str, shard_size: int, workers: int) -> tuple[float, float]:
    if tool in ("pack", "pack-py", "pack-nocheck"):
        from fastfeed.pack import PackOptions, pack, wds_native

        wds_native.ENABLED = tool != "pack-py"  # its private switch: pack-py is the Python writer (the fallback)

        t = _start()
        pack(src, out, PackOptions(format="wds", shard_size=shard_size, workers=workers, jpeg_mode="keep",
                                   shuffle_seed=None, scan_check=tool != "pack-nocheck"))
        return _stop(t)
    if tool in ("native", "native+check"):
        from fastfeed.pack.native import wds_sample, write_shards
        from fastfeed.pack.validate import LoadOptions, Rejected, check_image

        t = _start()
        items = _listing(src)
        check = None
        if tool == "native+check":
            opts = LoadOptions("keep")
            kept = [None] * len(items)

            def check(i, data):
                res = check_image(data, opts)
                if isinstance(res, Rejected):
                    return res.reason
                kept[i] = (res.width, res.height, res.jpeg_kind)  # what pack keeps for samples.npz
                return None if res.data is data and res.ext == "jpg" else (res.ext, bytes(res.data))

        os.makedirs(out)
        samples = [wds_sample(f"{i:08d}", p, "jpg", label) for i, (p, label) in enumerate(items)]
        _, results = write_shards(samples, out, shard_size=shard_size, num_threads=workers, check=check)
        assert all(r.ok for r in results)
        return _stop(t)
    if tool == "mds":
        from streaming import MDSWriter

        t = _start()
        items = _listing(src)
        with MDSWriter(out=out, columns={"jpg": "bytes", "cls": "int"}, size_limit=shard_size) as w:
            for p, label in items:
                with open(p, "rb") as f:
                    w.write({"jpg": f.read(), "cls": label})
        return _stop(t)
    if tool == "wds":
        import webdataset as wds

        t = _start()
        items = _listing(src)
        os.makedirs(out)
        with wds.ShardWriter(os.path.join(out, "shard-%06d.tar"), maxsize=shard_size, verbose=0) as w:
            for i, (p, label) in enumerate(items):
                with open(p, "rb") as f:
                    w.write({"__key__": f"{i:08d}", "jpg": f.read(), "cls": label})
        return _stop(t)
    if tool == "litdata":
        from litdata import optimize

        t = _start()
        items = _listing(src)
        optimize(fn=_litdata_sample, inputs=items, output_dir=out, chunk_bytes=shard_size, num_workers=workers,
                 mode="overwrite")
        return _stop(t)
    raise ValueError(tool)


def _litdata_sample(item):
    path, label = item
    with open(path, "rb") as f:
        return {"jpg": f.read(), "cls": label}


# ---- the driver ---------------------------------------------------------------------------------------------------

def _tree_bytes(root: str) -> tuple[int, int]:
    n = total = 0
    for dirpath, _, files in os.walk(root):
        for f in files:
            if not f.startswith("."):
                n += 1
                total += os.path.getsize(os.path.join(dirpath, f))
    return n, total


def _children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def _time_tool(tool: str, args, out: str) -> tuple[float, float] | None:
    """(wall, CPU) seconds of the work (CPU of the process tree: threads and litdata's worker processes)."""
    c0 = _children_cpu()
    if tool == "tar":
        t = time.perf_counter()
        subprocess.run(["tar", "-cf", out + ".tar", "-C", args.src, "."], check=True)
        s = time.perf_counter() - t
        os.unlink(out + ".tar")
        return s, _children_cpu() - c0
    py = args.peers_python if tool in PEERS else sys.executable
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (_ROOT, os.environ.get("PYTHONPATH")) if p))
    proc = subprocess.run([py, __file__, "--one", tool, "--src", args.src, "--out", out, "--shard-size",
                           str(args.shard_size), "--workers", str(args.workers)], capture_output=True, text=True,
                          env=env)
    shutil.rmtree(out, ignore_errors=True)
    if proc.returncode != 0:
        print(f"  {tool}: failed\n{proc.stderr[-2000:]}", file=sys.stderr)
        return None
    one = json.loads(proc.stdout.strip().splitlines()[-1])
    return one["seconds"], one["cpu"]


def _self_cpu() -> float:
    """CPU seconds of this process, its threads and its waited-for children (litdata's workers)."""
    total = 0.0
    for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN):
        r = resource.getrusage(who)
        total += r.ru_utime + r.ru_stime
    return total


_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--src", default=None, help="an image tree (default: generate --images JPEGs in the scratch dir)")
    ap.add_argument("--images", type=int, default=8000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--workers", type=int, default=2, help="threads (pack, native) / processes (litdata)")
    ap.add_argument("--shard-size", type=int, default=256 << 20)
    ap.add_argument("--tools", default=",".join(TOOLS))
    ap.add_argument("--peers-python", default=None, help="python of a venv with the peers installed")
    ap.add_argument("--scratch", default=None)
    ap.add_argument("--json", default=None, help="write every round's seconds and CPU seconds here")
    ap.add_argument("--one", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--out", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()

    if args.one:
        wall, cpu = _run_one(args.one, args.src, args.out, args.shard_size, args.workers)
        print(json.dumps({"seconds": wall, "cpu": cpu}))
        return 0

    scratch = args.scratch or tempfile.mkdtemp(prefix="bench_pack_")
    os.makedirs(scratch, exist_ok=True)
    if args.src is None:
        from fastfeed.demo_data import make_dataset

        args.src = os.path.join(scratch, "src")
        make_dataset(args.src, num_images=args.images, num_classes=100, seed=0, workers=args.workers)
    tools = [t for t in args.tools.split(",") if t]
    if args.peers_python is None:
        tools = [t for t in tools if t not in PEERS]
    n, total = _tree_bytes(args.src)
    subprocess.run(f"find '{args.src}' -type f -print0 | xargs -0 cat > /dev/null", shell=True, check=True)
    print(f"tree: {args.src}: {n} files, {total / 1e6:.0f} MB, mean {total / max(n, 1) / 1e3:.0f} KB; "
          f"workers={args.workers}; shard size {args.shard_size >> 20} MiB; {os.cpu_count()} CPUs")
    secs: dict[str, list[float]] = {t: [] for t in tools}
    cpus: dict[str, list[float]] = {t: [] for t in tools}
    ratios: dict[str, list[float]] = {t: [] for t in tools}
    for r in range(args.repeat):
        row = {}
        for tool in tools:
            os.sync()
            got = _time_tool(tool, args, os.path.join(scratch, "out"))
            if got is not None:
                row[tool] = got[0]
                secs[tool].append(got[0])
                cpus[tool].append(got[1])
        for tool, s in row.items():
            if "tar" in row:
                ratios[tool].append(row["tar"] / s)
        load = " ".join(f"{x:.1f}" for x in os.getloadavg())
        print(f"round {r + 1}: " + "  ".join(f"{t} {total / 1e6 / s:.0f}" for t, s in row.items()) +
              f" MB/s  (load {load})", flush=True)
    print(f"\n{'tool':14s} {'MB/s median':>11s} {'(min-max)':>13s} {'files/s':>8s} {'x tar median':>12s} "
          f"{'(min-max)':>11s} {'CPU s/GB':>9s}")
    for tool in tools:
        if not secs[tool]:
            print(f"{tool:14s} failed")
            continue
        mbs = [total / 1e6 / s for s in secs[tool]]
        rt = ratios[tool] or [float("nan")]
        print(f"{tool:14s} {statistics.median(mbs):11.0f} {f'({min(mbs):.0f}-{max(mbs):.0f})':>13s} "
              f"{n / statistics.median(secs[tool]):8.0f} {statistics.median(rt):12.2f} "
              f"{f'({min(rt):.2f}-{max(rt):.2f})':>11s} {statistics.median(cpus[tool]) / (total / 1e9):9.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"files": n, "bytes": total, "workers": args.workers, "shard_size": args.shard_size,
                       "cpus": os.cpu_count(), "seconds": secs, "cpu_seconds": cpus,
                       "ratio_to_tar": ratios, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}, f,
                      indent=1)
    if args.scratch is None:
        shutil.rmtree(scratch, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
