"""The GPU path, side by side on one machine, in one run, on the same data; and the progressive-JPEG mix.

    python3 benchmarks/gpu/bench_gpu.py --workdir /tmp/ffbench --sections progressive --json $OUT/progressive.json

(benchmarks/gpu/run.sh progressive runs the line above: the progressive-JPEG table of benchmarks/README.md. The
other sections, a sweep of hw_decoder_load x threads for each loader, are older than train_table.py, which measures
the training tables now.)

Loaders (train: RandomResizedCrop 224 + flip + normalize, float16 CHW on the GPU, batch 256):
  fastfeed        fastfeed.Loader, DALI `mixed` decode fed from the native ring (swept: hw_decoder_load x threads)
  torch           DataLoader + ImageFolder + PIL + torchvision, 16 workers, pin_memory, persistent, prefetch 4
  dali-file       DALI fn.readers.file on the folder, fused image_random_crop(mixed), swept like fastfeed
  dali-wds        DALI fn.readers.webdataset on fastfeed's shards and .idx files, swept like fastfeed
Consumers: none (pure loader throughput), resnet50 and resnet18 (bf16 autocast, channels_last, SGD), plus each
model's step time on GPU-resident synthetic data (the ceiling). Each row reports images/s, s/step, data-wait
fraction and the CPU cores the process tree kept busy.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # dali_reference
sys.path.insert(0, str(HERE.parent.parent))  # this tree's fastfeed

from fastfeed.bench.consumers import make_consumer, synthetic_batch  # noqa: E402
from fastfeed.bench.runner import run_compute_only, run_loader, percentiles  # noqa: E402
from fastfeed.bench.torch_baseline import make_torch_loader  # noqa: E402


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def ensure_data(workdir: Path, num_images: int, progressive_fraction: float, name: str, jpeg_modes: list[str],
                classes: int = 100) -> dict[str, Path]:
    from fastfeed.demo_data import make_dataset

    images = workdir / f"{name}-images"
    t0 = time.perf_counter()
    make_dataset(images, num_images=num_images, num_classes=classes, seed=0, workers=os.cpu_count(),
                 progressive_fraction=progressive_fraction)
    log(f"data {images}: {num_images} images in {time.perf_counter() - t0:.1f}s")
    out = {"images": images}
    for mode in jpeg_modes:
        packed = workdir / f"{name}-wds-{mode}"
        if not (packed / "fastfeed.json").exists():
            t0 = time.perf_counter()
            subprocess.run([sys.executable, "-m", "fastfeed.cli", "pack", str(images), str(packed), "--format",
                            "wds", "--shard-size", "256MB", "--jpeg", mode, "--shuffle-seed", "0",
                            "--workers", str(os.cpu_count()), "--quiet", "--overwrite"], check=True)
            log(f"packed {packed} (--jpeg {mode}) in {time.perf_counter() - t0:.1f}s")
        out[mode] = packed
    return out


def row(res, extra: dict | None = None) -> dict:
    d = res.to_dict()
    d.pop("per_step", None)
    if extra:
        d.update(extra)
    return d


def measure(name, factory, consumer, args, extra=None) -> dict | None:
    try:
        loader = factory()
    except Exception as e:  # a configuration DALI refuses is a result too, not a crash of the whole run
        log(f"{name}: could not build: {type(e).__name__}: {e}")
        return None
    try:
        res = run_loader(loader, consumer, name=name, steps=args.steps, warmup=args.warmup, gpu_index=0,
                         progress=False)
    except Exception as e:
        log(f"{name}: failed: {type(e).__name__}: {e}")
        return None
    finally:
        if hasattr(loader, "close"):
            loader.close()
    r = row(res, extra)
    log(f"{name:40s} {r['samples_per_s']:9,.0f} img/s  wait {r['wait_fraction']:6.1%}  "
        f"cores {r['host']['cpu_cores_busy'] if r['host'] else float('nan'):5.1f}  "
        f"step p50 {r['step_s']['p50'] * 1e3:7.1f} ms")
    return r


def fastfeed_auto(path, args, **kw):
    import fastfeed

    return lambda: fastfeed.Loader(path, batch_size=args.batch_size, train=True, image_size=224,
                                   device=args.device, dtype=torch.float16, **kw)


def fastfeed_factory(path, hw, threads, args, **kw):
    decoder = "dali" if args.device == "cuda" else "cpu-dali"
    return fastfeed_auto(path, args, decoder=decoder, num_threads=threads, hw_decoder_load=hw, **kw)


def dali_factory(source, root, hw, threads, args):
    from dali_reference import DaliReference

    return lambda: DaliReference(source, str(root), batch_size=args.batch_size, num_threads=threads,
                                 device_id=0 if args.device == "cuda" else None, hw_decoder_load=hw)


def sweep(label, make, consumer, args, grid) -> tuple[dict | None, list[dict]]:
    rows = []
    for hw, threads in grid:
        r = measure(f"{label} hw={hw} threads={threads}", make(hw, threads), consumer, args,
                    {"loader": label, "hw_decoder_load": hw, "num_threads": threads})
        if r:
            rows.append(r)
    best = max(rows, key=lambda r: r["samples_per_s"]) if rows else None
    return best, rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workdir", default="/tmp/ffbench")
    p.add_argument("--num-images", type=int, default=20000)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--torch-workers", type=int, default=16)
    p.add_argument("--sections", default="throughput,consumers,progressive",
                   help="comma list of: data, throughput, consumers, progressive")
    p.add_argument("--grid", default="0.9:4,1.0:4,0.9:6,1.0:2",
                   help="hw_decoder_load:threads pairs swept for fastfeed and DALI")
    p.add_argument("--json", default=None)
    p.add_argument("--device", default="cuda", help="'cpu' only to smoke-test this script on a machine without GPU")
    args = p.parse_args(argv)
    sections = set(args.sections.split(","))
    grid = [(float(a), int(b)) for a, b in (x.split(":") for x in args.grid.split(","))]
    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)

    env = {"date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "python": platform.python_version(),
           "torch": torch.__version__, "cpu_count": os.cpu_count(),
           "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None}
    try:
        import nvidia.dali as dali
        env["dali"] = dali.__version__
    except ImportError:
        env["dali"] = None
    log(f"environment: {env}")
    report: dict = {"env": env, "args": vars(args)}

    base = ensure_data(workdir, args.num_images, 0.0, "base", ["keep"])
    if "data" in sections:  # prepare only (the GPU host's set-up calls do this ahead of the measuring call)
        ensure_data(workdir, args.num_images, 0.2, "prog20", ["keep", "baseline"])
        return 0
    none = make_consumer("none", args.device)
    best: dict[str, dict] = {}

    if "throughput" in sections:
        log("== throughput (consumer none) ==")
        rows = []
        b, r = sweep("fastfeed", lambda hw, t: fastfeed_factory(base["keep"], hw, t, args), none, args, grid)
        rows += r
        best["fastfeed"] = b
        if b:  # the same best setting with one and with three decode pipelines, to show what overlap buys
            for n in (1, 3):
                extra = {"loader": "fastfeed", "hw_decoder_load": b["hw_decoder_load"],
                         "num_threads": b["num_threads"], "pipelines": n}
                r1 = measure(f"fastfeed hw={b['hw_decoder_load']} threads={b['num_threads']} pipelines={n}",
                             fastfeed_factory(base["keep"], b["hw_decoder_load"], b["num_threads"], args,
                                              pipelines=n), none, args, extra)
                rows += [r1] if r1 else []
        auto = measure("fastfeed defaults (num_threads='auto')", fastfeed_auto(base["keep"], args), none, args,
                       {"loader": "fastfeed-auto"})
        if auto:
            rows.append(auto)
            best["fastfeed-auto"] = auto
        t = measure("torch DataLoader (16 workers)",
                    lambda: make_torch_loader(base["images"], batch_size=args.batch_size, device=args.device,
                                              dtype=torch.float16, num_workers=args.torch_workers), none, args,
                    {"loader": "torch"})
        rows += [t] if t else []
        best["torch"] = t
        for label, source, root in (("dali-file", "file", base["images"]), ("dali-wds", "webdataset", base["keep"])):
            b, r = sweep(label, lambda hw, th, s=source, rt=root: dali_factory(s, rt, hw, th, args), none, args,
                         grid)
            rows += r
            best[label] = b
        report["throughput"] = rows
        report["best"] = {k: v for k, v in best.items() if v}

    if "consumers" in sections:
        log("== consumers ==")
        report["consumers"] = {}
        for model in ("resnet50", "resnet18"):
            consumer = make_consumer(model, args.device)
            synth = synthetic_batch(args.batch_size, 224, args.device, torch.float16)
            ceiling = percentiles(run_compute_only(consumer, synth, steps=args.steps, warmup=args.warmup))
            entry = {"ceiling_step_s": ceiling,
                     "ceiling_img_s": args.batch_size / ceiling["p50"], "loaders": {}}
            log(f"{model} ceiling (GPU-resident data): {ceiling['p50'] * 1e3:.1f} ms/step "
                f"= {entry['ceiling_img_s']:,.0f} img/s")
            cfg = {k: (v["hw_decoder_load"], v["num_threads"]) for k, v in best.items()
                   if v and "hw_decoder_load" in v}
            ff = cfg.get("fastfeed", (0.9, 4))
            facs = {
                # channels_last: fastfeed writes the layout the model wants; the others leave that copy to the step
                "fastfeed": fastfeed_factory(base["keep"], *ff, args, channels_last=True),
                "fastfeed-auto": fastfeed_auto(base["keep"], args, channels_last=True),
                "fastfeed-chw": fastfeed_factory(base["keep"], *ff, args),
                "fastfeed-1pipe": fastfeed_factory(base["keep"], *ff, args, channels_last=True, pipelines=1),
                "fastfeed-3pipe": fastfeed_factory(base["keep"], *ff, args, channels_last=True, pipelines=3),
                "torch": lambda: make_torch_loader(base["images"], batch_size=args.batch_size, device=args.device,
                                                   dtype=torch.float16, num_workers=args.torch_workers),
                "dali-wds": dali_factory("webdataset", base["keep"], *cfg.get("dali-wds", (0.9, 4)), args),
                "dali-file": dali_factory("file", base["images"], *cfg.get("dali-file", (0.9, 4)), args),
            }
            for name, fac in facs.items():
                r = measure(f"{model} <- {name}", fac, consumer, args, {"loader": name})
                if r:
                    r["slowdown_vs_ceiling"] = r["step_s"]["p50"] / ceiling["p50"] - 1
                    entry["loaders"][name] = r
            report["consumers"][model] = entry
            del consumer
            if args.device == "cuda":
                torch.cuda.empty_cache()

    if "progressive" in sections:
        log("== progressive JPEGs (20%) and --jpeg baseline ==")
        prog = ensure_data(workdir, args.num_images, 0.2, "prog20", ["keep", "baseline"])
        hw, th = (best["fastfeed"]["hw_decoder_load"], best["fastfeed"]["num_threads"]) if best.get("fastfeed") \
            else (0.9, 4)
        res = {}
        for label, path in (("all-baseline", base["keep"]), ("20%-progressive --jpeg keep", prog["keep"]),
                            ("20%-progressive --jpeg baseline", prog["baseline"])):
            r = measure(f"fastfeed {label}", fastfeed_factory(path, hw, th, args), none, args, {"set": label})
            if r:
                res[label] = r
        report["progressive"] = res

    print_table(report)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(report, indent=1, default=str))
        log(f"wrote {args.json}")
    return 0


def print_table(report: dict) -> None:
    print("\n=== best per loader (consumer none) ===")
    print(f"{'loader':12s} {'img/s':>9s} {'cores':>6s} {'wait':>7s} {'hw':>5s} {'thr':>4s}")
    for k, v in report.get("best", {}).items():
        print(f"{k:12s} {v['samples_per_s']:9,.0f} {v['host']['cpu_cores_busy']:6.1f} {v['wait_fraction']:7.1%} "
              f"{v.get('hw_decoder_load', '-')!s:>5s} {v.get('num_threads', '-')!s:>4s}")
    for model, e in report.get("consumers", {}).items():
        print(f"\n=== {model}: ceiling {e['ceiling_step_s']['p50'] * 1e3:.1f} ms/step "
              f"({e['ceiling_img_s']:,.0f} img/s) ===")
        print(f"{'loader':12s} {'img/s':>9s} {'step ms':>8s} {'wait':>7s} {'slower':>7s} {'cores':>6s}")
        for name, r in e["loaders"].items():
            print(f"{name:12s} {r['samples_per_s']:9,.0f} {r['step_s']['p50'] * 1e3:8.1f} {r['wait_fraction']:7.1%} "
                  f"{r['slowdown_vs_ceiling']:7.1%} {r['host']['cpu_cores_busy']:6.1f}")
    if report.get("progressive"):
        print("\n=== progressive mix (fastfeed, consumer none) ===")
        for label, r in report["progressive"].items():
            print(f"{label:34s} {r['samples_per_s']:9,.0f} img/s")


if __name__ == "__main__":
    sys.exit(main())
