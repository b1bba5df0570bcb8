#!/usr/bin/env python3
"""Write the synthetic ImageNet-like JPEG tree; same as `fastfeed demo-data DIR` (see fastfeed/demo_data.py).

    python tools/make_dataset.py data/sample --num-images 20000 --seed 0 --progressive-fraction 0.1
"""
from __future__ import annotations

import argparse
import sys

from fastfeed.commands import demo_data


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="make_dataset.py", description=__doc__.splitlines()[0])
    demo_data.configure(parser)
    return demo_data.run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
