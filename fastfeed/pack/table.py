"""The per-sample table (`samples.npz`), the rejected report and the manifest: built at the end of a pack.

`samples.npz` columns (all plain dtypes, read with `allow_pickle=False`):
    key U (fixed width), label int64, width/height int32, jpeg uint8 (fastfeed.jpeg kind code), transcoded bool,
    hw_decodable bool (the GPU hardware JPEG decoder takes the stored bytes: fastfeed.jpeg.ImageInfo),
    size int64 (stored image bytes), source U (path relative to the source root, for reports);
    WebDataset only: shard int32, offset int64 (image member data inside the tar, `size` bytes long),
    meta_offset/meta_size int64 (the `.json` member, -1/0 when absent).
"""
from __future__ import annotations

import io
import json
import os

import numpy as np

from fastfeed import jpeg
from fastfeed.pack.writers import atomic_write
from fastfeed.types import MANIFEST_NAME, REJECTED_NAME, SAMPLES_NAME, Manifest

__all__ = ["COLUMNS", "new_rows", "rows_to_table", "write_table", "write_rejected", "write_manifest",
           "image_stats", "jpeg_mix"]

COLUMNS = {
    "key": None, "label": np.int64, "width": np.int32, "height": np.int32, "jpeg": np.uint8,
    "transcoded": np.bool_, "hw_decodable": np.bool_, "size": np.int64, "source": None,
}
WDS_COLUMNS = {"shard": np.int32, "offset": np.int64, "meta_offset": np.int64,
               "meta_size": np.int64}


def new_rows(kind: str) -> dict[str, list]:
    cols = dict(COLUMNS, **(WDS_COLUMNS if kind == "wds" else {}))
    return {c: [] for c in cols}


def rows_to_table(rows: dict[str, list], kind: str) -> dict[str, np.ndarray]:
    cols = dict(COLUMNS, **(WDS_COLUMNS if kind == "wds" else {}))
    out = {}
    for name, dtype in cols.items():
        values = rows[name]
        if dtype is None:  # strings: fixed-width unicode ('<U1' minimum so an empty dataset still has a dtype)
            out[name] = np.array(values, dtype=str) if values else np.zeros(0, dtype="<U1")
        else:
            out[name] = np.asarray(values, dtype=dtype)
    return out


def write_table(folder: str, table: dict[str, np.ndarray]) -> None:
    buf = io.BytesIO()
    np.savez(buf, **table)
    atomic_write(os.path.join(folder, SAMPLES_NAME), buf.getvalue())


def write_rejected(folder: str, rejected: list[dict]) -> None:
    text = "".join(json.dumps(r, ensure_ascii=True, sort_keys=True) + "\n" for r in rejected)
    atomic_write(os.path.join(folder, REJECTED_NAME), text.encode("ascii"))


def write_manifest(folder: str, manifest: Manifest) -> None:
    """Written last: its presence is what makes the folder a dataset."""
    atomic_write(os.path.join(folder, MANIFEST_NAME), manifest.to_json().encode("ascii"))


def _stat(a: np.ndarray) -> dict:
    if a.size == 0:
        return {"min": 0, "mean": 0.0, "max": 0}
    return {"min": int(a.min()), "mean": round(float(a.mean()), 2), "max": int(a.max())}


def image_stats(table: dict[str, np.ndarray], sizes: np.ndarray) -> dict:
    return {
        "width": _stat(table["width"]),
        "height": _stat(table["height"]),
        "bytes": dict(_stat(sizes), total=int(sizes.sum())),
    }


def jpeg_mix(kinds: np.ndarray, hw_decodable: np.ndarray | None = None) -> dict[str, int]:
    """Counts by fastfeed.jpeg kind name, plus `baseline_not_hw` (baseline JPEGs the hardware decoder still
    rejects: CMYK/YCCK/RGB, odd subsampling) when the per-sample `hw_decodable` column is known."""
    counts = np.bincount(kinds.astype(np.int64), minlength=len(jpeg.KIND_NAMES))
    mix = {jpeg.KIND_NAMES[code]: int(counts[code]) for code in sorted(jpeg.KIND_NAMES)}
    if hw_decodable is not None:
        mix["baseline_not_hw"] = int(np.count_nonzero((kinds == jpeg.KIND_BASELINE) & ~hw_decodable.astype(bool)))
    return mix
