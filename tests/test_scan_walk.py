"""The scan check's fast walk (csrc/jpeg_entropy.h) never changes an answer: on clean encodes of every layout it
proves the file itself, and on thousands of damaged ones whatever it proves libjpeg's own pass also finds clean, so
the check (the walk, then libjpeg where the walk proves nothing) answers exactly as libjpeg alone, message for
message. The oracle is libjpeg's pass (`method="libjpeg"`), which does not share a line of code with the walk."""
from __future__ import annotations

import io
import random
import struct
from pathlib import Path

import pytest
from PIL import Image

from fastfeed.image import transcode
from odd_images.build import build_corpus, photo

pytestmark = pytest.mark.skipif(not transcode.HAVE_SCAN_CHECK, reason="native core built without libjpeg")

NOT_PROVEN = "not proven by the walk"


def check(items, method):
    return transcode._require_native().check_jpegs(list(items), 1, method)


def _encode(w, h, mode="RGB", seed=0, **kw) -> bytes:
    img = Image.fromarray(photo(w, h, seed=seed)).convert(mode)
    b = io.BytesIO()
    img.save(b, "JPEG", **kw)
    return b.getvalue()


def _baselines() -> dict[str, bytes]:
    """Clean baseline encodes: every subsampling, grey and CMYK (four components), restart intervals down to one
    MCU, default and optimised Huffman tables, qualities from coarse to 100, sizes from one pixel to a few MCUs
    over a round number."""
    out = {}
    for w, h in [(1, 1), (7, 9), (17, 33), (64, 48), (203, 150)]:
        for sub in (0, 1, 2):
            out[f"{w}x{h}_sub{sub}"] = _encode(w, h, quality=90, subsampling=sub, seed=w)
        out[f"{w}x{h}_grey"] = _encode(w, h, "L", quality=85, seed=h)
    for q in (20, 75, 100):
        out[f"q{q}_opt"] = _encode(120, 80, quality=q, optimize=True, seed=q)
    for blocks in (1, 3, 7):
        out[f"rst{blocks}_420"] = _encode(150, 100, quality=90, subsampling=2, restart_marker_blocks=blocks, seed=blocks)
        out[f"rst{blocks}_grey"] = _encode(70, 50, "L", quality=90, restart_marker_blocks=blocks, seed=blocks)
    out["rst_rows_444"] = _encode(90, 70, quality=95, subsampling=0, restart_marker_rows=1)
    out["cmyk"] = _encode(60, 40, "CMYK", quality=90)
    out["cmyk_rst"] = _encode(60, 40, "CMYK", quality=90, restart_marker_blocks=2)
    return out


@pytest.fixture(scope="module")
def baselines() -> dict[str, bytes]:
    return _baselines()


def test_the_walk_proves_every_clean_baseline_encode_itself(baselines):
    names, data = list(baselines), list(baselines.values())
    assert check(data, "libjpeg") == [None] * len(data)
    walked = check(data, "walk")
    assert [n for n, r in zip(names, walked) if r is not None] == []
    assert check(data, "default") == [None] * len(data)


def test_what_the_walk_does_not_read_goes_to_libjpeg():
    """A progressive file is not the walk's to read, and a frame that claims more rows than its scan codes is not
    complete: the walk proves neither, and libjpeg answers."""
    prog = _encode(96, 64, quality=90, progressive=True)
    assert check([prog], "walk") == [NOT_PROVEN]
    assert check([prog], "default") == check([prog], "libjpeg") == [None]
    lie = bytearray(_encode(64, 48, quality=90))
    sof = lie.find(b"\xff\xc0")
    struct.pack_into(">H", lie, sof + 5, 96)  # the frame claims twice the rows its scan codes
    assert check([bytes(lie)], "walk") == [NOT_PROVEN]
    verdict = check([bytes(lie)], "default")
    assert verdict == check([bytes(lie)], "libjpeg") and verdict[0] is not None


def _overflowing_table(data: bytes, nth: int) -> bytes:
    """The file with its `nth` Huffman table's counts moved so that two codes are one bit long (the code space
    overflows) and the table's size is unchanged: libjpeg refuses the table."""
    b, pos = bytearray(data), -1
    for _ in range(nth + 1):
        pos = b.find(b"\xff\xc4", pos + 1)
    counts = pos + 5  # marker, length, class/id; counts[0] is a 1-bit code's
    donor = next(i for i in range(1, 16) if b[counts + i] >= 2 - b[counts])
    b[counts + donor] -= 2 - b[counts]
    b[counts] = 2
    return bytes(b)


@pytest.mark.parametrize("nth", [0, 1, 2, 3])
def test_a_table_whose_codes_overflow_is_libjpegs_to_refuse(nth):
    data = _overflowing_table(_encode(64, 48, quality=90), nth)
    assert check([data], "walk") == [NOT_PROVEN]
    verdict = check([data], "default")
    assert verdict == check([data], "libjpeg") and "Huffman" in verdict[0]


def _without_quantisation_tables(data: bytes) -> bytes:
    out, pos = bytearray(data[:2]), 2
    while data[pos + 1] != 0xDA:
        (length,) = struct.unpack_from(">H", data, pos + 2)
        if data[pos + 1] != 0xDB:
            out += data[pos:pos + 2 + length]
        pos += 2 + length
    return bytes(out + data[pos:])


def _quantisation_table_number(data: bytes, component: int, number: int) -> bytes:
    b = bytearray(data)
    sof = b.find(b"\xff\xc0")
    b[sof + 10 + 3 * component + 2] = number  # after marker, length, precision, height, width, count: id, hv, table
    return bytes(b)


@pytest.mark.parametrize("damage", ["no DQT", "table 3", "table 255"])
def test_a_component_without_its_quantisation_table_is_libjpegs_to_refuse(damage):
    """Found by an adversarial run: the walk reads no quantisation table, libjpeg refuses a component whose table
    was never defined when the scan starts; the walk must leave such a file to it."""
    data = _encode(64, 48, quality=90)
    data = (_without_quantisation_tables(data) if damage == "no DQT"
            else _quantisation_table_number(data, 2, int(damage.split()[1])))
    assert check([data], "walk") == [NOT_PROVEN]
    verdict = check([data], "default")
    assert verdict == check([data], "libjpeg") and "Quantization table" in verdict[0]


def _scan_bounds(data: bytes) -> tuple[int, int]:
    """(first byte of the entropy-coded data, position of the final EOI)."""
    sos = data.find(b"\xff\xda")
    (length,) = struct.unpack_from(">H", data, sos + 2)
    return sos + 2 + length, data.rindex(b"\xff\xd9")


def _mutants(data: bytes, rng: random.Random, n: int) -> list[bytes]:
    start, eoi = _scan_bounds(data)
    rsts = [i for i in range(start, eoi - 1) if data[i] == 0xFF and 0xD0 <= data[i + 1] <= 0xD7]
    out = []
    for _ in range(n):
        b = bytearray(data)
        kind = rng.randrange(12)
        pos = rng.randrange(start, max(start + 1, eoi))
        if kind == 0:  # one bit of the entropy-coded data
            b[pos] ^= 1 << rng.randrange(8)
        elif kind == 1:  # cut inside the scan, with and without an EOI after the cut
            b = b[:pos] + (b"\xff\xd9" if rng.random() < 0.7 else b"")
        elif kind == 2:  # bytes inserted, deleted
            b[pos:pos] = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 4)))
        elif kind == 3:
            del b[pos:pos + rng.randrange(1, 4)]
        elif kind == 4:  # stuffing and markers where data was
            b[pos:pos] = rng.choice([b"\xff\x00", b"\xff\xff\x00", b"\xff\xff", b"\xff\xd9", b"\xff\xd0",
                                     bytes([0xFF, 0xD0 + rng.randrange(8)]), b"\xff\xc4", b"\xff"])
        elif kind == 5 and rsts:  # a restart marker renumbered, dropped or doubled
            r = rng.choice(rsts)
            choice = rng.randrange(3)
            if choice == 0:
                b[r + 1] = 0xD0 + rng.randrange(8)
            elif choice == 1:
                del b[r:r + 2]
            else:
                b[r:r] = bytes(b[r:r + 2])
        elif kind == 6:  # junk between the last MCU and EOI (libjpeg: extraneous bytes, benign)
            b[eoi:eoi] = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 6)))
        elif kind == 7:  # the frame's size a little off
            sof = max(data.find(b"\xff\xc0"), data.find(b"\xff\xc1"))
            field = sof + rng.choice([5, 7])
            (v,) = struct.unpack_from(">H", b, field)
            struct.pack_into(">H", b, field, max(0, min(65535, v + rng.randrange(-17, 18))))
        elif kind == 8:  # a Huffman table's counts or symbols
            dht = data.find(b"\xff\xc4")
            (length,) = struct.unpack_from(">H", data, dht + 2)
            b[dht + 4 + rng.randrange(1, length - 2)] = rng.randrange(256)
        elif kind == 9:  # sampling factors, table selectors, the scan's spectral fields
            sof = max(data.find(b"\xff\xc0"), data.find(b"\xff\xc1"))
            sos = data.find(b"\xff\xda")
            field = rng.choice([sof + 11, sof + 12, sof + 14, sof + 15, sos + 6, sos + 7, start - 3, start - 2,
                                start - 1])
            b[field] = rng.randrange(256)
        elif kind == 10:  # the restart interval
            dri = data.find(b"\xff\xdd")
            if dri >= 0:
                struct.pack_into(">H", b, dri + 4, rng.randrange(0, 12))
            else:
                sos = data.find(b"\xff\xda")
                b[sos:sos] = b"\xff\xdd\x00\x04" + struct.pack(">H", rng.randrange(1, 6))
        else:  # a byte past the EOI, and a missing one
            b = b[:eoi] + (b"\xff\xd9\x00" if rng.random() < 0.5 else b"\xff")
        out.append(bytes(b))
    return out


def test_on_damaged_files_the_check_answers_as_libjpeg_alone(baselines):
    rng = random.Random(0)
    files = [m for name, data in baselines.items() if min(Image.open(io.BytesIO(data)).size) >= 7
             for m in _mutants(data, rng, 120)]
    walked, alone, default = check(files, "walk"), check(files, "libjpeg"), check(files, "default")
    wrongly_proven = [i for i, (w, a) in enumerate(zip(walked, alone)) if w is None and a is not None]
    assert wrongly_proven == [], [alone[i] for i in wrongly_proven[:5]]
    assert default == alone
    # the damage reaches both sides: some files libjpeg fails, some the walk still proves
    assert sum(a is not None for a in alone) > len(files) // 10
    assert sum(w is None for w in walked) > len(files) // 10


def test_the_odd_corpus_gets_libjpegs_answers(tmp_path):
    data = [Path(c.path).read_bytes() for c in build_corpus(str(tmp_path / "odd"))]
    jpegs = [d for d in data if d[:2] == b"\xff\xd8"]
    assert len(jpegs) >= 20
    assert check(jpegs, "default") == check(jpegs, "libjpeg")
