"""Lossless progressive/arithmetic -> baseline transcoding (native core) and fastfeed.image.transcode.prepare.

Every transcode is checked by decoding before and after with PIL: the pixels must be identical.
"""
from __future__ import annotations

import functools
import io
import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image
from skimage import data as skdata

from fastfeed.image import jpeg, transcode

pytestmark = pytest.mark.skipif(
    not transcode.HAVE_TRANSCODE, reason="fastfeed._native built without libjpeg (no jpeglib.h at build time)"
)


@functools.lru_cache(maxsize=None)
def photo() -> Image.Image:
    # Odd size: partial MCUs at the right/bottom edges are where coefficient handling goes wrong.
    return Image.fromarray(skdata.astronaut()[100:331, 90:393])


def encode(img: Image.Image, fmt: str = "JPEG", **kwargs) -> bytes:
    buf = io.BytesIO()
    img.save(buf, fmt, **kwargs)
    return buf.getvalue()


def pixels(data: bytes) -> np.ndarray:
    with Image.open(io.BytesIO(data)) as im:
        return np.asarray(im)


def native():
    from fastfeed import _native

    return _native


@functools.lru_cache(maxsize=None)
def progressive_jpeg(subsampling: str = "4:2:0") -> bytes:
    if subsampling == "gray":
        return encode(photo().convert("L"), progressive=True, quality=88)
    return encode(photo(), progressive=True, subsampling=subsampling, quality=88)


@pytest.mark.parametrize("subsampling", ["4:4:4", "4:2:2", "4:2:0", "gray"])
def test_progressive_to_baseline_is_pixel_identical(subsampling):
    src = progressive_jpeg(subsampling)
    assert jpeg.probe(src).jpeg_kind == jpeg.KIND_PROGRESSIVE
    out = transcode.transcode_to_baseline(src)
    info = jpeg.probe(out)
    assert info.jpeg_kind == jpeg.KIND_BASELINE and info.hw_decodable
    assert info.subsampling == jpeg.probe(src).subsampling
    assert np.array_equal(pixels(src), pixels(out))
    # Baseline is larger than progressive but within a few percent (optimized Huffman tables).
    assert len(src) < len(out) < 1.15 * len(src)


@pytest.mark.parametrize("progressive", [False, True])
def test_arithmetic_coded_to_baseline_is_pixel_identical(progressive):
    # PIL cannot write arithmetic coding; libjpeg-turbo can, through the same lossless path.
    src = native().transcode(progressive_jpeg("4:2:0"), arithmetic=True, progressive=progressive)
    assert jpeg.probe(src).jpeg_kind == jpeg.KIND_ARITHMETIC
    out = transcode.transcode_to_baseline(src)
    assert jpeg.probe(out).jpeg_kind == jpeg.KIND_BASELINE
    assert np.array_equal(pixels(src), pixels(out))


@pytest.mark.parametrize("arithmetic", [False, True])
def test_a_progression_that_stops_short_is_refused_and_found_by_the_scan_check(arithmetic):
    """Cut after any of its first 9 scans, a progressive file leaves coefficients uncoded, which libjpeg estimates
    (block smoothing) and a baseline copy would not: the transcode refuses it and the scan check names it. All 10
    scans: a lossless copy, and a clean check."""
    from odd_images.build import _first_scans

    src = progressive_jpeg("4:2:0")
    if arithmetic:
        src = native().transcode(src, arithmetic=True, progressive=True)
    for k in range(1, 10):
        cut = _first_scans(src, k)
        pixels(cut)  # PIL decodes it
        assert transcode.check_scans([cut]) == [transcode.UNCODED_COEFFICIENTS], k
        with pytest.raises(transcode.JpegTranscodeError, match="leave coefficients uncoded"):
            transcode.transcode_to_baseline(cut)
    with pytest.raises(ValueError, match="10 scans"):
        _first_scans(src, 10)
    assert transcode.check_scans([src]) == [None]
    assert np.array_equal(pixels(src), pixels(transcode.transcode_to_baseline(src)))


def test_cmyk_progressive_transcodes_but_stays_cmyk():
    src = encode(photo().convert("CMYK"), progressive=True)
    out = transcode.transcode_to_baseline(src)
    info = jpeg.probe(out)
    assert (info.jpeg_kind, info.colorspace, info.hw_decodable) == (jpeg.KIND_BASELINE, "cmyk", False)
    assert np.array_equal(pixels(src), pixels(out))


def test_baseline_input_round_trips():
    src = encode(photo(), quality=75)
    out = transcode.transcode_to_baseline(src)
    assert np.array_equal(pixels(src), pixels(out))


def test_markers_are_copied():
    icc = bytes(np.random.default_rng(0).integers(0, 256, 70_000, dtype=np.uint8))  # spans two APP2 segments
    exif = Image.Exif()
    exif[0x010F] = "fastfeed-test-camera"
    src = encode(photo(), progressive=True, icc_profile=icc, exif=exif.tobytes(), comment=b"keep me")
    out = transcode.transcode_to_baseline(src)
    with Image.open(io.BytesIO(out)) as im:
        assert im.info["icc_profile"] == icc
        assert im.info["comment"] == b"keep me"
        assert im.getexif()[0x010F] == "fastfeed-test-camera"
    assert out.count(b"JFIF\x00") == 1  # not duplicated


def test_accepts_any_bytes_like():
    src = progressive_jpeg()
    expected = transcode.transcode_to_baseline(src)
    assert transcode.transcode_to_baseline(bytearray(src)) == expected
    assert transcode.transcode_to_baseline(memoryview(src)) == expected
    assert transcode.transcode_to_baseline(np.frombuffer(src, dtype=np.uint8)) == expected
    with pytest.raises((BufferError, ValueError), match="contiguous"):
        transcode.transcode_to_baseline(np.frombuffer(src * 2, dtype=np.uint8)[::2])
    with pytest.raises(TypeError):
        transcode.transcode_to_baseline("not bytes")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "make_bad",
    [
        lambda src: b"",
        lambda src: b"\xff\xd8",
        lambda src: src[: len(src) // 2],  # truncated mid-scan: libjpeg would pad with grey; strict rejects
        lambda src: src[:600] + bytes(200) + src[800:],  # zeroed entropy data
        lambda src: encode(photo(), "PNG"),
        lambda src: b"garbage" * 100,
    ],
    ids=["empty", "soi-only", "truncated", "zeroed", "png", "garbage"],
)
def test_corrupt_input_raises_clean_error(make_bad):
    with pytest.raises(transcode.JpegTranscodeError, match="JPEG|empty"):
        transcode.transcode_to_baseline(make_bad(progressive_jpeg()))


def test_decompression_bomb_is_rejected_before_allocating():
    bomb = bytearray(progressive_jpeg())
    sof = bomb.index(b"\xff\xc2")
    bomb[sof + 5 : sof + 9] = struct.pack(">HH", 60000, 60000)  # 3.6 gigapixels of coefficients
    assert jpeg.probe(bytes(bomb)).width == 60000
    with pytest.raises(transcode.JpegTranscodeError, match="image too large"):
        transcode.transcode_to_baseline(bytes(bomb))


def test_lenient_mode_accepts_what_strict_rejects():
    truncated = progressive_jpeg()[: len(progressive_jpeg()) * 3 // 4]
    with pytest.raises(transcode.JpegTranscodeError, match="Premature end"):
        transcode.transcode_to_baseline(truncated)
    out = native().transcode(truncated, strict=False)
    assert jpeg.probe(out).jpeg_kind == jpeg.KIND_BASELINE


@pytest.mark.parametrize("num_threads", [0, 1, 2, 5])
def test_transcode_many_matches_single_calls_in_order(num_threads):
    good = [progressive_jpeg(s) for s in ("4:4:4", "4:2:2", "4:2:0", "gray")]
    items = [good[0], b"bad", good[1], good[2][:500], good[3], good[0]]
    results = transcode.transcode_many(items, num_threads=num_threads)
    assert len(results) == len(items)
    for item, result in zip(items, results):
        if item in good:
            assert result == transcode.transcode_to_baseline(item)
        else:
            assert isinstance(result, transcode.JpegTranscodeError)
    assert transcode.transcode_many([], num_threads=num_threads) == []


def test_transcode_many_rejects_bad_arguments():
    with pytest.raises(ValueError, match="num_threads"):
        transcode.transcode_many([progressive_jpeg()], num_threads=-1)
    with pytest.raises(TypeError):
        transcode.transcode_many([progressive_jpeg(), 3])  # type: ignore[list-item]


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_fuzzed_jpegs_give_identical_pixels_or_a_clean_error(data):
    """Random truncations and bit flips: probe and transcode either fail cleanly or stay lossless."""
    original = progressive_jpeg(data.draw(st.sampled_from(["4:4:4", "4:2:0", "gray"])))
    buf = bytearray(original[: data.draw(st.integers(0, len(original)))])
    for _ in range(data.draw(st.integers(0, 3))):
        if buf:
            buf[data.draw(st.integers(0, len(buf) - 1))] ^= 1 << data.draw(st.integers(0, 7))
    corrupt = bytes(buf)
    try:
        jpeg.probe(corrupt)
    except jpeg.ImageProbeError:
        pass
    try:
        out = transcode.transcode_to_baseline(corrupt)
    except transcode.JpegTranscodeError:
        return
    # Strict mode only passes data libjpeg decoded without a warning, so both decodes must agree exactly.
    try:
        before = pixels(corrupt)
    except (OSError, SyntaxError, ValueError):
        return  # PIL's own marker parser rejects what libjpeg accepted (e.g. a broken APP segment)
    assert np.array_equal(before, pixels(out))


# ---- prepare ----------------------------------------------------------------------------------------------


def test_prepare_keep_returns_input_unchanged():
    src = progressive_jpeg()
    out, action = transcode.prepare(src, "keep")
    assert out is src and action == "kept"


def test_prepare_baseline_transcodes_only_what_needs_it():
    out, action = transcode.prepare(progressive_jpeg(), "baseline")
    assert action == "transcoded" and jpeg.probe(out).hw_decodable
    assert np.array_equal(pixels(out), pixels(progressive_jpeg()))
    for already_fine in (encode(photo()), encode(photo(), "PNG"), encode(photo().convert("CMYK"))):
        out, action = transcode.prepare(already_fine, "baseline")
        assert out is already_fine and action == "kept"


def test_prepare_reencode_prefers_lossless_transcode():
    out, action = transcode.prepare(progressive_jpeg("4:4:4"), "reencode", quality=80)
    assert action == "transcoded"
    assert np.array_equal(pixels(out), pixels(progressive_jpeg("4:4:4")))


@pytest.mark.parametrize(
    "src, mode_after",
    [
        (lambda: encode(photo().convert("CMYK"), progressive=True), "RGB"),
        (lambda: encode(photo().convert("RGBA"), "PNG"), "RGB"),
        (lambda: encode(photo().convert("P", palette=Image.Palette.ADAPTIVE), "GIF"), "RGB"),
        (lambda: encode(photo().convert("L"), "PNG"), "L"),
    ],
    ids=["cmyk-progressive", "png-rgba", "gif", "png-grey"],
)
def test_prepare_reencode_makes_rejected_images_hw_decodable(src, mode_after):
    data = src()
    out, action = transcode.prepare(data, "reencode", quality=92)
    info = jpeg.probe(out)
    assert action == "reencoded"
    assert info.hw_decodable and (info.width, info.height) == (303, 231)
    with Image.open(io.BytesIO(data)) as im:
        reference = np.asarray(im.convert(mode_after)).astype(np.int16)
    # Lossy, but close to the original at quality 92 (chroma subsampling dominates the error).
    assert np.abs(pixels(out).astype(np.int16) - reference).mean() < 6


def test_prepare_rejects_bad_arguments():
    with pytest.raises(ValueError, match="mode"):
        transcode.prepare(progressive_jpeg(), "fast")
    with pytest.raises(ValueError, match="quality"):
        transcode.prepare(progressive_jpeg(), "reencode", quality=0)
    with pytest.raises(jpeg.ImageProbeError):
        transcode.prepare(b"garbage", "baseline")
    with pytest.raises(transcode.JpegTranscodeError):
        transcode.prepare(progressive_jpeg()[:2000], "baseline")
