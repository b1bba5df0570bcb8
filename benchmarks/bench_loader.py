"""images/s of `fastfeed.Loader`'s CPU path against torch DataLoader + ImageFolder + PIL + torchvision, same run.

    python benchmarks/bench_loader.py [--workdir DIR] [--num-images 3000] [--images DIR --packed DIR]
                                      [--batch 64] [--size 224] [--dtype float32] [--seconds 40] [--warmup 8]
                                      [--loaders torch,cpu,cpu-dali] [--torch-workers N] [--rounds 1]
                                      [--fresh-processes] [--json FILE]

Data: by default `fastfeed.demo_data.make_dataset` renders `--num-images` ImageNet-like JPEGs (300-800 px, ~120 KB)
into WORKDIR/images (idempotent) and the real CLI packs them into WORKDIR/wds (`fastfeed pack --format wds`),
skipped when the packed manifest already points at that folder with the same sample count. The DataLoader reads
the unpacked folder, fastfeed the packed shards: that is the comparison the packer exists for.

What is compared (issue 4): train mode, RandomResizedCrop(S) + horizontal flip + normalize, batch 64, both
loaders producing [B, 3, S, S] tensors of `--dtype` on the CPU (float32 by default: the DataLoader's own output,
so the baseline pays no extra conversion) and int64 labels, consumer "none" (fastfeed/bench/consumers.py).
The baseline is `fastfeed.bench.torch_baseline.make_torch_loader`: num_workers = usable cores,
persistent_workers, prefetch_factor 4, pin_memory only with CUDA. fastfeed: `Loader(device="cpu",
decoder=...)` with its defaults (num_threads="auto" = the usable cores, 4 ring readers, prefetch 2).

Fairness: the loaders run one after the other, never together, each closed before the next starts; every file
of both copies is read once first so the page cache is warm for both; each gets `--warmup` untimed steps
(worker start-up, numba/DALI compilation) and then as many timed steps as fit in `--seconds` (epochs roll over
inside the timed part for both, as in training). The machine is shared, so the load average before and after
and each loader's CPU use are printed with the numbers: images per CPU-second is the figure least disturbed by
other tenants.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

DEFAULT_WORKDIR = Path(os.environ.get("TMPDIR", "/tmp")) / "fastfeed-bench" / "bench-loader"  # data, kept between runs
TARGET_RATIO = 1.5  # issue 4: the CPU path must reach 1.5x the DataLoader on the 2-core machine


def prepare_data(workdir: Path, num_images: int) -> tuple[Path, Path]:
    """(image folder, packed WebDataset folder) under `workdir`, created only when missing or different."""
    from fastfeed.demo_data import make_dataset

    images = make_dataset(workdir / "images", num_images=num_images, num_classes=10, seed=0)
    packed = workdir / "wds"
    try:
        manifest = json.loads((packed / "fastfeed.json").read_text())
        fresh = (manifest.get("num_samples") == num_images
                 and Path(manifest.get("source", "")).resolve() == images.resolve())
    except (OSError, ValueError):
        fresh = False
    if not fresh:
        cmd = [sys.executable, "-m", "fastfeed.cli", "pack", str(images), str(packed), "--format", "wds",
               "--shard-size", "64MB", "--overwrite", "--quiet"]
        subprocess.run(cmd, check=True)
    return images, packed


def warm_page_cache(*folders: Path) -> int:
    """Read every file once so neither loader pays for a cold disk; returns the bytes read."""
    total = 0
    for folder in folders:
        for p in sorted(folder.rglob("*")):
            if p.is_file():
                with open(p, "rb") as f:
                    while chunk := f.read(1 << 22):
                        total += len(chunk)
    return total


def _factories(args, images: Path, packed: Path) -> dict:
    import torch

    import fastfeed
    from fastfeed.bench.torch_baseline import make_torch_loader

    dtype = getattr(torch, args.dtype)
    out = {}
    for name in args.loaders.split(","):
        if name == "torch":
            out["torch DataLoader"] = lambda: make_torch_loader(
                images, batch_size=args.batch, image_size=args.size, train=True, device="cpu", dtype=dtype,
                num_workers=args.torch_workers, prefetch_factor=4, seed=0)
        elif name in ("cpu", "cpu-pil", "cpu-dali"):
            out[f"fastfeed {name}"] = (lambda kind: lambda: fastfeed.Loader(
                packed, batch_size=args.batch, train=True, image_size=args.size, device="cpu", decoder=kind,
                dtype=dtype, seed=0))(name)
        else:
            raise SystemExit(f"unknown loader {name!r}: use torch, cpu, cpu-pil, cpu-dali")
    return out


def _settings(res: dict) -> str:
    info = (res.get("loader_stats") or {}).get("info") or {}
    keys = ("decoder", "num_threads", "pipelines", "reader_threads", "prefetch")
    return " ".join(f"{k}={info[k]}" for k in keys if k in info)


def _run_fresh(a, key: str, images: Path, packed: Path) -> tuple[str, dict]:
    """One loader for one round in a new interpreter (this script with --loaders KEY); its result dict."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "r.json"
        cmd = [sys.executable, __file__, "--images", str(images), "--packed", str(packed), "--loaders", key,
               "--batch", str(a.batch), "--size", str(a.size), "--dtype", a.dtype, "--seconds", str(a.seconds),
               "--warmup", str(a.warmup), "--json", str(out)]
        if a.torch_workers:
            cmd += ["--torch-workers", str(a.torch_workers)]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        (name, r), = json.loads(out.read_text())["results"].items()
    return name, r


def main(argv=None) -> int:
    from fastfeed.bench.consumers import make_consumer
    from fastfeed.bench.runner import run_loader
    from fastfeed.bench.torch_baseline import default_num_workers

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workdir", type=Path, default=DEFAULT_WORKDIR)
    ap.add_argument("--num-images", type=int, default=3000)
    ap.add_argument("--images", type=Path, help="unpacked ImageFolder tree (with --packed: skip the demo data)")
    ap.add_argument("--packed", type=Path, help="the same images packed by `fastfeed pack`")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--dtype", choices=("float32", "float16", "bfloat16"), default="float32")
    ap.add_argument("--seconds", type=float, default=40.0, help="timed seconds per loader and round (default 40)")
    ap.add_argument("--warmup", type=int, default=8, help="untimed batches per loader (default 8)")
    ap.add_argument("--loaders", default="torch,cpu,cpu-dali")
    ap.add_argument("--torch-workers", type=int, default=None, help="default: usable cores")
    ap.add_argument("--rounds", type=int, default=1,
                    help="run the loaders in turn this many times and keep each one's best round (default 1)")
    ap.add_argument("--json", type=Path, help="write all results as JSON")
    ap.add_argument("--fresh-processes", action="store_true",
                    help="run every (round, loader) in a new Python process, interleaved (issue 14's protocol: "
                         "no loader inherits another's threads, caches or heap)")
    a = ap.parse_args(argv)
    if (a.images is None) != (a.packed is None):
        ap.error("--images and --packed go together")
    if a.images is not None:
        images, packed = a.images, a.packed
    else:
        images, packed = prepare_data(a.workdir, a.num_images)
    t0 = time.perf_counter()
    warmed = warm_page_cache(images, packed)
    load_before = os.getloadavg()
    cores = default_num_workers()
    print(f"images {images} | packed {packed} | page cache warmed: {warmed / 1e6:,.0f} MB in "
          f"{time.perf_counter() - t0:.1f}s")
    print(f"train RRC {a.size} + flip + normalize, batch {a.batch}, {a.dtype}, consumer none, {cores} usable cores, "
          f"torch workers {a.torch_workers or cores}, {a.seconds:.0f}s per loader; "
          f"load average before {load_before[0]:.2f} {load_before[1]:.2f} {load_before[2]:.2f}")

    consumer = make_consumer("none", "cpu")
    results = {}
    # Several rounds in turn: other tenants' load comes and goes, and each loader's best round is the one least
    # disturbed by it (the same rule timeit uses).
    for rnd in range(a.rounds):
        if a.fresh_processes:
            for key in a.loaders.split(","):
                name, r = _run_fresh(a, key, images, packed)
                print(f"  round {rnd + 1} {name}: {r['samples_per_s']:,.0f} img/s over {r['steps']} steps "
                      f"({r['host']['cpu_cores_busy']:.2f} cores busy, fresh process)", flush=True)
                results.setdefault(name, r)
                results[name].setdefault("rounds_img_s", [])
                results[name]["rounds_img_s"] = results[name]["rounds_img_s"] + [r["samples_per_s"]]
                if r["samples_per_s"] > results[name]["samples_per_s"]:
                    r["rounds_img_s"] = results[name]["rounds_img_s"]
                    results[name] = r
            continue
        for name, make in _factories(a, images, packed).items():
            loader = make()
            try:
                res = run_loader(loader, consumer, name=name, steps=1_000_000, warmup=a.warmup,
                                 max_seconds=a.seconds, progress=sys.stderr.isatty())
            finally:
                if hasattr(loader, "close"):
                    loader.close()
            r = res.to_dict()
            print(f"  round {rnd + 1} {name}: {r['samples_per_s']:,.0f} img/s over {r['steps']} steps "
                  f"({r['host']['cpu_cores_busy']:.2f} cores busy, machine "
                  f"{r['host']['system_cpu_busy_frac'] or 0:.0%}) {_settings(r)}", flush=True)
            if name not in results or r["samples_per_s"] > results[name]["samples_per_s"]:
                results[name] = r
    load_after = os.getloadavg()

    base = results.get("torch DataLoader")
    print()
    print(f"{'loader':<20}{'img/s':>9}{'vs torch':>10}{'s/step p50':>12}{'wait':>7}{'cores':>7}{'img/CPU-s':>11}")
    for name, r in results.items():
        ratio = f"{r['samples_per_s'] / base['samples_per_s']:.2f}x" if base else "-"
        busy = r["host"]["cpu_cores_busy"]
        per_cpu = r["samples_per_s"] / busy if busy > 0 else float("nan")
        print(f"{name:<20}{r['samples_per_s']:>9,.0f}{ratio:>10}{r['step_s']['p50']:>12.4f}"
              f"{100 * r['wait_fraction']:>6.0f}%{busy:>7.2f}{per_cpu:>11,.0f}")
    print(f"load average after {load_after[0]:.2f} {load_after[1]:.2f} {load_after[2]:.2f} "
          f"(machine CPU busy during each run: "
          + ", ".join(f"{n} {r['host']['system_cpu_busy_frac']:.0%}" for n, r in results.items()
                      if r["host"]["system_cpu_busy_frac"] is not None) + ")")
    if base:
        for name, r in results.items():
            if name != "torch DataLoader":
                if "rounds_img_s" in r:  # interleaved fresh processes: the ratio round by round too
                    per = [x / y for x, y in zip(r["rounds_img_s"], base["rounds_img_s"])]
                    print(f"{name}: per round " + ", ".join(f"{x:.2f}x" for x in per))
                ratio = r["samples_per_s"] / base["samples_per_s"]
                verdict = "meets" if ratio >= TARGET_RATIO else "MISSES"
                print(f"{name}: {ratio:.2f}x the DataLoader, {verdict} the {TARGET_RATIO}x target")
    if a.json:
        for r in results.values():
            r.pop("per_step", None)
        a.json.write_text(json.dumps({"config": {k: str(v) for k, v in vars(a).items()},
                                      "load_before": load_before, "load_after": load_after,
                                      "results": results}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
