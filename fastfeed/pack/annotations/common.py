"""What the detection layouts share: names files, image sizes and EXIF tags as pack stores them (YOLO's normalised
labels need them to become pixels), and the check every entry passes before it is kept."""
from __future__ import annotations

import io
import os
from concurrent.futures import ThreadPoolExecutor

from fastfeed.image import jpeg
from fastfeed.image.contract import orientation_tag
from fastfeed.image.headers import exif_header, exif_orientation, exif_orientation_plain, pil_read
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
    """(width, height, EXIF orientation) of each image as pack will store them, or why it is unreadable."""
    if not paths:
        return []
    with ThreadPoolExecutor(max_workers=min(8, len(paths)), thread_name_prefix="fastfeed-scan-probe") as pool:
        return list(pool.map(_probe_size, paths))


def _probe_size(path: str) -> tuple[int, int, int] | str:
    """The size and tag the sample table will hold, so that annotations are turned into the frame the Loader shows:
    a JPEG's or PNG's from its header (no decode), unless its EXIF readers disagree on the tag; then, and for other
    formats, PIL's, as pack's validation keeps such a file for PIL's decode with PIL's tag (pack/validate.py)."""
    try:
        with open(path, "rb") as f:
            head = f.read(_PROBE_BYTES)
            meta = exif_header(f)
            if meta and exif_orientation_plain(meta):
                f.seek(len(head))
                try:
                    try:
                        info = jpeg.probe(head)
                    except jpeg.ImageProbeError:
                        info = jpeg.probe(head + f.read())  # a big EXIF/ICC segment before the frame header
                    return info.width, info.height, exif_orientation(meta)
                except jpeg.ImageProbeError:
                    pass  # a header only PIL reads: pack keeps the file for PIL's decode if PIL decodes it
            f.seek(0)
            data = f.read()
    except OSError as e:
        return e.strerror or str(e)
    return _pil_size(data)


def _pil_size(data: bytes) -> tuple[int, int, int] | str:
    from PIL import Image, UnidentifiedImageError

    def facts(readable: bytes) -> tuple[int, int, int]:
        with Image.open(io.BytesIO(readable)) as im:
            tag = orientation_tag(data, im, "exif")  # (loads the image where PIL's tag is read)
            return im.width, im.height, tag

    try:
        return pil_read(facts, data)  # (without its text where PIL refuses that, as the contract decodes it)
    except UnidentifiedImageError:  # (PIL's message names the buffer's address: the same file, the same reason)
        return "not an image PIL reads"
    except Exception as e:  # noqa: BLE001 - PIL's plugins raise many types; pack's validation rejects the file too
        return f"{type(e).__name__}: {e}"


def _add(src: Source, entry: SourceEntry, where: str) -> None:
    """Append `entry` after fastfeed.targets.check_annotation: a scanner bug must not reach the stored data."""
    why = check_annotation(entry.metadata, len(src.classes))
    if why is not None:
        src.rejected.append({"path": where, "reason": f"annotation unusable: {why}: image not packed"})
    else:
        src.entries.append(entry)
