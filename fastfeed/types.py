"""Value types shared by the packer, the readers and the loader.

The on-disk manifest (`OUT/fastfeed.json`) is versioned: a reader refuses versions it does not know
(`READABLE_VERSIONS`), so a change to the layout of shards, `samples.npz` or the LMDB key scheme must bump it.

Version history:
    1  shards/LMDB + samples.npz.
    2  samples.npz gains `checksum` (xxh3_64 of each stored image) and `orientation` (EXIF tag 1..8), LMDB tables
       gain `offset`; the manifest gains `samples_xxh3` (checksum of samples.npz itself) and `changes`.
       Version 1 datasets still open: per-sample checks are then skipped.
    3  detection datasets (manifest `task` "detect", `objects`): each sample's KEY.json member is its annotation
       (fastfeed/targets.py). The layout is version 2's; the number changes so that an older fastfeed refuses
       them instead of reading them as classification. Classification packs are still written as version 2.
    4  shards adopted in place by `fastfeed index` (fastfeed/pack/index.py): samples carry named fields (manifest
       `fields`, table columns `field.NAME.offset/size/checksum`) and the shards may lie outside the folder
       (manifest `data_root`, an absolute path). Packs are still written as version 2 or 3.
    5  semantic segmentation packs (manifest `task` "semantic"): each sample carries its class-id mask as the member
       `KEY.seg.png`, a named field as in version 4 (`fields`, table columns `field.seg.png.offset/size/checksum`);
       the shards are pack's own, in the folder. A new number so that an older fastfeed refuses them rather than
       reading them as classification.
    Classification packs of a list with captions (version 2) carry them as the field `txt` (`KEY.txt`), as
    version 4 does; a fastfeed older than fields refuses them rather than read the images without them.
"""
from __future__ import annotations

import json
import os
import re
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from fastfeed.urls import has_scheme

__all__ = [
    "parse_size",
    "FIELD_NAME",
    "FORMAT_VERSION",
    "DETECT_FORMAT_VERSION",
    "ADOPTED_FORMAT_VERSION",
    "SEMANTIC_FORMAT_VERSION",
    "READABLE_VERSIONS",
    "TASK_VERSIONS",
    "MANIFEST_NAME",
    "SAMPLES_NAME",
    "REJECTED_NAME",
    "DatasetError",
    "ShardInfo",
    "Manifest",
    "Extents",
    "Sample",
    "ImageProfile",
]

FORMAT_VERSION = 2
DETECT_FORMAT_VERSION = 3  # what pack writes for task "detect"
ADOPTED_FORMAT_VERSION = 4  # what `fastfeed index` writes
SEMANTIC_FORMAT_VERSION = 5  # what pack writes for task "semantic"
READABLE_VERSIONS = (1, 2, 3, 4, 5)
TASK_NAMES = ("classify", "detect", "semantic")  # fastfeed.targets.TASKS (a layer above this module)
# The format version a pack of each task writes (what marks the task for readers: only "classify" is unmarked).
TASK_VERSIONS = {"classify": FORMAT_VERSION, "detect": DETECT_FORMAT_VERSION, "semantic": SEMANTIC_FORMAT_VERSION}
MANIFEST_NAME = "fastfeed.json"
SAMPLES_NAME = "samples.npz"
REJECTED_NAME = "rejected.jsonl"
KINDS = ("wds", "lmdb")


class DatasetError(ValueError):
    """A folder is not a usable packed dataset (no manifest, wrong version, missing or damaged files), or one
    sample of it is damaged. The message names the file and, when known, the sample key; both are also
    attributes (`path`, `key`: None when not known) for callers that report them structurally."""

    def __init__(self, message: str, *, path: str | None = None, key: str | None = None):
        super().__init__(message)
        self.path = path
        self.key = key


@dataclass(frozen=True)
class ShardInfo:
    """One data file of a dataset. `path` is relative to the dataset folder."""

    path: str
    bytes: int
    sha256: str
    num_samples: int


@dataclass(frozen=True)
class Manifest:
    """The contents of `fastfeed.json`.

    `source` is the absolute path of the packed image folder (or list file), so benchmarks can compare a packed
    dataset against reading the original files. `jpeg_mix` counts samples by `fastfeed.image.jpeg` kind name.
    `samples_xxh3` is the xxh3_64 (16 hex digits) of `samples.npz`, checked on every open ("" in version 1).
    `changes` counts accepted files whose stored bytes differ from the source, by the validator's change code
    (e.g. "trimmed_trailing_data", "converted_to_png").
    `image_stats` holds min/mean/max of width, height and stored bytes. `part` is `{"index": i, "count": K}`
    for one part of a `--num-parts` pack, None otherwise.
    `task` is what the samples hold: "classify" (a label each), "detect" (an annotation each, version 3) or
    "semantic" (a class-id mask each in its `seg.png` member, version 5, `fields` naming it). For
    "detect", `classes` is the class order of the annotations' labels, `changes` also counts the boxes the Loader
    clips ("clipped_boxes") and drops ("dropped_boxes"), and `objects` holds images with/without objects, objects
    per image (min/mean/max) and per class, and for COCO sources `source_ids` (the category id of each class).
    Both are left out of a classification manifest's JSON, so its bytes are those of earlier versions.
    `fields` (versions 2, 4 and 5) names the members each sample may carry besides its image (webdataset extensions:
    "txt", "json", "npy", ...), and `data_root`, when not "", is the absolute folder the shard paths are relative to
    (shards indexed where they lie, read-only), or the URL of the shards' folder (shards indexed at a URL: read
    through the shard cache, fastfeed/remote/dataset.py); both are left out of the JSON when empty. `pil_only` counts the
    samples only the decode contract's PIL decode reads as stored (samples.npz's `pil_only`; left out when 0).
    """

    kind: str
    num_samples: int
    classes: list[str]
    class_to_idx: dict[str, int]
    shards: list[ShardInfo]
    image_stats: dict[str, Any]
    jpeg_mix: dict[str, int]
    transcoded: int
    rejected: int
    source: str
    source_kind: str
    options: dict[str, Any]
    part: dict[str, int] | None = None
    version: int = FORMAT_VERSION
    created_by: str = ""
    extra: dict[str, Any] = field(default_factory=dict)
    samples_xxh3: str = ""
    changes: dict[str, int] = field(default_factory=dict)
    task: str = "classify"
    objects: dict[str, Any] = field(default_factory=dict)
    fields: list[str] = field(default_factory=list)
    data_root: str = ""
    pil_only: int = 0

    @property
    def annotation_frame(self) -> str:
        """The EXIF policy the annotations (boxes, polygons, masks) are in: `fastfeed pack --orientation`, kept in
        the options ("ignore", the stored pixels, for packs made before the option and for classification)."""
        return (self.options or {}).get("orientation") or "ignore"

    def to_json(self) -> str:
        d = asdict(self)
        if self.task == "classify":
            del d["task"], d["objects"]
        for name in ("fields", "data_root", "pil_only"):
            if not d[name]:
                del d[name]
        return json.dumps(d, indent=2, sort_keys=True, ensure_ascii=True) + "\n"

    @classmethod
    def from_json(cls, text: str, where: str = "manifest") -> "Manifest":
        try:
            raw = json.loads(text)
        except ValueError as e:
            raise DatasetError(f"{where}: not valid JSON ({e})") from None
        if not isinstance(raw, dict):
            raise DatasetError(f"{where}: expected a JSON object")
        version = raw.get("version")
        if version not in READABLE_VERSIONS:
            raise DatasetError(
                f"{where}: format version {version!r}, this fastfeed reads versions "
                f"{', '.join(map(str, READABLE_VERSIONS))}; re-pack the dataset", path=where)
        task = raw.get("task", "classify")
        for marked in ("detect", "semantic"):
            if (version == TASK_VERSIONS[marked]) != (task == marked):
                # Versions 3 and 5 exist to mark their task's datasets: any other pairing is a damaged or hand-made
                # manifest.
                raise DatasetError(f"{where}: format version {version} with task {task!r}: version "
                                   f"{TASK_VERSIONS[marked]} is for {marked} datasets only", path=where)
        if version not in (FORMAT_VERSION, ADOPTED_FORMAT_VERSION, SEMANTIC_FORMAT_VERSION) and raw.get("fields"):
            raise DatasetError(f"{where}: format version {version} with fields {raw.get('fields')!r}: only versions "
                               f"{FORMAT_VERSION} (a list's captions), {ADOPTED_FORMAT_VERSION} (shards adopted by "
                               f"`fastfeed index`) and {SEMANTIC_FORMAT_VERSION} (semantic packs) have fields",
                               path=where)
        if version != ADOPTED_FORMAT_VERSION and raw.get("data_root"):
            raise DatasetError(f"{where}: format version {version} with data root {raw.get('data_root')!r}: only "
                               f"version {ADOPTED_FORMAT_VERSION} (shards adopted by `fastfeed index`) has one",
                               path=where)
        if raw.get("kind") not in KINDS:
            raise DatasetError(f"{where}: unknown dataset kind {raw.get('kind')!r}", path=where)
        try:
            raw["shards"] = [ShardInfo(**s) for s in raw["shards"]]
            m = cls(**raw)
        except (TypeError, KeyError) as e:
            raise DatasetError(f"{where}: malformed manifest ({type(e).__name__}: {e})", path=where) from None
        m._check_types(where)
        return m

    def _check_types(self, where: str) -> None:
        """Readers index arrays with these values: a string or negative count must fail here, by name."""
        def bad(what: str, v) -> DatasetError:
            return DatasetError(f"{where}: malformed manifest ({what} is {v!r})", path=where)

        if not _is_count(self.num_samples):
            raise bad("num_samples", self.num_samples)
        if not _is_count(self.pil_only):
            raise bad("pil_only", self.pil_only)
        if not isinstance(self.classes, list) or not all(isinstance(c, str) for c in self.classes):
            raise bad("classes", self.classes)
        if not isinstance(self.samples_xxh3, str) or not isinstance(self.changes, dict):
            raise bad("samples_xxh3/changes", (self.samples_xxh3, self.changes))
        if self.task not in TASK_NAMES or not isinstance(self.objects, dict):
            raise bad("task/objects", (self.task, self.objects))
        names_ok = isinstance(self.fields, list) and all(isinstance(f, str) and FIELD_NAME.fullmatch(f)
                                                         for f in self.fields)
        if not names_ok or len(set(self.fields)) != len(self.fields):
            raise bad("fields", self.fields)
        if not isinstance(self.data_root, str) or (self.data_root and not os.path.isabs(self.data_root)
                                                   and not has_scheme(self.data_root)):
            raise bad("data_root (an absolute folder, a URL or \"\")", self.data_root)
        for s in self.shards:
            if not (isinstance(s.path, str) and s.path and _is_count(s.bytes) and isinstance(s.sha256, str)
                    and _is_count(s.num_samples)):
                raise bad("a shard entry", asdict(s))


# A field is a webdataset member extension: lower case, dot-separated words ("txt", "seg.png"). fastfeed index
# rejects a member whose extension is not one.
FIELD_NAME = re.compile(r"[a-z0-9_-]+(\.[a-z0-9_-]+)*")


def _is_count(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


@dataclass(frozen=True)
class Extents:
    """Where each sample's encoded image bytes sit: sample i is `size[i]` bytes at `offset[i]` of
    `paths[file_index[i]]`. The native ring `pread`s exactly these ranges."""

    paths: list[str]
    file_index: np.ndarray  # int32[N]
    offset: np.ndarray  # int64[N]
    size: np.ndarray  # int64[N]

    def __len__(self) -> int:
        return int(self.offset.shape[0])


@dataclass(frozen=True)
class Sample:
    """One sample as yielded by iterating a dataset: the encoded image bytes, untouched."""

    key: str
    data: bytes
    label: int
    metadata: dict | None


@dataclass(frozen=True)
class ImageProfile:
    """What a dataset's sample table says about its images, for the Loader's choices that depend on them
    (fastfeed/loader/settings.py): the median stored size, the share of samples the GPU's hardware JPEG decoder cannot
    take (PNG, progressive or CMYK JPEGs, ...), which DALI decodes with CPU threads, the stored (width, height) of
    the sample at the 99th percentile of pixels: the size a batch's largest images have, but for rare outliers, and
    the share of samples only the decode contract's PIL decode reads (samples.npz `pil_only`: TIFF, 16-bit, ...)."""

    median_pixels: float
    cpu_decode_share: float
    large_size: tuple[int, int] = (0, 0)
    pil_only_share: float = 0.0


def parse_size(text: str) -> int:
    """'64MB' -> 64_000_000, '1GiB' -> 2**30, '512K' -> 512 * 2**10, '1000' -> 1000 bytes."""
    s = str(text).strip().replace(" ", "")
    units = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
             "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40,
             "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}
    i = len(s)
    while i and not (s[i - 1].isdigit() or s[i - 1] == "."):
        i -= 1
    num, unit = s[:i], s[i:].upper()
    if unit not in units or not num:
        raise ValueError(f"cannot parse size {text!r}: use e.g. 64MB, 1GiB, 500000")
    try:
        value = float(num)
    except ValueError:
        raise ValueError(f"cannot parse size {text!r}") from None
    if not value > 0 or value == float("inf"):  # (NaN fails `> 0`)
        raise ValueError(f"size must be a positive finite number, got {text!r}")
    return int(value * units[unit])
