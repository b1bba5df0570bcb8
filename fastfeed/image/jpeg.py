"""What an image is, from its header alone, and whether the GPU's hardware JPEG decoder can take it as stored.

The hardware JPEG decoder of A100/H100/H200 (nvJPEG's hardware backend, which DALI's ``mixed`` decoder uses)
accepts only *baseline* (SOF0) Huffman-coded 8-bit JPEGs with one component or three YCbCr components in one of
nvJPEG's chroma subsamplings. Everything else (progressive, arithmetic-coded, CMYK/YCCK, lossless, PNG, ...) falls
back to the much slower CUDA/CPU decoders, so even a minority of such files costs a large share of the GPU path's
throughput (docs/design/decoders.md#hw-decodable).

- `probe(data)` classifies an image by parsing its JPEG markers (no decoding) or, for other formats, PIL's lazy
  header read: format, size, JPEG kind (`KIND_NAMES`), chroma subsampling, EXIF orientation, `hw_decodable`.
- `header_failures(samples)` walks a batch's headers in the native core, for bytes no checksum vouches for.
- `displayed_size(data)` is the size after the EXIF rotation.

What pack stores instead of what the hardware decoder rejects (lossless transcoding, re-encoding), and the advice
`fastfeed doctor` gives about it, is `fastfeed.image.transcode`.
"""
from __future__ import annotations

import io
import struct
from dataclasses import dataclass

from fastfeed.image.headers import STANDALONE_MARKERS as _STANDALONE
from fastfeed.image.headers import exif_orientation, jpeg_end, swaps_axes, tiff_orientation  # first two re-exported
from fastfeed.image.headers import PNG_SIGNATURE, png_facts

__all__ = [
    "KIND_NOT_JPEG",
    "KIND_BASELINE",
    "KIND_PROGRESSIVE",
    "KIND_ARITHMETIC",
    "KIND_OTHER_JPEG",
    "KIND_NAMES",
    "KIND_CODES",
    "ImageInfo",
    "ImageProbeError",
    "probe",
    "jpeg_info",
    "pil_colorspace",
    "exif_orientation",
    "displayed_size",
    "jpeg_end",
    "header_failures",
]

# uint8 codes stored per sample in samples.npz (`jpeg` column): never renumber.
KIND_NOT_JPEG = 0
KIND_BASELINE = 1  # SOF0: baseline Huffman, 8-bit
KIND_PROGRESSIVE = 2  # SOF2, 8-bit
KIND_ARITHMETIC = 3  # SOF9/SOF10: sequential or progressive arithmetic-coded, 8-bit
KIND_OTHER_JPEG = 4  # SOF1 extended, SOF3 lossless, hierarchical, 12-bit, ...
KIND_NAMES = {
    KIND_NOT_JPEG: "not_jpeg",
    KIND_BASELINE: "baseline",
    KIND_PROGRESSIVE: "progressive",
    KIND_ARITHMETIC: "arithmetic",
    KIND_OTHER_JPEG: "other_jpeg",
}
KIND_CODES = {name: code for code, name in KIND_NAMES.items()}

# nvJPEG's supported chroma subsamplings for 3-component images, plus 1-component grey.
_HW_SUBSAMPLINGS = frozenset({"4:4:4", "4:2:2", "4:2:0", "4:4:0", "4:1:1", "4:1:0", "gray"})

# (H_luma / H_chroma, V_luma / V_chroma) -> J:a:b name
_SUBSAMPLING_NAMES = {
    (1, 1): "4:4:4",
    (2, 1): "4:2:2",
    (2, 2): "4:2:0",
    (1, 2): "4:4:0",
    (4, 1): "4:1:1",
    (4, 2): "4:1:0",
}

_SOF = frozenset({0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF})
_PIL_FORMATS = {"JPEG": "jpeg", "MPO": "jpeg", "PNG": "png", "GIF": "gif", "BMP": "bmp", "WEBP": "webp",
                "TIFF": "tiff", "PPM": "ppm", "ICO": "ico", "JPEG2000": "jpeg2000", "TGA": "tga"}
_PIL_COLORSPACES = {"1": "gray", "L": "gray", "LA": "gray", "La": "gray", "I": "gray", "I;16": "gray",
                    "F": "gray", "P": "palette", "PA": "palette", "RGB": "rgb", "RGBA": "rgba", "RGBa": "rgba",
                    "RGBX": "rgb", "CMYK": "cmyk", "YCbCr": "ycbcr", "LAB": "lab", "HSV": "hsv"}


@dataclass(frozen=True)
class ImageInfo:
    """Header facts about one encoded image.

    format: 'jpeg', 'png', 'gif', 'bmp', 'webp', 'tiff', ... (lower-case).
    width, height: pixels, from the header.
    jpeg_kind: one of the KIND_* codes (KIND_NOT_JPEG for other formats).
    subsampling: JPEG chroma subsampling ('4:4:4', '4:2:2', '4:2:0', '4:4:0', '4:1:1', '4:1:0', 'gray',
        'other'), None for non-JPEG images and 4-component (CMYK/YCCK) JPEGs.
    colorspace: 'ycbcr', 'gray', 'rgb', 'cmyk', 'ycck' for JPEGs (as libjpeg would infer it); for other formats
        PIL's mode mapped to 'gray', 'palette', 'rgb', 'rgba', 'cmyk', ... (lower-cased mode when unknown).
    hw_decodable: the GPU hardware JPEG decoder accepts it as stored.
    precision: bits per sample (JPEG: from the frame header; 8 for other formats).
    orientation: the EXIF orientation tag 1..8 of a JPEG (1 when absent, invalid, or not a JPEG).
    """

    format: str
    width: int
    height: int
    jpeg_kind: int
    subsampling: str | None
    colorspace: str
    hw_decodable: bool
    precision: int = 8
    orientation: int = 1

    @property
    def kind_name(self) -> str:
        return KIND_NAMES[self.jpeg_kind]


class ImageProbeError(ValueError):
    """The bytes are not a readable image header (garbage, truncated, or malformed)."""


def _native():
    try:
        from fastfeed import _native
    except ImportError:  # an uncompiled checkout: the probe still works
        return None
    return _native


# ---- probe ---------------------------------------------------------------------------------------------------


def probe(data: bytes) -> ImageInfo:
    """Classify an image from its header without decoding pixels; raises ImageProbeError on bad input."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise TypeError(f"probe() needs bytes, got {type(data).__name__}")
    data = bytes(data) if not isinstance(data, bytes) else data
    if data[:2] == b"\xff\xd8":
        return _probe_jpeg(data)
    return _probe_other(data)


def _probe_jpeg(data: bytes) -> ImageInfo:
    n = len(data)
    pos = 2
    jfif = False
    adobe_transform: int | None = None
    sof: tuple[int, bytes] | None = None
    orientation = 1
    while True:
        # Markers may be preceded by any number of 0xFF fill bytes.
        if pos >= n or data[pos] != 0xFF:
            raise ImageProbeError(f"JPEG: expected a marker at byte {pos} (truncated or corrupt header)")
        while pos < n and data[pos] == 0xFF:
            pos += 1
        if pos >= n:
            raise ImageProbeError("JPEG: truncated header (ends inside a marker)")
        marker = data[pos]
        pos += 1
        # A restart marker belongs inside the entropy-coded data, TEM nowhere in practice: libjpeg reads past either
        # in a header, PIL refuses TEM and nvJPEG's parser both.
        if marker in _STANDALONE:
            raise ImageProbeError(f"JPEG: a parameterless marker (0xFF{marker:02X}) in the header")
        if marker == 0xD9:
            raise ImageProbeError("JPEG: end of image before any scan")
        if marker == 0x00 or marker == 0xD8:
            raise ImageProbeError(f"JPEG: unexpected marker 0xFF{marker:02X} in header")
        if pos + 2 > n:
            raise ImageProbeError("JPEG: truncated header (segment length missing)")
        (length,) = struct.unpack_from(">H", data, pos)
        if length < 2 or pos + length > n:
            raise ImageProbeError(f"JPEG: segment 0xFF{marker:02X} of length {length} overruns the data")
        segment = data[pos + 2 : pos + length]
        pos += length
        refused = _pil_refuses(marker, segment, sof is None)
        if refused:
            raise ImageProbeError(f"JPEG: {refused}, which PIL refuses")
        if marker == 0xE0 and segment[:5] == b"JFIF\x00":
            jfif = True
        elif marker == 0xE1 and segment[:6] == b"Exif\x00\x00" and orientation == 1:
            orientation = tiff_orientation(segment[6:])
        elif marker == 0xEE and len(segment) >= 12 and segment[:5] == b"Adobe":
            adobe_transform = segment[11]
        elif marker in _SOF:
            if sof is not None:
                raise ImageProbeError("JPEG: more than one frame header (SOF)")
            sof = (marker, segment)
        elif marker == 0xDA:  # start of scan: every header marker libjpeg uses has been seen
            break
    if sof is None:
        raise ImageProbeError("JPEG: scan before any frame header (SOF)")
    return jpeg_info(sof[0], sof[1], jfif, adobe_transform, orientation)


def _pil_refuses(marker: int, segment: bytes, before_sof: bool) -> str | None:
    """A header segment PIL's JPEG reader fails on, where libjpeg goes on (csrc/image_probe.cpp mirrors it): a JFIF
    or Adobe segment too short for its version field, an ICC fragment before the frame header too short for its
    sequence numbers, a quantisation table cut short."""
    if (marker == 0xE0 and segment[:4] == b"JFIF" or marker == 0xEE and segment[:5] == b"Adobe") and len(segment) < 7:
        return f"a {'JFIF' if marker == 0xE0 else 'Adobe'} segment of {len(segment)} bytes"
    if marker == 0xE2 and before_sof and segment[:12] == b"ICC_PROFILE\x00" and len(segment) < 14:
        return "an ICC profile fragment without its sequence numbers"
    if marker == 0xDB:
        at = 0
        while at < len(segment):
            table = 1 + 64 * (2 if segment[at] >> 4 else 1)
            if len(segment) - at < table:
                return "a quantisation table cut short"
            at += table
    return None


def header_failures(samples) -> list[tuple[int, str]]:
    """(position, why) for each JPEG (FF D8) and PNG among `samples` (buffers) that pack would not have stored as it
    is: a JPEG header `probe` cannot read ("bad image header: ..."), a JPEG without its end-of-image marker
    ("truncated JPEG", which pack trims to its EOI or refuses), a PNG whose chunks `png_facts` cannot walk (its
    reason). The walk runs natively over the whole batch with the GIL released (~0.2 us a sample); the Python walk
    runs again on the failures only, for the message."""
    from fastfeed import _native

    out = []
    for i in _native.header_failures(samples):
        data = bytes(samples[i])
        if data[:8] == PNG_SIGNATURE:
            facts = png_facts(data)
            why = facts if isinstance(facts, str) else "bad image header: PNG"  # unreached while the walks agree
        else:
            try:
                _probe_jpeg(data)
                why = "truncated JPEG (no end-of-image marker)"  # the native tail check, as pack's (validate._tail)
            except ImageProbeError as e:
                why = f"bad image header: {e}"
        out.append((i, why))
    return out


_HEADER_SCAN = 1 << 16  # a JPEG header larger than this (big EXIF thumbnail, ICC) is probed on the whole file


def displayed_size(data, orientation: int | None = None) -> tuple[int, int] | None:
    """(width, height) of a JPEG or PNG as shown under the "exif" orientation policy (axes swapped for tags
    5..8), from the header alone; None for other formats or a malformed header. Pass `orientation` when the
    caller already read the tag."""
    head = bytes(data[:24])
    if head[:8] == b"\x89PNG\r\n\x1a\n" and head[12:16] == b"IHDR":
        w, h = struct.unpack(">II", head[16:24])
    elif head[:2] == b"\xff\xd8":
        try:
            info = probe(bytes(data[:_HEADER_SCAN]))
        except ImageProbeError:
            try:
                info = probe(bytes(data))
            except ImageProbeError:
                return None
        w, h = info.width, info.height
    else:
        return None
    tag = exif_orientation(data) if orientation is None else orientation
    return (h, w) if swaps_axes(tag) else (w, h)


def jpeg_info(marker: int, seg: bytes, jfif: bool, adobe_transform: int | None, orientation: int = 1) -> ImageInfo:
    """ImageInfo of a JPEG from its frame header (marker, payload) and the markers before the scan; raises
    ImageProbeError on a malformed frame header. Also fed by the native reader threads' probe (validate.py)."""
    if len(seg) < 6:
        raise ImageProbeError("JPEG: frame header too short")
    precision, height, width, ncomp = struct.unpack_from(">BHHB", seg, 0)
    if len(seg) < 6 + 3 * ncomp or ncomp == 0:
        raise ImageProbeError(f"JPEG: frame header with {ncomp} components is malformed")
    if width == 0 or height == 0:
        raise ImageProbeError(f"JPEG: zero image size {width}x{height} (DNL height is not supported)")
    ids, factors = [], []
    for c in range(ncomp):
        cid, hv = seg[6 + 3 * c], seg[7 + 3 * c]
        h, v = hv >> 4, hv & 15
        if not (1 <= h <= 4 and 1 <= v <= 4):
            raise ImageProbeError(f"JPEG: invalid sampling factors {h}x{v}")
        ids.append(cid)
        factors.append((h, v))

    if marker == 0xC0 and precision == 8:
        kind = KIND_BASELINE
    elif marker == 0xC2 and precision == 8:
        kind = KIND_PROGRESSIVE
    elif marker in (0xC9, 0xCA) and precision == 8:
        kind = KIND_ARITHMETIC
    else:
        kind = KIND_OTHER_JPEG

    # Colour space inference follows libjpeg's default_decompress_parms (jdapimin.c).
    if ncomp == 1:
        colorspace, subsampling = "gray", "gray"
    elif ncomp == 3:
        if jfif:
            colorspace = "ycbcr"
        elif adobe_transform is not None:
            colorspace = "rgb" if adobe_transform == 0 else "ycbcr"
        elif ids == [82, 71, 66]:  # 'R', 'G', 'B' component ids
            colorspace = "rgb"
        else:
            colorspace = "ycbcr"
        subsampling = _subsampling_name(factors)
    elif ncomp == 4:
        colorspace = "ycck" if adobe_transform == 2 else "cmyk"
        subsampling = None
    else:
        colorspace, subsampling = f"{ncomp}-component", None

    hw = (
        kind == KIND_BASELINE
        and colorspace in ("ycbcr", "gray")
        and subsampling in _HW_SUBSAMPLINGS
    )
    return ImageInfo("jpeg", width, height, kind, subsampling, colorspace, hw, precision, orientation)


def _subsampling_name(factors: list[tuple[int, int]]) -> str:
    (hy, vy), (hb, vb), (hr, vr) = factors
    if (hb, vb) != (hr, vr) or hy % hb or vy % vb:
        return "other"
    return _SUBSAMPLING_NAMES.get((hy // hb, vy // vb), "other")


def _probe_other(data: bytes) -> ImageInfo:
    from PIL import Image, UnidentifiedImageError

    # No warnings.catch_warnings() here: it mutates global state and is not thread-safe, and packers probe from
    # threads. Images over PIL's MAX_IMAGE_PIXELS thus warn (DecompressionBombWarning); over twice that, they raise.
    try:
        with Image.open(io.BytesIO(data)) as im:  # lazy: reads the header only
            fmt = (im.format or "unknown").upper()
            width, height = im.size
            mode = im.mode
    except UnidentifiedImageError as e:
        # PIL's message names the BytesIO object; the first bytes say more about what the file is.
        what = "an empty file" if not data else f"no image format PIL knows starts {data[:8]!r}"
        raise ImageProbeError(f"not a readable image: {what}") from e
    except Image.DecompressionBombError as e:
        raise ImageProbeError(f"not a readable image: {e}") from e
    except (OSError, ValueError, SyntaxError, struct.error, EOFError, IndexError, KeyError) as e:
        # PIL's plugins signal malformed headers with a zoo of exception types.
        raise ImageProbeError(f"malformed image header: {type(e).__name__}: {e}") from e
    if width <= 0 or height <= 0:
        raise ImageProbeError(f"image has zero size {width}x{height}")
    return ImageInfo(_PIL_FORMATS.get(fmt, fmt.lower()), width, height, KIND_NOT_JPEG, None, pil_colorspace(mode),
                     False)


def pil_colorspace(mode: str) -> str:
    """ImageInfo.colorspace of an image PIL opens in `mode`."""
    return _PIL_COLORSPACES.get(mode, mode.lower())
