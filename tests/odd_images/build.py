"""Build the odd-image corpus: real files of every kind a user's folder holds, made with PIL and byte surgery.

    python tests/odd_images/build.py OUT_DIR        # writes the files and prints one line per case

Deterministic (fixed content, no timestamps) and fast (~1 s): pytest builds it into a tmp dir, tools/odd_corpus_gpu.py
on the device. Needs only PIL and numpy; when libjpeg-turbo's `jpegtran` is on PATH (Debian: libjpeg-turbo-progs)
an arithmetic-coded JPEG is added too.

Each case says what pack must do with it: `expect` "accept" (stored, possibly with `change` = the validation change
code, `pil_only` when only PIL reads it as the decode contract says) or "reject" (with a word the reason must
contain). Cases whose outcome depends on this PIL's codecs (WebP)
read PIL's features.
"""
from __future__ import annotations

import io
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import zlib
from dataclasses import dataclass

import numpy as np
from PIL import Image, features

__all__ = ["Case", "build_corpus", "photo"]

W, H = 120, 80  # non-square on purpose: rotations by EXIF change the displayed size


@dataclass(frozen=True)
class Case:
    name: str
    path: str
    expect: str  # "accept" | "reject"
    change: str | None = None  # the validation change code pack reports, for accepted files
    reason: str | None = None  # a word the rejection reason contains
    orientation: int = 1  # the EXIF tag pack's probe must return
    pil_only: bool = False  # stored as it is, for the decode contract's PIL decode only (Loaded.pil_only)


def photo(w: int = W, h: int = H, seed: int = 0) -> np.ndarray:
    """A deterministic photo-like RGB image: smooth gradients, hard edges and mild noise (uint8 [h, w, 3])."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w].astype(np.float64)
    r = 128 + 100 * np.sin(x / max(w, 1) * 6.0 + seed)
    g = 128 + 100 * np.cos(y / max(h, 1) * 5.0)
    b = 255 * ((x // 16 + y // 16) % 2) * 0.6 + 40
    img = np.stack([r, g, b], axis=-1)
    img[(x - w / 3) ** 2 + (y - h / 2) ** 2 < (min(w, h) / 4) ** 2] = (250, 240, 30)  # an off-centre disc
    img += rng.normal(0, 6, img.shape)
    return np.clip(img, 0, 255).astype(np.uint8)


def _enc(img: Image.Image, fmt: str, **kw) -> bytes:
    b = io.BytesIO()
    img.save(b, fmt, **kw)
    return b.getvalue()


def _exif(tag: int) -> bytes:
    ex = Image.Exif()
    ex[0x0112] = tag
    return ex.tobytes()


def _chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body) & 0xFFFFFFFF)


def _png(w: int, h: int, depth: int, ctype: int, raw_rows: bytes, extra: list[tuple[bytes, bytes]] = (),
         interlace: int = 0) -> bytes:
    """A PNG written chunk by chunk (PIL cannot write 16-bit RGB, Adam7 or lying headers)."""
    out = b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, depth, ctype, 0, 0, interlace))
    for kind, body in extra:
        out += _chunk(kind, body)
    return out + _chunk(b"IDAT", zlib.compress(raw_rows, 6)) + _chunk(b"IEND", b"")


def _rows(a: np.ndarray) -> bytes:
    """Filter-type-0 scanlines of a (h, w[, c]) big-endian-ready array."""
    h = a.shape[0]
    flat = a.reshape(h, -1)
    return b"".join(b"\x00" + flat[i].tobytes() for i in range(h))


def _adam7(a: np.ndarray) -> bytes:
    """The filter-type-0 scanlines of Adam7's seven passes over a (h, w, c) uint8 array."""
    passes = ((0, 0, 8, 8), (4, 0, 8, 8), (0, 4, 4, 8), (2, 0, 4, 4), (0, 2, 2, 4), (1, 0, 2, 2), (0, 1, 1, 2))
    return b"".join(_rows(a[y0::dy, x0::dx]) for x0, y0, dx, dy in passes if a[y0::dy, x0::dx].size)


def _scan_check() -> bool:
    """Whether pack finds a JPEG whose scans miss pixels (and marks it `pil_only`): it needs libjpeg."""
    try:
        from fastfeed.image.transcode import HAVE_SCAN_CHECK
    except ImportError:  # run standalone (the device's corpus tool): fastfeed's native core has libjpeg there
        return True
    return bool(HAVE_SCAN_CHECK)


def _sof_patch(jpeg: bytes, marker: int | None = None, precision: int | None = None,
               height: int | None = None, width: int | None = None) -> bytes:
    """Rewrite fields of the first SOF segment in place (header-faked files)."""
    b = bytearray(jpeg)
    pos = 2
    while True:
        assert b[pos] == 0xFF
        m = b[pos + 1]
        ln = struct.unpack_from(">H", b, pos + 2)[0]
        if m in (0xC0, 0xC1, 0xC2):
            if marker is not None:
                b[pos + 1] = marker
            if precision is not None:
                b[pos + 4] = precision
            if height is not None:
                struct.pack_into(">H", b, pos + 5, height)
            if width is not None:
                struct.pack_into(">H", b, pos + 7, width)
            return bytes(b)
        pos += 2 + ln


def _first_scans(jpeg: bytes, k: int) -> bytes:
    """The JPEG cut after its first `k` scans, then EOI: a progressive file whose scans stop short (as a scan script
    without the refinements writes it). libjpeg's simple progression, which PIL writes, has 10 scans for colour:
    the DC scan first, the last luma AC refinement last."""
    pos, scans = 2, 0
    while True:
        assert jpeg[pos] == 0xFF
        m = jpeg[pos + 1]
        if m == 0xDA:
            if scans == k:
                return jpeg[:pos] + b"\xff\xd9"
            scans += 1
            pos += 2 + struct.unpack_from(">H", jpeg, pos + 2)[0]
            while not (jpeg[pos] == 0xFF and jpeg[pos + 1] not in (0x00, *range(0xD0, 0xD8))):  # the scan's data
                pos += 1
        elif m == 0xD9:
            raise ValueError(f"the JPEG has {scans} scans, not more than {k}")
        else:
            pos += 2 + struct.unpack_from(">H", jpeg, pos + 2)[0]


def _adobe_transform(jpeg: bytes, transform: int) -> bytes:
    """Set the Adobe APP14 colour transform byte (0 = CMYK, 2 = YCCK) of a 4-component JPEG."""
    i = jpeg.index(b"\xff\xeeAdobe") if b"\xff\xeeAdobe" in jpeg else jpeg.index(b"\xff\xee")
    b = bytearray(jpeg)
    b[i + 4 + 11] = transform
    return bytes(b)


def _fake_icc() -> bytes:
    """A structurally valid ICC header (v2 display RGB profile) with an empty tag table: PIL embeds it as is."""
    body = bytearray(132)
    struct.pack_into(">I", body, 0, 132)
    body[4:8] = b"none"
    body[8:12] = bytes([2, 0x10, 0, 0])
    body[12:16], body[16:20], body[20:24] = b"mntr", b"RGB ", b"XYZ "
    body[36:40] = b"acsp"
    return bytes(body)


def _cases(rgb: np.ndarray) -> list[tuple[str, bytes, str, str | None, str | None, int, bool]]:
    im = Image.fromarray(rgb, "RGB")
    grey = im.convert("L")
    base = _enc(im, "JPEG", quality=90)
    out: list[tuple[str, bytes, str, str | None, str | None, int, bool]] = []

    def acc(name, data, change=None, orientation=1, pil=False):
        out.append((name, data, "accept", change, None, orientation, pil))

    def rej(name, data, reason):
        out.append((name, data, "reject", None, reason, 1, False))

    # -- JPEG as stored
    acc("jpeg_baseline.jpg", base)
    acc("jpeg_progressive.jpg", _enc(im, "JPEG", quality=90, progressive=True))
    # Progressive files whose scans stop short: libjpeg estimates the uncoded coefficients (block smoothing), other
    # decoders and a baseline copy do not. Stored as they are, for PIL (with libjpeg, so the scan check finds them).
    progressive = _enc(im, "JPEG", quality=90, progressive=True)
    acc("jpeg_progressive_dc_only.jpg", _first_scans(progressive, 1), pil=_scan_check())
    acc("jpeg_progressive_unrefined.jpg", _first_scans(progressive, 9), pil=_scan_check())
    acc("jpeg_444.jpg", _enc(im, "JPEG", quality=90, subsampling=0))
    acc("jpeg_grey.jpg", _enc(grey, "JPEG", quality=90))
    acc("jpeg_icc.jpg", _enc(im, "JPEG", quality=90, icc_profile=_fake_icc()))
    for tag in range(1, 9):
        acc(f"jpeg_exif_orientation_{tag}.jpg", _enc(im, "JPEG", quality=90, exif=_exif(tag)), orientation=tag)
    acc("jpeg_exif_orientation_6_progressive.jpg",
        _enc(im, "JPEG", quality=90, progressive=True, exif=_exif(6)), orientation=6)
    # hopper_bad_exif style: an APP1 "Exif" block whose TIFF structure is garbage; the tag reads as absent.
    acc("jpeg_bad_exif.jpg", base[:2] + _chunk_app(0xE1, b"Exif\x00\x00MM\x00*\xff\xff\xff\xf0garbage") + base[2:])
    big = Image.fromarray(photo(37, 1000, seed=3), "RGB")
    acc("jpeg_1px_wide.jpg", _enc(Image.fromarray(photo(1, 300, seed=1), "RGB"), "JPEG", quality=90))
    acc("jpeg_1px_tall.jpg", _enc(Image.fromarray(photo(300, 1, seed=2), "RGB"), "JPEG", quality=90))
    acc("jpeg_tall_strip.jpg", _enc(big, "JPEG", quality=90))
    acc("jpeg_1x1.jpg", _enc(Image.new("RGB", (1, 1), (200, 10, 30)), "JPEG", quality=90))
    acc("jpeg_restart_markers.jpg", _enc(im, "JPEG", quality=90, restart_marker_blocks=4))
    acc("jpeg_411.jpg", _enc(im, "JPEG", quality=90, subsampling="4:1:1"))
    # What the header walks must step over: 0xFF fill bytes before a marker (the standard allows any number), a
    # comment holding an end-of-image marker's bytes, an EXIF block holding a whole thumbnail JPEG.
    dqt, sof = base.index(b"\xff\xdb"), base.index(b"\xff\xc0")
    acc("jpeg_fill_bytes.jpg", base[:dqt] + b"\xff\xff\xff" + base[dqt:sof] + b"\xff" + base[sof:])
    acc("jpeg_comment_with_eoi.jpg", base[:2] + _chunk_app(0xFE, b"a comment \xff\xd9 holding an EOI") + base[2:])
    acc("jpeg_tables_after_sof.jpg", _tables_after_sof(base))  # legal, if unusual: DQT and an APP after the frame
    acc("jpeg_zero_padding.jpg", base + bytes(100))  # zeros after EOI, as some writers pad to a block
    # Motion-JPEG frames carry no Huffman tables (the standard ones are implied); camera files often no JFIF.
    acc("jpeg_no_huffman_tables.jpg", _without_segments(base, 0xC4))
    acc("jpeg_no_jfif.jpg", _without_segments(base, 0xE0))
    # Header segments PIL's reader fails on and libjpeg skips: rejected, since no CPU path could decode them.
    bare = _without_segments(base, 0xE0)
    rej("jpeg_short_jfif.jpg", bare[:2] + _chunk_app(0xE0, b"JFIF\x00\x01") + bare[2:], "PIL refuses")
    rej("jpeg_short_icc_fragment.jpg", bare[:2] + _chunk_app(0xE2, b"ICC_PROFILE\x00") + bare[2:], "PIL refuses")
    acc("jpeg_16bit_quant_tables.jpg", _wide_quant_tables(base))  # legal in baseline JPEG as in others
    # A restart marker between header segments: libjpeg reads past it, nvJPEG's parser refuses the file.
    dqt = base.index(b"\xff\xdb")
    acc("jpeg_restart_marker_in_header.jpg", base[:dqt] + b"\xff\xd3" + base[dqt:], pil=True)
    rej("jpeg_tem_marker_in_header.jpg", base[:dqt] + b"\xff\x01" + base[dqt:], "parameterless marker")  # PIL too
    # Every scan there but the end marker damaged: PIL decodes it (the GPU's decoders need the marker to trust it).
    acc("jpeg_damaged_eoi.jpg", base[:-2] + b"\xff\xd1", pil=True)  # EOI (D9) became RST1 (D1)
    thumb = _enc(Image.fromarray(photo(16, 12, seed=9), "RGB"), "JPEG", quality=80)
    acc("jpeg_exif_thumbnail.jpg", base[:2] + _chunk_app(0xE1, b"Exif\x00\x00MM\x00*\x00\x00\x00\x08\x00\x00" + thumb)
        + base[2:])
    # Orientation tags the header readers (fastfeed's, DALI's, PIL's) read differently: a LONG or count-0 entry, two
    # entries, a block past the first 64 KB, only an XMP copy. Kept for PIL's decode, with PIL's tag (the reference's).
    acc("jpeg_exif_orientation_long.jpg", base[:2] + _chunk_app(0xE1, b"Exif\x00\x00" + _ifd0_orientation(
        "<", 4, 1, struct.pack("<I", 6))) + base[2:], pil=True, orientation=6)
    acc("jpeg_exif_orientation_count_0.jpg", base[:2] + _chunk_app(0xE1, b"Exif\x00\x00" + _ifd0_orientation(
        ">", 3, 0, struct.pack(">HH", 6, 0))) + base[2:], pil=True)
    acc("jpeg_exif_orientation_twice.jpg", base[:2] + _chunk_app(0xE1, b"Exif\x00\x00" + _ifd0_orientation(
        ">", 3, 1, struct.pack(">HH", 6, 0), again=struct.pack(">HH", 8, 0))) + base[2:], pil=True, orientation=8)
    big_icc = b"".join(_chunk_app(0xE2, b"ICC_PROFILE\x00" + bytes([k, 2]) + bytes(40000)) for k in (1, 2))
    acc("jpeg_exif_orientation_after_80kb.jpg", base[:2] + big_icc + _chunk_app(0xE1, _exif(6)) + base[2:], pil=True,
        orientation=6)
    xmp = (b"http://ns.adobe.com/xap/1.0/\x00<x:xmpmeta xmlns:x='adobe:ns:meta/'><rdf:RDF xmlns:rdf='http://www.w3.org/"
           b"1999/02/22-rdf-syntax-ns#'><rdf:Description xmlns:tiff='http://ns.adobe.com/tiff/1.0/' tiff:Orientation=\"6\""
           b"/></rdf:RDF></x:xmpmeta>")
    acc("jpeg_xmp_orientation_6.jpg", base[:2] + _chunk_app(0xE1, xmp) + base[2:], pil=True, orientation=6)
    # -- JPEG losslessly fixed
    acc("jpeg_motion_photo_trailer.jpg",
        base + b"\x00\x00\x00\x18ftypmp42\x00\x00\x00\x00mp42isom" + bytes(range(256)) * 4 + b"\xff\xd9MotionPhoto",
        change="trimmed_trailing_data")
    acc("jpeg_samsung_trailer.jpg", base + b"SEFH\x00\x00\x00\x01" + b"\x00" * 100 + b"SEFT",
        change="trimmed_trailing_data")
    acc("jpeg_junk_before_soi.jpg", b"GARBAGE\x00\x01\x02" * 5 + base, change="dropped_leading_junk")
    acc("jpeg_junk_after_soi.jpg", base[:2] + b"\x00\x13\x37junk" + base[2:], change="dropped_leading_junk")
    # -- JPEG only PIL reads as the contract says (no decoder of fastfeed's GPU path does): stored as they are
    cmyk = _enc(im.convert("CMYK"), "JPEG", quality=90)
    acc("jpeg_cmyk.jpg", cmyk, pil=True)
    acc("jpeg_ycck.jpg", _adobe_transform(cmyk, 2), pil=True)
    acc("jpeg_cmyk_exif_orientation_6.jpg", _enc(im.convert("CMYK"), "JPEG", quality=90, exif=_exif(6)),
        pil=True, orientation=6)
    # -- JPEG rejected
    rej("jpeg_truncated.jpg", base[: len(base) // 2], "truncated")
    rej("jpeg_12bit_header.jpg", _sof_patch(base, marker=0xC1, precision=12), "12-bit")
    acc("jpeg_extended_8bit.jpg", _sof_patch(base, marker=0xC1), pil=True)  # SOF1 (extended sequential), 8-bit
    rej("jpeg_bomb_header.jpg", _sof_patch(base, height=40000, width=40000), "decompression bomb")
    # The frame header claims 3x the rows the scan holds: libjpeg (PIL, DALI's CPU decoder) fills the rest with grey,
    # nvJPEG with other pixels (112/255 mean difference on an H200). Pack's scan check finds it and keeps the
    # file for PIL's decode (without libjpeg in fastfeed's native core the check is skipped).
    acc("jpeg_header_lie.jpg", _sof_patch(base, height=H * 3), pil=_scan_check())
    # RGB colour space (no YCbCr transform), as Photoshop writes it (Adobe APP14 transform 0) and as `cjpeg -rgb`
    # does (component ids 'R', 'G', 'B'): libjpeg (PIL, DALI's CPU decoder) honours it, the GPU decoders do not.
    acc("jpeg_rgb_adobe.jpg", _rgb_jpeg(rgb, adobe=True), pil=True)
    acc("jpeg_rgb_ids.jpg", _rgb_jpeg(rgb, adobe=False), pil=True)

    # -- PNG as stored
    acc("png_rgb.png", _enc(im, "PNG"))
    acc("png_grey.png", _enc(grey, "PNG"))
    acc("png_interlaced.png", _png(W, H, 8, 2, _adam7(rgb), interlace=1))  # Adam7: common on the web
    acc("png_palette.png", _enc(im.convert("P", palette=Image.ADAPTIVE, colors=64), "PNG"))
    acc("png_1px_wide.png", _enc(Image.fromarray(photo(1, 300, seed=4), "RGB"), "PNG"))
    acc("png_1px_tall.png", _enc(Image.fromarray(photo(300, 1, seed=5), "RGB"), "PNG"))
    acc("png_1x1.png", _enc(Image.new("RGB", (1, 1), (200, 10, 30)), "PNG"))
    acc("png_gamma.png", _png(W, H, 8, 2, _rows(rgb), extra=[(b"gAMA", struct.pack(">I", 100000))]))  # ignored
    # -- PNG fixed, or only PIL reads them as the contract says
    acc("png_byte_after_iend.png", _enc(im, "PNG") + b"\x00", change="trimmed_trailing_data")
    g16 = (np.asarray(grey).astype(np.uint16) * 257 + np.arange(W, dtype=np.uint16)[None, :]).astype(">u2")
    acc("png_grey16.png", _png(W, H, 16, 0, _rows(g16)), pil=True)
    dark16 = (np.asarray(grey).astype(np.uint16)).astype(">u2")  # every value <= 255: the content-dependent trap
    acc("png_grey16_dark.png", _png(W, H, 16, 0, _rows(dark16)), pil=True)
    rgb16 = (rgb.astype(np.uint16) * 257).astype(">u2")
    acc("png_rgb16.png", _png(W, H, 16, 2, _rows(rgb16)), pil=True)
    pal = im.convert("P", palette=Image.ADAPTIVE, colors=16)
    acc("png_palette_trns.png", _enc(pal, "PNG", transparency=3), pil=True)
    rgba = im.convert("RGBA")
    alpha = np.asarray(grey).copy()
    alpha[:, : W // 3] = 0  # fully transparent third: its colour channels must survive as stored
    rgba.putalpha(Image.fromarray(alpha, "L"))
    acc("png_rgba.png", _enc(rgba, "PNG"), pil=True)
    la = grey.convert("LA")
    la.putalpha(128)
    acc("png_la.png", _enc(la, "PNG"), pil=True)
    grey_2bit = (np.asarray(grey) >> 6).astype(np.uint8)
    packed = np.packbits(np.unpackbits(grey_2bit[..., None], axis=-1)[..., 6:].reshape(H, -1), axis=1)
    acc("png_grey_2bit.png", _png(W, H, 2, 0, _rows(packed)), pil=True)
    acc("png_1bit.png", _enc(grey.convert("1"), "PNG"), pil=True)
    acc("png_palette_4bit.png", _enc(pal, "PNG", bits=4), pil=True)
    acc("png_rgba16.png", _png(W, H, 16, 6, _rows((np.asarray(rgba).astype(np.uint16) * 257).astype(">u2"))),
        pil=True)
    la16 = np.stack([np.asarray(grey), alpha], axis=-1).astype(np.uint16) * 257
    acc("png_la16.png", _png(W, H, 16, 4, _rows(la16.astype(">u2"))), pil=True)
    frames = [Image.fromarray(photo(W, H, seed=s), "RGB") for s in (10, 11, 12)]
    acc("png_apng.png", _enc(frames[0], "PNG", save_all=True, append_images=frames[1:], duration=100, loop=0),
        pil=True)
    acc("png_exif_orientation_6.png", _enc(im, "PNG", exif=_exif(6)), orientation=6)
    acc("png_rgba_exif_orientation_8.png", _enc(rgba, "PNG", exif=_exif(8)), pil=True, orientation=8)
    # An eXIf that repeats JPEG's "Exif" header (DALI then reads no tag), ImageMagick's text copy of the EXIF block
    # (only PIL reads it): kept for PIL's decode, with PIL's tag.
    acc("png_exif_with_jpeg_header.png", _png(W, H, 8, 2, _rows(rgb), extra=[(b"eXIf", _exif(6))]), pil=True,
        orientation=6)
    hexed = _exif(6)[6:].hex()
    profile = f"\nexif\n{len(hexed) // 2:8d}\n" + "\n".join(hexed[i:i + 72] for i in range(0, len(hexed), 72)) + "\n"
    acc("png_raw_profile_exif.png", _png(W, H, 8, 2, _rows(rgb), extra=[
        (b"zTXt", b"Raw profile type exif\x00\x00" + zlib.compress(profile.encode()))]), pil=True, orientation=6)
    # -- PNG rejected, or kept for PIL where only PIL reads it
    good_png = _enc(im, "PNG")
    rej("png_truncated.png", good_png[: len(good_png) // 2], "truncated")
    # The header says H rows, the data holds H/2: libpng refuses it, PIL fills the missing rows with black (as
    # libjpeg fills a JPEG's with grey): kept for PIL's decode, the same pixels on every path.
    short = _rows(rgb[: H // 2])
    acc("png_header_lie.png", _png(W, H, 8, 2, short), pil=True)
    # An IDAT length that runs into the IEND chunk: libpng (and pack's chunk walk) stop there, PIL has its rows.
    grown = bytearray(good_png)
    grown[33:37] = struct.pack(">I", struct.unpack(">I", good_png[33:37])[0] + 8)
    acc("png_idat_length_overruns.png", bytes(grown), pil=True)
    rej("png_bomb_header.png", _png(30000, 30000, 8, 0, b"\x00" * 31), "decompression bomb")
    # A wrong chunk CRC: PIL refuses any before the pixel data (so does libpng for IHDR), libpng refuses the pixel
    # data's (PIL never checks it), and both skip one after it.
    rej("png_bad_crc_ihdr.png", _bad_crc(good_png, b"IHDR"), "checksum")
    text = _chunk(b"tEXt", b"Comment\x00hello")
    rej("png_bad_crc_text_before_pixels.png", _bad_crc(good_png[:33] + text + good_png[33:], b"tEXt"), "checksum")
    acc("png_bad_crc_idat.png", _bad_crc(good_png, b"IDAT"), pil=True)
    # The compressed pixel stream: without its checksum PIL decodes every row and libpng refuses the file; with a
    # wrong one both refuse it; bytes after its end both ignore.
    stream = zlib.compress(_rows(rgb), 6)
    acc("png_stream_without_checksum.png", _png_stream(W, H, stream[:-4]), pil=True)
    rej("png_stream_bad_checksum.png", _png_stream(W, H, stream[:-4] + bytes(b ^ 0xFF for b in stream[-4:])),
        "corrupt")
    # A stream whose header declares a 512-byte window and whose matches reach 14 KB back (the lower half of the
    # image repeats the upper): libpng inflates with the declared window and refuses it, PIL's zlib with its own
    # 32 KB and decodes it.
    far = zlib.compress(_rows(np.concatenate([rgb[: H // 2]] * 2)), 6)
    acc("png_stream_past_its_window.png", _png_stream(W, H, bytes([0x18, 0x19]) + far[2:]), pil=True)
    acc("png_bytes_after_stream.png", _png_stream(W, H, stream + b"\x00 bytes after the stream"))
    # What the standard forbids: both refuse a row filter type over 4, a filter method other than 0, IDATs with a
    # chunk between them; PIL forgives (libpng does not) another compression method and palette mistakes.
    rows = bytearray(_rows(rgb))
    rows[5 * (1 + 3 * W)] = 7
    rej("png_bad_filter_type.png", _png(W, H, 8, 2, bytes(rows)), "filter type")
    rej("png_filter_method_1.png", _png_stream(W, H, stream, filter_method=1), "filter method")
    rej("png_idat_apart.png", _png_stream(W, H, stream, text_between=True), "consecutive")
    acc("png_compression_method_1.png", _png_stream(W, H, stream, compression=1), pil=True)
    index = (np.arange(W)[None, :] // 8 % 4 + np.zeros((H, 1), int)).astype(np.uint8)
    plte = bytes([10, 20, 30, 200, 100, 50, 0, 255, 0, 255, 255, 255])
    acc("png_palette_missing.png", _png(W, H, 8, 3, _rows(index)), pil=True)
    acc("png_palette_twice.png", _png(W, H, 8, 3, _rows(index), extra=[(b"PLTE", plte), (b"PLTE", plte)]), pil=True)
    acc("png_palette_partial_entry.png", _png(W, H, 8, 3, _rows(index), extra=[(b"PLTE", plte + b"\x01")]),
        pil=True)
    after = _png(W, H, 8, 3, _rows(index))
    end = after.index(b"IEND") - 4
    acc("png_palette_after_pixels.png", after[:end] + _chunk(b"PLTE", plte) + after[end:], pil=True)
    acc("png_palette_short.png", _png(W, H, 8, 3, _rows(index * 4), extra=[(b"PLTE", plte)]))  # indices past it
    acc("png_icc_profile.png", _png(W, H, 8, 2, _rows(rgb), extra=[(b"iCCP", b"icc\x00\x00" + zlib.compress(
        _fake_icc()))]))
    # Metadata chunks: PIL refuses the whole file over a malformed one libpng skips, before the pixels or after;
    # libpng refuses a critical chunk it does not know, PIL skips it.
    rej("png_short_phys.png", _png(W, H, 8, 2, _rows(rgb), extra=[(b"pHYs", b"\x00\x00")]), "PIL refuses")
    rej("png_iccp_without_name_end.png", _png(W, H, 8, 2, _rows(rgb), extra=[(b"iCCP", b"profile" * 20)]),
        "PIL refuses")
    plain = _png(W, H, 8, 2, _rows(rgb))
    end = plain.index(b"IEND") - 4
    rej("png_short_phys_after_pixels.png", plain[:end] + _chunk(b"pHYs", b"\x00\x00") + plain[end:], "PIL refuses")
    acc("png_text_after_pixels.png", plain[:end] + _chunk(b"tEXt", b"Comment\x00after") + plain[end:])
    acc("png_unknown_critical_chunk.png", _png(W, H, 8, 2, _rows(rgb), extra=[(b"ABCD", b"data")]), pil=True)
    iend = good_png.index(b"IEND") - 4
    acc("png_bad_crc_text_after_pixels.png", _bad_crc(good_png[:iend] + text + good_png[iend:], b"tEXt"))

    # -- other formats torchvision's ImageFolder loads: stored as they are, for PIL
    acc("bmp_rgb.bmp", _enc(im, "BMP"), pil=True)
    acc("bmp_palette.bmp", _enc(im.convert("P", palette=Image.ADAPTIVE, colors=256), "BMP"),
        pil=True)
    acc("bmp_rgba32.bmp", _enc(rgba, "BMP"), pil=True)
    acc("bmp_1bit.bmp", _enc(grey.convert("1"), "BMP"), pil=True)
    acc("bmp_top_down.bmp", _bmp_top_down(_enc(im, "BMP")), pil=True)
    acc("ico_rgba.ico", _enc(rgba, "ICO", sizes=[(64, 64)]), pil=True)
    acc("gif_static.gif", _enc(im.convert("P", palette=Image.ADAPTIVE, colors=256), "GIF"),
        pil=True)
    gif_frames = [f.convert("P", palette=Image.ADAPTIVE, colors=256) for f in frames]
    acc("gif_animated.gif", _enc(gif_frames[0], "GIF", save_all=True, append_images=gif_frames[1:], duration=100,
                                 loop=0), pil=True)
    acc("gif_transparent.gif", _enc(pal, "GIF", transparency=3), pil=True)
    acc("gif_interlaced.gif", _enc(im.convert("P", palette=Image.ADAPTIVE, colors=256), "GIF", interlace=True),
        pil=True)
    acc("tiff_rgba.tif", _enc(rgba, "TIFF"), pil=True)
    acc("tiff_palette.tif", _enc(im.convert("P", palette=Image.ADAPTIVE, colors=32), "TIFF"), pil=True)
    acc("tiff_float.tif", _enc(Image.fromarray(np.asarray(grey).astype(np.float32) / 255), "TIFF"), pil=True)
    acc("tiff_rgb.tif", _enc(im, "TIFF"), pil=True)
    # PIL applies a TIFF's orientation tag while opening it (so does torchvision): the displayed size, no tag.
    acc("tiff_exif_orientation_5.tif", _enc(im, "TIFF", exif=_exif(5)), pil=True)
    # CIELAB: PIL decodes it, but turns it into RGB only with its littlecms (ImageCms); without, no decoder could.
    lab = _enc(Image.frombytes("LAB", im.size, im.tobytes()), "TIFF")
    if features.check("littlecms2"):
        acc("tiff_lab.tif", lab, pil=True)
    else:
        rej("tiff_lab.tif", lab, "cannot convert it to RGB")
    acc("tiff_grey16.tif", _enc(Image.fromarray(g16.astype(np.uint16)), "TIFF"), pil=True)
    acc("tiff_cmyk.tif", _enc(im.convert("CMYK"), "TIFF"), pil=True)
    # BigTIFF (64-bit offsets), as scanners and slide or satellite imaging write large files: PIL reads it; its
    # signature differs from classic TIFF's.
    acc("tiff_bigtiff.tif", _bigtiff(rgb), pil=True)
    acc("tiff_multipage.tif", _enc(frames[0], "TIFF", save_all=True, append_images=frames[1:]),
        pil=True)
    acc("ppm_rgb.ppm", _enc(im, "PPM"), pil=True)
    acc("pgm_grey.pgm", _enc(grey, "PPM"), pil=True)
    acc("pgm_grey16.pgm", _enc(Image.fromarray(np.asarray(grey).astype(np.uint16) * 257), "PPM"), pil=True)
    acc("pbm_1bit.pbm", _enc(grey.convert("1"), "PPM"), pil=True)  # P4
    # PFM, Netpbm's float form (HDR and depth tools write it): grey values as they are, in [0, 255] so that the
    # contract's clip keeps them.
    acc("pfm_float.pfm", _enc(grey.convert("F"), "PPM"), pil=True)
    small = np.asarray(grey)[:6, :5]  # Netpbm's ASCII forms (P1-P3), as some tools still write them
    acc("pbm_ascii.pbm", _netpbm_ascii("P1", (small < 128).astype(int), None), pil=True)
    acc("pgm_ascii.pgm", _netpbm_ascii("P2", small, 255), pil=True)
    acc("ppm_ascii.ppm", _netpbm_ascii("P3", rgb[:6, :5].reshape(6, -1), 255), pil=True)
    if features.check("webp"):
        acc("webp_lossless.webp", _enc(im, "WEBP", lossless=True), pil=True)
    else:  # a real 1x1 lossless WebP; this PIL cannot decode it, so neither could torchvision here
        rej("webp_lossless.webp", bytes.fromhex(
            "524946461a000000574542505650384c0d0000002f0000001007101111888 8fe0700".replace(" ", "")), "webp")

    # -- formats with no signature (TGA) or a weak one: accepted when the extension names what PIL then finds
    for name, img, fmt, kw in (("tga_rgb.tga", im, "TGA", {}), ("tga_rle.tga", im, "TGA", {"compression": "tga_rle"}),
                               ("pcx_rgb.pcx", im, "PCX", {}), ("sgi_rgb.sgi", im, "SGI", {}),
                               ("qoi_rgb.qoi", im, "QOI", {}), ("dds_rgba.dds", im.convert("RGBA"), "DDS", {}),
                               ("xbm_1bit.xbm", grey.convert("1"), "XBM", {}), ("dib_rgb.dib", im, "DIB", {})):
        try:
            acc(name, _enc(img, fmt, **kw), pil=True)
        except (KeyError, OSError, ValueError):  # a PIL that cannot write it
            pass
    rej("noise_named_tga.tga", np.random.default_rng(0).integers(0, 256, 4000, dtype=np.uint8).tobytes(),
        "not an image")
    rej("text_named_pcx.pcx", b"this is not an image at all\n" * 20, "not an image")

    # -- not images
    rej("text_named_jpg.jpg", b"this is not an image at all\n" * 20, "not an image")
    # A container holding a JPEG is not that JPEG (junk before SOI is dropped only when short and not a container).
    rej("pdf_with_jpeg.jpg", b"%PDF-1.4\n1 0 obj << /Filter /DCTDecode >> stream\n" + base + b"\nendstream\n%%EOF",
        "not an image")
    rej("jpeg_after_2kb_junk.jpg", bytes(2048) + base, "not an image")
    rej("empty.png", b"", "empty")
    return out


def _netpbm_ascii(magic: str, rows: np.ndarray, maxval: int | None) -> bytes:
    """A Netpbm file in its ASCII form: `rows` [h, w * channels] of values."""
    w = rows.shape[1] // (3 if magic == "P3" else 1)
    head = f"{magic}\n# written by hand\n{w} {rows.shape[0]}\n" + (f"{maxval}\n" if maxval else "")
    return (head + "".join(" ".join(str(int(v)) for v in row) + "\n" for row in rows)).encode()


def _png_stream(w: int, h: int, idat: bytes, compression: int = 0, filter_method: int = 0,
                text_between: bool = False) -> bytes:
    """An 8-bit RGB PNG whose IDAT holds `idat` as it is (a compressed stream made by the caller), with the IHDR's
    methods given; `text_between` splits it in two IDATs with a tEXt between them."""
    head = b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, compression, filter_method, 0))
    cut = len(idat) // 2 if text_between else len(idat)
    pixels = _chunk(b"IDAT", idat[:cut])
    if text_between:
        pixels += _chunk(b"tEXt", b"Comment\x00between") + _chunk(b"IDAT", idat[cut:])
    return head + pixels + _chunk(b"IEND", b"")


def _bad_crc(png: bytes, kind: bytes) -> bytes:
    """The PNG with the CRC of its first `kind` chunk off by one bit."""
    b, pos = bytearray(png), 8
    while True:
        length = struct.unpack(">I", b[pos:pos + 4])[0]
        if b[pos + 4:pos + 8] == kind:
            b[pos + 8 + length] ^= 1
            return bytes(b)
        pos += 12 + length


def _without_segments(jpeg: bytes, marker: int) -> bytes:
    """The JPEG without its header segments of `marker` (PIL writes the standard Huffman tables, so without DHT it
    is what a Motion-JPEG frame is)."""
    out, pos = [jpeg[:2]], 2
    while jpeg[pos + 1] != 0xDA:
        n = struct.unpack(">H", jpeg[pos + 2:pos + 4])[0]
        if jpeg[pos + 1] != marker:
            out.append(jpeg[pos:pos + 2 + n])
        pos += 2 + n
    return b"".join(out) + jpeg[pos:]


def _wide_quant_tables(jpeg: bytes) -> bytes:
    """The same JPEG with its quantisation tables written with 16-bit entries (precision 1), values unchanged."""
    out, pos = [jpeg[:2]], 2
    while jpeg[pos + 1] != 0xDA:
        n = struct.unpack(">H", jpeg[pos + 2:pos + 4])[0]
        if jpeg[pos + 1] == 0xDB:
            body, wide = jpeg[pos + 4:pos + 2 + n], b""
            for at in range(0, len(body), 65):
                wide += bytes([0x10 | body[at] & 0xF]) + struct.pack(">64H", *body[at + 1:at + 65])
            out.append(b"\xff\xdb" + struct.pack(">H", len(wide) + 2) + wide)
        else:
            out.append(jpeg[pos:pos + 2 + n])
        pos += 2 + n
    return b"".join(out) + jpeg[pos:]


def _tables_after_sof(jpeg: bytes) -> bytes:
    """The same JPEG with its quantisation tables, and an APP5 segment, moved after the frame header (SOF0)."""
    segments, rest = [], jpeg
    while b"\xff\xdb" in rest[:rest.index(b"\xff\xda")]:
        i = rest.index(b"\xff\xdb")
        n = struct.unpack(">H", rest[i + 2:i + 4])[0]
        segments.append(rest[i:i + 2 + n])
        rest = rest[:i] + rest[i + 2 + n:]
    sof = rest.index(b"\xff\xc0")
    end = sof + 2 + struct.unpack(">H", rest[sof + 2:sof + 4])[0]
    return rest[:end] + _chunk_app(0xE5, b"vendor data") + b"".join(segments) + rest[end:]


def _bmp_top_down(bmp: bytes) -> bytes:
    """The same 24-bit BMP stored top-down: rows in reading order and a negative height, as some writers do."""
    b = bytearray(bmp)
    off, w, h = struct.unpack("<I", b[10:14])[0], *struct.unpack("<ii", b[18:26])
    stride = (w * 3 + 3) & ~3
    rows = [bytes(b[off + r * stride:off + (r + 1) * stride]) for r in range(h)]
    b[off:off + h * stride] = b"".join(reversed(rows))
    b[22:26] = struct.pack("<i", -h)
    return bytes(b)


def _bigtiff(rgb: np.ndarray) -> bytes:
    """An uncompressed RGB BigTIFF (version 43, 8-byte offsets and counts; PIL writes only classic TIFF): one strip
    after its only IFD."""
    h, w = rgb.shape[:2]
    tags = [(256, 3, 1, w), (257, 3, 1, h), (258, 3, 3, (8, 8, 8)), (259, 3, 1, 1), (262, 3, 1, 2), (273, 16, 1, None),
            (277, 3, 1, 3), (278, 3, 1, h), (279, 16, 1, rgb.size)]  # type 16: LONG8
    data_at = 16 + 8 + 20 * len(tags) + 8  # header, entry count, entries, next-IFD offset
    ifd = struct.pack("<Q", len(tags))
    for tag, typ, count, value in tags:
        value = data_at if value is None else value
        packed = struct.pack("<3H", *value) if count == 3 else struct.pack("<Q" if typ == 16 else "<H", value)
        ifd += struct.pack("<HHQ", tag, typ, count) + packed.ljust(8, b"\x00")
    return b"II+\x00" + struct.pack("<HHQ", 8, 0, 16) + ifd + struct.pack("<Q", 0) + rgb.tobytes()


def _ifd0_orientation(e: str, typ: int, count: int, value: bytes, again: bytes | None = None) -> bytes:
    """A TIFF-structured EXIF block (byte order `e`) whose IFD0 holds one orientation entry as given (`again`: a
    second one, of type SHORT)."""
    entries = [struct.pack(e + "HHI", 0x0112, typ, count) + value]
    if again is not None:
        entries.append(struct.pack(e + "HHI", 0x0112, 3, 1) + again)
    return ((b"II*\x00" if e == "<" else b"MM\x00*") + struct.pack(e + "IH", 8, len(entries)) + b"".join(entries)
            + struct.pack(e + "I", 0))


def _chunk_app(marker: int, body: bytes) -> bytes:
    return bytes([0xFF, marker]) + struct.pack(">H", len(body) + 2) + body


def _rgb_jpeg(rgb: np.ndarray, adobe: bool) -> bytes:
    """A JPEG coding R, G, B planes without the YCbCr transform (4:4:4): PIL writes a "YCbCr" image's planes as
    they are; its JFIF segment (which means YCbCr) is dropped and the colour space marked by an Adobe segment with
    transform 0, or by the component ids 'R', 'G', 'B'."""
    coded = _enc(Image.frombytes("YCbCr", (rgb.shape[1], rgb.shape[0]), rgb.tobytes()), "JPEG", quality=95,
                 subsampling=0)
    assert coded[2:4] == b"\xff\xe0"  # APP0 JFIF right after SOI
    body = coded[4 + struct.unpack(">H", coded[4:6])[0]:]
    if adobe:
        return coded[:2] + _chunk_app(0xEE, b"Adobe" + struct.pack(">HHHB", 100, 0, 0, 0)) + body
    b = bytearray(coded[:2] + body)
    sof, sos = b.index(b"\xff\xc0"), b.index(b"\xff\xda")
    for c, new in enumerate(b"RGB"):
        b[sof + 10 + 3 * c] = new  # SOF: id, sampling, table per component
        b[sos + 5 + 2 * c] = new  # SOS: selector, tables per component
    return bytes(b)


def _jpegtran_cases(base: bytes, tmp: str) -> list[tuple[str, bytes, str, str | None, str | None, int, bool]]:
    """Cases only libjpeg-turbo's command-line tools can make (skipped when `jpegtran` is not installed)."""
    tool = shutil.which("jpegtran")
    if tool is None:
        return []
    src = os.path.join(tmp, "in.jpg")
    with open(src, "wb") as f:
        f.write(base)
    try:
        arith = subprocess.run([tool, "-arithmetic", src], capture_output=True, check=True, timeout=30).stdout
    except (subprocess.SubprocessError, OSError):
        return []
    # Lossless: transcoded back to baseline Huffman with the native core, or stored as it is for PIL.
    return [("jpeg_arithmetic.jpg", arith, "accept", "transcoded_baseline", None, 1, False)]


def build_corpus(out_dir: str) -> list[Case]:
    """Write every case into `out_dir` (created) and return them, sorted by name."""
    os.makedirs(out_dir, exist_ok=True)
    rgb = photo()
    items = _cases(rgb)
    with tempfile.TemporaryDirectory() as tmp:
        items += _jpegtran_cases(_enc(Image.fromarray(rgb, "RGB"), "JPEG", quality=90), tmp)
    cases = []
    for name, data, expect, change, reason, orientation, pil_only in sorted(items):
        path = os.path.join(out_dir, name)
        with open(path, "wb") as f:
            f.write(data)
        cases.append(Case(name, path, expect, change, reason, orientation, pil_only))
    return cases


if __name__ == "__main__":
    for c in build_corpus(sys.argv[1] if len(sys.argv) > 1 else "odd_images_out"):
        print(f"{c.name:45s} {c.expect:7s} {c.change or c.reason or ''}{' pil_only' if c.pil_only else ''}")
