"""`fastfeed pack --jpeg`: the default (baseline when built with libjpeg), the fallback without a transcoder,
corrupt-but-decodable JPEGs kept untouched, and what the manifest / `fastfeed inspect` report."""
from __future__ import annotations

import filecmp
import glob
import io
import json
import os

import numpy as np
import pytest
from PIL import Image
from skimage import data as skdata

import fastfeed
from fastfeed.cli import main as cli
from fastfeed.demo_data import make_dataset
from fastfeed.image import jpeg, transcode
from fastfeed.pack import PackError, PackOptions, pack
from fastfeed.pack.options import NO_TRANSCODER_NOTE, resolve_jpeg_mode

needs_libjpeg = pytest.mark.skipif(not transcode.HAVE_TRANSCODE, reason="fastfeed._native built without libjpeg")


@pytest.fixture(scope="module")
def src(tmp_path_factory):
    root = tmp_path_factory.mktemp("src") / "images"
    make_dataset(root, num_images=16, num_classes=2, seed=5, workers=1, progressive_fraction=0.5)
    return str(root)


def _read(path) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def _pixels(data: bytes) -> np.ndarray:
    with Image.open(io.BytesIO(data)) as im:
        return np.asarray(im)


def test_resolve_jpeg_mode():
    assert resolve_jpeg_mode(None, True) == ("baseline", None)
    assert resolve_jpeg_mode(None, False) == ("keep", NO_TRANSCODER_NOTE)
    assert resolve_jpeg_mode("keep", False) == ("keep", None)
    assert resolve_jpeg_mode("reencode", True) == ("reencode", None)
    for mode in ("baseline", "reencode"):
        with pytest.raises(PackError, match="without libjpeg"):
            resolve_jpeg_mode(mode, False)
    with pytest.raises(PackError, match="--jpeg must be one of"):
        resolve_jpeg_mode("fast", True)


@needs_libjpeg
def test_default_transcodes_progressive_losslessly_and_inspect_reports_it(src, tmp_path, capsys):
    out = str(tmp_path / "out")
    assert cli(["pack", src, out, "--shard-size", "1MB"]) == 0
    assert "transcoded 8" in capsys.readouterr().out
    originals = {os.path.relpath(p, src): _read(p) for p in glob.glob(os.path.join(src, "*", "*.jpg"))}
    with fastfeed.open_dataset(out) as ds:
        m = ds.manifest
        assert m.options["jpeg_mode"] == "baseline" and "jpeg_note" not in m.options
        assert m.jpeg_mix["progressive"] == 0 and m.jpeg_mix["baseline"] == 16 and m.jpeg_mix["baseline_not_hw"] == 0
        assert m.transcoded == 8 and m.extra["jpeg_actions"] == {"transcoded": 8, "transcode_failed": 0}
        for i in range(len(ds)):
            original = originals[str(ds.sources[i])]
            was_progressive = jpeg.probe(original).jpeg_kind == jpeg.KIND_PROGRESSIVE
            assert bool(ds.transcoded[i]) == was_progressive  # samples.npz names the transcoded samples
            if was_progressive:
                assert jpeg.probe(ds.read(i)).hw_decodable
                assert np.array_equal(_pixels(ds.read(i)), _pixels(original))
            else:
                assert ds.read(i) == original
    assert cli(["inspect", out]) == 0
    shown = capsys.readouterr().out
    assert "jpeg mode:   baseline; transcoded 8" in shown and "baseline 16" in shown


@needs_libjpeg
def test_transcoded_output_is_identical_across_worker_counts(src, tmp_path):
    outs = []
    for workers in (1, 2):
        out = tmp_path / f"w{workers}"
        pack(src, str(out), PackOptions(workers=workers, shard_size=1 << 20))
        outs.append(out)
    names = sorted(os.listdir(outs[0]))
    assert any(n.endswith(".tar") for n in names) and names == sorted(os.listdir(outs[1]))
    for n in names:
        if n.endswith((".tar", ".idx")):
            assert filecmp.cmp(outs[0] / n, outs[1] / n, shallow=False), n
    shards = [json.loads((o / "fastfeed.json").read_text())["shards"] for o in outs]
    assert shards[0] == shards[1]


def _corrupt_progressive() -> tuple[bytes, bytes]:
    buf = io.BytesIO()
    Image.fromarray(skdata.astronaut()[:200, :256]).save(buf, "JPEG", progressive=True, quality=85)
    good = buf.getvalue()
    sos = good.index(b"\xff\xda")
    return good, good[: sos + 400] + bytes(300) + good[sos + 700 :]  # zeroed entropy data; EOI intact


@needs_libjpeg
@pytest.mark.parametrize("fmt", ["wds", "lmdb"])
def test_corrupt_jpeg_that_libjpeg_refuses_is_stored_untouched(tmp_path, fmt, capsys):
    good, bad = _corrupt_progressive()
    with pytest.raises(transcode.JpegTranscodeError, match="Corrupt JPEG data"):
        transcode.transcode_to_baseline(bad)
    _pixels(bad)  # ...yet PIL decodes it, as DALI does: dropping it would lose a sample
    root = tmp_path / "src" / "c"
    root.mkdir(parents=True)
    (root / "bad.jpg").write_bytes(bad)
    (root / "good.jpg").write_bytes(good)
    out = tmp_path / "out"
    assert cli(["pack", str(tmp_path / "src"), str(out), "--format", fmt, "--strict"]) == 0
    assert "1 JPEG(s) libjpeg found corrupt were stored untouched" in capsys.readouterr().out
    with fastfeed.open_dataset(str(out)) as ds:
        by_source = {str(s): i for i, s in enumerate(ds.sources)}
        i, j = by_source[os.path.join("c", "bad.jpg")], by_source[os.path.join("c", "good.jpg")]
        assert ds.read(i) == bad and not ds.transcoded[i]
        assert ds.transcoded[j] and np.array_equal(_pixels(ds.read(j)), _pixels(good))
        m = ds.manifest
        assert m.rejected == 0 and m.transcoded == 1 and m.jpeg_mix["progressive"] == 1
        assert m.extra["jpeg_actions"] == {"transcoded": 1, "transcode_failed": 1}
        (failed,) = m.extra["transcode_failed"]
        assert failed["source"] == os.path.join("c", "bad.jpg") and "Corrupt JPEG data" in failed["reason"]
    assert (out / "rejected.jsonl").read_text() == ""
    assert cli(["inspect", str(out)]) == 0
    assert "stored untouched after a failed transcode 1" in capsys.readouterr().out


def test_without_transcoder_default_keeps_bytes_and_explicit_baseline_exits_2(src, tmp_path, monkeypatch, capsys):
    # Stands in for a build without libjpeg headers: the packer reads this flag when a pack starts.
    monkeypatch.setattr(transcode, "HAVE_TRANSCODE", False)
    for mode in ("baseline", "reencode"):
        out = tmp_path / mode
        assert cli(["pack", src, str(out), "--jpeg", mode]) == 2
        assert "without libjpeg" in capsys.readouterr().err
        assert not out.exists()  # refused before touching OUT
    out = tmp_path / "default"
    assert cli(["pack", src, str(out)]) == 0
    printed = capsys.readouterr().out
    assert printed.count(NO_TRANSCODER_NOTE) == 1
    with fastfeed.open_dataset(str(out)) as ds:
        assert ds.manifest.options["jpeg_mode"] == "keep"
        assert ds.manifest.options["jpeg_note"] == NO_TRANSCODER_NOTE
        assert ds.manifest.transcoded == 0 and ds.manifest.jpeg_mix["progressive"] == 8
        for i in range(len(ds)):
            assert ds.read(i) == _read(os.path.join(src, str(ds.sources[i])))
