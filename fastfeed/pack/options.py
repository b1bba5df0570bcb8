"""What `fastfeed pack` can be asked (PackOptions), checked before any file is read, and what of it the manifest
and a resume's fingerprint record."""
from __future__ import annotations

import os
from dataclasses import asdict, dataclass

from fastfeed.constants import ORIENTATIONS
from fastfeed.image import transcode as _transcode
from fastfeed.pack.base import WRITERS, PackError
from fastfeed.pack.sources import Source
from fastfeed.pack.validate import DEFAULT_MAX_PIXELS

__all__ = ["PackOptions", "resolve_jpeg_mode", "check_options", "check_annotated", "check_out", "recorded_options",
           "NO_TRANSCODER_NOTE", "NO_SCAN_CHECK_NOTE"]

NO_TRANSCODER_NOTE = ("lossless JPEG transcoding unavailable (fastfeed._native built without libjpeg): "
                      "stored original bytes (--jpeg keep); progressive JPEGs will miss the GPU hardware decoder")
NO_SCAN_CHECK_NOTE = ("JPEG scan check skipped (fastfeed._native built without libjpeg): a JPEG whose scans code "
                      "fewer rows than its header claims is stored as is and may decode differently per decoder")


@dataclass(frozen=True)
class PackOptions:
    """Args: format 'wds'|'lmdb'; shard_size in bytes (wds); shuffle_seed None keeps source order; workers threads
    (None: the cores this process may use); jpeg_mode 'keep'|'baseline'|'reencode' (fastfeed.image.transcode.prepare) or
    None for the default ('baseline' when fastfeed.image.transcode.HAVE_TRANSCODE, else 'keep'); quality for
    re-encoding; max_side re-encodes larger images as JPEG at `quality`; scan_check False skips the JPEG scan check
    (validate.py); num_parts/part pack one contiguous 1/K of the plan into OUT/part-NNNNN. Detection sources
    (fastfeed/pack/annotations/): annotations is a COCO instances JSON, classes_file a names file (VOC, YOLO), split
    the YOLO/VOC/ADE20K split to pack; YOLO, VOC and ADE20K folders are recognised under source_kind 'auto'.
    orientation is the frame annotations (boxes, polygons, masks) are in: "exif" (the default: each image as
    displayed) or "ignore" (as stored); the manifest records it and the Loader decodes the images in that frame.
    Segmentation sources: masks is the masks folder of an image folder (fastfeed/pack/annotations/masks.py)."""

    format: str = "wds"
    shard_size: int = 1 << 30
    shuffle_seed: int | None = 0
    workers: int | None = None
    jpeg_mode: str | None = None
    quality: int = 90
    max_side: int | None = None
    max_pixels: int = DEFAULT_MAX_PIXELS
    scan_check: bool = True  # validate.LoadOptions.scan_check: JPEGs whose scans miss pixels are marked pil_only
    source_kind: str = "auto"
    num_parts: int = 1
    part: int = 0
    resume: bool = False
    overwrite: bool = False
    progress: bool = False
    annotations: str | None = None
    classes_file: str | None = None
    split: str | None = None
    masks: str | None = None
    orientation: str | None = None


# Options a classification pack leaves unset: left out of its manifest, whose bytes stay those of earlier versions.
_ANNOTATION_OPTIONS = ("annotations", "classes_file", "split", "masks", "orientation")


def recorded_options(o: PackOptions) -> dict:
    """The options the manifest and a resume's fingerprint record: not how the run went (workers, resume, ...)."""
    return {k: v for k, v in asdict(o).items() if k not in ("resume", "overwrite", "progress", "workers")
            and not (k in _ANNOTATION_OPTIONS and v is None)}


def resolve_jpeg_mode(requested: str | None, have_transcode: bool) -> tuple[str, str | None]:
    """(mode to use, note for the summary/manifest or None). Raises PackError when an explicitly requested mode
    needs the transcoder and it is missing: better to stop at the start than to fail every progressive file."""
    if requested is None:
        return ("baseline", None) if have_transcode else ("keep", NO_TRANSCODER_NOTE)
    if requested not in _transcode.PREPARE_MODES:
        raise PackError(f"--jpeg must be one of {', '.join(_transcode.PREPARE_MODES)}, got {requested!r}")
    if requested != "keep" and not have_transcode:
        raise PackError(f"--jpeg {requested} needs lossless JPEG transcoding, but fastfeed._native was built "
                        f"without libjpeg: install libjpeg-turbo headers (e.g. `apt-get install libjpeg-dev`), "
                        f"rebuild with `python setup.py build_ext --inplace`, or pack with --jpeg keep")
    return requested, None


def check_options(o: PackOptions) -> None:
    if o.format not in WRITERS:
        raise PackError(f"--format must be one of {', '.join(sorted(WRITERS))}, got {o.format!r}")
    if o.shard_size < 4096:
        raise PackError(f"--shard-size {o.shard_size} is too small")
    if o.num_parts < 1:
        raise PackError(f"--num-parts must be >= 1, got {o.num_parts}")
    if not 0 <= o.part < o.num_parts:
        raise PackError(f"--part must be in 0..{o.num_parts - 1}, got {o.part}")
    if o.workers is not None and o.workers < 0:  # 0, like None, means the usable cores
        raise PackError(f"--workers must be >= 1 (or 0: the cores this process may use), got {o.workers}")
    if o.shuffle_seed is not None and o.shuffle_seed < 0:
        raise PackError(f"--shuffle-seed must be >= 0, got {o.shuffle_seed}")
    if o.max_pixels < 1:  # else every image is rejected as a decompression bomb
        raise PackError(f"--max-pixels must be >= 1, got {o.max_pixels}")
    if not 1 <= o.quality <= 100:
        raise PackError(f"--quality must be in 1..100, got {o.quality}")
    if o.max_side is not None and o.max_side < 16:
        raise PackError(f"--max-side must be >= 16, got {o.max_side}")
    if o.resume and o.overwrite:
        raise PackError("--resume and --overwrite contradict each other")
    if o.orientation is not None and o.orientation not in ORIENTATIONS:
        raise PackError(f"--orientation must be one of {', '.join(ORIENTATIONS)}, got {o.orientation!r}")


def check_annotated(src: Source, o: PackOptions) -> None:
    if src.task == "classify" and o.orientation is not None:  # a label has no frame: the Loader's policy decides
        raise PackError(f"--orientation applies to detection and segmentation sources, not to {src.kind} ones")
    if src.task != "classify" and o.max_side is not None:
        # Re-encoding at a smaller size would need every box (and polygon) scaled with it, or every mask stored
        # byte for byte resized: not done.
        what = "boxes" if src.task == "detect" else "masks"
        raise PackError(f"--max-side does not work with annotated ({src.kind}) sources yet: the {what} would have to "
                        f"be scaled with the images; pack without it")
    if src.fields and not WRITERS[o.format].stores_fields:
        raise ValueError(f"members beside the image ({', '.join(src.fields)}: masks, captions) are stored in "
                         f"WebDataset shards; use --format wds (not --format {o.format})")


def check_out(src: str, out: str) -> None:
    """Refuse an OUT that is a file, and an OUT folder at or inside a source folder: a later pack (--resume,
    --overwrite) would scan the earlier output as source files, an ImageFolder would gain OUT as a class, and --resume
    would refuse a changed listing."""
    path = out.rstrip("/") or out  # ("file/" names the file too)
    if "://" not in out and os.path.lexists(path) and not os.path.isdir(path):
        what = "a link to nothing" if not os.path.exists(path) else "a file"
        raise PackError(f"OUT {out} is {what}, not a folder: the dataset is a folder of files; choose another OUT")
    if "://" in src or "://" in out or not os.path.isdir(src):  # URLs: fastfeed/pack/remote.py; a list file
        return
    root, target = os.path.realpath(src), os.path.realpath(out)
    if os.path.commonpath([root, target]) == root:
        raise PackError(f"OUT {out} is SRC {src} or a folder inside it: the pack would read its own output as "
                        "source files; choose an OUT outside SRC")
