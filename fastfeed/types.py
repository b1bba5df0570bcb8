"""Value types shared by the packer, the readers and the loader.

The on-disk manifest (`OUT/fastfeed.json`) is versioned: a reader refuses any other `FORMAT_VERSION`, so a change
to the layout of shards, `samples.npz` or the LMDB key scheme must bump it.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

__all__ = [
    "FORMAT_VERSION",
    "MANIFEST_NAME",
    "SAMPLES_NAME",
    "REJECTED_NAME",
    "DatasetError",
    "ShardInfo",
    "Manifest",
    "Extents",
    "Sample",
]

FORMAT_VERSION = 1
MANIFEST_NAME = "fastfeed.json"
SAMPLES_NAME = "samples.npz"
REJECTED_NAME = "rejected.jsonl"
KINDS = ("wds", "lmdb")


class DatasetError(ValueError):
    """A folder is not a usable packed dataset (no manifest, wrong version, missing or damaged files)."""


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
    dataset against reading the original files. `jpeg_mix` counts samples by `fastfeed.jpeg` kind name.
    `image_stats` holds min/mean/max of width, height and stored bytes. `part` is `{"index": i, "count": K}`
    for one part of a `--num-parts` pack, None otherwise.
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

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True, ensure_ascii=True) + "\n"

    @classmethod
    def from_json(cls, text: str, where: str = "manifest") -> "Manifest":
        try:
            raw = json.loads(text)
        except ValueError as e:
            raise DatasetError(f"{where}: not valid JSON ({e})") from None
        if not isinstance(raw, dict):
            raise DatasetError(f"{where}: expected a JSON object")
        version = raw.get("version")
        if version != FORMAT_VERSION:
            raise DatasetError(
                f"{where}: format version {version!r}, this fastfeed reads version {FORMAT_VERSION}; re-pack the dataset"
            )
        if raw.get("kind") not in KINDS:
            raise DatasetError(f"{where}: unknown dataset kind {raw.get('kind')!r}")
        try:
            raw["shards"] = [ShardInfo(**s) for s in raw["shards"]]
            return cls(**raw)
        except (TypeError, KeyError) as e:
            raise DatasetError(f"{where}: malformed manifest ({e})") from None


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
