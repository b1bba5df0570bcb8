"""What the detection layouts share: names files, image sizes read from headers (YOLO's normalised labels need
them to become pixels), and the check every entry passes before it is kept."""
from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

from fastfeed.image import jpeg
from fastfeed.image.headers import PNG_SIGNATURE, png_file_exif_orientation
from fastfeed.pack.sources import Source, SourceEntry
from fastfeed.targets import check_annotation

_PROBE_BYTES = 64 << 10  # enough for nearly every header; a miss retries on the whole file


def _has_file(folder: str, ext: str, depth: int = 1) -> bool:
    """Whether `folder` (or a subfolder, `depth` levels down) holds a file ending in `ext`."""
    try:
        with os.scandir(folder) as it:
            entries = list(it)
    except OSError:
        return False
    if any(e.name.endswith(ext) and e.is_file() for e in entries):
        return True
    return depth > 0 and any(_has_file(e.path, ext, depth - 1) for e in entries if e.is_dir())


def read_names(path: str) -> list[str]:
    """A names file: one class name per line (blank lines and '#' comments skipped), in index order."""
    try:
        with open(path, encoding="utf-8") as f:
            names = [line.strip() for line in f]
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"classes file {path!r} unreadable: {e}") from None
    names = [n for n in names if n and not n.startswith("#")]
    if not names:
        raise ValueError(f"classes file {path!r} names no classes")
    return names


def _probe_sizes(paths: list[str]) -> list[tuple[int, int, int] | str]:
    """(width, height, EXIF orientation) of each image from its header (no decode), or why it is unreadable."""
    if not paths:
        return []
    with ThreadPoolExecutor(max_workers=min(8, len(paths)), thread_name_prefix="fastfeed-scan-probe") as pool:
        return list(pool.map(_probe_size, paths))


def _probe_size(path: str) -> tuple[int, int, int] | str:
    try:
        with open(path, "rb") as f:
            head = f.read(_PROBE_BYTES)
            try:
                info = jpeg.probe(head)
            except jpeg.ImageProbeError:
                info = jpeg.probe(head + f.read())  # a big EXIF/ICC segment before the frame header
            # The probe reads a JPEG's tag; a PNG's eXIf chunk is found as the decoders find it, anywhere in the
            # file (after large text or ICC chunks it lies past the head).
            tag = png_file_exif_orientation(f) if head[:8] == PNG_SIGNATURE else info.orientation
    except OSError as e:
        return e.strerror or str(e)
    except jpeg.ImageProbeError as e:
        return str(e)
    return info.width, info.height, tag


def _add(src: Source, entry: SourceEntry, where: str) -> None:
    """Append `entry` after fastfeed.targets.check_annotation: a scanner bug must not reach the stored data."""
    why = check_annotation(entry.metadata, len(src.classes))
    if why is not None:
        src.rejected.append({"path": where, "reason": f"annotation unusable: {why}: image not packed"})
    else:
        src.entries.append(entry)
