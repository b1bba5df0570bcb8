"""The per-sample table (`samples.npz`), the rejected report and the manifest: built at the end of a pack.

`samples.npz` columns (all plain dtypes, read with `allow_pickle=False`):
    key U (fixed width), label int64, width/height int32, jpeg uint8 (fastfeed.image.jpeg kind code), transcoded bool,
    hw_decodable bool (the GPU hardware JPEG decoder takes the stored bytes: fastfeed.image.jpeg.ImageInfo),
    size int64 (stored image bytes), source U (path relative to the source root, for reports),
    checksum uint64 (xxh3_64 of the stored image bytes: fastfeed.formats.integrity.checksum),
    orientation uint8 (EXIF orientation tag 1..8 of the stored image, 1 when absent or not a JPEG),
    change U (the validator's change code when the stored bytes differ from the source file, "" otherwise),
    pil_only bool (only the decode contract's PIL decode reads the stored image as the contract says: a CMYK or
    RGB-colour JPEG, a 16-bit or transparent PNG, a TIFF, ...; pack/validate.py. The Loader routes it there);
    WebDataset only: shard int32, offset int64 (image member data inside the tar, `size` bytes long),
    meta_offset/meta_size int64 (the `.json` member, -1/0 when absent); per field (a semantic pack's `seg.png`
    mask, fastfeed/formats/fields.py `columns`): field.NAME.offset/size int64 (the member's data in the tar) and
    field.NAME.checksum uint64 (its xxh3_64);
    LMDB only: offset int64 (the `img/KEY` value's offset inside data.mdb, resolved when the pack finishes).

The file is a plain .npz written with fixed zip timestamps, so the same pack gives the same bytes (and the same
checksum in the manifest) every time.
"""
from __future__ import annotations

import collections
import io
import json
import os
import zipfile

import numpy as np

from fastfeed.formats.fields import columns
from fastfeed.formats.integrity import xxh3_hex
from fastfeed.image import jpeg
from fastfeed.pack.annotations import box_change_counts
from fastfeed.pack.base import PackError
from fastfeed.pack.writers import atomic_write
from fastfeed.types import MANIFEST_NAME, REJECTED_NAME, SAMPLES_NAME, TASK_VERSIONS, Manifest

__all__ = ["COLUMNS", "table_columns", "new_rows", "rows_to_table", "write_table", "write_rejected", "write_manifest",
           "write_dataset", "table_bytes", "change_counts", "image_stats", "jpeg_mix", "jpeg_extra", "MAX_NOTES",
           "NothingPacked"]

COLUMNS = {
    "key": None, "label": np.int64, "width": np.int32, "height": np.int32, "jpeg": np.uint8,
    "transcoded": np.bool_, "hw_decodable": np.bool_, "size": np.int64, "source": None,
    "checksum": np.uint64, "orientation": np.uint8, "change": None, "pil_only": np.bool_,
}


def table_columns(fmt: type, fields=()) -> dict:
    """A format writer's own columns (`FormatWriter.columns`) and those of the dataset's fields (`fields`: a
    semantic pack's mask member), name -> dtype: what new_rows and rows_to_table take."""
    cols = dict(fmt.columns)
    for name in fields:
        off, size, check = columns(name)
        cols.update({off: np.int64, size: np.int64, check: np.uint64})
    return cols


def new_rows(format_columns: dict) -> dict[str, list]:
    """Empty row lists for the common columns plus a format's own (`FormatWriter.columns`)."""
    return {c: [] for c in dict(COLUMNS, **format_columns)}


def rows_to_table(rows: dict[str, list], format_columns: dict) -> dict[str, np.ndarray]:
    cols = dict(COLUMNS, **format_columns)
    out = {}
    for name, dtype in cols.items():
        values = rows[name]
        if dtype is None:  # strings: fixed-width unicode ('<U1' minimum so an empty dataset still has a dtype)
            out[name] = np.array(values, dtype=str) if values else np.zeros(0, dtype="<U1")
        else:
            out[name] = np.asarray(values, dtype=dtype)
    return out


def table_bytes(table: dict[str, np.ndarray]) -> bytes:
    """The .npz bytes `np.savez` would write, minus its wall-clock zip timestamps (reproducible output)."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED, allowZip64=True) as z:
        for name, arr in table.items():
            info = zipfile.ZipInfo(f"{name}.npy", date_time=(1980, 1, 1, 0, 0, 0))
            with z.open(info, "w", force_zip64=True) as f:
                np.lib.format.write_array(f, np.asanyarray(arr), allow_pickle=False)
    return buf.getvalue()


def write_table(folder: str, table: dict[str, np.ndarray]) -> str:
    """Write samples.npz; returns its xxh3_64 hex digest for the manifest."""
    data = table_bytes(table)
    atomic_write(os.path.join(folder, SAMPLES_NAME), data)
    return xxh3_hex(data)


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
    """Counts by fastfeed.image.jpeg kind name, plus `baseline_not_hw` (baseline JPEGs the hardware decoder still
    rejects: CMYK/YCCK/RGB, odd subsampling) when the per-sample `hw_decodable` column is known."""
    counts = np.bincount(kinds.astype(np.int64), minlength=len(jpeg.KIND_NAMES))
    mix = {jpeg.KIND_NAMES[code]: int(counts[code]) for code in sorted(jpeg.KIND_NAMES)}
    if hw_decodable is not None:
        mix["baseline_not_hw"] = int(np.count_nonzero((kinds == jpeg.KIND_BASELINE) & ~hw_decodable.astype(bool)))
    return mix


def change_counts(changes: np.ndarray | None) -> dict[str, int]:
    """{change code: samples} over the `change` column ("" = unchanged, not counted)."""
    if changes is None or not len(changes):
        return {}
    codes, counts = np.unique(changes, return_counts=True)
    return {str(c): int(n) for c, n in zip(codes, counts) if c}


MAX_NOTES = 1000  # transcode_failed entries listed in the manifest (all are counted)


def jpeg_extra(transcoded: int, notes: list[dict], failed: int) -> dict:
    """The manifest's `extra`: what --jpeg did, by action (samples.npz `transcoded` says which samples changed),
    and the first MAX_NOTES of the `failed` files libjpeg found corrupt (stored untouched), in plan order."""
    return {"jpeg_actions": {"transcoded": int(transcoded), "transcode_failed": int(failed)},
            "transcode_failed": list(notes[:MAX_NOTES])}


class NothingPacked(PackError):
    """A pack (or merge) that stored no sample: rejected.jsonl is written, so that the reasons can be read, and
    nothing else; a folder with a manifest is a dataset every reader opens and `fastfeed verify` passes."""

    def __init__(self, folder: str, rejected: list[dict]):
        self.folder = folder
        if not rejected:
            why = "the source holds no file to pack"
        else:
            counts = collections.Counter(str(r.get("reason")) for r in rejected).most_common()
            top = "; ".join(f"{n} x {reason}" for reason, n in counts[:_TOP_REASONS])
            more = f"; {len(counts) - _TOP_REASONS} other reason(s)" if len(counts) > _TOP_REASONS else ""
            why = (f"every file was rejected ({top}{more}); {os.path.join(folder, REJECTED_NAME)} gives the reason "
                   f"for each")
        super().__init__(f"nothing was packed: {why}; no dataset was written")


_TOP_REASONS = 3  # the commonest rejection reasons a NothingPacked message quotes


def write_dataset(folder: str, kind: str, table: dict[str, np.ndarray], shards: list, rejected: list[dict], *,
                  classes: list[str], class_to_idx: dict[str, int], source: str, source_kind: str, options: dict,
                  part: dict | None, created_by: str, extra: dict, task: str = "classify",
                  objects: dict | None = None, fields: list[str] | None = None, data_root: str = "",
                  version: int | None = None) -> Manifest:
    """The one manifest builder (pack and merge): write samples.npz and rejected.jsonl, derive every count and
    statistic from the table, and write the manifest last (its presence makes the folder a dataset).
    task "detect": format version 3; `objects` is pack.annotations.annotation_stats(...); the box counts of
    `changes` come from the rejected records (pack.annotations.sample_issues), so pack and merge agree.
    task "semantic": format version 5, `fields` names the mask member. `fields`, `data_root`, `version`: shards
    adopted by `fastfeed index` (format version 4, fastfeed/types.py).
    A dataset (`part` None) without a sample is never written: NothingPacked, after rejected.jsonl. A part may be
    empty (its slice of the plan all rejected, or fewer files than parts): the merge of all of them decides."""
    if part is None and not len(table["key"]):
        write_rejected(folder, rejected)
        raise NothingPacked(folder, rejected)
    samples_xxh3 = write_table(folder, table)
    write_rejected(folder, rejected)
    changes = change_counts(table.get("change"))
    if task == "detect":
        changes.update(box_change_counts(rejected))
    manifest = Manifest(
        kind=kind,
        num_samples=int(len(table["key"])),
        classes=list(classes),
        class_to_idx=dict(class_to_idx),
        shards=list(shards),
        image_stats=image_stats(table, table["size"]),
        jpeg_mix=jpeg_mix(table["jpeg"], table.get("hw_decodable")),
        transcoded=int(table["transcoded"].sum()),
        rejected=len(rejected),
        source=source,
        source_kind=source_kind,
        options=options,
        part=part,
        created_by=created_by,
        extra=extra,
        samples_xxh3=samples_xxh3,
        changes=changes,
        version=version or TASK_VERSIONS[task],
        task=task,
        objects=dict(objects or {}),
        fields=list(fields or []),
        data_root=data_root,
        pil_only=int(np.count_nonzero(table["pil_only"])),
    )
    write_manifest(folder, manifest)
    return manifest
