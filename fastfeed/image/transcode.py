"""What pack stores for an image the GPU's hardware JPEG decoder rejects, and the libjpeg checks pack runs.

What the hardware decoder takes, and how an image is classified, is `fastfeed.image.jpeg`.

- `prepare(data, mode)` returns the bytes the packer should store:

  ======== =============================================== ============================================
  mode     what changes                                    pixels
  ======== =============================================== ============================================
  keep     nothing                                         identical
  baseline progressive and arithmetic-coded JPEGs are       identical (DCT coefficients are copied, only
           transcoded to baseline Huffman; the rest kept    the entropy coding changes; markers kept); a
                                                            progressive file whose scans leave
                                                            coefficients uncoded is refused (libjpeg
                                                            estimates them, a copy would not)
  reencode as baseline, then whatever the hardware decoder  lossy for the re-encoded images only
           still rejects (CMYK/YCCK/RGB JPEGs, exotic
           subsampling, 12-bit, lossless, PNG/GIF/WebP/...)
           is decoded and re-encoded as a baseline JPEG at
           ``quality`` (RGB, or grey for grey images)
  ======== =============================================== ============================================

  Re-encoding converts to RGB (alpha dropped, first frame of animations) because that is what both fastfeed
  decoders deliver for such images anyway; the ICC profile is kept unless the colour mode changed.
- `check_scans(items)` decodes every scan of each JPEG to its coefficients, to find the ones whose pixels decoders
  would fill in differently.
- `hw_decoder_advice(jpeg_mix)` turns a manifest's ``jpeg_mix`` (counts by `KIND_NAMES` name, plus optional
  ``"baseline_not_hw"``) into the warning `fastfeed doctor`/`inspect` print, or None.

Lossless transcoding and the scan check run in the native core (`csrc/jpeg_transcode.cpp`, libjpeg-turbo); when
the extension was built without libjpeg, `HAVE_TRANSCODE` is False and transcoding raises
`TranscodeUnavailableError`.
"""
from __future__ import annotations

import io
import struct
from typing import Mapping, Sequence

from fastfeed.image.jpeg import KIND_ARITHMETIC, KIND_CODES, KIND_PROGRESSIVE, ImageInfo, ImageProbeError, _native, probe

__all__ = [
    "PREPARE_MODES",
    "HAVE_TRANSCODE",
    "HAVE_SCAN_CHECK",
    "UNCODED_COEFFICIENTS",
    "JpegTranscodeError",
    "TranscodeUnavailableError",
    "prepare",
    "transcode_to_baseline",
    "transcode_many",
    "check_scans",
    "hw_decoder_advice",
]

PREPARE_MODES = ("keep", "baseline", "reencode")
_TRANSCODABLE_KINDS = frozenset({KIND_PROGRESSIVE, KIND_ARITHMETIC})


class JpegTranscodeError(ValueError):
    """libjpeg rejected the JPEG while transcoding (corrupt data; warnings count as errors)."""


class TranscodeUnavailableError(RuntimeError):
    """fastfeed._native was built without libjpeg, so JPEGs cannot be transcoded."""


def _have_transcode() -> bool:
    native = _native()
    return bool(native is not None and getattr(native, "HAVE_LIBJPEG", False))


HAVE_TRANSCODE = _have_transcode()
# The scan check needs libjpeg too (csrc/jpeg_transcode.h check_jpeg_scans).
HAVE_SCAN_CHECK = HAVE_TRANSCODE
# check_scans' answer for a progressive JPEG whose scans leave coefficients uncoded (csrc/jpeg_transcode.h): every
# pixel is coded, but decoders estimate the missing frequencies differently, so no baseline copy is lossless.
UNCODED_COEFFICIENTS = getattr(_native(), "UNCODED_COEFFICIENTS", None)


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
    restart markers, an unsupported or malformed header..., or UNCODED_COEFFICIENTS). Decoders fill uncoded pixels
    (and estimate uncoded coefficients) differently, so such a file gives different pixels per decoder. See csrc/jpeg_transcode.h
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
            from fastfeed.image.contract import GREY_MODES, to_8bit, to_rgb

            grey = im.mode in GREY_MODES
            target = "L" if grey else "RGB"
            icc = im.info.get("icc_profile") if im.mode == target else None
            exif = exif_to_carry(im, data)
            # The decode contract's rules (16-bit -> v >> 8, alpha dropped), not PIL's clipping convert().
            converted = im if im.mode == target else (to_8bit(im) if grey else to_rgb(im)).convert(target)
            buf = io.BytesIO()
            kwargs = {"quality": quality, "optimize": True, "progressive": False}
            if icc:
                kwargs["icc_profile"] = icc
            if exif:
                kwargs["exif"] = exif
            converted.save(buf, format="JPEG", **kwargs)
    except (Image.DecompressionBombError, OSError, ValueError, SyntaxError, struct.error, EOFError, IndexError,
            KeyError) as e:
        raise ImageProbeError(f"cannot decode image for re-encoding: {type(e).__name__}: {e}") from e
    return buf.getvalue()


def exif_to_carry(im, data) -> bytes | None:
    """The EXIF block to write into a JPEG coded from `im` (opened from `data`, loaded), so that it keeps the tag it
    is displayed by: a JPEG's own block where every reader finds the same tag in it; else PIL's reading of the file
    (an XMP-only tag, a PNG's eXIf or text-chunk copy, a LONG entry), written plainly, or None where it has none."""
    from fastfeed.image.headers import exif_orientation_plain

    if im.format == "JPEG" and exif_orientation_plain(data):
        return im.info.get("exif")
    exif = im.getexif()
    if im.format != "JPEG" and exif.get(0x0112, 1) == 1:
        return None  # nothing to display it by (and a PNG's text and metadata stay out of a JPEG, as before)
    return exif.tobytes() if len(exif) else None


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
