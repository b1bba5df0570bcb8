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
    the report says so), and every field member's (a semantic pack's mask, an adopted dataset's members).
Full mode adds a decode of every image with the Loader's CPU decoder (`fastfeed.decode.cpu.decode_rgb`), under
the pixel limit the pack used, and of every field member's value as `Loader(fields=...)` reads it (text that is not
UTF-8, JSON that does not parse, an array torch has no tensor for: a bad record there). PIL warnings are not
errors: what the Loader decodes, verify accepts.

Every problem names the file and the sample key (and source path), so the bad original can be found. `verify`
raises DatasetError only when the dataset cannot be opened at all; everything else lands in the report.
"""
from __future__ import annotations

import io
import os
import warnings
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from fastfeed.datasets import open_dataset
from fastfeed.formats.base import data_path, shard_root
from fastfeed.formats.fields import PICKLED, FieldError, decode_value, value_kind
from fastfeed.formats.integrity import checksum, sha256_file
from fastfeed.image.headers import png_text_over_limit, without_png_text
from fastfeed.pack.validate import DEFAULT_MAX_PIXELS
from fastfeed.types import DatasetError
from fastfeed.world import usable_cpus

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
        # a remote dataset fetches (and sha-checks) every shard first; one it cannot have is reported, and its
        # samples are left out of the checks below
        unfetched = ds.fetch_each() if hasattr(ds, "fetch_each") else {}
        left_out = np.isin(ds.shard_index, list(unfetched)) if unfetched else np.zeros(len(ds), bool)
        for s, why in unfetched.items():
            report.errors.append(f"{why}; its {int(np.count_nonzero(ds.shard_index == s))} samples were not checked")
        unavailable = frozenset(ds.manifest.shards[s].path for s in unfetched)
        damaged = _check_files(ds, report, unavailable)
        # the format's own records (formats/wds.py, lmdb.py)
        errors, notes, checked = ds.check_layout(damaged, unavailable)
        report.errors += errors
        report.notes += notes
        report.checked += checked
        good = _check_samples(ds, report, quick, left_out)
        if not quick:
            _decode_all(ds, report, good, workers)
    return report


def _name(ds, i: int) -> str:
    return ds.describe(i)


def _check_files(ds, report: VerifyReport, unfetched: set[str]) -> set[str]:
    """The manifest paths of the data files whose sha256 is wrong (each reported), `unfetched` ones among them."""
    damaged = set(unfetched)
    for shard in ds.manifest.shards:
        if shard.path in unfetched:
            continue
        digest = sha256_file(data_path(shard_root(ds.root, ds.manifest), shard.path))
        if digest != shard.sha256:
            damaged.add(shard.path)
            report.errors.append(f"{shard.path}: sha256 {digest[:16]}... differs from the manifest's "
                                 f"{shard.sha256[:16]}... (file modified or corrupted)")
    report.checked.append("file sha256")
    return damaged


# ---- per-sample checksums and decode ----------------------------------------------------------------------------


def _check_samples(ds, report: VerifyReport, quick: bool, left_out: np.ndarray) -> list[int]:
    """Read every sample but the `left_out` ones and check its checksum; returns the samples whose bytes are as
    packed (or unknown)."""
    sums = ds.checksums
    if sums is None:
        report.notes.append(f"format version {ds.manifest.version} dataset: no per-sample checksums, skipped "
                            f"(re-pack to get them)")
    good = []
    for i in np.flatnonzero(~left_out).tolist():
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
    _check_fields(ds, report, quick, left_out)
    return good


def _check_fields(ds, report: VerifyReport, quick: bool, left_out: np.ndarray) -> None:
    """Every field member of the samples but the `left_out` ones (an adopted dataset's, a semantic pack's mask)
    against its xxh3 in the table; unless quick, its value as the Loader reads it."""
    names = [n for n in getattr(ds.manifest, "fields", []) if ds.field_extents(n).checksum is not None]
    for name in names:
        fe = ds.field_extents(name)
        kind = None if quick or name.rsplit(".", 1)[-1] in PICKLED else value_kind(name)
        for i in np.flatnonzero((fe.size >= 0) & ~left_out).tolist():
            try:
                data = ds.read_range(i, int(fe.offset[i]), int(fe.size[i]))
            except DatasetError as e:
                report.errors.append(f"{ds.file_of(i)}: {_name(ds, i)}: .{name} unreadable ({e})")
                continue
            if checksum(data) != int(fe.checksum[i]):
                report.errors.append(f"{os.path.relpath(ds.file_of(i), ds.root)}: {_name(ds, i)}: .{name} member "
                                     "checksum mismatch (bytes changed after packing or indexing)")
                continue
            if kind is not None:
                try:
                    decode_value(kind, data)
                except FieldError as e:
                    report.errors.append(f"{os.path.relpath(ds.file_of(i), ds.root)}: {_name(ds, i)}: .{name} "
                                         f"member is a bad record for Loader(fields=[{name!r}]): {e}")
    if names:
        report.checked += ["member checksums"] if quick else ["member checksums", "member values"]


def _decode_all(ds, report: VerifyReport, indices: list[int], workers: int | None) -> None:
    from PIL import Image

    from fastfeed.decode.cpu import decode_rgb

    max_pixels = int(ds.manifest.options.get("max_pixels", DEFAULT_MAX_PIXELS))

    def check(i: int, data: bytes) -> str | None:
        w, h = int(ds.widths[i]), int(ds.heights[i])
        where = f"{os.path.relpath(ds.file_of(i), ds.root)}: {_name(ds, i)}"
        if w * h > max_pixels:
            return f"{where}: {w}x{h} pixels exceeds the pack's limit of {max_pixels}"
        def decodes(d) -> tuple[int, int]:
            with Image.open(io.BytesIO(d)) as im:
                size = im.size
            decode_rgb(d, (0.0, 0.0, float(w), float(h)), _DECODE_SIZE)
            return size

        try:
            try:
                size = decodes(data)
            except ValueError as e:  # PIL's text-chunk limit: the Loader decodes the pixels without the text
                if not png_text_over_limit(e):
                    raise
                size = decodes(without_png_text(data))
        except Exception as e:  # noqa: BLE001 - PIL raises a zoo of types for corrupt data; all mean "bad"
            return f"{where}: does not decode: {type(e).__name__}: {e}"
        if size != (w, h):
            return f"{where}: decodes to {size[0]}x{size[1]}, samples.npz says {w}x{h}"
        return None

    # Reads stay on this thread (a reader's file handles belong to it); decodes run on the pool, where PIL
    # releases the GIL. At most `window` samples are held in memory.
    nworkers = workers or usable_cpus()
    window = 4 * nworkers
    # PIL warns about odd but decodable files (corrupt EXIF, truncated metadata); the Loader decodes them, so they
    # are not errors here, even under `-W error`. The filter is set once, on this (the calling) thread, around the
    # pool's whole life: catch_warnings() saves and restores the process-wide filter list, so calling it per
    # decode on the pool threads would race (the reason jpeg.py and transcode.py avoid it).
    with warnings.catch_warnings(), ThreadPoolExecutor(max_workers=nworkers,
                                                       thread_name_prefix="fastfeed-verify") as pool:
        warnings.filterwarnings("ignore", module=r"PIL(\..*)?$")
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
