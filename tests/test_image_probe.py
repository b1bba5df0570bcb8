"""The native readers' JPEG probe (csrc/image_probe.h) is a mirror of the Python header walk (fastfeed/image/jpeg.py probe,
headers.tiff_orientation, validate._tail): on real files (the odd-image corpus, demo JPEGs) and on thousands of
mutated ones (byte flips in the header, cuts, EXIF edits, trailing padding) the facts it hands to
pack/validate.check_image lead to the very same decision, byte for byte, as the Python walk on its own."""
from __future__ import annotations

import io
import struct
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from fastfeed import _native
from fastfeed.image import jpeg
from fastfeed.image.headers import png_facts
from fastfeed.pack.validate import Loaded, LoadOptions, _tail, check_image
from odd_images.build import build_corpus, photo

pytestmark = pytest.mark.filterwarnings("ignore:Corrupt EXIF data:UserWarning",
                                        "ignore::PIL.Image.DecompressionBombWarning")


def _python_facts(data: bytes):
    """What the Python walk says: ImageInfo or the exception type, and whether the tail ends in EOI."""
    try:
        info = jpeg.probe(data)
    except jpeg.ImageProbeError:
        info = jpeg.ImageProbeError
    return info, _tail(data).endswith(b"\xff\xd9")


def _same(data: bytes, opts: LoadOptions) -> None:
    facts = _native.probe_jpeg(data)
    if data[:3] != b"\xff\xd8\xff":
        assert facts is None
        return
    info, eoi = _python_facts(data)
    if facts is None:
        assert info is jpeg.ImageProbeError, data[:64]
        return
    try:
        native_info = jpeg.jpeg_info(*facts[:5])
    except jpeg.ImageProbeError:
        native_info = jpeg.ImageProbeError
    assert native_info == info, data[:64]
    assert facts[5] == eoi
    a, b = check_image(data, opts), check_image(data, opts, facts)
    assert type(a) is type(b)
    if isinstance(a, Loaded):
        assert (bytes(a.data), a.ext, a.width, a.height, a.jpeg_kind, a.change, a.orientation, a.hw_decodable) == \
               (bytes(b.data), b.ext, b.width, b.height, b.jpeg_kind, b.change, b.orientation, b.hw_decodable)
    else:
        assert a.reason == b.reason


def _exif(tag_value: int, little: bool, typ: int = 3, count: int = 1, ifd: int = 8) -> bytes:
    e = "<" if little else ">"
    pad = ifd - 8 if ifd < 1024 else 0  # a larger offset points past the block's end
    tiff = (b"II*\x00" if little else b"MM\x00*") + struct.pack(e + "I", ifd) + b"\x00" * pad
    tiff += struct.pack(e + "H", 2) + struct.pack(e + "HHI", 0x010F, 2, 4) + b"abc\x00"
    tiff += struct.pack(e + "HHIHH", 0x0112, typ, count, tag_value, 0) + b"\x00" * 4
    return b"Exif\x00\x00" + tiff


def _with_app(data: bytes, marker: int, payload: bytes) -> bytes:
    return data[:2] + bytes([0xFF, marker]) + struct.pack(">H", len(payload) + 2) + payload + data[2:]


@pytest.fixture(scope="module")
def bases(tmp_path_factory) -> list[bytes]:
    out = []
    for prog in (False, True):
        b = io.BytesIO()
        Image.fromarray(photo(64, 48, seed=int(prog))).save(b, "JPEG", quality=80, progressive=prog)
        out.append(b.getvalue())
    g = io.BytesIO()
    Image.fromarray(photo(40, 40, seed=3)).convert("L").save(g, "JPEG", quality=70)
    out.append(g.getvalue())
    return out


def test_real_files_corpus_and_demo(tmp_path, demo_tree):
    opts = LoadOptions(jpeg_mode="keep")
    files = [Path(c.path) for c in build_corpus(str(tmp_path / "odd"))]
    files += sorted(Path(demo_tree).rglob("*.jpg"))[:40]
    n = 0
    for f in files:
        data = f.read_bytes()
        _same(data, opts)
        n += data[:3] == b"\xff\xd8\xff"
    assert n >= 60


def test_exif_orientation_edge_cases(bases):
    opts = LoadOptions(jpeg_mode="keep")
    base = bases[0]
    for little in (True, False):
        for v in (0, 1, 3, 6, 8, 9, 0xFFFF):
            _same(_with_app(base, 0xE1, _exif(v, little)), opts)
        _same(_with_app(base, 0xE1, _exif(6, little, typ=4)), opts)       # wrong type: no tag
        _same(_with_app(base, 0xE1, _exif(6, little, count=0)), opts)     # no value
        _same(_with_app(base, 0xE1, _exif(6, little, ifd=1 << 30)), opts)  # IFD past the end
        _same(_with_app(base, 0xE1, _exif(6, little)[:30]), opts)         # entries cut
    # the first Exif block without the tag, a second one with it (the walk keeps looking while the tag is 1)
    two = _with_app(_with_app(base, 0xE1, _exif(5, True)), 0xE1, _exif(1, True))
    _same(two, opts)
    assert _native.probe_jpeg(two)[4] == 5
    _same(_with_app(base, 0xEE, b"Adobe\x00\x64\x00\x00\x00\x00\x00"), opts)  # Adobe transform 0: RGB
    _same(_with_app(base, 0xEE, b"Adobe"), opts)  # too short to count


def test_tails_and_padding(bases):
    opts = LoadOptions(jpeg_mode="keep")
    base = bases[0]
    for tail in (b"", b"\x00", b"\r\n", b" " * 511, b" " * 512, b"\x00" * 2000, b"x", b"\xff", b"trailer\xff\xd9",
                 b"\xff\xd9" + b"\x00" * 600):
        _same(base + tail, opts)
    _same(base[:-2], opts)  # no EOI at all: truncated
    # EOI's FF as the first byte of the last-512 window, its D9 the last non-padding byte: Python's window sees
    # only D9 (not "ends in EOI") and walks to the end marker instead; the mirror must agree
    _same(base[:-1] + b"\xd9" + b"\x00" * 511, opts)
    _same(base + b"\x00" * 510, opts)


def test_mutated_headers(bases):
    opts = LoadOptions(jpeg_mode="keep", scan_check=False)  # the decision with the check is test_scan_check's
    rng = np.random.default_rng(0)
    for base in bases:
        head = len(base) - 200
        for _ in range(150):
            b = bytearray(base)
            op = rng.integers(4)
            if op == 0:  # flip bytes in the header
                for _ in range(rng.integers(1, 4)):
                    b[rng.integers(2, min(head, 700))] = rng.integers(256)
            elif op == 1:  # cut the file
                b = b[: rng.integers(3, len(b))]
            elif op == 2:  # duplicate a header span
                i = int(rng.integers(2, 300))
                b[i:i] = b[i: i + int(rng.integers(1, 40))]
            else:  # drop a header span
                i = int(rng.integers(3, 300))
                del b[i: i + int(rng.integers(1, 20))]
            _same(bytes(b), opts)


def test_header_failures_is_the_python_walk_over_a_batch(bases):
    """`jpeg.header_failures`, the Loader's check of unchecked bytes (assemble.py `_untrusted`), names exactly the JPEGs
    and PNGs pack would not store as they are: a JPEG header `jpeg.probe` cannot read (with its message) or a missing
    end marker (validate._tail), a PNG whose chunks `headers.png_facts` cannot walk (its reason); in one native call
    per batch (numpy views, as the ring hands them over, and other buffers). Other formats are not looked at."""
    rng = np.random.default_rng(1)
    png = io.BytesIO()
    Image.fromarray(photo(48, 40, seed=5)).save(png, "PNG")
    batch = [np.empty(0, np.uint8), b"\xff\xd8", b"GIF89a" + b"\x00" * 20, b"\x89PNG\r\n\x1a\n"]
    for base in bases + [png.getvalue()]:
        for _ in range(40):
            b = bytearray(base)
            op = rng.integers(3)
            if op == 0:  # a header byte changed
                b[rng.integers(2, 400)] = rng.integers(256)
            elif op == 1:  # cut
                b = b[: rng.integers(2, len(b))]
            else:  # garbage after the first bytes
                cut = int(rng.integers(8, 300))
                b[cut:] = bytes([7]) * (len(b) - cut)
            batch.append(np.frombuffer(bytes(b), np.uint8))
    want = []
    for i, s in enumerate(batch):
        s = bytes(s)
        if s[:2] == b"\xff\xd8":
            try:
                jpeg.probe(s)
                if not _tail(s).endswith(b"\xff\xd9"):
                    want.append((i, "truncated JPEG (no end-of-image marker)"))
            except jpeg.ImageProbeError as e:
                want.append((i, f"bad image header: {e}"))
        elif s[:8] == b"\x89PNG\r\n\x1a\n" and isinstance(png_facts(s), str):
            want.append((i, png_facts(s)))
    got = jpeg.header_failures(batch)
    assert got == want
    assert {w.split(":")[0].split(" (")[0] for _, w in want} >= {"bad image header", "truncated JPEG", "truncated PNG"}
    assert len(want) < len(batch) - 20  # the changed bytes that leave the structure readable pass
