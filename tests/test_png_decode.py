"""The native PNG decode (csrc/png_decode.h): PIL's pixels for every PNG it takes, a reason for every other one.

The PNGs are written here by an encoder of the test's own (numpy filters, zlib): every filter type on every row
kind, the stream split across IDAT chunks; PIL decodes each as the reference. A refusal must leave the CPU paths with
PIL's pixels (they fall back to it), so those are checked through `decode_rgbx` too.
"""
from __future__ import annotations

import io
import struct
import threading
import zlib

import numpy as np
import pytest
from PIL import Image

from fastfeed import _native
from fastfeed.decode.cpu import decode_rgb, whole_png_rgbx
from fastfeed.detect.render import decode_rgbx
from fastfeed.image.contract import to_rgb

SIGNATURE = b"\x89PNG\r\n\x1a\n"


def chunk(kind: bytes, body: bytes, crc: int | None = None) -> bytes:
    crc = zlib.crc32(kind + body) if crc is None else crc
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", crc & 0xFFFFFFFF)


def _paeth(a, b, c):
    a, b, c = (x.astype(np.int16) for x in (a, b, c))
    pa, pb, pc = np.abs(b - c), np.abs(a - c), np.abs(a + b - 2 * c)
    return np.where((pa <= pb) & (pa <= pc), a, np.where(pb <= pc, b, c))


def filtered(rows: np.ndarray, bpp: int, filters) -> bytes:
    """The rows (uint8 [h, w * bpp]) filtered as PNG's encoder does, `filters[y]` the type of row y."""
    out = []
    prior = np.zeros(rows.shape[1], np.int16)
    for y, f in enumerate(filters):
        x = rows[y].astype(np.int16)
        left = np.concatenate([np.zeros(bpp, np.int16), x[:-bpp]])[: len(x)]
        upleft = np.concatenate([np.zeros(bpp, np.int16), prior[:-bpp]])[: len(x)]
        pred = [np.zeros_like(x), left, prior, (left + prior) // 2, _paeth(left, prior, upleft)][f]
        out.append(bytes([f]) + ((x - pred) % 256).astype(np.uint8).tobytes())
        prior = x
    return b"".join(out)


def encode(pixels: np.ndarray, ctype: int, rng, palette: np.ndarray | None = None, pieces: int = 3,
           before: bytes = b"", after_palette: bytes = b"", ihdr_tail: bytes = b"\x00\x00\x00",
           raw: bytes | None = None) -> bytes:
    """A PNG of `pixels` (uint8 [h, w] grey or palette indices, [h, w, 3] RGB): random filter types (each of the five
    where there are rows enough), the zlib stream cut into `pieces` IDAT chunks (some maybe empty); `before` chunks
    after IHDR, `after_palette` ones after PLTE; `raw` the filtered rows instead of the pixels'."""
    h, w = pixels.shape[:2]
    bpp = 3 if ctype == 2 else 1
    filters = rng.permutation(np.resize(np.arange(5), h)) if h >= 5 else rng.integers(0, 5, h)
    data = zlib.compress(raw if raw is not None else filtered(pixels.reshape(h, w * bpp), bpp, filters), 6)
    cuts = sorted(int(c) for c in rng.integers(0, len(data) + 1, pieces - 1))
    idat = b"".join(chunk(b"IDAT", data[a:b]) for a, b in zip([0, *cuts], [*cuts, len(data)]))
    plte = b"" if palette is None else chunk(b"PLTE", palette.astype(np.uint8).tobytes())
    ihdr = chunk(b"IHDR", struct.pack(">IIBB", w, h, 8, ctype) + ihdr_tail)
    return SIGNATURE + ihdr + before + plte + after_palette + idat + chunk(b"IEND", b"")


def pil_rgb(png: bytes) -> np.ndarray:
    """PIL's decode by the contract's rules (alpha dropped, a palette through its colours)."""
    with Image.open(io.BytesIO(png)) as im:
        im.load()
        return np.asarray(to_rgb(im))


def native_rgb(png: bytes) -> np.ndarray:
    got = _native.decode_png_rgbx(png)
    assert not isinstance(got, str), got
    assert got.shape[2] == 4 and (got[:, :, 3] == 255).all()  # PIL's pad byte
    return got[:, :, :3]


SIZES = [(1, 1), (1, 7), (7, 1), (5, 3), (17, 6), (64, 48), (1, 4000), (4000, 1)]


@pytest.mark.parametrize("size", SIZES, ids=[f"{w}x{h}" for w, h in SIZES])
@pytest.mark.parametrize("ctype", [0, 2, 3], ids=["grey", "rgb", "palette"])
def test_every_filter_and_colour_type_gives_pils_pixels(ctype, size):
    rng = np.random.default_rng(hash((ctype, size)) % 2**32)
    w, h = size
    palette = rng.integers(0, 256, (rng.integers(1, 257), 3)) if ctype == 3 else None
    if ctype == 2:
        pixels = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
    else:
        pixels = rng.integers(0, 256 if ctype == 0 else len(palette), (h, w), dtype=np.uint8)
    png = encode(pixels, ctype, rng, palette, pieces=int(rng.integers(1, 5)))
    want = pil_rgb(png)
    np.testing.assert_array_equal(native_rgb(png), want)
    expected_direct = palette[pixels] if ctype == 3 else np.repeat(pixels[..., None], 3, 2) if ctype == 0 else pixels
    np.testing.assert_array_equal(want, expected_direct)  # (the test's encoder is right)


def test_pil_written_photo_pngs_give_pils_pixels():
    """PIL's own encoder (adaptive filters, every compression level) on a smooth picture with noise."""
    rng = np.random.default_rng(0)
    y, x = np.mgrid[0:301, 0:417]
    img = np.stack([(x * 255 // 416), (y * 255 // 300), ((x + y) % 256)], 2).astype(np.int16)
    img = np.clip(img + rng.integers(-20, 21, img.shape), 0, 255).astype(np.uint8)
    for mode in ("RGB", "L", "P"):
        pic = Image.fromarray(img).convert(mode) if mode != "P" else Image.fromarray(img).quantize(200)
        for level in (0, 1, 9):
            buf = io.BytesIO()
            pic.save(buf, "PNG", compress_level=level)
            np.testing.assert_array_equal(native_rgb(buf.getvalue()), pil_rgb(buf.getvalue()))


def _refusals(rng):
    """(name, PNG bytes) the native decode must refuse; each says in its name what PIL does with it."""
    rgb = rng.integers(0, 256, (9, 11, 3), dtype=np.uint8)
    grey = rgb[:, :, 0]
    good = encode(rgb, 2, rng)
    yield "pil-decodes: RGB with tRNS", encode(rgb, 2, rng, before=chunk(b"tRNS", b"\x00\x01\x00\x02\x00\x03"))
    yield "pil-decodes: palette with tRNS", encode(grey % 4, 3, rng, palette=np.arange(12).reshape(4, 3),
                                                   after_palette=chunk(b"tRNS", b"\x00\x80"))
    for name, mode in (("pil-decodes: RGBA", "RGBA"), ("pil-decodes: grey with alpha", "LA"),
                       ("pil-decodes: 16-bit grey", "I;16")):
        buf = io.BytesIO()
        src = Image.fromarray(rgb).convert("RGBA" if mode == "RGBA" else "LA" if mode == "LA" else "L")
        if mode == "I;16":
            src = Image.fromarray(grey.astype(np.uint16) * 257)
        src.save(buf, "PNG")
        yield name, buf.getvalue()
    yield "pil-decodes: animated", encode(rgb, 2, rng, before=chunk(b"acTL", struct.pack(">II", 1, 0)))
    yield "pil-refuses: interlace method 1 header on sequential data", encode(rgb, 2, rng, ihdr_tail=b"\x00\x00\x01")
    yield "pil-refuses: bad CRC before the pixels", encode(rgb, 2, rng, before=chunk(b"tEXt", b"a\x00b", crc=1))
    rows = bytearray(filtered(rgb.reshape(9, 33), 3, [0] * 9))
    rows[34] = 5  # the second row's filter type
    yield "pil-refuses: filter type 5", encode(rgb, 2, rng, raw=bytes(rows))
    yield "pil-decodes: palette index past the palette", encode(grey % 8, 3, rng, palette=np.arange(12).reshape(4, 3))
    yield "pil-decodes: palette image without its palette", encode(grey % 4, 3, rng)
    yield "pil-decodes: a row short (pack refuses it)", encode(rgb, 2, rng, raw=filtered(rgb.reshape(9, 33), 3, [1] * 9)[:-34])
    yield "pil-decodes: a row too many", encode(rgb, 2, rng, raw=filtered(rgb.reshape(9, 33), 3, [1] * 9) * 2)
    yield "pil-refuses: cut short", good[: len(good) - 30]
    yield "not a PNG", b"\xff\xd8\xff\xe0" + good[4:]
    damaged = bytearray(good)
    damaged[good.index(b"IDAT") + 10] ^= 0x40
    yield "pil-refuses: damaged pixel data", bytes(damaged)
    # a second IHDR: PIL takes the last (another size and colour type), libpng refuses the file
    second = chunk(b"IHDR", struct.pack(">IIBBBBB", 33, 9, 8, 0, 0, 0, 0))
    yield "pil-decodes: a second IHDR", encode(rgb, 2, rng, before=second)
    # an APNG frame's control chunk without acTL: PIL decodes the pixel data into the frame's rectangle
    frame = struct.pack(">IIIIIHHBB", 0, 11, 5, 0, 0, 1, 10, 0, 0)
    yield "pil-decodes: an fcTL before the pixels", encode(rgb, 2, rng, before=chunk(b"fcTL", frame))
    yield "pil-refuses: an fdAT before the pixels", encode(rgb, 2, rng, before=chunk(b"fdAT", b"\0\0\0\1"))


def test_what_it_refuses_names_a_reason_and_the_cpu_paths_give_pils_answer():
    names = []
    for name, png in _refusals(np.random.default_rng(1)):
        names.append(name)
        got = _native.decode_png_rgbx(png)
        assert isinstance(got, str) and got, name
        assert whole_png_rgbx(png) is None
        try:
            want = pil_rgb(png)
        except Exception:  # noqa: BLE001 - PIL refuses it: so must the CPU path
            want = None
        if want is None:
            with pytest.raises(Exception):
                decode_rgbx(png)
        else:
            assert name.startswith("pil-decodes"), name
            np.testing.assert_array_equal(decode_rgbx(png)[:, :, :3], want, err_msg=name)
    assert len(names) == 19


def test_pack_keeps_the_pngs_whose_header_or_frame_chunks_only_pil_reads_for_pil():
    """A second IHDR or an APNG frame chunk before the pixel data: PIL decodes another image than libpng (DALI) and
    the native decode would, so pack stores such a file for PIL's decode on every path (`pil_only`), sized as PIL
    decodes it."""
    from fastfeed.pack.validate import Loaded, LoadOptions, check_image

    cases = {name: png for name, png in _refusals(np.random.default_rng(1))
             if "IHDR" in name or "fcTL" in name}
    assert len(cases) == 2
    for name, png in cases.items():
        got = check_image(png, LoadOptions(jpeg_mode="keep"))
        assert isinstance(got, Loaded) and got.pil_only, name
        assert (got.width, got.height) == Image.open(io.BytesIO(png)).size, name
        np.testing.assert_array_equal(decode_rgbx(png)[:, :, :3], pil_rgb(png), err_msg=name)


def test_damaged_files_are_refused_or_decoded_as_pil_decodes_them():
    """Random byte changes and cuts of real PNGs: never a crash, and a success is always PIL's pixels."""
    rng = np.random.default_rng(2)
    sources = [encode(rng.integers(0, 256, (13, 21, 3), dtype=np.uint8), 2, rng),
               encode(rng.integers(0, 256, (8, 30), dtype=np.uint8), 0, rng, pieces=4),
               encode(rng.integers(0, 5, (12, 12), dtype=np.uint8), 3, rng, palette=np.arange(15).reshape(5, 3))]
    decoded = 0
    for k in range(600):
        png = bytearray(sources[k % 3])
        if k % 4 == 0:
            png = png[: int(rng.integers(0, len(png)))]
        else:
            for _ in range(int(rng.integers(1, 4))):
                png[int(rng.integers(8, len(png)))] = int(rng.integers(0, 256))
        got = _native.decode_png_rgbx(bytes(png))
        if not isinstance(got, str):
            decoded += 1
            np.testing.assert_array_equal(got[:, :, :3], pil_rgb(bytes(png)))
    assert 0 < decoded < 600  # (some changes leave the pixels alone: a byte of an unchecked CRC, say)


def test_into_the_callers_buffer_when_it_fits():
    rng = np.random.default_rng(3)
    png = encode(rng.integers(0, 256, (10, 12, 3), dtype=np.uint8), 2, rng)
    out = np.zeros(10 * 12 * 4 + 7, np.uint8)
    got = _native.decode_png_rgbx(png, out)
    assert np.shares_memory(got, out)
    small = np.zeros(10 * 12 * 4 - 1, np.uint8)
    own = _native.decode_png_rgbx(png, small)
    assert not np.shares_memory(own, small) and (small == 0).all()
    np.testing.assert_array_equal(got, own)
    with pytest.raises(BufferError):
        _native.decode_png_rgbx(png, b"\x00" * 1000)  # read-only


def test_threads_decode_side_by_side():
    """The decode releases the GIL and shares nothing between calls (tools/sanitize.sh runs this under TSan)."""
    rng = np.random.default_rng(4)
    pngs = [encode(rng.integers(0, 256, (40, 50 + i, 3), dtype=np.uint8), 2, rng) for i in range(8)]
    want = [pil_rgb(p) for p in pngs]
    errors = []

    def work():
        for _ in range(20):
            for p, w in zip(pngs, want):
                if not np.array_equal(native_rgb(p), w):
                    errors.append("differs")

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


def test_classification_crop_of_a_png_is_pils():
    """decode_rgb (the CPU classification path) through the native decode: the crop PIL's decode gives, bit for
    bit, shown as stored and turned by an EXIF tag."""
    rng = np.random.default_rng(5)
    pixels = rng.integers(0, 256, (37, 53, 3), dtype=np.uint8)
    png = encode(pixels, 2, rng)
    box = (3.5, 2.25, 41.0, 30.75)
    want = np.asarray(Image.fromarray(pixels).resize((16, 16), Image.BILINEAR, box=box))
    np.testing.assert_array_equal(decode_rgb(png, box, 16), want)
    exif = b"Exif\x00\x00" + b"MM\x00\x2a\x00\x00\x00\x08" + struct.pack(">HHHIHH", 1, 0x0112, 3, 1, 6, 0) + b"\0" * 4
    turned = encode(pixels, 2, rng, before=chunk(b"eXIf", exif[6:]))
    shown = np.ascontiguousarray(np.rot90(pixels, -1))  # tag 6: turned 90 degrees clockwise to display
    box = (2.0, 3.0, 30.0, 40.0)
    want = np.asarray(Image.fromarray(shown).resize((16, 16), Image.BILINEAR, box=box))
    np.testing.assert_array_equal(decode_rgb(turned, box, 16, orientation="exif"), want)


def test_label_pngs_decode_to_their_stored_samples():
    """decode_png_samples (a mask's class ids): numpy's view of PIL's L and P images, a palette index past the
    palette included (an id needs no colour); RGB refused. decode_mask takes it and keeps its checks."""
    from fastfeed.detect.masks import MaskError, decode_mask

    rng = np.random.default_rng(7)
    for ctype, palette in ((0, None), (3, np.arange(30).reshape(10, 3)), (3, np.arange(768).reshape(256, 3) % 256)):
        for w, h in ((1, 1), (33, 7), (5, 40)):
            ids = rng.integers(0, 256 if palette is None or len(palette) == 256 else 20, (h, w), dtype=np.uint8)
            png = encode(ids, ctype, rng, palette)
            with Image.open(io.BytesIO(png)) as im:
                want = np.asarray(im)
            got = _native.decode_png_samples(png)
            assert not isinstance(got, str), got
            np.testing.assert_array_equal(got, want)
            np.testing.assert_array_equal(got, ids)
            mask = decode_mask(png, (w, h))
            assert mask.dtype == np.uint8
            np.testing.assert_array_equal(mask, ids)
            with pytest.raises(MaskError, match=f"the mask is {w}x{h}, its image {w + 1}x{h}"):
                decode_mask(png, (w + 1, h))
    odd = encode(ids, 0, rng, before=chunk(b"gAMA", b""))  # a metadata chunk PIL refuses, the native decode skips
    assert isinstance(decode_mask(odd, (w, h)), np.ndarray)
    with pytest.raises(MaskError, match="does not decode"):  # pack's check of a mask: PIL's
        decode_mask(odd, (w, h), native=False)
    rgb = encode(rng.integers(0, 256, (4, 5, 3), dtype=np.uint8), 2, rng)
    assert isinstance(_native.decode_png_samples(rgb), str)
    with pytest.raises(MaskError, match="RGB image"):
        decode_mask(rgb, (5, 4))
    buf = io.BytesIO()
    Image.fromarray(np.full((3, 4), 700, np.uint16)).save(buf, "PNG")  # 16-bit ids: PIL's decode
    np.testing.assert_array_equal(decode_mask(buf.getvalue(), (4, 3)), np.full((3, 4), 700, np.uint16))


def test_rgb_is_the_rgbx_decode_without_its_pad():
    """decode_png_rgb (the detection GPU path's PNGs, handed on as DALI's RGB): the same pixels in 3 bytes."""
    rng = np.random.default_rng(8)
    for ctype, palette in ((0, None), (2, None), (3, np.arange(60).reshape(20, 3))):
        pixels = (rng.integers(0, 256, (9, 14, 3), dtype=np.uint8) if ctype == 2 else
                  rng.integers(0, 20 if palette is not None else 256, (9, 14), dtype=np.uint8))
        png = encode(pixels, ctype, rng, palette)
        rgb = _native.decode_png_rgb(png)
        assert rgb.shape == (9, 14, 3) and rgb.flags.c_contiguous
        np.testing.assert_array_equal(rgb, pil_rgb(png))
        np.testing.assert_array_equal(rgb, native_rgb(png))
    assert isinstance(_native.decode_png_rgb(b"\x89PNG\r\n\x1a\n" + b"\0" * 40), str)
