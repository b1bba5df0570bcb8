"""`fastfeed verify`: check that a packed dataset is exactly what the packer wrote, and (full mode) that every image
decodes the way the Loader decodes it.

Quick mode (`quick=True`, no decoding):
  - the manifest and samples.npz (its checksum, column sanity, extents inside the data files): `open_dataset`;
  - every data file's sha256 against the manifest;
  - WebDataset: each shard's `.idx` (DALI reads it: a wrong offset there means wrong bytes on the DALI path) and
    each image's tar header against samples.npz (name, offset, size), each `.cls` member against the label;
  - LMDB: each `cls/KEY` record against the label and each `img/KEY` size, walked only when data.mdb matches its
    sha256 (liblmdb trusts its pages: a damaged file can make it crash, so it is not handed one);
  - every sample's bytes against its xxh3 checksum (format version 2; version 1 datasets have none: skipped, and
    the report says so).
Full mode adds a decode of every image with the Loader's CPU decoder (`fastfeed.decode.cpu.decode_rgb`), under
the pixel limit the pack used. PIL warnings are not errors: what the Loader decodes, verify accepts.

Every problem names the file and the sample key (and source path), so the bad original can be found. `verify`
raises DatasetError only when the dataset cannot be opened at all; everything else lands in the report.
"""
from __future__ import annotations

import io
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from fastfeed.formats import open_dataset
from fastfeed.formats.integrity import checksum, sha256_file
from fastfeed.formats.lmdb import cls_key, img_key
from fastfeed.pack.validate import DEFAULT_MAX_PIXELS
from fastfeed.types import DatasetError

__all__ = ["VerifyReport", "verify"]

_DECODE_SIZE = 16  # the decoder's output size: small, the point is the full decode of the source


@dataclass
class VerifyReport:
    path: str
    num_samples: int = 0
    num_files: int = 0
    quick: bool = False
    errors: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # checks that were skipped, and why
    checked: list[str] = field(default_factory=list)  # what was checked, for the summary line

    @property
    def ok(self) -> bool:
        return not self.errors


def verify(path: str, workers: int | None = None, decode: bool = True, quick: bool | None = None) -> VerifyReport:
    """Check the dataset at `path` (see the module docstring). `quick=True` (or `decode=False`) skips decoding.
    Never raises on corruption found after the dataset opened: everything is in the report's `errors`."""
    quick = (not decode) if quick is None else quick
    report = VerifyReport(path, quick=quick)
    with open_dataset(path) as ds:
        report.num_samples = len(ds)
        report.num_files = len(ds.manifest.shards)
        report.checked.append("manifest and sample table")
        damaged = _check_files(ds, report)
        if ds.manifest.kind == "wds":
            _check_wds_layout(ds, report)
        else:
            _check_lmdb_records(ds, report, damaged)
        good = _check_samples(ds, report)
        if not quick:
            _decode_all(ds, report, good, workers)
    return report


def _name(ds, i: int) -> str:
    src = ds.sources
    return f"key {ds.keys[i]} (sample {i}" + (f", source {src[i]})" if src is not None else ")")


def _check_files(ds, report: VerifyReport) -> set[str]:
    damaged = set()
    for shard in ds.manifest.shards:
        digest = sha256_file(os.path.join(ds.root, shard.path))
        if digest != shard.sha256:
            damaged.add(shard.path)
            report.errors.append(f"{shard.path}: sha256 {digest[:16]}... differs from the manifest's "
                                 f"{shard.sha256[:16]}... (file modified or corrupted)")
    report.checked.append("file sha256")
    return damaged


# ---- WebDataset: .idx, tar headers, .cls ----------------------------------------------------------------------


def _tar_header(block: bytes) -> tuple[str, int] | None:
    """(member name, size) of a ustar header block, None when its checksum is wrong or a field is garbage."""
    if len(block) != 512:
        return None
    stored = block[148:156].split(b"\0")[0].strip()
    try:
        want = int(stored, 8)
        size = int(block[124:136].split(b"\0")[0].strip() or b"0", 8)
    except ValueError:
        return None
    if sum(block[:148]) + 8 * 32 + sum(block[156:]) != want:
        return None
    return block[:100].split(b"\0")[0].decode("utf-8", "replace"), size


def _check_wds_layout(ds, report: VerifyReport) -> None:
    t = ds._table
    for s_idx, shard in enumerate(ds.manifest.shards):
        tar_path = os.path.join(ds.root, shard.path)
        idx_rel = shard.path[: -len(".tar")] + ".idx"
        rows = np.flatnonzero(t["shard"] == s_idx)
        rows = rows[np.argsort(t["offset"][rows], kind="stable")]
        try:
            with open(os.path.join(ds.root, idx_rel), encoding="utf-8") as f:
                lines = f.read().splitlines()
        except (OSError, UnicodeDecodeError) as e:
            report.errors.append(f"{idx_rel}: unreadable DALI index ({e})")
            lines = None
        if lines is not None:
            head = lines[0].split() if lines else []
            if len(head) != 2 or head[1] != str(len(rows)) or len(lines) - 1 != len(rows):
                report.errors.append(f"{idx_rel}: header {lines[0] if lines else ''!r} and {len(lines) - 1} "
                                     f"entries, samples.npz has {len(rows)} samples in {shard.path}")
        with open(tar_path, "rb") as f:
            fd = f.fileno()
            for n, i in enumerate(rows.tolist()):
                key, off, size = str(t["key"][i]), int(t["offset"][i]), int(t["size"][i])
                if lines is not None and n + 1 < len(lines):
                    _check_idx_line(ds, report, idx_rel, lines[n + 1], i)
                hdr = _tar_header(os.pread(fd, 512, off - 512)) if off >= 512 else None
                if hdr is None or hdr[1] != size or not hdr[0].startswith(key + "."):
                    report.errors.append(f"{shard.path}: {_name(ds, i)}: tar header before offset {off} is "
                                         f"{'damaged' if hdr is None else repr(hdr)}, samples.npz says "
                                         f"{key}.* of {size} bytes")
                    continue
                cls_at = off + size + (-size % 512)
                chdr = _tar_header(os.pread(fd, 512, cls_at))
                if chdr is None or chdr[0] != f"{key}.cls":
                    report.errors.append(f"{shard.path}: {_name(ds, i)}: no intact {key}.cls member after the image")
                    continue
                raw = os.pread(fd, chdr[1], cls_at + 512)
                if raw.strip() != b"%d" % int(t["label"][i]):
                    report.errors.append(f"{shard.path}: {_name(ds, i)}: {key}.cls holds {raw[:20]!r}, samples.npz "
                                         f"says label {int(t['label'][i])}")
    report.checked.append("DALI indexes, tar headers and .cls labels")


def _check_idx_line(ds, report: VerifyReport, idx_rel: str, line: str, i: int) -> None:
    t = ds._table
    key = str(t["key"][i])
    f = line.split()
    members = {f[j]: (f[j + 1], f[j + 2], f[j + 3]) for j in range(0, len(f) - 3, 4)}
    want = {"cls"}
    if int(t["meta_offset"][i]) >= 0:
        want.add("json")
    img = [e for e in members if e not in ("cls", "json")]
    problem = None
    if len(f) % 4 or not want <= set(members) or len(img) != 1:
        problem = f"entry {line!r} lacks members"
    else:
        off, size, name = members[img[0]]
        if (off, size, name) != (str(t["offset"][i]), str(t["size"][i]), f"{key}.{img[0]}"):
            problem = (f"says {name} at offset {off}, {size} bytes; samples.npz says offset {t['offset'][i]}, "
                       f"{t['size'][i]} bytes")
        elif "json" in want and members["json"][:2] != (str(t["meta_offset"][i]), str(t["meta_size"][i])):
            problem = "metadata member offset/size differ from samples.npz"
    if problem:
        report.errors.append(f"{idx_rel}: {_name(ds, i)}: {problem}")


# ---- LMDB: cls/ and img/ records --------------------------------------------------------------------------------


def _check_lmdb_records(ds, report: VerifyReport, damaged: set[str]) -> None:
    if damaged:
        report.notes.append("LMDB records not cross-checked: data.mdb does not match its sha256, and liblmdb is not "
                            "safe to walk on damaged pages (the per-sample checksums name the damaged images)")
        return
    import lmdb

    t = ds._table
    env_path = os.path.join(ds.root, "data.lmdb")
    try:
        env = lmdb.open(env_path, readonly=True, lock=False, subdir=True, readahead=False)
    except lmdb.Error as e:
        report.errors.append(f"data.lmdb: cannot open ({e})")
        return
    try:
        with env.begin(buffers=True) as txn:
            for i, k in enumerate(t["key"].tolist()):
                img = txn.get(img_key(k))
                cls = txn.get(cls_key(k))
                if img is None or len(img) != int(t["size"][i]):
                    report.errors.append(f"data.lmdb/data.mdb: {_name(ds, i)}: img/{k} is "
                                         f"{'missing' if img is None else f'{len(img)} bytes'}, samples.npz says "
                                         f"{int(t['size'][i])} bytes")
                if cls is None or bytes(cls).strip() != b"%d" % int(t["label"][i]):
                    report.errors.append(f"data.lmdb/data.mdb: {_name(ds, i)}: cls/{k} holds "
                                         f"{None if cls is None else bytes(cls)[:20]!r}, samples.npz says label "
                                         f"{int(t['label'][i])}")
    except lmdb.Error as e:
        report.errors.append(f"data.lmdb/data.mdb: damaged LMDB environment ({e})")
    finally:
        env.close()
    report.checked.append("LMDB labels and sizes")


# ---- per-sample checksums and decode ----------------------------------------------------------------------------


def _check_samples(ds, report: VerifyReport) -> list[int]:
    """Read every sample and check its checksum; returns the samples whose bytes are as packed (or unknown)."""
    sums = ds.checksums
    if sums is None:
        report.notes.append(f"format version {ds.manifest.version} dataset: no per-sample checksums, skipped "
                            f"(re-pack to get them)")
    good = []
    for i in range(len(ds)):
        try:
            data = ds.read(i, check=False)
        except DatasetError as e:
            report.errors.append(f"{ds.file_of(i)}: {_name(ds, i)}: unreadable ({e})")
            continue
        if sums is not None and checksum(data) != int(sums[i]):
            report.errors.append(f"{os.path.relpath(ds.file_of(i), ds.root)}: {_name(ds, i)}: checksum mismatch "
                                 f"(bytes changed after packing)")
            continue
        good.append(i)
    if sums is not None:
        report.checked.append("per-sample checksums")
    return good


def _decode_all(ds, report: VerifyReport, indices: list[int], workers: int | None) -> None:
    from PIL import Image

    from fastfeed.decode.cpu import decode_rgb

    max_pixels = int(ds.manifest.options.get("max_pixels", DEFAULT_MAX_PIXELS))

    def check(i: int, data: bytes) -> str | None:
        w, h = int(ds.widths[i]), int(ds.heights[i])
        where = f"{os.path.relpath(ds.file_of(i), ds.root)}: {_name(ds, i)}"
        if w * h > max_pixels:
            return f"{where}: {w}x{h} pixels exceeds the pack's limit of {max_pixels}"
        try:
            with Image.open(io.BytesIO(data)) as im:
                size = im.size
            decode_rgb(data, (0.0, 0.0, float(w), float(h)), _DECODE_SIZE)
        except Exception as e:  # noqa: BLE001 - PIL raises a zoo of types for corrupt data; all mean "bad"
            return f"{where}: does not decode: {type(e).__name__}: {e}"
        if size != (w, h):
            return f"{where}: decodes to {size[0]}x{size[1]}, samples.npz says {w}x{h}"
        return None

    # Reads stay on this thread (a reader's file handles belong to it); decodes run on the pool, where PIL
    # releases the GIL. At most `window` samples are held in memory.
    nworkers = workers or os.cpu_count() or 1
    window = 4 * nworkers
    with ThreadPoolExecutor(max_workers=nworkers, thread_name_prefix="fastfeed-verify") as pool:
        pending: list = []
        for i in indices:
            try:
                data = ds.read(i, check=False)
            except DatasetError as e:
                report.errors.append(str(e))
                continue
            pending.append(pool.submit(check, i, data))
            if len(pending) >= window:
                _drain(pending[: window // 2], report)
                del pending[: window // 2]
        _drain(pending, report)
    report.checked.append("full decode")


def _drain(futures: list, report: VerifyReport) -> None:
    for f in futures:
        err = f.result()
        if err:
            report.errors.append(err)
