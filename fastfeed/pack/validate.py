"""Read one source file and decide, cheaply, whether it goes into the dataset, and in which form.

Pack accepts every image torchvision's ImageFolder would load, and keeps every pixel, channel and bit of it
(docs/decode-contract.md):
- JPEG (8-bit, YCbCr/grey, baseline or progressive) and 8-bit grey/RGB/opaque-palette PNG: stored as they are, or
  losslessly fixed: data after the JPEG's end-of-image marker / the PNG's IEND trimmed (phone motion photos,
  vendor trailers), junk before the SOI or between SOI and the first marker dropped. Every decoder reads these;
- everything else PIL decodes (BMP, GIF, TIFF, WebP where PIL has it, PPM, 16-bit/low-bit-depth PNG, APNG, PNG
  with alpha or tRNS, CMYK/YCCK, RGB-colour, 12-bit and lossless JPEGs): stored as it is, marked `pil_only`. The
  Loader hands such a sample to the decode contract's PIL decode on every path, so the rules (first frame,
  16-bit -> v >> 8, alpha dropped) apply when it is decoded, never to what is stored;
- arithmetic-coded JPEGs: transcoded losslessly to baseline (native core), else stored as they are (`pil_only`);
- progressive JPEGs whose scans leave coefficients uncoded (DC only, refinements missing): stored as they are,
  `pil_only`, never transcoded: libjpeg (so PIL and torchvision) estimates the missing frequencies, other decoders
  and a baseline copy of the coefficients do not;
- JPEGs whose scans do not code every pixel (the frame header claims more rows than the scans hold, a bad
  Huffman code, lost restart markers: the scan check, transcode.check_scans) but that PIL loads: stored as they
  are, `pil_only`: decoders fill the uncoded pixels differently, PIL (so torchvision) fills them its way. The
  check needs the native core's libjpeg; without it (`transcode.HAVE_SCAN_CHECK` False) it is skipped and pack says
  so in its note. A JPEG too large for the check's 1 GiB of coefficient memory fails it too (then `pil_only`);
- formats without a signature a few bytes can tell (TGA) or with one too weak to trust alone (PCX, SGI, QOI, DDS):
  stored as they are, `pil_only`, when the file's extension names the format PIL then finds and decodes, so that a
  damaged file of another kind is never read as one of them;
- the rest is rejected with the reason (not an image, truncated, decompression bomb, PIL cannot decode it).
`--jpeg reencode` and `--max-side` are the lossy exceptions, asked for. Each fix is named by a code on
`Loaded.change` (CHANGES) that the manifest counts.

Cost: JPEGs (the bulk of any dataset) are checked from the header and the last bytes, plus the scan check (an
entropy-decoding pass, no IDCT: the bulk of pack's CPU time, see benchmarks/README.md; `LoadOptions.scan_check`
False, `fastfeed pack --no-scan-check`, skips it); only a JPEG that does not end in EOI is scanned for the end of
its first image. PNGs get their compressed pixel data inflated and its length checked against the header (DALI
refuses a PNG whose data is shorter than its header says while PIL silently accepts it). `pil_only` files are
fully decoded once, by PIL, to prove they decode. Every failure becomes a reason string, never an exception.
"""
from __future__ import annotations

import errno
import io
import os
import stat
import struct
from dataclasses import dataclass, replace

from fastfeed.image import jpeg, transcode
from fastfeed.image.headers import (PNG_SIGNATURE, exif_orientation, exif_orientation_plain, jpeg_end,
                                    jpeg_without_junk_after_soi, jpeg_without_junk_before_markers, png_data_ok,
                                    pil_read, png_facts, png_text_over_limit, without_png_text)
from fastfeed.pack.containers import TAR_REASON, container, is_tar

__all__ = ["Loaded", "Rejected", "LoadOptions", "load_image", "check_image", "check_for_pil", "SUPPORTED_FORMATS",
           "DEFAULT_MAX_PIXELS",
           "CHANGES", "TRIMMED", "DROPPED_JUNK", "CONVERTED", "REPAIRED", "TRANSCODED", "REENCODED", "DOWNSCALED"]

# Formats every decoder reads as stored; every other image PIL decodes is stored as it is, `pil_only`.
SUPPORTED_FORMATS = ("jpeg", "png")
# The member extension a stored image gets, by _sniff's format name.
EXTENSIONS = {"jpeg": "jpg", "png": "png", "gif": "gif", "bmp": "bmp", "tiff": "tif", "webp": "webp",
              "jpeg2000": "jp2", "ppm": "ppm", "pgm": "pgm", "pbm": "pbm", "ico": "ico", "psd": "psd",
              "heif/avif": "heif"}

# Change codes on Loaded.change (the manifest counts them under "changes"); never rename one.
TRIMMED = "trimmed_trailing_data"  # bytes after the JPEG EOI / PNG IEND dropped (pixels identical)
# bytes before the JPEG SOI, or where a marker should start (after SOI, between header segments) dropped
DROPPED_JUNK = "dropped_leading_junk"
# Written by earlier versions, which stored odd images and corrupt-scan JPEGs as 8-bit PNGs; kept so that their
# manifests read. These files are now stored as they are (`Loaded.pil_only`).
CONVERTED = "converted_to_png"
REPAIRED = "repaired_corrupt_scan"
TRANSCODED = "transcoded_baseline"  # JPEG entropy coding changed to baseline Huffman (pixels identical)
REENCODED = "reencoded_jpeg"  # --jpeg reencode: lossy
DOWNSCALED = "downscaled_max_side"  # --max-side: lossy
CHANGES = (TRIMMED, DROPPED_JUNK, CONVERTED, REPAIRED, TRANSCODED, REENCODED, DOWNSCALED)
# When several apply to one file, the code reported is the one that changed the most (later in this order).
_WEIGHT = {c: i for i, c in enumerate(CHANGES)}
_JUNK_MAX = 1024  # junk before the SOI: at most this many bytes
# Twice PIL's own bomb limit: ImageNet's largest image is ~30 Mpx; anything above this is almost surely hostile.
DEFAULT_MAX_PIXELS = 2 * 89_478_485
MAX_FILE_BYTES = 1 << 31  # keeps one sample far below any shard/LMDB limit

_MAGIC = (
    (b"GIF87a", "gif"), (b"GIF89a", "gif"), (b"BM", "bmp"), (b"II*\x00", "tiff"), (b"MM\x00*", "tiff"),
    (b"II+\x00", "tiff"), (b"MM\x00+", "tiff"),  # BigTIFF (64-bit offsets: scanners, slide and satellite images)
    (b"\x00\x00\x00\x0cjP  ", "jpeg2000"), (b"\xffO\xffQ", "jpeg2000"), (b"P6", "ppm"), (b"P5", "pgm"),
    (b"P4", "pbm"), (b"P3", "ppm"), (b"P2", "pgm"), (b"P1", "pbm"),  # Netpbm: binary, then the ASCII forms
    (b"Pf", "pfm"), (b"PF", "pfm"),  # PFM, float grey / RGB: PIL decodes the grey one (a PF is rejected with why)
    (b"\x00\x00\x01\x00", "ico"), (b"8BPS", "psd"),
)
_PNG_END = b"IEND\xaeB`\x82"


@dataclass(frozen=True)
class LoadOptions:
    jpeg_mode: str = "keep"  # fastfeed.image.transcode.prepare mode
    quality: int = 90
    max_side: int | None = None  # re-encode images whose longer side exceeds this
    max_pixels: int = DEFAULT_MAX_PIXELS
    scan_check: bool = True  # run the JPEG scan check (when the native core has libjpeg: transcode.HAVE_SCAN_CHECK)
    orientation: str = "ignore"  # the frame a sample's mask is in: "exif" is checked against the displayed size


@dataclass(frozen=True)
class Loaded:
    """An accepted image. `data` is bytes-like (a memoryview into the batch reader's buffer, or bytes);
    `note` says why the bytes were stored untouched although the mode asked for a change (e.g. libjpeg found
    corrupt data while transcoding: DALI and PIL may still decode what libjpeg's strict mode refuses).
    `change`: what was done to the file (a CHANGES code) or None when stored byte for byte.
    `orientation`: the EXIF orientation tag 1..8 the decoders apply under policy "exif" (contract.orientation_tag;
    1 when absent).
    `pil_only`: only the decode contract's PIL decode reads these bytes as the contract says (see the module
    docstring); the Loader routes the sample there on every path."""

    data: bytes
    ext: str
    width: int
    height: int
    jpeg_kind: int
    transcoded: bool
    hw_decodable: bool = False
    note: str | None = None
    change: str | None = None
    orientation: int = 1
    pil_only: bool = False


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
    return check_image(data, opts, name=path)


def check_image(data, opts: LoadOptions, facts: tuple | None = None, name: str | None = None) -> Loaded | Rejected:
    """Validate (and, per `opts` and the module docstring, fix or convert) one image held in `data` (bytes or a
    memoryview). Never raises on bad image bytes: every problem becomes a Rejected reason. `name`: the file's name
    (or its extension: "tga", ".tga"), for the formats that have no signature (the module docstring).

    `facts`: what the native reader threads found in this very `data` (pack/native.py `add_samples(probe=True)`:
    csrc/image_probe.h, a mirror of the Python header walk, plus the scan check), given only for a JPEG whose
    header walk succeeded; the decision is the same as without it, only the bytes are not walked again here."""
    if not len(data):
        return Rejected("empty file (0 bytes)")
    if facts is not None:
        return _check_jpeg(data, opts, None, facts)
    # First: a tar's first member starts 512 bytes in, where a JPEG there would pass for one behind leading junk,
    # and its member name can start like another format's signature.
    if is_tar(data):
        return Rejected(TAR_REASON)
    fmt = _sniff(bytes(data[:16]))
    if fmt is None and bytes(data[:2]) == b"\xff\xd8":  # SOI, then junk before the first marker
        return _check_jpeg(data, opts, None)
    if fmt is None:
        head = bytes(data[:_JUNK_MAX + 3])
        soi = head.find(b"\xff\xd8\xff")
        # A few bytes of junk (an HTTP header, a BOM, padding) before a JPEG are dropped; a container that holds a
        # JPEG (PDF, ZIP, MP4 cover art, ...) is not one: its embedded picture is not what the user's file shows.
        what = container(head)
        if soi <= 0 or what is not None:
            return _named_for_pil(data, name, opts) or Rejected(f"not an image: {what}" if what else
                                                                "not an image (unknown file signature)")
        return _check_jpeg(data[soi:], opts, DROPPED_JUNK)
    if fmt == "jpeg":
        return _check_jpeg(data, opts, None)
    if fmt == "png":
        return _check_png(data, opts)
    return _keep_for_pil(data, fmt, opts, None)


def _check_jpeg(data, opts: LoadOptions, change: str | None, facts: tuple | None = None) -> Loaded | Rejected:
    info = scan = None
    if facts is not None:
        marker, sof, jfif, adobe, orientation, ends_with_eoi, scan = facts
        try:
            info = jpeg.jpeg_info(marker, sof, jfif, adobe, orientation)
        except jpeg.ImageProbeError:
            facts = scan = None  # the walk below raises the same error and tries the junk fix
    if info is None:
        try:
            info = _probe(data)
        except jpeg.ImageProbeError as e:
            return _check_jpeg_unreadable(data, opts, e)
    return _check_jpeg_info(data, opts, change, info, facts[5] if facts is not None else None, scan)


def _check_jpeg_unreadable(data, opts: LoadOptions, e: jpeg.ImageProbeError) -> Loaded | Rejected:
    """The header walk failed: junk between SOI and the first marker, or before a later marker, is dropped (the
    scans are left as they are), else the file is kept for PIL's decode if that reads it, or rejected."""
    for fix in (jpeg_without_junk_after_soi, jpeg_without_junk_before_markers):
        fixed = fix(data)
        if fixed is None:
            continue
        try:
            info = _probe(fixed)
        except jpeg.ImageProbeError as e2:
            e = e2
            continue
        return _check_jpeg_info(fixed, opts, DROPPED_JUNK, info, None, None)
    # No fix makes the header walk read it; PIL (libjpeg) reads past more than the GPU's decoders: its decode decides.
    return _keep_for_pil(data, "jpeg", opts, None, f"bad image header: {e}")


def _check_jpeg_info(data, opts: LoadOptions, change: str | None, info: jpeg.ImageInfo, ends_with_eoi: bool | None,
                     scan: str | None) -> Loaded | Rejected:
    """The rest of the JPEG decision once the header is read; `ends_with_eoi` / `scan` (the scan check's answer
    for these very bytes: '' clean, else libjpeg's message) when the native readers found them, else None."""
    if info.width * info.height > opts.max_pixels:
        return _bomb(info, opts)
    if ends_with_eoi is None:
        ends_with_eoi = _tail(data).endswith(b"\xff\xd9")
    if not ends_with_eoi:
        end = jpeg_end(data)
        if end is None:  # cut short, or only its marker damaged: PIL's decode tells (it refuses a cut file)
            return _keep_for_pil(data, "jpeg", opts, change, "truncated JPEG (no end-of-image marker)", info)
        data, change = data[:end], _worse(change, TRIMMED)
    if info.precision != 8 or info.jpeg_kind == jpeg.KIND_OTHER_JPEG or info.colorspace not in ("ycbcr", "gray"):
        # 12-bit, lossless, hierarchical, CMYK/YCCK, RGB colour: the GPU decoder cannot, or does not identically,
        # decode them.
        what = (f"{info.precision}-bit JPEG" if info.precision != 8 else
                "lossless/extended JPEG" if info.jpeg_kind == jpeg.KIND_OTHER_JPEG else
                f"{info.colorspace.upper()} JPEG")
        return _keep_for_pil(data, "jpeg", opts, change, what, info)
    if not exif_orientation_plain(data):  # DALI's and PIL's readers disagree on its tag: PIL's decode, with PIL's tag
        return _keep_for_pil(data, "jpeg", opts, change, "JPEG whose EXIF orientation readers disagree on", info)
    if opts.scan_check and transcode.HAVE_SCAN_CHECK:
        err = (scan or None) if scan is not None and change is None else transcode.check_scans([data], 1)[0]
        if err == transcode.UNCODED_COEFFICIENTS:  # kept as it is: a baseline copy would lose libjpeg's estimates
            return _keep_for_pil(data, "jpeg", replace(opts, jpeg_mode="keep"), change, f"JPEG with {err}", info)
        if err is not None:
            return _keep_for_pil(data, "jpeg", opts, change, f"JPEG with corrupt scan data ({err})", info)
    if info.jpeg_kind == jpeg.KIND_ARITHMETIC and opts.jpeg_mode == "keep":
        # Not every decoder of every path reads arithmetic coding: make it baseline even in keep mode (lossless).
        if transcode.HAVE_TRANSCODE:
            try:
                out = transcode.transcode_to_baseline(bytes(data))
                new = jpeg.probe(out)
                return Loaded(out, "jpg", new.width, new.height, new.jpeg_kind, True, new.hw_decodable,
                              change=_worse(change, TRANSCODED), orientation=new.orientation)
            except (transcode.JpegTranscodeError, jpeg.ImageProbeError):
                pass
        return _keep_for_pil(data, "jpeg", opts, change, "arithmetic-coded JPEG", info)
    return _maybe_convert(data, "jpeg", info, opts, change)


def _bomb(info, opts: LoadOptions) -> Rejected:
    return Rejected(f"decompression bomb: {info.width}x{info.height} pixels exceeds the limit of "
                    f"{opts.max_pixels} (--max-pixels)")


def _worse(a: str | None, b: str | None) -> str | None:
    if a is None or b is None:
        return a or b
    return a if _WEIGHT[a] >= _WEIGHT[b] else b


# ---- PNG -----------------------------------------------------------------------------------------------------

def _check_png(data, opts: LoadOptions) -> Loaded | Rejected:
    f = png_facts(data)
    if isinstance(f, str):  # a chunk structure libpng refuses; PIL, which stops once it has every row, may not
        return _keep_for_pil(data, "png", opts, None, f)
    if f.width * f.height > opts.max_pixels:
        return _bomb(f, opts)
    change = None
    if f.end < len(data):
        data, change = data[: f.end], TRIMMED
    if f.bad_crc_before_idat is not None:
        kind = f.bad_crc_before_idat.decode("latin-1")
        return Rejected(f"damaged PNG: the checksum (CRC) of its {kind} chunk is wrong, and PIL refuses such a file")
    if f.filter_method != 0 or f.interlace > 1 or f.idat_apart:  # PIL and libpng both refuse these
        return Rejected(f"damaged PNG: filter method {f.filter_method} (only 0 exists)" if f.filter_method else
                        f"damaged PNG: interlace method {f.interlace} (only 0 and 1 exist)" if f.interlace > 1 else
                        "damaged PNG: its pixel data chunks (IDAT) are not consecutive")
    err, stream_ends = png_data_ok(data, f)
    if err is not None:  # libpng refuses it; PIL, which stops once it has every row, may still decode it
        return _keep_for_pil(data, "png", opts, change, err)
    # What libpng (DALI's CPU decoder) refuses and PIL decodes: decoded by PIL on every path.
    libpng_refuses = ("PNG whose pixel data's CRC is wrong" if f.bad_crc_idat else
                      "PNG whose compressed pixel data stops short of its end" if not stream_ends else
                      f"PNG with compression method {f.compression}" if f.compression else
                      f"PNG with an unknown critical chunk ({f.unknown_critical.decode('latin-1')})"
                      if f.unknown_critical else
                      "PNG with a missing, repeated, misplaced or malformed palette"
                      if not f.palette_ok or f.palettes > 1 or (f.ctype == 3 and not f.palettes) else
                      "PNG with a second image header (IHDR)" if f.repeated_header else None)
    if f.depth != 8 or f.ctype in (4, 6) or f.trns or f.animated or libpng_refuses:
        what = ("APNG (or an APNG frame's chunks)" if f.animated else f"{f.depth}-bit PNG" if f.depth != 8 else
                libpng_refuses or "PNG with transparency")
        return _keep_for_pil(data, "png", opts, change, what)  # (PIL decodes it whole there, metadata included)
    err = _pil_reads_png_chunks(data, f)
    if err is not None:
        return Rejected(err)
    if not exif_orientation_plain(data):
        return _keep_for_pil(data, "png", opts, change, "PNG whose EXIF orientation readers disagree on")
    info = jpeg.ImageInfo("png", f.width, f.height, jpeg.KIND_NOT_JPEG, None,
                          {0: "gray", 2: "rgb", 3: "palette"}[f.ctype], False, orientation=exif_orientation(data))
    return _maybe_convert(data, "png", info, opts, change)


def _pil_reads_png_chunks(data, f) -> str | None:
    """Why PIL refuses the PNG's metadata chunks, or None. PIL parses every chunk before the pixel data when it opens
    the file (cheap), and those after it as it finishes loading: a malformed one (a short pHYs, gAMA or cHRM, an
    iCCP without its name) makes it refuse the whole file, which libpng decodes. So the file is opened, and loaded
    whole only when chunks follow the pixel data."""
    from PIL import Image, UnidentifiedImageError

    def refusal(png: bytes) -> Exception | None:
        try:
            with Image.open(io.BytesIO(png), formats=["PNG"]) as im:
                if f.after_pixels:
                    im.load()
        except Exception as e:  # noqa: BLE001 - any refusal is the reason, with PIL's words
            return e
        return None

    e = refusal(bytes(data))
    if e is not None and png_text_over_limit(e):  # the CPU paths decode it without its text (the contract)
        e = refusal(without_png_text(data))
    if e is None:
        return None
    # (PIL's "cannot identify" names the file object's address: the same file must give the same reason.)
    said = "it cannot identify it" if isinstance(e, UnidentifiedImageError) else f"{type(e).__name__}: {e}"
    return f"PIL refuses this PNG's metadata ({said}), so no CPU path could decode it"


# ---- images only PIL reads as the contract says -------------------------------------------------------------


def check_for_pil(data, opts: LoadOptions) -> Loaded | Rejected:
    """`data` accepted exactly as it is, `pil_only`, when PIL decodes it whole (else the reason): for a caller that
    may not change a byte (`fastfeed index`) of a file that check_image would fix (junk dropped, a JPEG transcoded)."""
    fmt = _sniff(bytes(data[:16])) or "jpeg"
    info = None
    if fmt == "jpeg":
        try:
            info = _probe(data)
        except jpeg.ImageProbeError:
            pass  # PIL may still read it (junk before a marker): its decode decides
    return _keep_for_pil(data, fmt, replace(opts, jpeg_mode="keep", max_side=None), None, None, info)


def _keep_for_pil(data, fmt: str, opts: LoadOptions, change: str | None, what: str | None = None,
                  info: jpeg.ImageInfo | None = None) -> Loaded | Rejected:
    """Store `data` as it is, `pil_only`, once PIL has decoded it whole (else reject with the reason); `info`: the
    JPEG header's facts, when it is a JPEG."""
    from PIL import Image, UnidentifiedImageError

    from fastfeed.image.contract import orientation_tag, to_rgb

    reason = (f"{what}: no fastfeed decoder reads it as stored and PIL cannot decode it" if what else
              f"unsupported format: {fmt} (this PIL cannot decode it, so neither can torchvision's ImageFolder here)")
    codec = _PIL_CODECS.get(fmt)
    if codec is not None and not _pil_has(codec):
        return Rejected(reason)
    def decoded(readable: bytes) -> tuple[int, int, str, int] | Rejected:
        with Image.open(io.BytesIO(readable)) as im:  # the first frame of an animation: the contract's choice
            w, h = im.size
            if w * h > opts.max_pixels:
                return Rejected(f"decompression bomb: {w}x{h} pixels exceeds the limit of {opts.max_pixels} "
                                f"(--max-pixels)")
            im.load()
            try:  # what every decoder makes of it: a LAB image, say, needs the littlecms PIL may be built without
                to_rgb(im)
            except Exception as e:  # noqa: BLE001 - any failure of the conversion is the reason, with PIL's words
                return Rejected(f"PIL decodes this {im.mode} image but cannot convert it to RGB ({type(e).__name__}: "
                                f"{e}), so no fastfeed decoder (nor torchvision's ImageFolder) could read it")
            # After load(): PNG's eXIf may follow the pixel data; what the decoders apply under policy "exif".
            return im.size[0], im.size[1], im.mode, orientation_tag(data, im, "exif")

    try:
        facts = pil_read(decoded, bytes(data))
        if isinstance(facts, Rejected):
            return facts
        w, h, mode, tag = facts
    except UnidentifiedImageError:
        return Rejected(reason)
    except Image.DecompressionBombError as e:
        return Rejected(f"decompression bomb: {e}")
    except (OSError, ValueError, SyntaxError, EOFError, IndexError, KeyError, struct.error, MemoryError) as e:
        return Rejected(f"{reason} ({type(e).__name__}: {e})")
    except Exception as e:  # noqa: BLE001 - a plugin or a patched Image.open (ultralytics') raises others: a rejection
        return Rejected(f"{reason} ({type(e).__name__}: {e})")
    if info is None:
        info = jpeg.ImageInfo(fmt, w, h, jpeg.KIND_NOT_JPEG, None, jpeg.pil_colorspace(mode), False)
    info = replace(info, width=w, height=h, hw_decodable=False, orientation=tag)
    return _maybe_convert(data, fmt, info, opts, change, pil_only=True)


def _named_for_pil(data, name: str | None, opts: LoadOptions) -> Loaded | Rejected | None:
    """A file without a known signature whose extension names a format PIL reads: PIL's plugin for that format
    alone opens it (so a text or damaged file is never taken for another format), then `_keep_for_pil`'s decode
    decides. None when the name names no such format."""
    from PIL import Image

    ext = (os.path.splitext(name)[1] or f".{name}") if name else ""
    plugin = Image.registered_extensions().get(ext.lower())
    if plugin is None or plugin in _SIGNED_PLUGINS:
        return None
    try:
        with Image.open(io.BytesIO(bytes(data)), formats=[plugin]):
            pass
    except Exception:  # noqa: BLE001 - not this format (or not one at all): the caller's rejection
        return None
    return _keep_for_pil(data, ext[1:].lower(), opts, None)


# PIL plugins of the formats _sniff knows by their signature: a file of one of them without it is damaged.
# (A DIB is a BMP without the file header that holds BMP's signature: named by its extension, as TGA is.)
_SIGNED_PLUGINS = {"JPEG", "MPO", "PNG", "GIF", "BMP", "TIFF", "WEBP", "JPEG2000", "PPM", "ICO", "PSD"}

# Formats whose PIL plugin needs an optional codec library (PIL only warns when it is missing).
_PIL_CODECS = {"webp": "webp", "heif/avif": "avif", "jpeg2000": "jpg_2000"}


def _pil_has(codec: str) -> bool:
    from PIL import features

    try:
        return bool(features.check(codec))
    except ValueError:  # a PIL that does not know the feature's name
        return False


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
    if data[:8] == PNG_SIGNATURE:
        return "png"
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "webp"
    if data[4:12] in (b"ftypheic", b"ftypheix", b"ftypmif1", b"ftypavif"):
        return "heif/avif"
    for magic, name in _MAGIC:
        if data.startswith(magic):
            return name
    return None


def _maybe_convert(data, fmt: str, info: jpeg.ImageInfo, opts: LoadOptions, change: str | None = None,
                   pil_only: bool = False) -> Loaded | Rejected:
    """Apply --max-side and --jpeg to an accepted image; `pil_only` as for Loaded, true of the result as long as
    its bytes stay the source's coding (kept, or a JPEG transcoded losslessly)."""
    if opts.max_side and max(info.width, info.height) > opts.max_side:
        try:
            out, w, h = _downscale(bytes(data), opts.max_side, opts.quality)
            new = jpeg.probe(out)
        except (OSError, ValueError, SyntaxError, EOFError) as e:
            return Rejected(f"cannot decode image for --max-side re-encoding: {type(e).__name__}: {e}")
        tag, odd = _coded_tag(out, new.orientation)
        return Loaded(out, "jpg", w, h, new.jpeg_kind, True, new.hw_decodable, change=_worse(change, DOWNSCALED),
                      orientation=tag, pil_only=odd)
    kept = Loaded(data, EXTENSIONS.get(fmt, fmt), info.width, info.height, info.jpeg_kind, False, info.hw_decodable,
                  change=change, orientation=info.orientation, pil_only=pil_only)
    if opts.jpeg_mode == "keep" or (info.hw_decodable and opts.jpeg_mode in transcode.PREPARE_MODES):
        return kept
    try:
        out, action = transcode.prepare(bytes(data), opts.jpeg_mode, opts.quality, info=info)
    except transcode.JpegTranscodeError as e:
        # libjpeg's strict mode turns "Corrupt JPEG data" warnings into errors; the file still decodes in PIL
        # and DALI (the probe and end marker passed), so store it untouched rather than lose a sample.
        return replace(kept, note=f"transcode_failed: {e}")
    except jpeg.ImageProbeError as e:
        return Rejected(f"cannot re-encode: {e}")
    if action == "kept":
        return kept
    new = jpeg.probe(out)
    code = TRANSCODED if action == "transcoded" else REENCODED
    tag, odd = _coded_tag(out, new.orientation)
    return Loaded(out, EXTENSIONS.get(new.format, new.format), new.width, new.height, new.jpeg_kind, True,
                  new.hw_decodable, change=_worse(change, code), orientation=tag,
                  pil_only=odd or (pil_only and code == TRANSCODED))


def _coded_tag(out: bytes, header_tag: int) -> tuple[int, bool]:
    """(the EXIF tag to store, whether only PIL's decode may read it) for JPEG bytes pack coded itself: they carry
    the source's EXIF over, and where its readers disagree on the tag (headers.exif_orientation_plain) the table
    holds PIL's, as for a source kept for PIL (`_keep_for_pil`)."""
    if exif_orientation_plain(out):
        return header_tag, False
    from PIL import Image

    from fastfeed.image.contract import orientation_tag

    with Image.open(io.BytesIO(out)) as im:
        return orientation_tag(out, im, "exif"), True


def _downscale(data: bytes, max_side: int, quality: int) -> tuple[bytes, int, int]:
    from PIL import Image

    from fastfeed.image.contract import to_rgb

    # No warnings.catch_warnings() here: it is not thread-safe and this runs on pack's threads; the pixel limit
    # was checked before.
    with Image.open(io.BytesIO(data)) as im:
        w, h = im.size
        scale = max_side / max(w, h)
        size = (max(1, round(w * scale)), max(1, round(h * scale)))
        im.draft("RGB", size)  # JPEG: decode at a reduced DCT scale first
        rgb = to_rgb(im)
        exif = transcode.exif_to_carry(im, data)  # keeps the tag it is displayed by (read after the pixels)
        out = rgb.resize(size, Image.BICUBIC, reducing_gap=3.0)
    buf = io.BytesIO()
    out.save(buf, format="JPEG", quality=quality, optimize=False, progressive=False, **({"exif": exif} if exif else {}))
    return buf.getvalue(), size[0], size[1]
