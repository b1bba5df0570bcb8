"""The byte structure of JPEG and PNG files, read without decoding a pixel: the EXIF orientation tag, where a
JPEG's first image ends, a PNG's chunks and whether its compressed data holds as many bytes as its header promises.

Pure Python on bytes-like input (bytes, memoryview, numpy uint8 views of ring slots); no PIL, no numpy. Used by
pack's validation (fastfeed/pack/validate.py), fastfeed.image.jpeg.probe and the decoders (the one EXIF reader of the
decode contract, docs/decode-contract.md).
"""
from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass

import numpy as np

__all__ = ["STANDALONE_MARKERS", "PNG_SIGNATURE", "tiff_orientation", "exif_orientation", "exif_orientation_plain",
           "exif_header", "swaps_axes", "jpeg_end", "PngFacts", "png_facts", "png_raw_size", "png_data_ok",
           "png_text_over_limit", "pil_read", "without_png_text", "jpeg_without_junk_after_soi",
           "jpeg_without_junk_before_markers"]

# JPEG markers without a length field.
STANDALONE_MARKERS = frozenset({0x01, *range(0xD0, 0xD8)})
_STANDALONE = STANDALONE_MARKERS
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
_EXIF_FIRST = 4096  # EXIF is nearly always in the first few KB (APP1 right after SOI/APP0) ...
_EXIF_SCAN = 1 << 16  # ... else it is looked for this far in


def tiff_orientation(tiff: bytes) -> int:
    """Tag 0x0112 of IFD0 of a TIFF-structured EXIF block; 1 when absent or malformed (never raises).
    The one EXIF parser of fastfeed: pack's probe (the `orientation` column) and the CPU decoder use it."""
    if len(tiff) < 8 or tiff[:4] not in (b"II*\x00", b"MM\x00*"):
        return 1
    e = "<" if tiff[:2] == b"II" else ">"
    (ifd,) = struct.unpack_from(e + "I", tiff, 4)
    if ifd + 2 > len(tiff):
        return 1
    (count,) = struct.unpack_from(e + "H", tiff, ifd)
    for k in range(count):
        at = ifd + 2 + 12 * k
        if at + 12 > len(tiff):
            return 1
        tag, typ, n = struct.unpack_from(e + "HHI", tiff, at)
        if tag == 0x0112:
            if typ != 3 or n < 1:  # SHORT
                return 1
            (v,) = struct.unpack_from(e + "H", tiff, at + 8)
            return v if 1 <= v <= 8 else 1
    return 1


def swaps_axes(tag: int) -> bool:
    """Whether EXIF orientation `tag` displays the image with its axes swapped (5-8: transpose, the rotations by
    90 degrees, transverse): its displayed width is its stored height."""
    return 5 <= tag <= 8


def exif_orientation(data) -> int:
    """The EXIF orientation tag (1..8) of a JPEG (APP1 "Exif") or PNG (eXIf chunk) held in `data` (bytes-like),
    without decoding; 1 for other formats, without a (valid) tag, or with a malformed header. The one reader of
    the tag: pack's `orientation` column, the CPU decoder and the DALI decoder's window clamp all use it."""
    if bytes(data[:8]) == PNG_SIGNATURE:
        return _png_exif_orientation(data)
    tag = _jpeg_exif_orientation(data, _EXIF_FIRST)
    if tag is None and len(data) > _EXIF_FIRST:
        tag = _jpeg_exif_orientation(data, _EXIF_SCAN)
    return tag or 1


def _jpeg_exif_orientation(data, scan: int) -> int | None:
    """The tag, 1 when the header has none, None when the header runs past `scan` bytes before the scan data."""
    head = bytes(data[:scan])
    if head[:2] != b"\xff\xd8":
        return 1
    segments, end = _jpeg_segments(head)
    for pos, marker, length in segments:
        seg = head[pos + 3 : pos + 1 + length]
        if marker == 0xE1 and seg[:6] == b"Exif\x00\x00":
            if pos + 1 + length > len(head) and len(data) > len(head):  # a large EXIF block (thumbnail): all of it
                seg = bytes(data[pos + 3 : pos + 1 + length])
            return tiff_orientation(seg[6:])
    return None if end is None and len(data) > len(head) else 1


def _jpeg_segments(data) -> tuple[list[tuple[int, int, int]], int | None]:
    """A JPEG header's segments before its first scan, each (its marker byte's position, the marker, its length),
    and where the walk stopped: the 0xFF of the scan's or end's marker, or a byte that starts no marker; None when
    the header runs past `data`. Every header walk of this module's EXIF readers is this one."""
    segments, pos, n = [], 2, len(data)
    while pos + 4 <= n:
        if data[pos] != 0xFF:
            return segments, pos
        while pos < n and data[pos] == 0xFF:
            pos += 1
        if pos + 3 > n:
            return segments, None
        marker = data[pos]
        if marker in _STANDALONE:
            pos += 1
            continue
        if marker in (0xDA, 0xD9):
            return segments, pos - 1
        (length,) = struct.unpack_from(">H", data, pos + 1)
        segments.append((pos, marker, length))
        pos += 1 + length
    return segments, None


def _png_exif_orientation(data) -> int:
    bodies, _ = _png_exif_chunks(data)
    return _png_exif_body_orientation(bodies[0]) if bodies else 1


def _png_exif_chunks(data) -> tuple[list[bytes], list[bytes]]:
    """A PNG's eXIf chunk bodies and its text chunks' keywords, in file order, up to IEND: what this module's EXIF
    readers look at."""
    bodies, keys, pos, n = [], [], 8, len(data)
    while pos + 8 <= n:
        length, kind = struct.unpack(">I4s", bytes(data[pos : pos + 8]))
        if kind == b"eXIf":
            bodies.append(bytes(data[pos + 8 : pos + 8 + length]))
        elif kind in (b"tEXt", b"zTXt", b"iTXt"):
            keys.append(bytes(data[pos + 8 : pos + 8 + min(length, 80)]).split(b"\x00", 1)[0])
        elif kind == b"IEND":
            break
        pos += 12 + length
    return bodies, keys


def exif_orientation_plain(data) -> bool:
    """Whether every reader of the orientation tag (this module, DALI's parsers, PIL's `getexif`, the tests'
    reference) finds the same one in this JPEG or PNG: at most one EXIF block, in reach of `exif_orientation`, whose
    IFD0 holds at most one orientation entry, of type SHORT and count 1, and no XMP or text-chunk copy of the tag
    that PIL alone would read. Readers disagree on anything else (a LONG tag, a second block, a PNG eXIf that repeats
    the JPEG "Exif" header): pack keeps such files for the contract's PIL decode (pack/validate.py)."""
    if bytes(data[:8]) == PNG_SIGNATURE:
        return _png_exif_plain(data)
    if bytes(data[:2]) != b"\xff\xd8":
        return True
    blocks, xmp = [], False
    for pos, marker, length in _jpeg_segments(data)[0]:
        if marker == 0xE1:
            seg = bytes(data[pos + 3 : pos + 1 + length])
            if seg[:6] == b"Exif\x00\x00":
                blocks.append((pos, seg[6:]))
            elif seg.startswith(b"http://ns.adobe.com/xap/1.0/\x00") and b"tiff:Orientation" in seg:
                xmp = True
    if len(blocks) > 1 or (blocks and blocks[0][0] + 64 > _EXIF_SCAN):
        return False
    entries = _orientation_entries(blocks[0][1]) if blocks else []
    return _entries_plain(entries) and not (xmp and not entries)


def _png_exif_plain(data) -> bool:
    blocks, keys = _png_exif_chunks(data)
    other = any(key in (b"Raw profile type exif", b"XML:com.adobe.xmp") for key in keys)
    if len(blocks) > 1 or (blocks and blocks[0][:6] == b"Exif\x00\x00"):
        return False
    entries = _orientation_entries(blocks[0]) if blocks else []
    return _entries_plain(entries) and not (other and not entries)


def _orientation_entries(tiff: bytes) -> list[tuple[int, int]]:
    """(type, count) of each orientation entry of IFD0 of a TIFF-structured EXIF block; [] when malformed."""
    if len(tiff) < 8 or tiff[:4] not in (b"II*\x00", b"MM\x00*"):
        return []
    e = "<" if tiff[:2] == b"II" else ">"
    (ifd,) = struct.unpack_from(e + "I", tiff, 4)
    if ifd + 2 > len(tiff):
        return []
    (count,) = struct.unpack_from(e + "H", tiff, ifd)
    found = []
    for k in range(count):
        at = ifd + 2 + 12 * k
        if at + 12 > len(tiff):
            break
        tag, typ, num = struct.unpack_from(e + "HHI", tiff, at)
        if tag == 0x0112:
            found.append((typ, num))
    return found


def _entries_plain(entries: list[tuple[int, int]]) -> bool:
    return len(entries) <= 1 and all(typ == 3 and num == 1 for typ, num in entries)


def exif_header(f) -> bytes:
    """What the EXIF readers of this module read of the JPEG or PNG open in `f` (binary, seekable), without reading
    its image data: a JPEG's bytes up to its first scan, a PNG's signature and its eXIf and text chunks wherever they
    lie (the other chunks left out, a text chunk cut after its keyword). `exif_orientation` and
    `exif_orientation_plain` give on it what they give on the whole file; b"" for other formats."""
    f.seek(0)
    data = f.read(_EXIF_SCAN)
    if data[:8] == PNG_SIGNATURE:
        out, pos = [PNG_SIGNATURE], 8
        while True:
            f.seek(pos)
            head = f.read(8)
            if len(head) < 8:
                break
            length, kind = struct.unpack(">I4s", head)
            if kind == b"eXIf":
                out.append(_png_chunk(kind, f.read(length)))
            elif kind in (b"tEXt", b"zTXt", b"iTXt"):
                out.append(_png_chunk(kind, f.read(min(length, 80)).split(b"\x00", 1)[0] + b"\x00"))
            elif kind == b"IEND":
                break
            pos += 12 + length
        return b"".join(out)
    if data[:2] != b"\xff\xd8":
        return b""
    while (end := _jpeg_segments(data)[1]) is None:
        more = f.read(len(data))
        if not more:
            return data
        data += more
    return data[:end + 4]


def _png_chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body) & 0xFFFFFFFF)


def _png_exif_body_orientation(body: bytes) -> int:
    return tiff_orientation(body[6:] if body[:6] == b"Exif\x00\x00" else body)


def jpeg_end(data, start: int = 0) -> int | None:
    """Offset just past the EOI marker that ends the JPEG starting at `start` (its first image, for files with
    more after it: motion-photo video, MPF secondary images, vendor trailers), or None when there is none
    (a truncated file). Walks the marker segments and scans each entropy-coded segment for its ending marker."""
    mv = bytes(data)
    n = len(mv)
    if mv[start : start + 2] != b"\xff\xd8":
        return None
    pos = start + 2
    while pos < n:
        if mv[pos] != 0xFF:
            return None
        while pos < n and mv[pos] == 0xFF:
            pos += 1
        if pos >= n:
            return None
        marker = mv[pos]
        pos += 1
        if marker == 0xD9:
            return pos
        if marker in _STANDALONE or marker == 0xD8:
            continue
        if pos + 2 > n:
            return None
        (length,) = struct.unpack_from(">H", mv, pos)
        pos += length
        if marker != 0xDA:
            continue
        # Entropy-coded data: ends at the first 0xFF followed by a byte other than 0x00 (stuffing) or RSTn.
        while True:
            pos = mv.find(b"\xff", pos)
            if pos < 0 or pos + 1 >= n:
                return None
            nxt = mv[pos + 1]
            if nxt == 0x00 or 0xD0 <= nxt <= 0xD7 or nxt == 0xFF:
                pos += 1 if nxt == 0xFF else 2
                continue
            break
    return None


_JUNK_SCAN = 1 << 16  # junk between a JPEG's SOI and its first marker is looked for only this far in


def jpeg_without_junk_after_soi(data):
    """SOI + the data from the first marker on, when bytes sit between SOI and that marker (libjpeg skips them
    with a warning, PIL refuses the file); None when there is no such marker."""
    head = bytes(data[:_JUNK_SCAN])
    pos = 2
    while True:
        pos = head.find(b"\xff", pos)
        if pos < 0 or pos + 1 >= len(head):
            return None
        if 0xC0 <= head[pos + 1] <= 0xFE and head[pos + 1] != 0xD8:
            return b"\xff\xd8" + bytes(data[pos:])
        pos += 1


def jpeg_without_junk_before_markers(data):
    """The header with what libjpeg's and PIL's marker walks skip left out: bytes other than 0xFF, and stuffed
    FF 00 pairs, where a marker should start (an APP segment whose length is short of its data leaves such bytes).
    Up to the first scan; the scans byte for byte. None when nothing was skipped or the walk still fails."""
    d = bytes(data)
    n, pos, skipped = len(d), 2, 0
    out = [d[:2]]
    while True:
        while True:  # libjpeg's next_marker
            start = pos
            while pos < n and d[pos] != 0xFF:
                pos += 1
            skipped += pos - start
            while pos < n and d[pos] == 0xFF:
                pos += 1
            if pos >= n:
                return None
            if d[pos] != 0x00:
                break
            pos += 1
            skipped += 2
        marker = d[pos]
        pos += 1
        if marker in STANDALONE_MARKERS:
            out.append(bytes((0xFF, marker)))
            continue
        if marker in (0xD8, 0xD9) or pos + 2 > n:
            return None
        length = int.from_bytes(d[pos:pos + 2], "big")
        if length < 2 or pos + length > n:
            return None
        out.append(bytes((0xFF, marker)) + d[pos:pos + length])
        pos += length
        if marker == 0xDA:
            out.append(d[pos:])
            return b"".join(out) if skipped else None


# ---- PNG ---------------------------------------------------------------------------------------------------

_PNG_CHANNELS = {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}
_ADAM7 = ((0, 0, 8, 8), (4, 0, 8, 8), (0, 4, 4, 8), (2, 0, 4, 4), (0, 2, 2, 4), (1, 0, 2, 2), (0, 1, 1, 2))


@dataclass
class PngFacts:
    width: int
    height: int
    depth: int
    ctype: int
    interlace: int
    end: int  # offset just past the IEND chunk
    idat: list  # (offset, length) of each IDAT body
    trns: bool = False
    animated: bool = False  # APNG's chunks (acTL, fcTL, fdAT): PIL reads a frame's rectangle, libpng the default image
    repeated_header: bool = False  # a second IHDR: PIL takes the last, libpng refuses the file
    # Chunks whose CRC is wrong, by where the decoders care: PIL checks every chunk before the first IDAT and
    # refuses the file; libpng refuses a critical chunk's (IHDR, PLTE, IDAT) and skips an ancillary one's.
    bad_crc_before_idat: bytes | None = None  # the first such chunk's type
    bad_crc_idat: bool = False
    # What the standard forbids and only some decoders forgive (pack/validate.py `_check_png` decides):
    compression: int = 0  # IHDR's compression method (0 the only one)
    filter_method: int = 0  # IHDR's filter method (0 the only one)
    palettes: int = 0  # PLTE chunks
    palette_ok: bool = True  # every PLTE holds 1-256 whole RGB entries, before the pixel data
    idat_apart: bool = False  # another chunk between two IDATs
    unknown_critical: bytes | None = None  # a chunk type the standard does not define, marked critical (upper case)
    after_pixels: bool = False  # chunks other than IEND after the last IDAT


def png_facts(data) -> PngFacts | str:
    """Walk the chunks (no pixel work but their CRCs); a reason string when the structure is broken."""
    n = len(data)
    pos = 8
    facts = None
    while pos + 8 <= n:
        length, kind = struct.unpack(">I4s", bytes(data[pos : pos + 8]))
        body = pos + 8
        nxt = body + length + 4
        if nxt > n:
            return "truncated PNG (a chunk runs past the end of the file)"
        crc_ok = zlib.crc32(data[pos + 4:body + length]) == struct.unpack(">I", bytes(data[body + length:nxt]))[0]
        if facts is not None and not crc_ok:
            if kind == b"IDAT":
                facts.bad_crc_idat = True
            elif not facts.idat and facts.bad_crc_before_idat is None:
                facts.bad_crc_before_idat = kind
        if facts is None:
            if kind != b"IHDR" or length != 13:
                return "bad image header: PNG does not start with IHDR"
            w, h, depth, ctype, compression, filter_method, interlace = struct.unpack(
                ">IIBBBBB", bytes(data[body : body + 13]))
            if w == 0 or h == 0 or ctype not in _PNG_CHANNELS:
                return f"bad image header: PNG {w}x{h} colour type {ctype}"
            facts = PngFacts(w, h, depth, ctype, interlace, 0, [], bad_crc_before_idat=None if crc_ok else kind,
                             compression=compression, filter_method=filter_method)
        elif kind == b"IDAT":
            if facts.idat and facts.idat[-1][0] + facts.idat[-1][1] + 4 != pos:
                facts.idat_apart = True
            facts.idat.append((body, length))
        elif kind == b"PLTE":
            facts.palettes += 1
            facts.palette_ok &= not facts.idat and 0 < length <= 768 and length % 3 == 0
        elif kind == b"tRNS":
            facts.trns = True
        elif kind in (b"acTL", b"fcTL", b"fdAT"):
            facts.animated = True
        elif kind == b"IHDR":
            facts.repeated_header = True
        elif kind == b"IEND":
            facts.end = nxt
            return facts if facts.idat else "bad image header: PNG without pixel data (no IDAT)"
        elif kind[:1].isupper() and kind not in _PNG_CRITICAL and facts.unknown_critical is None:
            facts.unknown_critical = kind
        if facts.idat and kind != b"IDAT":
            facts.after_pixels = True
        pos = nxt
    return "truncated PNG (no IEND chunk at the end)"


_PNG_TEXT = (b"tEXt", b"zTXt", b"iTXt")
_PNG_CRITICAL = (b"IHDR", b"PLTE", b"IDAT", b"IEND")


def png_text_over_limit(exc: BaseException) -> bool:
    """PIL refused a PNG because its text chunks exceed PngImagePlugin's safety limits (MAX_TEXT_CHUNK,
    MAX_TEXT_MEMORY): metadata only, which torchvision and DALI skip; `without_png_text` makes it decodable."""
    return isinstance(exc, ValueError) and ("MAX_TEXT" in str(exc) or "text chunks" in str(exc))


def pil_read(read, data):
    """read(data) with PIL, or, where PIL refuses the PNG for its text chunks (`png_text_over_limit`, when it opens
    the file or loads chunks after the pixels), read(the PNG without them): what the decode contract decodes, on
    every path."""
    try:
        return read(data)
    except ValueError as e:
        if not png_text_over_limit(e):
            raise
    return read(without_png_text(data))


def without_png_text(data) -> bytes:
    """The PNG with its text chunks (tEXt, zTXt, iTXt) left out, every other chunk byte for byte: the same pixels.
    Bytes that are not a well-formed PNG come back unchanged (the decoder then says what is wrong)."""
    data = bytes(data)
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        return data
    out, pos, n = [data[:8]], 8, len(data)
    while pos + 8 <= n:
        length, kind = struct.unpack(">I4s", data[pos : pos + 8])
        nxt = min(n, pos + 12 + length)
        if kind not in _PNG_TEXT:
            out.append(data[pos:nxt])
        pos = nxt
    out.append(data[pos:])
    return b"".join(out)


def _png_filter_offsets(f: PngFacts) -> np.ndarray:
    """int64 offsets of every row's filter type byte in the inflated pixel stream (each Adam7 pass's rows in turn)."""
    bits = _PNG_CHANNELS[f.ctype] * f.depth
    passes = _ADAM7 if f.interlace else ((0, 0, 1, 1),)
    out, at = [], 0
    for x0, y0, dx, dy in passes:
        w, h = (f.width - x0 + dx - 1) // dx, (f.height - y0 + dy - 1) // dy
        if w and h:
            stride = 1 + (w * bits + 7) // 8
            out.append(at + stride * np.arange(h, dtype=np.int64))
            at += stride * h
    return np.concatenate(out) if out else np.zeros(0, np.int64)


def png_raw_size(f: PngFacts) -> int:
    """Bytes the inflated IDAT stream must hold: filter byte + packed samples per row (per Adam7 pass)."""
    bits = _PNG_CHANNELS[f.ctype] * f.depth

    def rows(w, h):
        return 0 if w == 0 or h == 0 else h * (1 + (w * bits + 7) // 8)

    if not f.interlace:
        return rows(f.width, f.height)
    total = 0
    for x0, y0, dx, dy in _ADAM7:
        total += rows((f.width - x0 + dx - 1) // dx, (f.height - y0 + dy - 1) // dy)
    return total


_PNG_EXTRA_INFLATE = 64 << 20


def png_data_ok(data, f: PngFacts) -> tuple[str | None, bool]:
    """Inflate the pixel data in 1 MB steps (bounded memory) and compare its length with the header's promise:
    (the reason it would fail to decode, or None; whether the compressed stream ends properly, its checksum
    included). PIL decodes a stream that holds every row but stops short of its end; libpng does not."""
    need = png_raw_size(f)
    filters = _png_filter_offsets(f)  # where each row's filter type byte lies in the inflated stream
    # The window the stream's header declares (wbits 0), as libpng inflates it: a row at a time, so that a match
    # reaching further back than that window fails there (libpng refuses the file, PIL decodes it: zlib reads the
    # whole output of one call as window). Only a window smaller than the data needs the small steps; writers
    # declare one only where the data fits it (libpng's does), so the common file inflates in 1 MB steps.
    z = zlib.decompressobj(0)
    step = 1 << 20
    head = next((data[off] for off, length in f.idat if length), None)
    if head is not None and need > 1 << ((head >> 4) + 8) and len(filters) > 1:
        step = max(1, int(np.diff(filters).min()))
    got = 0
    limit = need + _PNG_EXTRA_INFLATE  # a stream that inflates far past its rows is not followed to its end

    def take(piece: bytes) -> str | None:
        nonlocal got
        lo, hi = np.searchsorted(filters, [got, got + len(piece)])
        kinds = np.frombuffer(piece, np.uint8)[filters[lo:hi] - got]
        got += len(piece)
        if (kinds > 4).any():
            row = int(lo + np.flatnonzero(kinds > 4)[0])
            return f"corrupt PNG pixel data (row {row} has filter type {int(kinds.max())}, not 0-4)"
        return None

    try:
        for off, length in f.idat:
            chunk = bytes(data[off : off + length])
            while chunk and not z.eof and got <= limit:
                bad = take(z.decompress(chunk, step))
                if bad:
                    return bad, False
                chunk = z.unconsumed_tail
        while not z.eof and got <= limit:
            more = z.decompress(b"", step)
            if not more:
                break
            bad = take(more)
            if bad:
                return bad, False
    except zlib.error as e:
        return f"corrupt PNG pixel data ({e}); it would fail to decode", False
    if got < need:
        return (f"PNG pixel data shorter than its header says ({got} of {need} bytes: a header lie or a cut "
                f"file); it would fail to decode"), False
    return None, z.eof
