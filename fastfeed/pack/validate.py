"""Read one source file and decide, cheaply, whether it goes into the dataset.

Pack-time checks must cost far less than the copy itself (the benchmark target is 0.7x `tar -cf`'s MB/s), so
no pixels are decoded here: the file is read once, its header parsed by `fastfeed.jpeg.probe` (dimensions,
JPEG kind), the pixel count bounded (decompression bombs) and the last bytes checked for the format's end
marker (JPEG EOI, PNG IEND), which catches the common truncated download. A full decode is `fastfeed verify`'s
job. Every failure becomes a reason string, never an exception.
"""
from __future__ import annotations

import errno
import io
import os
import stat
import warnings
from dataclasses import dataclass

from fastfeed import jpeg

__all__ = ["Loaded", "Rejected", "LoadOptions", "load_image", "check_image", "SUPPORTED_FORMATS", "DEFAULT_MAX_PIXELS"]

SUPPORTED_FORMATS = ("jpeg", "png")
EXTENSIONS = {"jpeg": "jpg", "png": "png"}
# Twice PIL's own bomb limit: ImageNet's largest image is ~30 Mpx; anything above this is almost surely hostile.
DEFAULT_MAX_PIXELS = 2 * 89_478_485
MAX_FILE_BYTES = 1 << 31  # keeps one sample far below any shard/LMDB limit

_MAGIC = (
    (b"GIF87a", "gif"), (b"GIF89a", "gif"), (b"BM", "bmp"), (b"II*\x00", "tiff"), (b"MM\x00*", "tiff"),
    (b"\x00\x00\x00\x0cjP  ", "jpeg2000"), (b"\xffO\xffQ", "jpeg2000"), (b"P6", "ppm"), (b"P5", "pgm"),
    (b"\x00\x00\x01\x00", "ico"), (b"8BPS", "psd"),
)
_PNG_SIG = b"\x89PNG\r\n\x1a\n"
_PNG_END = b"IEND\xaeB`\x82"


@dataclass(frozen=True)
class LoadOptions:
    jpeg_mode: str = "keep"  # fastfeed.jpeg.prepare mode
    quality: int = 90
    max_side: int | None = None  # re-encode images whose longer side exceeds this
    max_pixels: int = DEFAULT_MAX_PIXELS


@dataclass(frozen=True)
class Loaded:
    """An accepted image. `data` is bytes-like (a memoryview into the batch reader's buffer, or bytes);
    `note` says why the bytes were stored untouched although the mode asked for a change (e.g. libjpeg found
    corrupt data while transcoding: DALI and PIL may still decode what libjpeg's strict mode refuses)."""

    data: bytes
    ext: str
    width: int
    height: int
    jpeg_kind: int
    transcoded: bool
    hw_decodable: bool = False
    note: str | None = None


@dataclass(frozen=True)
class Rejected:
    reason: str


# Header probes copy only this much: JPEG headers are a few KB unless they carry a large EXIF thumbnail or ICC
# profile, and then the probe simply retries on the whole file.
_PROBE_BYTES = 16 << 10
_TAIL_BYTES = 512


def load_image(path: str, opts: LoadOptions) -> Loaded | Rejected:
    data = _read(path)
    if isinstance(data, Rejected):
        return data
    return check_image(data, opts)


def check_image(data, opts: LoadOptions) -> Loaded | Rejected:
    """Validate (and, per `opts`, convert) one image held in `data` (bytes or a memoryview). Never raises on
    bad image bytes: every problem becomes a Rejected reason."""
    if not len(data):
        return Rejected("empty file (0 bytes)")
    fmt = _sniff(bytes(data[:16]))
    if fmt not in SUPPORTED_FORMATS:
        return Rejected(f"unsupported format: {fmt}" if fmt else "not an image (unknown file signature)")
    try:
        info = _probe(data)
    except jpeg.ImageProbeError as e:
        return Rejected(f"bad image header: {e}")
    if info.width * info.height > opts.max_pixels:
        return Rejected(f"decompression bomb: {info.width}x{info.height} pixels exceeds the limit of "
                        f"{opts.max_pixels} (--max-pixels)")
    if fmt == "jpeg" and not _tail(data).endswith(b"\xff\xd9"):
        return Rejected("truncated JPEG (no end-of-image marker)")
    if fmt == "png" and not bytes(data[-len(_PNG_END):]) == _PNG_END:
        return Rejected("truncated PNG (no IEND chunk at the end)")
    return _maybe_convert(data, fmt, info, opts)


def _probe(data) -> jpeg.ImageInfo:
    try:
        return jpeg.probe(bytes(data[:_PROBE_BYTES]))
    except jpeg.ImageProbeError:
        if len(data) <= _PROBE_BYTES:
            raise
    return jpeg.probe(bytes(data))


def _tail(data) -> bytes:
    """The file's last bytes without trailing zero/whitespace padding (some writers pad after EOI)."""
    tail = bytes(data[-_TAIL_BYTES:]).rstrip(b"\x00\r\n ")
    if not tail and len(data) > _TAIL_BYTES:
        tail = bytes(data).rstrip(b"\x00\r\n ")
    return tail


def stat_size(path: str) -> int | Rejected:
    """The size of a readable regular image file, or why it is rejected before reading."""
    try:
        st = os.stat(path)
    except OSError as e:
        return Rejected(_os_reason(path, e))
    if not stat.S_ISREG(st.st_mode):
        # Opening a FIFO or device would block or never end.
        return Rejected("not a regular file")
    if st.st_size == 0:
        return Rejected("empty file (0 bytes)")
    if st.st_size > MAX_FILE_BYTES:
        return Rejected(f"file too large ({st.st_size} bytes)")
    return st.st_size


def _read(path: str) -> bytes | Rejected:
    size = stat_size(path)
    if isinstance(size, Rejected):
        return size
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        return Rejected(_os_reason(path, e))
    if not data:
        return Rejected("empty file (0 bytes)")
    return data


def _os_reason(path: str, e: OSError) -> str:
    if e.errno == errno.ELOOP:
        return "symlink loop"
    if e.errno == errno.ENOENT and os.path.islink(path):
        return f"broken symlink (-> {os.readlink(path)})"
    if e.errno in (errno.EACCES, errno.EPERM):
        return "unreadable: permission denied"
    if e.errno == errno.ENOENT:
        return "file not found"
    return f"unreadable: {e.strerror or e}"


def _sniff(data: bytes) -> str | None:
    if data[:3] == b"\xff\xd8\xff":
        return "jpeg"
    if data[:8] == _PNG_SIG:
        return "png"
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "webp"
    if data[4:12] in (b"ftypheic", b"ftypheix", b"ftypmif1", b"ftypavif"):
        return "heif/avif"
    for magic, name in _MAGIC:
        if data.startswith(magic):
            return name
    return None


def _maybe_convert(data, fmt: str, info: jpeg.ImageInfo, opts: LoadOptions) -> Loaded | Rejected:
    if opts.max_side and max(info.width, info.height) > opts.max_side:
        try:
            out, w, h = _downscale(bytes(data), opts.max_side, opts.quality)
            new = jpeg.probe(out)
        except (OSError, ValueError, SyntaxError, EOFError) as e:
            return Rejected(f"cannot decode image for --max-side re-encoding: {type(e).__name__}: {e}")
        return Loaded(out, "jpg", w, h, new.jpeg_kind, True, new.hw_decodable)
    kept = Loaded(data, EXTENSIONS[fmt], info.width, info.height, info.jpeg_kind, False, info.hw_decodable)
    if opts.jpeg_mode == "keep" or (info.hw_decodable and opts.jpeg_mode in jpeg.PREPARE_MODES):
        return kept
    try:
        out, action = jpeg.prepare(bytes(data), opts.jpeg_mode, opts.quality, info=info)
    except jpeg.JpegTranscodeError as e:
        # libjpeg's strict mode turns "Corrupt JPEG data" warnings into errors; the file still decodes in PIL
        # and DALI (the probe and end marker passed), so store it untouched rather than lose a sample.
        return Loaded(data, kept.ext, kept.width, kept.height, kept.jpeg_kind, False, kept.hw_decodable,
                      note=f"transcode_failed: {e}")
    except jpeg.ImageProbeError as e:
        return Rejected(f"cannot re-encode: {e}")
    if action == "kept":
        return kept
    new = jpeg.probe(out)
    return Loaded(out, EXTENSIONS.get(new.format, new.format), new.width, new.height, new.jpeg_kind, True,
                  new.hw_decodable)


def _downscale(data: bytes, max_side: int, quality: int) -> tuple[bytes, int, int]:
    from PIL import Image

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)
        with Image.open(io.BytesIO(data)) as im:
            w, h = im.size
            scale = max_side / max(w, h)
            size = (max(1, round(w * scale)), max(1, round(h * scale)))
            im.draft("RGB", size)  # JPEG: decode at a reduced DCT scale first
            rgb = im.convert("RGB")
            out = rgb.resize(size, Image.BICUBIC, reducing_gap=3.0)
    buf = io.BytesIO()
    out.save(buf, format="JPEG", quality=quality, optimize=False, progressive=False)
    return buf.getvalue(), size[0], size[1]
