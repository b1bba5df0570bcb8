#!/usr/bin/env python3
"""Write a synthetic image tree for benchmarks: ImageNet-like JPEGs (same as `fastfeed demo-data DIR`) or another
image regime (issue 14: the loader must be fast on every kind of image, not only on ImageNet-sized JPEGs).

    python tools/make_dataset.py data/sample --num-images 20000 --seed 0 --progressive-fraction 0.1
    python tools/make_dataset.py /tmp/thumb --regime thumb --num-images 20000
    python tools/make_dataset.py /tmp/phone --regime phone --num-images 512
    python tools/make_dataset.py /tmp/custom --short-side 200:300 --png-fraction 0.5 --num-images 4000

Regimes (short side in px; long side up to 4:3; JPEG quality 75-95 unless said):
    imagenet  300-600, JPEG                        -> fastfeed.demo_data (byte-identical to `fastfeed demo-data`)
    thumb     80-120, JPEG                         small web thumbnails; train them with 64 px crops
    phone     3024 x 4032 (12 MP), JPEG q 85-95    phone-camera photos
    png       300-600, 70% PNG / 30% JPEG          PNG-heavy set
    mixed     per image: 15% thumb, 70% imagenet, 5% phone sizes (10% 1000-2000 px); 15% PNG
The pixels are crops of scikit-image's photographs plus film grain (see fastfeed/demo_data.py for why: decode cost
must be that of real photos). Image i depends only on (seed, i, regime); files are class_XXX/img_XXXXXXX.{jpg,png}.
"""
from __future__ import annotations

import argparse
import io
import json
import math
import multiprocessing
import os
import sys
import time
from pathlib import Path

import numpy as np

# (weight, short-side min, short-side max); a fixed 4:3 frame when min == max == 3024 (phone)
REGIMES = {
    "thumb": dict(sizes=[(1.0, 80, 120)], png_fraction=0.0, quality=(75, 95)),
    "phone": dict(sizes=[(1.0, 3024, 3024)], png_fraction=0.0, quality=(85, 95)),
    "png": dict(sizes=[(1.0, 300, 600)], png_fraction=0.7, quality=(75, 95)),
    "mixed": dict(sizes=[(0.15, 80, 120), (0.70, 300, 600), (0.10, 1000, 2000), (0.05, 3024, 3024)],
                  png_fraction=0.15, quality=(75, 95)),
}
_REGIME_STREAM = {"thumb": 1, "phone": 2, "png": 3, "mixed": 4, "custom": 5}
_CHUNK = 32


def _render(job) -> tuple[int, int]:
    """Render and write images `indices` of a regime; returns (count, bytes)."""
    from PIL import Image

    from fastfeed import demo_data as dd

    out_dir, seed, num_classes, spec, indices = job
    dd._init_worker()  # the source photos and the grain texture of demo_data, loaded once per process
    sizes, png_fraction, (q0, q1) = spec["sizes"], spec["png_fraction"], spec["quality"]
    weights = np.array([s[0] for s in sizes], dtype=np.float64)
    total = 0
    for index in indices:
        rng = np.random.default_rng(np.random.SeedSequence([seed, _REGIME_STREAM[spec["name"]], int(index)]))
        _, lo, hi = sizes[int(rng.choice(len(sizes), p=weights / weights.sum()))]
        short = int(rng.integers(lo, hi + 1))
        aspect = 4 / 3 if lo == hi == 3024 else math.exp(rng.uniform(math.log(3 / 4), math.log(4 / 3)))
        if rng.random() < 0.5 and lo == hi == 3024:
            aspect = 3 / 4
        long = min(round(short * max(aspect, 1 / aspect)), short * 4 // 3)
        width, height = (long, short) if aspect >= 1 else (short, long)
        variants = dd._SOURCES[int(rng.integers(len(dd._SOURCES)))]
        src = variants[int(rng.integers(len(variants)))]
        fit = min(src.width / width, src.height / height)
        scale = fit * math.sqrt(rng.uniform(0.3, 1.0))
        cw, ch = width * scale, height * scale
        x0, y0 = rng.uniform(0, src.width - cw), rng.uniform(0, src.height - ch)
        img = src.resize((width, height), Image.BILINEAR, box=(x0, y0, x0 + cw, y0 + ch))
        if rng.random() < 0.5:
            img = img.transpose(Image.FLIP_LEFT_RIGHT)
        # grain: demo_data's texture, tiled for frames larger than it (12 MP photos)
        g = dd._GRAIN
        reps = (math.ceil(height / g.shape[0]) + 1, math.ceil(width / g.shape[1]) + 1, 1)
        gy, gx = int(rng.integers(g.shape[0])), int(rng.integers(g.shape[1]))
        if gy + height <= g.shape[0] and gx + width <= g.shape[1]:
            grain = g[gy:gy + height, gx:gx + width]
        else:
            grain = np.tile(g, reps)[gy:gy + height, gx:gx + width]
        pixels = np.asarray(img).astype(np.int16) + grain
        img = Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8), "RGB")
        buf = io.BytesIO()
        if rng.random() < png_fraction:
            img.save(buf, "PNG", compress_level=6)
            ext = "png"
        else:
            quality = q0 + int(math.sqrt(rng.random()) * (q1 - q0 + 1))
            img.save(buf, "JPEG", quality=min(quality, q1))
            ext = "jpg"
        path = Path(out_dir) / f"class_{int(index) % num_classes:03d}" / f"img_{int(index):07d}.{ext}"
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_bytes(buf.getvalue())
        os.replace(tmp, path)  # a killed run never leaves a truncated file under the final name
        total += len(buf.getvalue())
    return len(indices), total


def make_regime(out_dir, regime: str, num_images: int, num_classes: int = 100, seed: int = 0,
                workers: int | None = None, sizes=None, png_fraction: float | None = None) -> dict:
    """Write `num_images` images of `regime` (or custom `sizes`/`png_fraction`) under out_dir; returns a summary.
    Idempotent: a folder whose marker matches the parameters is left as it is."""
    spec = dict(REGIMES.get(regime, {"sizes": [(1.0, 300, 600)], "png_fraction": 0.0, "quality": (75, 95)}))
    if sizes is not None:
        spec["sizes"] = sizes
    if png_fraction is not None:
        if not 0.0 <= png_fraction <= 1.0:
            raise ValueError(f"png_fraction must be in [0, 1], got {png_fraction}")
        spec["png_fraction"] = png_fraction
    spec["name"] = regime if regime in REGIMES else "custom"
    if num_images < 1 or num_classes < 1:
        raise ValueError("num_images and num_classes must be >= 1")
    out = Path(out_dir)
    marker = out / ".fastfeed-regime.json"
    key = {"spec": {k: (list(map(list, v)) if k == "sizes" else (list(v) if k == "quality" else v))
                    for k, v in spec.items()}, "num_images": num_images, "num_classes": num_classes, "seed": seed}
    if marker.exists():
        old = json.loads(marker.read_text())
        if {k: old.get(k) for k in key} == key:
            return old
        raise FileExistsError(f"{out} holds another data set ({old.get('spec')}); choose a new folder")
    if out.exists() and any(out.iterdir()):
        raise FileExistsError(f"{out} is not empty; choose an empty or new folder")
    for c in range(min(num_classes, num_images)):
        (out / f"class_{c:03d}").mkdir(parents=True, exist_ok=True)
    jobs = [(str(out), seed, num_classes, spec, list(range(i, min(i + _CHUNK, num_images))))
            for i in range(0, num_images, _CHUNK)]
    t0 = time.perf_counter()
    workers = max(1, min(workers or os.cpu_count() or 1, len(jobs)))
    if workers == 1:
        results = [_render(j) for j in jobs]
    else:
        with multiprocessing.get_context("spawn").Pool(workers) as pool:
            results = pool.map(_render, jobs, chunksize=1)
    nbytes = sum(b for _, b in results)
    summary = {**key, "bytes": nbytes, "mean_kb": round(nbytes / num_images / 1e3, 1),
               "seconds": round(time.perf_counter() - t0, 1)}
    marker.write_text(json.dumps(summary))
    return summary


def _sizes_arg(text: str):
    lo, _, hi = text.partition(":")
    lo, hi = int(lo), int(hi or lo)
    if not 8 <= lo <= hi:
        raise argparse.ArgumentTypeError(f"--short-side wants MIN:MAX with 8 <= MIN <= MAX, got {text!r}")
    return [(1.0, lo, hi)]


def main(argv: list[str] | None = None) -> int:
    from fastfeed.commands import demo_data

    parser = argparse.ArgumentParser(prog="make_dataset.py", description=__doc__.splitlines()[0])
    demo_data.configure(parser)
    parser.add_argument("--regime", choices=["imagenet", *REGIMES], default="imagenet",
                        help="image regime (default imagenet: the demo-data JPEG tree)")
    parser.add_argument("--short-side", type=_sizes_arg, default=None, metavar="MIN:MAX",
                        help="short side range in px (overrides the regime's sizes)")
    parser.add_argument("--png-fraction", type=float, default=None, help="share of images written as PNG")
    args = parser.parse_args(argv)
    if args.regime == "imagenet" and args.short_side is None and args.png_fraction is None:
        return demo_data.run(args)
    if args.progressive_fraction:
        parser.error("--progressive-fraction applies to the imagenet regime only")
    try:
        s = make_regime(args.out_dir, args.regime, args.num_images, args.num_classes, args.seed, args.workers,
                        sizes=args.short_side, png_fraction=args.png_fraction)
    except (ValueError, OSError) as exc:
        print(f"make_dataset.py: error: {exc}", file=sys.stderr)
        return 2
    print(f"{args.out_dir}: {args.num_images} images ({args.regime}), mean {s['mean_kb']} KB, {s['seconds']} s")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    sys.exit(main())
