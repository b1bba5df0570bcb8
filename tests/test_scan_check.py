"""The JPEG scan check (nothing pack accepts may decode differently later): a JPEG whose scans code fewer
pixels than its frame header claims decodes to grey rows in PIL/libjpeg and to other pixels in nvJPEG, so pack
stores it as it is marked `pil_only`, and the Loader decodes it by PIL (torchvision's reading) on every path; a JPEG
PIL cannot read stays rejected; every clean JPEG (the demo data, the odd-image corpus) passes the check and is stored
byte for byte. Real files throughout:
the corpus, demo JPEGs, and truncated-scan JPEGs made by patching the frame header (SOF) of real encodes."""
from __future__ import annotations

import io
import json
import struct
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import fastfeed
from fastfeed.image import jpeg, transcode
from fastfeed.pack.validate import Loaded, LoadOptions, Rejected, check_image, load_image
from odd_images.build import build_corpus, photo
from odd_images.reference import reference_eval

pytestmark = [pytest.mark.filterwarnings("ignore:Corrupt EXIF data:UserWarning"),
              pytest.mark.skipif(not transcode.HAVE_SCAN_CHECK, reason="native core built without libjpeg")]

S = 48
TOL = 2.0  # /255, mean abs per image: the decode contract's tolerance (tests/test_decode_odd.py)


def _jpeg(seed: int, w: int, h: int, **kw) -> bytes:
    b = io.BytesIO()
    Image.fromarray(photo(w, h, seed=seed)).save(b, "JPEG", quality=90, **kw)
    return b.getvalue()


def _claim_rows(data: bytes, factor: int) -> bytes:
    """The same file with the frame header (SOF0/SOF2) claiming `factor` times the rows its scans hold."""
    b = bytearray(data)
    pos = 2
    while True:
        marker, length = b[pos + 1], struct.unpack_from(">H", b, pos + 2)[0]
        if marker in (0xC0, 0xC2):
            (h,) = struct.unpack_from(">H", b, pos + 5)
            struct.pack_into(">H", b, pos + 5, h * factor)
            return bytes(b)
        pos += 2 + length


def _bad_huffman_table(data: bytes) -> bytes:
    """The first DHT's code counts made to overflow (more codes than 16-bit lengths allow): libjpeg and PIL fail."""
    b = bytearray(data)
    pos = b.find(b"\xff\xc4")
    b[pos + 5: pos + 21] = bytes([255] * 16)
    return bytes(b)


@pytest.fixture(scope="module")
def lies() -> dict[str, bytes]:
    """Truncated-scan JPEGs: baseline 4:2:0, progressive and grey, each claiming 2-3x its rows."""
    grey = io.BytesIO()
    Image.fromarray(photo(96, 64, seed=3)).convert("L").save(grey, "JPEG", quality=85)
    return {"lie_baseline.jpg": _claim_rows(_jpeg(1, 160, 120), 2),
            "lie_progressive.jpg": _claim_rows(_jpeg(2, 128, 96, progressive=True), 3),
            "lie_grey.jpg": _claim_rows(grey.getvalue(), 2)}


def test_check_finds_every_lie_and_passes_the_clean_originals(lies):
    res = transcode.check_scans(list(lies.values()), 2)
    assert all(r is not None and ("premature" in r.lower() or "corrupt" in r.lower()) for r in res), res
    clean = [_jpeg(1, 160, 120), _jpeg(2, 128, 96, progressive=True)]
    assert transcode.check_scans(clean, 2) == [None, None]
    # bytes-like inputs of every kind; an empty list; a bad thread count
    assert transcode.check_scans([memoryview(clean[0]), bytearray(clean[1])]) == [None, None]
    assert transcode.check_scans([]) == []
    with pytest.raises(ValueError):
        transcode.check_scans(clean, -1)


def test_corpus_only_the_header_lie_and_the_short_progressions_fail_among_stored_jpegs(tmp_path):
    """Every JPEG of the corpus that pack stores as a JPEG passes the check but the three it exists for (scans that
    miss rows, or stop short of coding every coefficient): the check changes no other file."""
    cases = build_corpus(str(tmp_path / "odd"))
    found = {"jpeg_header_lie.jpg", "jpeg_progressive_dc_only.jpg", "jpeg_progressive_unrefined.jpg"}
    assert found <= {c.name for c in cases}
    for c in cases:
        data = Path(c.path).read_bytes()
        with_check = load_image(c.path, LoadOptions(jpeg_mode="keep"))
        without = load_image(c.path, LoadOptions(jpeg_mode="keep", scan_check=False))
        if c.name in found:
            assert isinstance(with_check, Loaded) and with_check.pil_only and with_check.change is None
            assert not without.pil_only and without.change is None
            assert bytes(with_check.data) == bytes(without.data) == data
            continue
        # identical outcome with and without the check, for every other file of every kind
        assert type(with_check) is type(without), c.name
        if isinstance(with_check, Loaded):
            assert bytes(with_check.data) == bytes(without.data) and with_check.change == without.change, c.name
            assert with_check.pil_only == without.pil_only, c.name
        else:
            assert with_check.reason == without.reason, c.name


def test_demo_jpegs_all_pass(demo_tree):
    files = sorted(p for p in Path(demo_tree).rglob("*.jpg"))
    assert len(files) >= 50
    assert transcode.check_scans([f.read_bytes() for f in files], 2) == [None] * len(files)


@pytest.mark.parametrize("mode", ["keep", "baseline"])
def test_a_lie_is_stored_as_it_is_for_pil_with_its_orientation(lies, mode):
    opts = LoadOptions(jpeg_mode=mode)
    for name, data in lies.items():
        res = check_image(data, opts)
        assert isinstance(res, Loaded) and res.pil_only and res.ext == "jpg", name
        if res.change is None:
            assert bytes(res.data) == data, name
        else:  # the progressive lie under --jpeg baseline: libjpeg's transcode refuses corrupt data, or keeps it
            assert res.change == "transcoded_baseline", name
        with Image.open(io.BytesIO(data)) as a:
            assert a.size == (res.width, res.height)
    ex = Image.Exif()
    ex[0x0112] = 6
    b = io.BytesIO()
    Image.fromarray(photo(96, 64, seed=5)).save(b, "JPEG", quality=90, exif=ex.tobytes())
    res = check_image(_claim_rows(b.getvalue(), 2), LoadOptions(jpeg_mode=mode))
    assert res.pil_only and res.orientation == 6 and jpeg.exif_orientation(bytes(res.data)) == 6


def test_a_corrupt_jpeg_pil_cannot_read_stays_rejected():
    bad = _bad_huffman_table(_jpeg(4, 96, 64))
    assert transcode.check_scans([bad])[0] is not None
    res = check_image(bad, LoadOptions(jpeg_mode="keep"))
    assert isinstance(res, Rejected) and "corrupt scan data" in res.reason and "PIL cannot decode" in res.reason


@pytest.fixture(scope="module")
def packed_lies(tmp_path_factory, lies, pack_cli):
    """The lies next to clean JPEGs, packed by the native writer (wds) and the Python path (lmdb)."""
    root = tmp_path_factory.mktemp("lies")
    src = root / "src"
    (src / "a").mkdir(parents=True)
    (src / "b").mkdir()
    clean = {f"clean_{i}.jpg": _jpeg(10 + i, 120 + 8 * i, 90) for i in range(4)}
    for name, data in {**lies, **clean}.items():
        ((src / "a") if name.startswith("lie") or name == "clean_0.jpg" else (src / "b")).joinpath(name) \
            .write_bytes(data)
    out = {}
    for fmt in ("wds", "lmdb"):
        out[fmt] = root / fmt
        pack_cli(src, out[fmt], "--format", fmt, "--jpeg", "keep", "--no-shuffle")
    out["wds-unchecked"] = root / "wds-unchecked"
    pack_cli(src, out["wds-unchecked"], "--format", "wds", "--jpeg", "keep", "--no-shuffle", "--no-scan-check")
    return src, out


@pytest.mark.parametrize("fmt", ["wds", "lmdb"])
def test_pack_marks_the_lies_and_stores_every_file_byte_for_byte(packed_lies, lies, fmt):
    src, out = packed_lies
    manifest = json.loads((out[fmt] / "fastfeed.json").read_text())
    assert manifest["pil_only"] == len(lies) and not manifest.get("changes")
    sources = sorted(src.rglob("*.jpg"))
    with fastfeed.open_dataset(out[fmt]) as ds:
        assert len(ds) == len(sources)
        for i, path in enumerate(sources):  # --no-shuffle: the sorted listing's order
            assert ds.read(i) == path.read_bytes(), path.name
            assert bool(ds.pil_only[i]) == path.name.startswith("lie"), path.name
    unchecked = json.loads((out["wds-unchecked"] / "fastfeed.json").read_text())
    assert not unchecked.get("changes") and not unchecked.get("pil_only")
    assert unchecked["options"]["scan_check"] is False


@pytest.mark.parametrize("decoder", ["cpu-pil", "cpu-dali"])
def test_loader_agrees_with_the_reference_on_repaired_files(packed_lies, decoder):
    """Pack + Loader (eval transform) give torchvision's pixels of the lying file on both CPU decoders: DALI's
    hands the lies to PIL."""
    src, out = packed_lies
    sources = sorted(src.rglob("*.jpg"))
    refs = {i: reference_eval(p.read_bytes(), S).astype(np.int16) for i, p in enumerate(sources)}
    with fastfeed.Loader(out["wds"], batch_size=len(sources), train=False, image_size=S, device="cpu",
                         decoder=decoder, dtype=torch.uint8, num_threads=1, drop_last=False, shuffle=False,
                         on_error="raise") as L:
        images, labels = next(iter(L))
    got = images.permute(0, 2, 3, 1).numpy().astype(np.int16)
    for i, p in enumerate(sources):
        diff = float(np.abs(got[i] - refs[i]).mean())
        assert diff < TOL, (p.name, decoder, diff)


def test_native_writer_threads_probe_and_check_each_file(tmp_path, lies):
    """The tar writer's reader threads (4 of them, many small chunks) hand each sample's facts to the check, in
    order: the lie's scan error, '' for a clean JPEG, None for a PNG; the probe never changes what is written."""
    from fastfeed.pack.native import HAVE_NATIVE_WRITER, NativeTarShardWriter, wds_sample

    if not HAVE_NATIVE_WRITER:
        pytest.skip("native core built without the tar writer")
    png = io.BytesIO()
    Image.fromarray(photo(32, 24, seed=9)).save(png, "PNG")
    files = []
    for i in range(40):
        kind = i % 3
        data = (list(lies.values())[i % len(lies)] if kind == 0 else _jpeg(20 + i, 64, 48) if kind == 1
                else png.getvalue())
        p = tmp_path / f"{i:03d}.img"
        p.write_bytes(data)
        files.append((p, kind))
    seen = {}

    def check(i, data, facts):
        seen[i] = facts
        return None

    out = {}
    for probe in (True, False):
        folder = tmp_path / f"probe{probe}"
        folder.mkdir()
        w = NativeTarShardWriter(str(folder), 0, num_threads=4)
        res = w.add_samples([wds_sample(f"{i:03d}", str(p), "jpg", 0) for i, (p, _) in enumerate(files)],
                            check if probe else None, probe=probe, scan_check=probe)
        assert all(r.ok for r in res)
        w.finish()
        out[probe] = (folder / "shard-000000.tar").read_bytes()
    assert out[True] == out[False]
    assert sorted(seen) == list(range(len(files)))
    for i, (_, kind) in enumerate(files):
        if kind == 2:
            assert seen[i] is None
        else:
            marker, sof, jfif, adobe, orientation, ends_with_eoi, scan = seen[i]
            assert marker in (0xC0, 0xC2) and sof[0] == 8 and ends_with_eoi and orientation == 1
            assert (scan != "") if kind == 0 else (scan == ""), (i, scan)
