"""JPEGs with bytes where a marker should start (junk, a stuffed FF 00, an APP13 segment whose length is short of its
data): libjpeg and PIL skip them with a warning and decode the image. Pack keeps the file with those header bytes
left out (`dropped_leading_junk`): the scans byte for byte, so every decoder gets PIL's pixels of the original."""
from __future__ import annotations

import io
import struct
import warnings

import numpy as np
import pytest
from PIL import Image

from fastfeed.pack.validate import DROPPED_JUNK, Loaded, LoadOptions, Rejected, check_image


def _base() -> tuple[bytes, int]:
    buf = io.BytesIO()
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (32, 40, 3), dtype=np.uint8)).save(
        buf, format="JPEG", quality=90)
    data = buf.getvalue()
    assert data[2:4] == b"\xff\xe0"
    return data, 4 + struct.unpack(">H", data[4:6])[0]  # the end of the JFIF segment


def _pil(data: bytes) -> np.ndarray:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with Image.open(io.BytesIO(data)) as im:
            return np.asarray(im.convert("RGB"))


@pytest.mark.parametrize("insert", [b"\x00\x12\x34", b"\xff\x00", b"\xff\xed\x00\x08Photoshop 3.0\x008BIM\x04\x04"],
                         ids=["junk", "stuffed-ff00", "app13-short-length"])
def test_bytes_before_a_marker_are_left_out_and_the_pixels_are_pils(insert):
    base, cut = _base()
    data = base[:cut] + insert + base[cut:]
    got = check_image(data, LoadOptions())
    assert isinstance(got, Loaded) and got.change == DROPPED_JUNK, got
    stored = bytes(got.data)
    assert stored.endswith(base[base.index(b"\xff\xda"):])  # the scans as they were
    assert np.array_equal(_pil(stored), _pil(data)) and np.array_equal(_pil(stored), _pil(base))


def test_a_segment_running_past_the_file_is_still_rejected():
    base, cut = _base()
    got = check_image(base[:cut] + b"\xff\xee\xff\xf0Adobe" + base[cut:cut + 8], LoadOptions())
    assert isinstance(got, Rejected)
