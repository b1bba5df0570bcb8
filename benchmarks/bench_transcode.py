"""Lossless progressive -> baseline JPEG transcoding speed and size change (issue 8).

Generates ImageNet-like progressive JPEGs (~100 KB, ~500x375, 4:2:0, skimage's photos), then times:
  - PIL full decode of the same files (the reference cost a sample pays anyway, once per epoch),
  - fastfeed.image.transcode.transcode_to_baseline one file at a time (GIL released, 1 thread),
  - fastfeed.image.transcode.transcode_many with 1 and 2 native threads,
  - the native transcoder without Huffman optimisation (what optimize_coding costs).
Reports files/s, MB/s (input bytes), CPU ms per file, and the baseline/progressive size ratio. Checks a few
outputs decode pixel-identical first.

    python benchmarks/bench_transcode.py [--files 200] [--repeat 3] [--json out.json]
"""
from __future__ import annotations

import argparse
import io
import json
import sys
import time

import numpy as np
from PIL import Image
from skimage import data as skdata

from fastfeed.image import jpeg, transcode


def make_corpus(n: int, seed: int = 0) -> list[bytes]:
    photos = [skdata.astronaut(), skdata.coffee(), skdata.rocket(), skdata.immunohistochemistry()]
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        src = Image.fromarray(photos[i % len(photos)])
        # Native resolution (upscaling smooths texture away) cropped to ImageNet's typical 500x375, high quality:
        # about 100 KB per file, like ImageNet's average.
        w, h = min(500, src.width), min(375, src.height)
        x = int(rng.integers(0, src.width - w + 1))
        y = int(rng.integers(0, src.height - h + 1))
        buf = io.BytesIO()
        src.crop((x, y, x + w, y + h)).save(buf, "JPEG", quality=int(rng.integers(96, 100)), progressive=True)
        out.append(buf.getvalue())
    return out


def timed(fn, repeat: int) -> tuple[float, float]:
    """Best-of-`repeat` (wall seconds, process CPU seconds) of fn()."""
    best = (float("inf"), float("inf"))
    for _ in range(repeat):
        w0, c0 = time.perf_counter(), time.process_time()
        fn()
        wall, cpu = time.perf_counter() - w0, time.process_time() - c0
        if wall < best[0]:
            best = (wall, cpu)
    return best


def pil_decode_all(files: list[bytes]) -> None:
    for f in files:
        with Image.open(io.BytesIO(f)) as im:
            im.load()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--files", type=int, default=200)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--json", help="also write the results here")
    args = p.parse_args(argv)
    if not transcode.HAVE_TRANSCODE:
        print("transcoding unavailable: fastfeed._native was built without libjpeg", file=sys.stderr)
        return 2
    from fastfeed import _native

    files = make_corpus(args.files)
    n, mb = len(files), sum(map(len, files)) / 1e6
    print(f"corpus: {n} progressive JPEGs, mean {1e3 * mb / n:.1f} KB, "
          f"{Image.open(io.BytesIO(files[0])).size} px, 4:2:0")

    outs = transcode.transcode_many(files, num_threads=2)
    for f, o in zip(files[:5], outs[:5]):
        assert np.array_equal(np.asarray(Image.open(io.BytesIO(f))), np.asarray(Image.open(io.BytesIO(o))))
    assert all(jpeg.probe(o).jpeg_kind == jpeg.KIND_BASELINE for o in outs)
    out_mb = sum(map(len, outs)) / 1e6
    unopt_mb = sum(len(_native.transcode(f, optimize_coding=False)) for f in files) / 1e6

    cases = {
        "PIL decode (reference)": lambda: pil_decode_all(files),
        "transcode_to_baseline, 1 by 1": lambda: [transcode.transcode_to_baseline(f) for f in files],
        "transcode_many, 1 thread": lambda: transcode.transcode_many(files, num_threads=1),
        "transcode_many, 2 threads": lambda: transcode.transcode_many(files, num_threads=2),
        "no Huffman optimisation, 1 by 1": lambda: [_native.transcode(f, optimize_coding=False) for f in files],
    }
    results = {"files": n, "input_mb": mb, "baseline_mb": out_mb, "baseline_unoptimized_mb": unopt_mb, "cases": {}}
    print(f"{'case':34s} {'files/s':>9s} {'MB/s':>7s} {'wall ms/file':>13s} {'CPU ms/file':>12s}")
    for name, fn in cases.items():
        wall, cpu = timed(fn, args.repeat)
        row = {"files_per_s": n / wall, "mb_per_s": mb / wall, "wall_ms_per_file": 1e3 * wall / n,
               "cpu_ms_per_file": 1e3 * cpu / n}
        results["cases"][name] = row
        print(f"{name:34s} {row['files_per_s']:9.0f} {row['mb_per_s']:7.1f} {row['wall_ms_per_file']:13.2f} "
              f"{row['cpu_ms_per_file']:12.2f}")
    print(f"size: progressive {mb:.2f} MB -> baseline {out_mb:.2f} MB ({100 * (out_mb / mb - 1):+.1f}%), "
          f"without Huffman optimisation {unopt_mb:.2f} MB ({100 * (unopt_mb / mb - 1):+.1f}%)")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(results, fh, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
