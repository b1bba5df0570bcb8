"""fastfeed.image.jpeg.probe and transcode.hw_decoder_advice on real encoded images (skimage photos) and crafted headers."""
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


@functools.lru_cache(maxsize=None)
def photo() -> Image.Image:
    # Odd size: partial MCUs at the right/bottom edges are where coefficient handling goes wrong.
    return Image.fromarray(skdata.chelsea()[:227, :301])


def encode(img: Image.Image, fmt: str = "JPEG", **kwargs) -> bytes:
    buf = io.BytesIO()
    img.save(buf, fmt, **kwargs)
    return buf.getvalue()


def segment(marker: int, payload: bytes) -> bytes:
    return struct.pack(">BBH", 0xFF, marker, len(payload) + 2) + payload


def crafted_jpeg(sof: int = 0xC0, precision: int = 8, size=(64, 48), components=((1, 0x22), (2, 0x11), (3, 0x11)),
                 app: bytes = b"") -> bytes:
    """A JPEG header (SOI, optional APPn, SOFn, SOS) with chosen frame parameters; no entropy data needed."""
    w, h = size
    sof_payload = struct.pack(">BHHB", precision, h, w, len(components))
    sof_payload += b"".join(struct.pack(">BBB", cid, hv, 0) for cid, hv in components)
    sos = segment(0xDA, bytes([len(components)]) + b"".join(bytes([cid, 0]) for cid, _ in components) + b"\x00\x3f\x00")
    return b"\xff\xd8" + app + segment(sof, sof_payload) + sos + b"\x00" * 16 + b"\xff\xd9"


def adobe(transform: int) -> bytes:
    return segment(0xEE, b"Adobe" + struct.pack(">HHHB", 100, 0, 0, transform))


@pytest.mark.parametrize("subsampling", ["4:4:4", "4:2:2", "4:2:0"])
@pytest.mark.parametrize("progressive", [False, True])
def test_colour_jpeg_kind_and_subsampling(subsampling, progressive):
    info = jpeg.probe(encode(photo(), subsampling=subsampling, progressive=progressive, quality=90))
    assert (info.format, info.width, info.height) == ("jpeg", 301, 227)
    assert info.jpeg_kind == (jpeg.KIND_PROGRESSIVE if progressive else jpeg.KIND_BASELINE)
    assert info.subsampling == subsampling
    assert info.colorspace == "ycbcr"
    assert info.hw_decodable is (not progressive)
    assert info.kind_name == ("progressive" if progressive else "baseline")


@pytest.mark.parametrize("progressive", [False, True])
def test_grey_jpeg(progressive):
    info = jpeg.probe(encode(photo().convert("L"), progressive=progressive))
    assert (info.subsampling, info.colorspace) == ("gray", "gray")
    assert info.hw_decodable is (not progressive)


def test_cmyk_jpeg_is_not_hw_decodable():
    info = jpeg.probe(encode(photo().convert("CMYK")))
    assert info.jpeg_kind == jpeg.KIND_BASELINE
    assert (info.colorspace, info.subsampling, info.hw_decodable) == ("cmyk", None, False)


@pytest.mark.parametrize(
    "app, components, colorspace",
    [
        (adobe(2), ((1, 0x11), (2, 0x11), (3, 0x11), (4, 0x11)), "ycck"),
        (adobe(0), ((1, 0x11), (2, 0x11), (3, 0x11), (4, 0x11)), "cmyk"),
        (adobe(0), ((1, 0x11), (2, 0x11), (3, 0x11)), "rgb"),
        (adobe(1), ((1, 0x11), (2, 0x11), (3, 0x11)), "ycbcr"),
        (b"", ((82, 0x11), (71, 0x11), (66, 0x11)), "rgb"),  # component ids 'R','G','B', no markers
        (segment(0xE0, b"JFIF\x00\x01\x01\x00\x00\x01\x00\x01\x00\x00"), ((82, 0x11), (71, 0x11), (66, 0x11)),
         "ycbcr"),  # JFIF wins over the ids, as in libjpeg
    ],
)
def test_colour_space_follows_libjpeg_rules(app, components, colorspace):
    info = jpeg.probe(crafted_jpeg(app=app, components=components))
    assert info.colorspace == colorspace
    assert info.hw_decodable is (colorspace == "ycbcr")


@pytest.mark.parametrize(
    "components, name, hw",
    [
        (((1, 0x12), (2, 0x11), (3, 0x11)), "4:4:0", True),
        (((1, 0x41), (2, 0x11), (3, 0x11)), "4:1:1", True),
        (((1, 0x42), (2, 0x11), (3, 0x11)), "4:1:0", True),
        (((1, 0x22), (2, 0x22), (3, 0x22)), "4:4:4", True),  # all components at 2x2 is still 4:4:4
        (((1, 0x22), (2, 0x21), (3, 0x11)), "other", False),  # Cb and Cr differ
        (((1, 0x32), (2, 0x21), (3, 0x21)), "other", False),  # non-integer ratio
    ],
)
def test_unusual_subsamplings(components, name, hw):
    info = jpeg.probe(crafted_jpeg(components=components))
    assert (info.subsampling, info.hw_decodable) == (name, hw)


@pytest.mark.parametrize(
    "sof, precision, kind",
    [
        (0xC0, 8, jpeg.KIND_BASELINE),
        (0xC1, 8, jpeg.KIND_OTHER_JPEG),  # extended sequential
        (0xC2, 8, jpeg.KIND_PROGRESSIVE),
        (0xC2, 12, jpeg.KIND_OTHER_JPEG),
        (0xC3, 8, jpeg.KIND_OTHER_JPEG),  # lossless
        (0xC9, 8, jpeg.KIND_ARITHMETIC),
        (0xCA, 8, jpeg.KIND_ARITHMETIC),
        (0xCB, 8, jpeg.KIND_OTHER_JPEG),  # lossless arithmetic
        (0xC5, 8, jpeg.KIND_OTHER_JPEG),  # hierarchical
    ],
)
def test_frame_types(sof, precision, kind):
    info = jpeg.probe(crafted_jpeg(sof=sof, precision=precision))
    assert info.jpeg_kind == kind
    assert info.hw_decodable is (kind == jpeg.KIND_BASELINE)


def test_fill_bytes_and_restart_markers_before_frame_are_skipped():
    good = crafted_jpeg()
    padded = good[:2] + b"\xff\xff\xff" + good[2:]
    assert jpeg.probe(padded) == jpeg.probe(good)


@pytest.mark.parametrize(
    "img_mode, fmt, kwargs, colorspace",
    [
        ("RGB", "PNG", {}, "rgb"),
        ("RGBA", "PNG", {}, "rgba"),
        ("L", "PNG", {}, "gray"),
        ("P", "GIF", {}, "palette"),
        ("RGB", "BMP", {}, "rgb"),
        ("RGB", "TIFF", {}, "rgb"),
        ("RGB", "PPM", {}, "rgb"),
    ],
)
def test_other_formats_via_pil_header(img_mode, fmt, kwargs, colorspace):
    img = photo().convert(img_mode)
    info = jpeg.probe(encode(img, fmt, **kwargs))
    assert info == jpeg.ImageInfo(fmt.lower(), 301, 227, jpeg.KIND_NOT_JPEG, None, colorspace, False)


def test_probe_reads_headers_only():
    # Everything after the start of scan is irrelevant to the probe: a JPEG cut right after SOS still probes.
    full = encode(photo(), progressive=True)
    sos = full.index(b"\xff\xda")
    assert jpeg.probe(full[: sos + 20]) == jpeg.probe(full)


@pytest.mark.parametrize("data", [b"", b"x", b"not an image at all", b"\xff\xd8", b"\xff\xd8\xff", b"\xff\xd8\xff\xd9",
                                  b"\x89PNG\r\n\x1a\n", b"GIF89a", b"\xff\xd8\x00\x00"])
def test_garbage_raises_probe_error(data):
    with pytest.raises(jpeg.ImageProbeError):
        jpeg.probe(data)


def test_unidentified_bytes_are_described_by_what_they_start_with():
    # PIL's own message names a BytesIO object at some address: useless in rejected.jsonl.
    with pytest.raises(jpeg.ImageProbeError, match="an empty file"):
        jpeg.probe(b"")
    with pytest.raises(jpeg.ImageProbeError, match="starts b'not an i'") as e:
        jpeg.probe(b"not an image at all")
    assert "BytesIO" not in str(e.value)


def test_every_truncated_header_raises_probe_error():
    full = encode(photo(), progressive=True)
    sos = full.index(b"\xff\xda")
    for cut in range(sos + 4):
        with pytest.raises(jpeg.ImageProbeError):
            jpeg.probe(full[:cut])


def test_malformed_frame_headers():
    with pytest.raises(jpeg.ImageProbeError, match="zero image size"):
        jpeg.probe(crafted_jpeg(size=(0, 10)))
    with pytest.raises(jpeg.ImageProbeError, match="sampling factors"):
        jpeg.probe(crafted_jpeg(components=((1, 0x50), (2, 0x11), (3, 0x11))))
    doubled = crafted_jpeg()
    sof_at = doubled.index(b"\xff\xc0")
    sof_len = struct.unpack_from(">H", doubled, sof_at + 2)[0] + 2
    doubled = doubled[: sof_at + sof_len] + doubled[sof_at : sof_at + sof_len] + doubled[sof_at + sof_len :]
    with pytest.raises(jpeg.ImageProbeError, match="more than one frame"):
        jpeg.probe(doubled)


def test_probe_rejects_non_bytes():
    with pytest.raises(TypeError):
        jpeg.probe("a string")  # type: ignore[arg-type]


@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_fuzzed_jpeg_headers_never_crash(data):
    original = encode(photo(), progressive=data.draw(st.booleans()))
    header_end = original.index(b"\xff\xda") + 16
    buf = bytearray(original[: data.draw(st.integers(0, header_end + 64))])
    for _ in range(data.draw(st.integers(0, 4))):
        if buf:
            i = data.draw(st.integers(0, len(buf) - 1))
            buf[i] ^= 1 << data.draw(st.integers(0, 7))
    try:
        info = jpeg.probe(bytes(buf))
    except jpeg.ImageProbeError:
        return
    assert info.width > 0 and info.height > 0
    assert info.jpeg_kind in jpeg.KIND_NAMES


# ---- hw_decoder_advice -------------------------------------------------------------------------------------


def test_advice_none_when_all_baseline():
    assert transcode.hw_decoder_advice({"baseline": 1000}) is None
    assert transcode.hw_decoder_advice({}) is None
    assert transcode.hw_decoder_advice({"baseline": 1000, "progressive": 5}) is None  # under 1%


def test_advice_for_progressive_points_at_lossless_repack():
    text = transcode.hw_decoder_advice({"baseline": 800, "progressive": 150, "arithmetic": 50})
    assert text is not None
    assert "200 of 1000 images (20.0%)" in text
    assert "--jpeg baseline" in text and "--jpeg reencode" not in text


def test_advice_for_rejected_images_points_at_reencode():
    text = transcode.hw_decoder_advice({"baseline": 93, "not_jpeg": 5, "other_jpeg": 2, "baseline_not_hw": 3})
    assert text is not None and "10 of 100" in text
    assert "--jpeg reencode" in text and "--jpeg baseline" not in text


def test_advice_rejects_unknown_kinds():
    with pytest.raises(ValueError, match="unknown jpeg_mix"):
        transcode.hw_decoder_advice({"baseline": 3, "jpeg2000": 1})
    with pytest.raises(ValueError, match="inconsistent"):
        transcode.hw_decoder_advice({"baseline": 3, "baseline_not_hw": 4})


def test_kind_codes_are_stable():
    # Stored in samples.npz: renumbering would misread every packed dataset.
    assert jpeg.KIND_CODES == {"not_jpeg": 0, "baseline": 1, "progressive": 2, "arithmetic": 3, "other_jpeg": 4}
    assert np.uint8(jpeg.KIND_OTHER_JPEG) == 4


# ---- EXIF orientation and the end of the first image (decode contract, pack's lossless fixes) ------------------


@pytest.mark.parametrize("tag", range(1, 9))
@pytest.mark.parametrize("fmt", ["JPEG", "PNG"])
def test_exif_orientation_matches_pil_and_reaches_the_probe(tag, fmt):
    ex = Image.Exif()
    ex[0x0112] = tag
    data = encode(photo(), fmt, exif=ex.tobytes())
    with Image.open(io.BytesIO(data)) as im:
        im.load()
        assert im.getexif().get(0x0112) == tag  # the file really carries it, as PIL reads it
    assert jpeg.exif_orientation(data) == tag
    if fmt == "JPEG":
        assert jpeg.probe(data).orientation == tag
        w, h = photo().size
        assert jpeg.displayed_size(data) == ((h, w) if tag >= 5 else (w, h))


def test_exif_orientation_is_1_when_absent_bad_or_not_an_image():
    assert jpeg.exif_orientation(encode(photo())) == 1
    assert jpeg.exif_orientation(b"not an image") == 1
    bad = encode(photo())
    bad = bad[:2] + segment(0xE1, b"Exif\x00\x00MM\x00*\xff\xff\xff\xf0") + bad[2:]  # IFD offset past the end
    assert jpeg.exif_orientation(bad) == 1 and jpeg.probe(bad).orientation == 1
    ex = Image.Exif()
    ex[0x0112] = 9  # out of range
    assert jpeg.exif_orientation(encode(photo(), exif=ex.tobytes())) == 1


@pytest.mark.parametrize("progressive", [False, True])
def test_jpeg_end_finds_the_first_image_end_past_a_trailer(progressive):
    data = encode(photo(), quality=90, progressive=progressive)
    assert jpeg.jpeg_end(data) == len(data)
    # A trailer holding marker-like bytes, even an EOI of its own (motion photo video, MPF second image).
    trailer = b"\x00\x00\x00\x18ftypmp42" + bytes(range(256)) * 8 + data
    assert jpeg.jpeg_end(data + trailer) == len(data)
    assert jpeg.jpeg_end(data[: len(data) // 2]) is None  # truncated: no end
    assert jpeg.jpeg_end(b"\x89PNG\r\n\x1a\n") is None


def test_exif_orientation_behind_a_large_segment_is_found():
    ex = Image.Exif()
    ex[0x0112] = 6
    data = encode(photo(), exif=ex.tobytes())
    big = segment(0xE2, b"ICC_PROFILE\x00\x01\x01" + bytes(20000))  # 20 KB before the EXIF block
    moved = data[:2] + big + data[2:]
    assert jpeg.exif_orientation(moved) == 6 and jpeg.probe(moved).orientation == 6
    assert jpeg.exif_orientation(np.frombuffer(moved, np.uint8)) == 6  # ring slots are numpy views
