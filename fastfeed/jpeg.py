"""What an image is, from its header alone, and how to store it so the GPU's hardware JPEG decoder can take it.

The hardware JPEG decoder of A100/H100/H200 (nvJPEG's hardware backend, which DALI's ``mixed`` decoder uses)
accepts only *baseline* (SOF0) Huffman-coded 8-bit JPEGs with one component or three YCbCr components in one of
nvJPEG's chroma subsamplings. Everything else (progressive, arithmetic-coded, CMYK/YCCK, lossless, PNG, ...) falls
back to the much slower CUDA/CPU decoders: 20% progressive JPEGs cost 59% of GPU-path throughput (issue 8).

- `probe(data)` classifies an image by parsing its JPEG markers (no decoding) or, for other formats, PIL's lazy
  header read.
- `prepare(data, mode)` returns the bytes the packer should store:

  ======== =============================================== ============================================
  mode     what changes                                    pixels
  ======== =============================================== ============================================
  keep     nothing                                         identical
  baseline progressive and arithmetic-coded JPEGs are       identical (DCT coefficients are copied, only
           transcoded to baseline Huffman; the rest kept    the entropy coding changes; markers kept)
  reencode as baseline, then whatever the hardware decoder  lossy for the re-encoded images only
           still rejects (CMYK/YCCK/RGB JPEGs, exotic
           subsampling, 12-bit, lossless, PNG/GIF/WebP/...)
           is decoded and re-encoded as a baseline JPEG at
           ``quality`` (RGB, or grey for grey images)
  ======== =============================================== ============================================

  Re-encoding converts to RGB (alpha dropped, first frame of animations) because that is what both fastfeed
  decoders deliver for such images anyway; the ICC profile is kept unless the colour mode changed.
- `hw_decoder_advice(jpeg_mix)` turns a manifest's ``jpeg_mix`` (counts by `KIND_NAMES` name, plus optional
  ``"baseline_not_hw"``) into the warning `fastfeed doctor`/`inspect` print, or None.

Lossless transcoding runs in the native core (`csrc/jpeg_transcode.cpp`, libjpeg-turbo); when the extension was
built without libjpeg, `HAVE_TRANSCODE` is False and transcoding raises `TranscodeUnavailableError`.
"""
from __future__ import annotations

import io
import struct
from dataclasses import dataclass
from typing import Mapping, Sequence

from fastfeed.headers import STANDALONE_MARKERS as _STANDALONE
from fastfeed.headers import exif_orientation, jpeg_end, tiff_orientation  # exif_orientation, jpeg_end: re-exported
from fastfeed.headers import _PNG_SIG, png_facts

__all__ = [
    "KIND_NOT_JPEG",
    "KIND_BASELINE",
    "KIND_PROGRESSIVE",
    "KIND_ARITHMETIC",
    "KIND_OTHER_JPEG",
    "KIND_NAMES",
    "KIND_CODES",
    "PREPARE_MODES",
    "HAVE_TRANSCODE",
    "ImageInfo",
    "ImageProbeError",
    "JpegTranscodeError",
    "TranscodeUnavailableError",
    "probe",
    "jpeg_info",
    "exif_orientation",
    "displayed_size",
    "jpeg_end",
    "prepare",
    "transcode_to_baseline",
    "transcode_many",
    "HAVE_SCAN_CHECK",
    "check_scans",
    "hw_decoder_advice",
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
PREPARE_MODES = ("keep", "baseline", "reencode")

# nvJPEG's supported chroma subsamplings for 3-component images, plus 1-component grey.
_HW_SUBSAMPLINGS = frozenset({"4:4:4", "4:2:2", "4:2:0", "4:4:0", "4:1:1", "4:1:0", "gray"})
_TRANSCODABLE_KINDS = frozenset({KIND_PROGRESSIVE, KIND_ARITHMETIC})

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


class JpegTranscodeError(ValueError):
    """libjpeg rejected the JPEG while transcoding (corrupt data; warnings count as errors)."""


class TranscodeUnavailableError(RuntimeError):
    """fastfeed._native was built without libjpeg, so JPEGs cannot be transcoded."""


def _native():
    try:
        from fastfeed import _native
    except ImportError:  # an uncompiled checkout: the probe still works
        return None
    return _native


def _have_transcode() -> bool:
    native = _native()
    return bool(native is not None and getattr(native, "HAVE_LIBJPEG", False))


HAVE_TRANSCODE = _have_transcode()
# The scan check needs libjpeg too (csrc/jpeg_transcode.h check_jpeg_scans).
HAVE_SCAN_CHECK = HAVE_TRANSCODE


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
        if marker in _STANDALONE:
            continue
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
        if data[:8] == _PNG_SIG:
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
    return (h, w) if tag >= 5 else (w, h)


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
    except (UnidentifiedImageError, Image.DecompressionBombError) as e:
        raise ImageProbeError(f"not a readable image: {e}") from e
    except (OSError, ValueError, SyntaxError, struct.error, EOFError, IndexError, KeyError) as e:
        # PIL's plugins signal malformed headers with a zoo of exception types.
        raise ImageProbeError(f"malformed image header: {type(e).__name__}: {e}") from e
    if width <= 0 or height <= 0:
        raise ImageProbeError(f"image has zero size {width}x{height}")
    colorspace = _PIL_COLORSPACES.get(mode, mode.lower())
    return ImageInfo(_PIL_FORMATS.get(fmt, fmt.lower()), width, height, KIND_NOT_JPEG, None, colorspace, False)


# ---- transcoding ---------------------------------------------------------------------------------------------


def _require_native():
    native = _native()
    if native is None or not getattr(native, "HAVE_LIBJPEG", False):
        raise TranscodeUnavailableError(
            "lossless JPEG transcoding is unavailable: fastfeed._native was built without libjpeg "
            "(install libjpeg-turbo headers, e.g. `apt-get install libjpeg-dev`, and rebuild with "
            "`python setup.py build_ext --inplace`), or pack with --jpeg keep"
        )
    return native


def transcode_to_baseline(data: bytes) -> bytes:
    """Losslessly re-code a JPEG as baseline Huffman (optimized tables), keeping all markers.

    Raises JpegTranscodeError on corrupt input (libjpeg warnings included), TranscodeUnavailableError without
    libjpeg. The GIL is released while libjpeg runs.
    """
    native = _require_native()
    try:
        return native.transcode_to_baseline(data)
    except native.JpegError as e:
        raise JpegTranscodeError(str(e)) from None


def transcode_many(items: Sequence[bytes], num_threads: int = 0) -> list[bytes | JpegTranscodeError]:
    """Transcode many JPEGs on `num_threads` native threads (0: one per CPU), GIL released.

    Returns one entry per input, in order: the baseline bytes, or a JpegTranscodeError for that input.
    """
    native = _require_native()
    if num_threads < 0:
        raise ValueError(f"num_threads must be >= 0, got {num_threads}")
    out = native.transcode_many(list(items), int(num_threads))
    return [JpegTranscodeError(r) if isinstance(r, str) else r for r in out]


def check_scans(items: Sequence, num_threads: int = 0) -> list[str | None]:
    """Decode every scan of each JPEG to its DCT coefficients (libjpeg's Huffman/arithmetic pass; no IDCT, no
    output) on `num_threads` native threads (0: one per CPU), GIL released. One entry per input: None when every
    pixel is coded in the file, else libjpeg's message (premature end of the scan data or file, a bad code, lost
    restart markers, an unsupported or malformed header...). Decoders fill uncoded pixels differently (PIL grey,
    nvJPEG otherwise), so such a file gives different pixels per decoder. See csrc/jpeg_transcode.h
    check_jpeg_scans for which libjpeg warnings count. Raises TranscodeUnavailableError without libjpeg."""
    native = _require_native()
    if num_threads < 0:
        raise ValueError(f"num_threads must be >= 0, got {num_threads}")
    return native.check_jpegs(list(items), int(num_threads))


def prepare(data: bytes, mode: str, quality: int = 90, info: ImageInfo | None = None) -> tuple[bytes, str]:
    """Return (bytes to store, action) for one image under pack mode 'keep' | 'baseline' | 'reencode'.

    action is 'kept' (bytes returned unchanged), 'transcoded' (lossless) or 'reencoded' (lossy, quality Q).
    Pass `info` when the caller already probed `data`. Raises ImageProbeError for unreadable images,
    JpegTranscodeError for corrupt JPEGs, TranscodeUnavailableError when transcoding is needed but unavailable.
    """
    if mode not in PREPARE_MODES:
        raise ValueError(f"mode must be one of {PREPARE_MODES}, got {mode!r}")
    if not isinstance(quality, int) or not 1 <= quality <= 100:
        raise ValueError(f"quality must be an int in 1..100, got {quality!r}")
    if mode == "keep":
        return data, "kept"
    if info is None:
        info = probe(data)
    out, action = data, "kept"
    if info.jpeg_kind in _TRANSCODABLE_KINDS:
        out, action = transcode_to_baseline(data), "transcoded"
        info = probe(out)
    if mode == "reencode" and not info.hw_decodable:
        return _reencode(data, quality), "reencoded"
    return out, action


def _reencode(data: bytes, quality: int) -> bytes:
    from PIL import Image

    try:
        with Image.open(io.BytesIO(data)) as im:
            im.load()
            from fastfeed.decode.contract import GREY_MODES, to_8bit, to_rgb

            grey = im.mode in GREY_MODES
            target = "L" if grey else "RGB"
            icc = im.info.get("icc_profile") if im.mode == target else None
            exif = im.info.get("exif") if im.format == "JPEG" else None  # keeps the EXIF orientation tag
            # The decode contract's rules (16-bit -> v >> 8, alpha dropped), not PIL's clipping convert().
            converted = im if im.mode == target else (to_8bit(im) if grey else to_rgb(im)).convert(target)
            buf = io.BytesIO()
            kwargs = {"quality": quality, "optimize": True, "progressive": False}
            if icc:
                kwargs["icc_profile"] = icc
            if exif:
                kwargs["exif"] = exif
            converted.save(buf, format="JPEG", **kwargs)
    except (Image.DecompressionBombError, OSError, ValueError, SyntaxError, struct.error, EOFError, IndexError, KeyError) as e:
        raise ImageProbeError(f"cannot decode image for re-encoding: {type(e).__name__}: {e}") from e
    return buf.getvalue()


# ---- advice for doctor / inspect -----------------------------------------------------------------------------


def hw_decoder_advice(jpeg_mix: Mapping[str, int], threshold: float = 0.01) -> str | None:
    """The doctor/inspect warning for a manifest's jpeg_mix, or None when the hardware decoder stays busy.

    jpeg_mix maps KIND_NAMES names to counts, plus an optional "baseline_not_hw": how many of the "baseline"
    images the hardware still rejects (CMYK/YCCK/RGB, odd subsampling; `ImageInfo.hw_decodable` False), a
    subset of "baseline". Warns when more than `threshold` (fraction) of the images miss the hardware decoder.
    """
    counts = {k: int(v) for k, v in jpeg_mix.items()}
    unknown = set(counts) - set(KIND_CODES) - {"baseline_not_hw"}
    if unknown:
        raise ValueError(f"unknown jpeg_mix keys: {sorted(unknown)}")
    if any(v < 0 for v in counts.values()) or counts.get("baseline_not_hw", 0) > counts.get("baseline", 0):
        raise ValueError(f"inconsistent jpeg_mix counts: {counts}")
    total = sum(counts.get(name, 0) for name in KIND_CODES)
    if total <= 0:
        return None
    transcodable = counts.get("progressive", 0) + counts.get("arithmetic", 0)
    rejected = counts.get("not_jpeg", 0) + counts.get("other_jpeg", 0) + counts.get("baseline_not_hw", 0)
    missed = transcodable + rejected
    if missed / total <= threshold:
        return None
    lines = [
        f"{missed} of {total} images ({100 * missed / total:.1f}%) cannot use the GPU hardware JPEG decoder "
        "and fall back to slower CUDA/CPU decoding (20% progressive cost 59% of GPU throughput on an H200)."
    ]
    if transcodable:
        lines.append(
            f"  {transcodable} progressive/arithmetic JPEGs: repack losslessly (identical pixels) with "
            "`fastfeed pack SRC OUT --jpeg baseline`."
        )
    if rejected:
        lines.append(
            f"  {rejected} other images (non-JPEG, CMYK/YCCK, lossless/12-bit, unusual subsampling): repack with "
            "`fastfeed pack SRC OUT --jpeg reencode --quality 95` (lossy for those images only)."
        )
    return "\n".join(lines)
