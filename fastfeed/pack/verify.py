"""`fastfeed verify`: recompute every data file's sha256 and fully decode every image.

This is the expensive check the packer deliberately skips (it only parses headers): PIL decodes every image,
and JPEGs are also entropy-decoded strictly by the native transcoder when it is built. A problem is reported by
sample key and source path, so the bad original can be found.
"""
from __future__ import annotations

import hashlib
import io
import os
import warnings
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from fastfeed import jpeg
from fastfeed.formats import open_dataset

__all__ = ["VerifyReport", "verify"]


@dataclass
class VerifyReport:
    path: str
    num_samples: int = 0
    num_files: int = 0
    errors: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.errors


def _sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(8 << 20):
            h.update(chunk)
    return h.hexdigest()


def _decode(data: bytes) -> tuple[int, int]:
    from PIL import Image

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # PIL warns (e.g. on corrupt EXIF) where it should fail
        with Image.open(io.BytesIO(data)) as im:
            im.load()
            size = im.size
    if data[:2] == b"\xff\xd8" and jpeg.HAVE_TRANSCODE:
        # PIL shrugs off libjpeg's "Corrupt JPEG data" warnings and returns grey blocks; the native transcoder
        # entropy-decodes the whole scan with warnings as errors, so it catches damaged scan data.
        jpeg.transcode_to_baseline(data)
    return size


def verify(path: str, workers: int | None = None, decode: bool = True) -> VerifyReport:
    """Check checksums, sizes and (when `decode`) a full decode of every image. Never raises on corruption:
    everything found is in the report's `errors`."""
    report = VerifyReport(path)
    with open_dataset(path) as ds:
        getattr(ds, "fetch_all", lambda: None)()  # hook: a remote dataset fetches (and sha-checks) every shard
        report.num_samples = len(ds)
        report.num_files = len(ds.manifest.shards)
        for shard in ds.manifest.shards:
            digest = _sha256(os.path.join(ds.root, shard.path))
            if digest != shard.sha256:
                report.errors.append(f"{shard.path}: sha256 {digest[:16]}... differs from the manifest's "
                                     f"{shard.sha256[:16]}... (file modified or corrupted)")
        if not decode:
            return report
        sources = ds.sources

        def name(i: int) -> str:
            return f"sample {i} (key {ds.keys[i]}" + (f", source {sources[i]})" if sources is not None else ")")

        def check(i: int, data: bytes) -> str | None:
            try:
                w, h = _decode(data)
            except Exception as e:  # noqa: BLE001 - PIL raises a zoo of types for corrupt data; all mean "bad"
                return f"{name(i)}: does not decode: {type(e).__name__}: {e}"
            if (w, h) != (int(ds.widths[i]), int(ds.heights[i])):
                return f"{name(i)}: decodes to {w}x{h}, samples.npz says {ds.widths[i]}x{ds.heights[i]}"
            return None

        # Reads stay on this thread (an LMDB transaction belongs to one thread); decodes run on the pool, where
        # PIL releases the GIL. At most `window` decoded-pending samples are held in memory.
        nworkers = workers or os.cpu_count() or 1
        window = 4 * nworkers
        with ThreadPoolExecutor(max_workers=nworkers) as pool:
            pending: list = []
            for i in range(len(ds)):
                try:
                    data = ds.read(i)
                except (OSError, ValueError) as e:
                    report.errors.append(f"{name(i)}: unreadable: {e}")
                    continue
                pending.append(pool.submit(check, i, data))
                if len(pending) >= window:
                    _drain(pending[: window // 2], report)
                    del pending[: window // 2]
            _drain(pending, report)
    return report


def _drain(futures: list, report: VerifyReport) -> None:
    for f in futures:
        err = f.result()
        if err:
            report.errors.append(err)
