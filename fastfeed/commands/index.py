"""`fastfeed index SHARDS [OUT]`: adopt WebDataset shards written by anyone where they lie (fastfeed/pack/index.py):
the manifest, the sample table, checksums and DALI's index files, without rewriting a byte of the shards."""
from __future__ import annotations

import argparse
import sys

from fastfeed.constants import IMAGE_EXTS, ORIENTATIONS

__all__ = ["configure", "run"]


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("shards", help="a folder of .tar shards, a glob ('data/*.tar') or a brace pattern "
                                  "('data/shard-{000000..000099}.tar'), here or at a URL (s3://, gs://, ...)")
    p.add_argument("out", nargs="?", default=None,
                   help="where the dataset's files go (default: the shards' folder; another folder, or for shards "
                        "at a URL another URL, when that one is read-only)")
    p.add_argument("--image-ext", default=None, choices=IMAGE_EXTS, metavar="EXT",
                   help=f"the member that is each sample's image: {', '.join(IMAGE_EXTS)} (default: the first of "
                        "jpg, jpeg, png it has, else the first other image member)")
    p.add_argument("--threads", type=int, default=None, help="shards read side by side (default: cores, at most 8)")
    p.add_argument("--no-scan-check", action="store_true",
                   help="skip the JPEG scan check (faster; a JPEG whose scans leave pixels uncoded is then kept)")
    p.add_argument("--overwrite", action="store_true", help="index again where a dataset already is")
    p.add_argument("--orientation", choices=ORIENTATIONS, default=None,
                   help="the frame the samples' masks are in (semantic segmentation): exif, each image as displayed "
                        "by its EXIF orientation; default: as stored")


def run(args: argparse.Namespace) -> int:
    from fastfeed.pack.index import index_shards
    from fastfeed.types import DatasetError

    try:
        report = index_shards(args.shards, args.out, image_ext=args.image_ext, threads=args.threads,
                              scan_check=not args.no_scan_check, overwrite=args.overwrite,
                              orientation=args.orientation)
    except (DatasetError, ValueError, OSError) as e:
        print(f"fastfeed index: error: {e}", file=sys.stderr)
        return 2
    m = report.manifest
    for r in report.rejected[:20]:
        print(f"rejected {r['source']}: {r['reason']}", file=sys.stderr)
    if len(report.rejected) > 20:
        print(f"... and {len(report.rejected) - 20} more (rejected.jsonl)", file=sys.stderr)
    for shard, why in m.extra.get("no_dali_index", {}).items():
        print(f"warning: {shard}: no DALI index: {why}", file=sys.stderr)
    if m.extra.get("without_cls"):
        print(f"warning: {m.extra['without_cls']} of {m.num_samples} samples have no cls member: their label is -1, "
              "which a classification loss refuses", file=sys.stderr)
    print(f"indexed {m.num_samples} samples in {len(m.shards)} shard(s), {len(m.classes)} classes, fields "
          f"{', '.join(m.fields) or 'none'}; {m.rejected} rejected"
          + (f"; {m.pil_only} decoded by PIL on every path (pil_only)" if m.pil_only else "") + f" -> {report.out}")
    return 0
