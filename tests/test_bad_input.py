"""Every kind of bad input is rejected with a reason in rejected.jsonl (never a crash, never a silent drop), and
every odd-but-valid input is packed."""
from __future__ import annotations

import io
import json
import os
import struct

import numpy as np
import pytest
from PIL import Image
from skimage import data as skdata

import fastfeed
from fastfeed.cli import main as cli
from fastfeed.pack import PackOptions, pack


def _jpeg(img: np.ndarray, mode: str = "RGB", **kw) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(img).convert(mode).save(buf, format="JPEG", quality=85, **kw)
    return buf.getvalue()


def _png(im: Image.Image) -> bytes:
    buf = io.BytesIO()
    im.save(buf, format="PNG")
    return buf.getvalue()


def _bomb(jpeg_bytes: bytes) -> bytes:
    """A real JPEG whose frame header claims 60000x60000 pixels."""
    b = bytearray(jpeg_bytes)
    i = b.index(b"\xff\xc0")
    struct.pack_into(">HH", b, i + 5, 60000, 60000)
    return bytes(b)


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    root = tmp_path_factory.mktemp("bad") / "src"
    a, b = root / "a_class", root / "b_class"
    a.mkdir(parents=True)
    b.mkdir()
    astro = skdata.astronaut()[::2, ::2]
    coffee = skdata.coffee()[::2, ::2]
    good = _jpeg(astro)
    w = lambda p, d: p.write_bytes(d)  # noqa: E731
    # --- accepted ---
    w(a / "good.jpg", good)
    w(a / "same_name.jpg", _jpeg(coffee))
    w(b / "same_name.jpg", _jpeg(astro[:, ::-1]))  # duplicate basename in another class
    w(a / "grey.jpg", _jpeg(astro, "L"))
    w(a / "cmyk.jpg", _jpeg(astro, "CMYK"))
    w(a / "progressive.jpg", _jpeg(coffee, progressive=True))
    w(b / "palette.png", _png(Image.fromarray(coffee).convert("P")))
    w(b / "rgba.png", _png(Image.fromarray(astro).convert("RGBA")))
    w(b / "sixteen_bit.png", _png(Image.fromarray((skdata.camera().astype(np.uint16) * 257))))
    w(b / "猫 ünïcødé é.jpg", _jpeg(coffee[::2, ::2]))
    os.symlink(a / "good.jpg", b / "link_to_good.jpg")
    bad_utf8 = os.path.join(os.fsencode(b), b"latin1_\xe9t\xe9.jpg")
    with open(bad_utf8, "wb") as f:
        f.write(_jpeg(astro[::3, ::3]))
    # --- rejected ---
    w(a / "empty.jpg", b"")
    w(a / "truncated.jpg", good[: len(good) // 2])
    w(a / "truncated.png", _png(Image.fromarray(coffee))[:-200])
    w(a / "notes.jpg", b"this is a text file with a .jpg name\n" * 20)
    w(a / "anim.gif", _gif(coffee))
    w(a / "bomb.jpg", _bomb(good))
    w(a / "garbage_header.jpg", b"\xff\xd8\xff\xe0\x00\x10JFIF\x00" + bytes(range(256)) * 4 + b"\xff\xd9")
    os.symlink(root / "nowhere.jpg", a / "broken_link.jpg")
    os.symlink(a / "loop2.jpg", a / "loop1.jpg")
    os.symlink(a / "loop1.jpg", a / "loop2.jpg")
    os.symlink(b, b / "dir_loop")  # a folder symlink back to its own ancestor
    os.mkfifo(a / "fifo.jpg")
    w(a / "no_read.jpg", good)
    os.chmod(a / "no_read.jpg", 0)
    w(root / "stray_top_level.jpg", good)
    return root


REJECTED = {
    "a_class/empty.jpg": "empty file",
    "a_class/truncated.jpg": "truncated JPEG",
    "a_class/truncated.png": "truncated PNG",
    "a_class/notes.jpg": "not an image",
    "a_class/bomb.jpg": "decompression bomb",
    "a_class/garbage_header.jpg": "bad image header",
    "a_class/broken_link.jpg": "broken symlink",
    "a_class/loop1.jpg": "symlink loop",
    "a_class/loop2.jpg": "symlink loop",
    "b_class/dir_loop": "symlink loop",
    "a_class/fifo.jpg": "not a regular file",
    "stray_top_level.jpg": "not inside a class folder",
}
ACCEPTED = {"a_class/good.jpg", "a_class/same_name.jpg", "b_class/same_name.jpg", "a_class/grey.jpg",
            "a_class/cmyk.jpg", "a_class/progressive.jpg", "b_class/palette.png", "b_class/rgba.png",
            "b_class/sixteen_bit.png", "b_class/猫 ünïcødé é.jpg", "b_class/link_to_good.jpg",
            os.fsdecode(b"b_class/latin1_\xe9t\xe9.jpg"), "a_class/anim.gif"}
# Stored as they are, `pil_only`: only the decode contract's PIL decode reads them as the contract says
# (docs/decode-contract.md), and the Loader routes them there.
PIL_ONLY = {"a_class/cmyk.jpg", "b_class/rgba.png", "b_class/sixteen_bit.png", "a_class/anim.gif"}


def _pixels(data: bytes) -> np.ndarray:
    with Image.open(io.BytesIO(data)) as im:
        return np.asarray(im)


def _gif(img: np.ndarray) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(img).save(buf, format="GIF")
    return buf.getvalue()


@pytest.mark.parametrize("fmt,jpeg_mode", [("wds", "keep"), ("lmdb", "keep"), ("wds", None), ("lmdb", None)])
def test_bad_inputs_are_reported_and_good_ones_packed(tree, tmp_path, fmt, jpeg_mode):
    out = tmp_path / "out"
    res = pack(str(tree), str(out), PackOptions(format=fmt, workers=2, jpeg_mode=jpeg_mode))
    transcoding = res.manifest.options["jpeg_mode"] == "baseline"  # the default when built with libjpeg
    with open(out / "rejected.jsonl", encoding="ascii") as f:
        rejected = {os.path.relpath(r["path"], tree): r["reason"] for r in map(json.loads, f)}
    root_can_read = os.geteuid() == 0  # root ignores file permissions: then the file is simply packed
    expected = dict(REJECTED)
    if not root_can_read:
        expected["a_class/no_read.jpg"] = "permission denied"
    assert set(rejected) == set(expected), rejected
    for rel, reason in expected.items():
        assert reason in rejected[rel], (rel, rejected[rel])
    assert res.manifest.rejected == len(expected)
    accepted = ACCEPTED | ({"a_class/no_read.jpg"} if root_can_read else set())
    with fastfeed.open_dataset(out) as ds:
        assert {str(s) for s in ds.sources} == accepted
        assert len(set(ds.keys.tolist())) == len(ds) == len(accepted)
        for i in range(len(ds)):
            with open(os.path.join(os.fsencode(tree), os.fsencode(str(ds.sources[i]))), "rb") as f:
                original = f.read()
            if str(ds.sources[i]) == "a_class/progressive.jpg" and transcoding:
                assert ds.transcoded[i] and ds.read(i) != original
                assert np.array_equal(_pixels(ds.read(i)), _pixels(original))  # lossless
            else:
                assert not ds.transcoded[i] and ds.read(i) == original
            assert bool(ds.pil_only[i]) == (str(ds.sources[i]) in PIL_ONLY)
        mix = ds.manifest.jpeg_mix
        assert mix["not_jpeg"] == 4 and mix["progressive"] == (0 if transcoding else 1)
        assert mix["baseline_not_hw"] == 1  # the CMYK JPEG, which the hardware decoder rejects
        assert ds.manifest.transcoded == int(transcoding) and ds.manifest.pil_only == len(PIL_ONLY)
    assert cli(["verify", str(out)]) == 0  # everything accepted really decodes


def test_strict_turns_rejections_into_exit_1(tree, tmp_path, capsys):
    assert cli(["pack", str(tree), str(tmp_path / "lenient"), "--quiet"]) == 0
    assert cli(["pack", str(tree), str(tmp_path / "strict"), "--strict"]) == 1
    captured = capsys.readouterr()
    assert "rejected" in captured.out and "--strict" in captured.err
    assert (tmp_path / "strict" / "fastfeed.json").exists()  # the dataset is still written


def test_bad_list_rows_are_rejected(tree, tmp_path):
    lst = tmp_path / "list.jsonl"
    lst.write_text("\n".join([
        json.dumps({"path": str(tree / "a_class" / "good.jpg"), "label": 1}),
        "{not json",
        json.dumps({"label": 3}),
        json.dumps({"path": str(tree / "a_class" / "empty.jpg"), "label": 0}),
        json.dumps({"path": str(tree / "a_class" / "missing.jpg"), "label": 0}),
    ]) + "\n", encoding="utf-8")
    res = pack(str(lst), str(tmp_path / "out"), PackOptions())
    reasons = sorted(r["reason"].split(":")[0] for r in res.rejected)
    assert res.manifest.num_samples == 1
    assert reasons == ["bad list row", "bad list row", "empty file (0 bytes)", "file not found"]
