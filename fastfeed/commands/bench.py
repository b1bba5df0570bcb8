"""`fastfeed bench DATASET`: throughput, step-time percentiles and data wait, optionally against torch."""
from __future__ import annotations

import argparse
import sys

from fastfeed.bench.session import DTYPES, BenchConfig
from fastfeed.constants import BENCH_CONSUMERS
from fastfeed.decode import KINDS as DECODER_KINDS


def _threads(text: str):
    if text == "auto":
        return "auto"
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer or 'auto', got {text!r}") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {n}")
    return n


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("dataset", metavar="DATASET", help="packed dataset folder (holds fastfeed.json)")
    p.add_argument("--steps", type=int, default=BenchConfig.steps, help="timed steps")
    p.add_argument("--warmup", type=int, default=BenchConfig.warmup, help="untimed steps before measuring")
    p.add_argument("--max-warmup", type=int, default=BenchConfig.max_warmup,
                   help="more untimed steps while the Loader is still tuning itself (pipeline count, the hybrid's "
                        "CPU share), up to this many in all (0: --warmup exactly)")
    p.add_argument("--batch-size", type=int, default=BenchConfig.batch_size,
                   help="images per step (lowered to the dataset size when the dataset is smaller)")
    p.add_argument("--image-size", type=int, default=BenchConfig.image_size, help="output side in pixels")
    p.add_argument("--decoder", choices=DECODER_KINDS, default=BenchConfig.decoder,
                   help="Loader decoder (auto: dali on a GPU, else the fastest CPU decoder)")
    p.add_argument("--device", default=None, help="cuda, cuda:N or cpu (default: cuda when available)")
    p.add_argument("--dtype", choices=DTYPES, default=BenchConfig.dtype, help="output dtype of both loaders")
    p.add_argument("--channels-last", action="store_true", help="channels_last output")
    p.add_argument("--num-threads", type=_threads, default=None, help="Loader num_threads: N or auto (default: auto)")
    p.add_argument("--prefetch", type=int, default=None, help="Loader prefetch depth in batches (default: Loader's)")
    p.add_argument("--pipelines", type=int, default=None,
                   help="Loader decode pipelines side by side (default: Loader's)")
    p.add_argument("--reader-threads", type=int, default=None, help="Loader ring reader threads (default: Loader's)")
    p.add_argument("--hw-decoder-load", type=float, default=None,
                   help="Loader share of JPEGs for the GPU hardware decoder, DALI only (default: Loader's)")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--train", dest="train", action="store_true", default=True,
                      help="random-resized-crop + flip (default)")
    mode.add_argument("--eval", dest="train", action="store_false", help="resize + centre crop")
    p.add_argument("--consumer", choices=BENCH_CONSUMERS, default=BenchConfig.consumer,
                   help="training step run on each batch (none: pure loader throughput; a model also measures "
                        "its step on resident data, the ceiling the verdict compares with)")
    p.add_argument("--compare", choices=("torch",), default=None,
                   help="also run torch's DataLoader + PIL + torchvision transforms on the same packed images")
    p.add_argument("--images", default=None,
                   help="give the --compare baseline this unpacked ImageFolder tree instead of the packed dataset")
    p.add_argument("--torch-workers", type=int, default=None, help="baseline num_workers (default: usable cores)")
    p.add_argument("--seed", type=int, default=BenchConfig.seed, help="shuffle and augmentation seed")
    p.add_argument("--json", metavar="FILE", default=None, help="write the report as JSON (schema in bench/report.py)")
    p.add_argument("--plot", metavar="FILE.png", default=None, help="write throughput and wait plots")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def missing_extras(args: argparse.Namespace) -> list[str]:
    """Modules of the `[bench]` extra this run needs but cannot import (checked before minutes of measuring)."""
    import importlib.util

    needed = []
    if args.consumer != "none" or args.compare:
        needed.append("torchvision")  # the ResNet consumers and the DataLoader baseline's transforms
    if args.plot:
        needed.append("matplotlib")
    return [m for m in needed if importlib.util.find_spec(m) is None]


def run(args: argparse.Namespace) -> int:
    missing = missing_extras(args)
    if missing:
        print(f"fastfeed bench: {' and '.join(missing)} not installed; install the bench extra: "
              "pip install 'fastfeed[bench]' (or -e '.[bench]' in a clone)", file=sys.stderr)
        return 2
    from fastfeed.bench.report import format_table, write_json
    from fastfeed.bench.session import run_bench

    cfg = BenchConfig(dataset=args.dataset, images=args.images, batch_size=args.batch_size,
                      image_size=args.image_size, decoder=args.decoder, device=args.device, dtype=args.dtype,
                      channels_last=args.channels_last, num_threads=args.num_threads, prefetch=args.prefetch,
                      pipelines=args.pipelines, reader_threads=args.reader_threads,
                      hw_decoder_load=args.hw_decoder_load,
                      train=args.train, steps=args.steps, warmup=args.warmup, max_warmup=args.max_warmup,
                      consumer=args.consumer,
                      compare=args.compare, torch_workers=args.torch_workers, seed=args.seed)
    def note(text: str) -> None:
        print(f"fastfeed bench: {text}", file=sys.stderr)

    try:
        report = run_bench(cfg, progress=not args.no_progress and sys.stderr.isatty(), log=note)
    except (ValueError, FileNotFoundError) as e:
        print(f"fastfeed bench: {e}", file=sys.stderr)
        return 2
    # Everything measured is written even when a baseline failed; the exit status then says the run is partial.
    print(format_table(report))
    if args.json:
        write_json(report, args.json)
        print(f"wrote {args.json}")
    if args.plot:
        from fastfeed.bench.plot import plot_report

        plot_report(report, args.plot)
        print(f"wrote {args.plot}")
    return 1 if report["errors"] else 0
