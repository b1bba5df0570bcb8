"""`fastfeed pack SRC OUT`: see fastfeed/pack/run.py."""
from __future__ import annotations

import argparse
import os
import sys

__all__ = ["configure", "run"]


def configure(p: argparse.ArgumentParser) -> None:
    from fastfeed.constants import ORIENTATIONS
    from fastfeed.image.transcode import PREPARE_MODES
    from fastfeed.pack.annotations import ALL_KINDS
    from fastfeed.pack.options import PackOptions
    from fastfeed.pack.remote import add_arguments as remote_arguments
    from fastfeed.types import KINDS

    p.add_argument("src", help="ImageFolder tree, flat folder of images, a .csv/.jsonl list (path,label[,metadata]), "
                               "or a detection dataset: YOLO folder (images/ + labels/), Pascal VOC folder "
                               "(Annotations/ + JPEGImages/), COCO image folder with --annotations; or a segmentation "
                               "dataset: ADE20K-style folder (images/ + annotations/), Cityscapes folder (leftImg8bit/ "
                               "+ gtFine/), VOC folder with --source voc-seg (JPEGImages/ + SegmentationClass/), image "
                               "folder with --masks")
    p.add_argument("out", help="output folder or fsspec URL (s3://bucket/prefix, gs://...)")
    p.add_argument("--format", choices=KINDS, default=PackOptions.format, help="WebDataset tar shards or LMDB")
    p.add_argument("--source", choices=ALL_KINDS, default=PackOptions.source_kind,
                   help="how to read SRC (auto: guess from SRC)")
    p.add_argument("--annotations", default=None, metavar="FILE",
                   help="COCO instances JSON for the images in SRC: packs a detection dataset (format version 3)")
    p.add_argument("--classes", default=None, metavar="FILE",
                   help="class names, one per line, in label order (VOC: else the sorted names seen; YOLO: else "
                        "data.yaml's names; YOLO also takes a data.yaml kept apart, e.g. ultralytics' coco128.yaml)")
    p.add_argument("--split", default=None, metavar="NAME",
                   help="YOLO: pack images/NAME + labels/NAME, NAME/images + NAME/labels, or the folders data.yaml's "
                        "NAME key (train, val, test) names; VOC: the ids of ImageSets/Main/NAME.txt (voc-seg: "
                        "ImageSets/Segmentation/NAME.txt); ADE20K: images/NAME + annotations/NAME; Cityscapes: "
                        "leftImg8bit/NAME + gtFine/NAME")
    p.add_argument("--masks", default=None, metavar="FOLDER",
                   help="class-id masks of the images in SRC, laid out as they are (SRC/a/b.jpg -> FOLDER/a/b.png): "
                        "packs a semantic segmentation dataset, each mask stored as its image's .seg.png member")
    p.add_argument("--orientation", choices=ORIENTATIONS, default=None,
                   help="detection and segmentation sources: the frame the boxes and masks are in: exif (the "
                        "default) each image as displayed by its EXIF orientation, as labelling tools show it and "
                        "ultralytics reads it; ignore: the pixels as stored. The Loader decodes the images in it")
    p.add_argument("--shard-size", default="1GiB", help="target shard size for wds, e.g. 64MB, 1GiB")
    p.add_argument("--shuffle-seed", type=int, default=PackOptions.shuffle_seed, help="pack-time shuffle seed")
    p.add_argument("--no-shuffle", action="store_true", help="keep the sorted source order")
    p.add_argument("--workers", type=int, default=None, help="reader threads (default: the cores this process may use)")
    p.add_argument("--jpeg", choices=PREPARE_MODES, default=None,
                   help="baseline (default when built with libjpeg, else keep): losslessly transcode progressive/"
                        "arithmetic JPEGs to baseline for the GPU hardware decoder (identical pixels); keep: store "
                        "bytes untouched; reencode: also re-encode, lossily, what that decoder cannot take "
                        "(see fastfeed/image/transcode.py)")
    p.add_argument("--quality", type=int, default=PackOptions.quality, help="JPEG quality for re-encoded images")
    p.add_argument("--max-side", type=int, default=None,
                   help="re-encode images whose longer side exceeds N pixels to JPEG at --quality")
    p.add_argument("--max-pixels", type=int, default=PackOptions.max_pixels,
                   help="reject images with more pixels than this (decompression bombs)")
    p.add_argument("--no-scan-check", action="store_true",
                   help="skip the JPEG scan check (an entropy-decoding pass per JPEG: the bulk of pack's CPU time); "
                        "JPEGs whose scans code fewer pixels than their header claims are then not marked for PIL's "
                        "decode and decode differently per decoder (see fastfeed/pack/validate.py)")
    p.add_argument("--num-parts", type=int, default=PackOptions.num_parts,
                   help="split the pack into K parts (then `fastfeed merge`)")
    p.add_argument("--part", type=int, default=PackOptions.part, help="which part (0..K-1) this process packs")
    p.add_argument("--resume", action="store_true", help="finish an interrupted pack in OUT")
    p.add_argument("--overwrite", action="store_true", help="replace fastfeed's files in OUT")
    p.add_argument("--strict", action="store_true", help="exit with status 1 if any file was rejected")
    p.add_argument("--quiet", action="store_true", help="no progress bar and no summary line")
    remote_arguments(p)  # hook: --engine, --ray-address, --staging (fastfeed/pack/remote.py)


def _demo_marker(src: str) -> int:
    """1 when SRC is a `fastfeed demo-data` folder: its own marker file is hidden on purpose, not worth a notice."""
    from fastfeed.demo_data import MARKER_NAME

    return int(os.path.isfile(os.path.join(src, MARKER_NAME)))


def run(args: argparse.Namespace) -> int:
    from fastfeed.pack import PackError, PackOptions, parse_size
    from fastfeed.pack.remote import pack_any as _remote_pack

    try:
        opts = PackOptions(
            format=args.format,
            shard_size=parse_size(args.shard_size),
            shuffle_seed=None if args.no_shuffle else args.shuffle_seed,
            workers=args.workers,
            jpeg_mode=args.jpeg,
            quality=args.quality,
            max_side=args.max_side,
            max_pixels=args.max_pixels,
            scan_check=not args.no_scan_check,
            source_kind=args.source,
            num_parts=args.num_parts,
            part=args.part,
            resume=args.resume,
            overwrite=args.overwrite,
            progress=not args.quiet and sys.stderr.isatty(),
            annotations=args.annotations,
            classes_file=args.classes,
            split=args.split,
            masks=args.masks,
            orientation=args.orientation,
        )
        result = _remote_pack(args.src, args.out, opts, engine=args.engine, ray_address=args.ray_address,
                              staging=args.staging)  # hook: URLs and --engine ray (fastfeed/pack/remote.py)
    except (PackError, ValueError, OSError) as e:
        print(f"fastfeed pack: error: {e}", file=sys.stderr)
        return 2
    if not args.quiet:
        print(result.summary())
        if result.rejected:
            print(f"rejected files are listed with reasons in {result.folder}/rejected.jsonl", file=sys.stderr)
        hidden = result.hidden_skipped - _demo_marker(args.src)
        if hidden:
            print(f"skipped {hidden} hidden entries (names starting with '.')", file=sys.stderr)
    if args.strict and result.rejected:
        print(f"fastfeed pack: --strict: {len(result.rejected)} file(s) rejected", file=sys.stderr)
        return 1
    return 0
