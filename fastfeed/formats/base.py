"""What every packed-dataset reader offers, and the checks every reader runs when it opens a folder.

A folder is a dataset only when `fastfeed.json` exists (the packer writes it last), carries this fastfeed's
`FORMAT_VERSION`, and every data file it lists exists with the recorded size. Checksums are not recomputed on
open (that reads every byte); `fastfeed verify` does that.

Readers are not fork-safe once they have read data (open file handles, LMDB transactions): open them in the
process that reads, or call `close()` before forking.
"""
from __future__ import annotations

import os
from typing import Iterator, Protocol, runtime_checkable

import numpy as np

from fastfeed.types import MANIFEST_NAME, SAMPLES_NAME, DatasetError, Extents, Manifest, Sample

__all__ = ["Dataset", "TableDataset", "load_manifest", "load_table"]


@runtime_checkable
class Dataset(Protocol):
    manifest: Manifest

    def __len__(self) -> int: ...
    @property
    def labels(self) -> np.ndarray: ...
    @property
    def classes(self) -> list[str]: ...
    @property
    def keys(self) -> np.ndarray: ...
    @property
    def widths(self) -> np.ndarray: ...
    @property
    def heights(self) -> np.ndarray: ...
    def read(self, i: int) -> bytes: ...
    def metadata(self, i: int) -> dict | None: ...
    def extents(self) -> Extents: ...
    def __iter__(self) -> Iterator[Sample]: ...
    def close(self) -> None: ...


def load_manifest(root: str) -> Manifest:
    path = os.path.join(root, MANIFEST_NAME)
    if not os.path.isdir(root):
        raise DatasetError(f"{root}: not a folder")
    if not os.path.exists(path):
        hint = ""
        if os.path.isdir(os.path.join(root, ".fastfeed-pack")):
            hint = " (an interrupted pack: finish it with `fastfeed pack ... --resume`)"
        elif any(n.startswith("part-") for n in os.listdir(root)):
            hint = " (packed in parts: join them with `fastfeed merge`)"
        raise DatasetError(f"{root}: no {MANIFEST_NAME}, so this is not a complete fastfeed dataset{hint}")
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as e:
        raise DatasetError(f"{path}: unreadable ({e})") from None
    manifest = Manifest.from_json(text, where=path)
    for shard in manifest.shards:
        p = os.path.join(root, shard.path)
        try:
            size = os.path.getsize(p)
        except OSError:
            raise DatasetError(f"{root}: data file {shard.path} listed in the manifest is missing") from None
        if size != shard.bytes:
            raise DatasetError(f"{root}: data file {shard.path} is {size} bytes, the manifest says {shard.bytes} "
                               f"(truncated or modified; run `fastfeed verify`)")
    return manifest


def load_table(root: str, manifest: Manifest, required: tuple[str, ...]) -> dict[str, np.ndarray]:
    path = os.path.join(root, SAMPLES_NAME)
    try:
        with np.load(path, allow_pickle=False) as z:
            table = {k: z[k] for k in z.files}
    except (OSError, ValueError) as e:
        raise DatasetError(f"{path}: unreadable sample table ({e})") from None
    missing = [c for c in required if c not in table]
    if missing:
        raise DatasetError(f"{path}: missing columns {missing}")
    n = {len(v) for v in table.values()}
    if n != {manifest.num_samples} and not (manifest.num_samples == 0 and n <= {0}):
        raise DatasetError(f"{path}: column lengths {sorted(n)} differ from the manifest's {manifest.num_samples}")
    return table


class TableDataset:
    """The part of a reader that comes from the manifest and `samples.npz`; formats add the byte access."""

    REQUIRED = ("key", "label", "width", "height", "jpeg", "transcoded", "size")

    def __init__(self, root: str, kind: str, extra_columns: tuple[str, ...] = ()):
        self.root = os.path.abspath(root)
        self.manifest = load_manifest(self.root)
        if self.manifest.kind != kind:
            raise DatasetError(f"{root}: a {self.manifest.kind!r} dataset, not {kind!r}")
        self._table = load_table(self.root, self.manifest, self.REQUIRED + extra_columns)

    def __len__(self) -> int:
        return self.manifest.num_samples

    @property
    def labels(self) -> np.ndarray:
        return self._table["label"]

    @property
    def classes(self) -> list[str]:
        return list(self.manifest.classes)

    @property
    def keys(self) -> np.ndarray:
        return self._table["key"]

    @property
    def widths(self) -> np.ndarray:
        return self._table["width"]

    @property
    def heights(self) -> np.ndarray:
        return self._table["height"]

    @property
    def sizes(self) -> np.ndarray:
        return self._table["size"]

    @property
    def jpeg_kinds(self) -> np.ndarray:
        return self._table["jpeg"]

    @property
    def transcoded(self) -> np.ndarray:
        return self._table["transcoded"]

    @property
    def sources(self) -> np.ndarray | None:
        return self._table.get("source")

    def _index(self, i: int) -> int:
        n = len(self)
        i = int(i)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(f"sample index {i} out of range for {n} samples")
        return i

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:  # overridden by formats holding resources
        pass

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.root!r}, {len(self)} samples, {len(self.manifest.classes)} classes)"
