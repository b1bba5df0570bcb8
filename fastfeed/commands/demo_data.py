"""`fastfeed demo-data DIR`: write the synthetic ImageNet-like JPEG tree (see fastfeed/demo_data.py)."""
from __future__ import annotations

import argparse
import json
import sys
import time

__all__ = ["configure", "run"]


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("out_dir", metavar="DIR", help="output folder (DIR/class_XXX/img_XXXXXXX.jpg)")
    parser.add_argument("--num-images", type=int, default=2000, help="number of JPEGs")
    parser.add_argument("--num-classes", type=int, default=10, help="number of class folders")
    parser.add_argument("--seed", type=int, default=0, help="same seed -> byte-identical files")
    parser.add_argument("--workers", type=int, default=None, help="processes (default: the cores this process may use)")
    parser.add_argument(
        "--progressive-fraction", type=float, default=0.0,
        help="fraction of images written as progressive JPEGs",
    )


def run(args: argparse.Namespace) -> int:
    from fastfeed.demo_data import MARKER_NAME, dataset_present, make_dataset

    params = dict(
        num_images=args.num_images, num_classes=args.num_classes, seed=args.seed,
        progressive_fraction=args.progressive_fraction,
    )
    start = time.perf_counter()
    try:
        if dataset_present(args.out_dir, **params):
            print(f"{args.out_dir}: already holds this dataset ({args.num_images} images, seed {args.seed})")
            return 0
        out = make_dataset(args.out_dir, workers=args.workers, **params)
    except (ValueError, OSError, RuntimeError) as exc:
        print(f"fastfeed demo-data: error: {exc}", file=sys.stderr)
        return 2
    elapsed = time.perf_counter() - start
    marker = json.loads((out / MARKER_NAME).read_text())
    print(
        f"{out}: {args.num_images} images in {args.num_classes} classes, {marker['bytes'] / 1e6:.1f} MB "
        f"(mean {marker['bytes'] / args.num_images / 1e3:.0f} KB, {marker['progressive']} progressive) "
        f"in {elapsed:.1f} s ({args.num_images / elapsed:.0f} images/s)"
    )
    return 0
