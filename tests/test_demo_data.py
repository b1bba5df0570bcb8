"""The demo data generator: real JPEGs on disk, checked by decoding them."""
from __future__ import annotations

import functools
import io
import json
import os
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from fastfeed.commands import demo_data as command
from fastfeed.demo_data import MARKER_NAME, dataset_present, image_path, make_dataset

N = 120


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.glob("class_*/img_*.jpg"))}


def _is_progressive(path_or_bytes) -> bool:
    src = io.BytesIO(path_or_bytes) if isinstance(path_or_bytes, bytes) else path_or_bytes
    with Image.open(src) as img:
        return bool(img.info.get("progressive"))


@functools.cache
def _reference_tables() -> dict[str, int]:
    """libjpeg's quantisation tables at every quality, found by encoding a tiny image at each."""
    refs = {}
    for q in range(1, 101):
        buf = io.BytesIO()
        Image.new("RGB", (8, 8)).save(buf, "JPEG", quality=q)
        with Image.open(buf) as ref:
            refs.setdefault(repr(sorted((k, list(v)) for k, v in ref.quantization.items())), q)
    return refs


def _quality_of(img: Image.Image) -> int | None:
    return _reference_tables().get(repr(sorted((k, list(v)) for k, v in img.quantization.items())))


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> Path:
    return make_dataset(tmp_path_factory.mktemp("demo") / "ds", num_images=N, num_classes=7, seed=3, workers=1,
                        progressive_fraction=0.25)


def test_class_layout(dataset):
    dirs = sorted(p.name for p in dataset.iterdir() if p.is_dir())
    assert dirs == [f"class_{c:03d}" for c in range(7)]
    for i in range(N):
        assert image_path(dataset, i, 7).is_file()
    counts = [len(list((dataset / d).iterdir())) for d in dirs]
    assert sum(counts) == N and max(counts) - min(counts) <= 1
    assert not list(dataset.rglob("*.tmp"))


def test_sizes_aspect_quality(dataset):
    qualities, sizes = [], []
    for path in dataset.glob("class_*/*.jpg"):
        with Image.open(path) as img:
            assert img.format == "JPEG" and img.mode == "RGB"
            w, h = img.size
            assert 300 <= min(w, h) <= 600
            assert 3 / 4 - 1e-9 <= w / h <= 4 / 3 + 1e-9
            q = _quality_of(img)
            assert q is not None and 75 <= q <= 95, (path, q)
            qualities.append(q)
        sizes.append(path.stat().st_size)
    assert len(set(qualities)) > 5  # the quality really varies
    assert 90e3 <= np.mean(sizes) <= 145e3, np.mean(sizes)


def test_content_is_photographic_not_flat_or_noise(dataset):
    for i in range(0, N, 10):
        with Image.open(image_path(dataset, i, 7)) as img:
            px = np.asarray(img.convert("L"), dtype=np.float64)
        assert px.std() > 12  # not a flat colour
        # Neighbouring pixels of a photo are strongly correlated; of white noise, not at all.
        a, b = px[:, :-1].ravel(), px[:, 1:].ravel()
        assert np.corrcoef(a, b)[0, 1] > 0.6


def test_progressive_fraction(dataset, tmp_path):
    progressive = [_is_progressive(p) for p in dataset.glob("class_*/*.jpg")]
    assert sum(progressive) == round(0.25 * N)
    none = make_dataset(tmp_path / "base", num_images=20, num_classes=2, seed=3, workers=1)
    assert not any(_is_progressive(p) for p in none.glob("class_*/*.jpg"))
    every = make_dataset(tmp_path / "prog", num_images=20, num_classes=2, seed=3, workers=1, progressive_fraction=1)
    assert all(_is_progressive(p) for p in every.glob("class_*/*.jpg"))


@pytest.mark.integration  # spawned worker processes
def test_deterministic_across_worker_counts(dataset, tmp_path):
    again = make_dataset(tmp_path / "again", num_images=N, num_classes=7, seed=3, workers=2,
                         progressive_fraction=0.25)
    assert _files(again) == _files(dataset)
    other = make_dataset(tmp_path / "other", num_images=N, num_classes=7, seed=4, workers=1,
                         progressive_fraction=0.25)
    a, b = _files(other), _files(dataset)
    assert sum(a[k] == b[k] for k in a) == 0


def test_prefix_is_stable(dataset, tmp_path):
    """Image i depends only on (seed, i): a smaller dataset is a prefix of a bigger one."""
    small = make_dataset(tmp_path / "small", num_images=30, num_classes=7, seed=3, workers=1,
                         progressive_fraction=0.0)
    full = _files(dataset)
    progressive = {k for k in full if _is_progressive(full[k])}
    same = [k for k, v in _files(small).items() if k not in progressive]
    assert same and all(_files(small)[k] == full[k] for k in same)


def test_idempotent_and_regenerates(tmp_path):
    out = tmp_path / "ds"
    make_dataset(out, num_images=12, num_classes=3, seed=0, workers=1)
    marker = json.loads((out / MARKER_NAME).read_text())
    assert marker["spec"]["num_images"] == 12
    first = image_path(out, 0, 3)
    os.utime(first, ns=(1, 1))
    make_dataset(out, num_images=12, num_classes=3, seed=0, workers=1)
    assert first.stat().st_mtime_ns == 1  # skipped: nothing rewritten
    assert dataset_present(out, num_images=12, num_classes=3, seed=0)
    assert not dataset_present(out, num_images=12, num_classes=3, seed=1)

    # Different parameters: the old tree is replaced, with no stale files left behind.
    make_dataset(out, num_images=5, num_classes=2, seed=0, workers=1)
    assert sorted(_files(out)) == sorted(str(image_path(Path(), i, 2)) for i in range(5))

    # An interrupted run (a file missing) is completed.
    image_path(out, 4, 2).unlink()
    assert not dataset_present(out, num_images=5, num_classes=2, seed=0)
    make_dataset(out, num_images=5, num_classes=2, seed=0, workers=1)
    assert image_path(out, 4, 2).is_file()


def test_refuses_foreign_folder_and_bad_args(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="does not look like a fastfeed demo dataset"):
        make_dataset(tmp_path, num_images=3)
    assert (tmp_path / "notes.txt").read_text() == "mine"
    for bad in (dict(num_images=0), dict(num_classes=0), dict(seed=-1), dict(workers=0),
                dict(progressive_fraction=1.5)):
        with pytest.raises(ValueError):
            make_dataset(tmp_path / "x", **{"num_images": 3, **bad})


def test_command(tmp_path, capsys):
    import argparse

    parser = argparse.ArgumentParser()
    command.configure(parser)
    args = parser.parse_args([str(tmp_path / "ds"), "--num-images", "8", "--num-classes", "2", "--workers", "1",
                              "--progressive-fraction", "0.5"])
    assert command.run(args) == 0
    assert "8 images in 2 classes" in capsys.readouterr().out
    assert command.run(args) == 0
    assert "already holds" in capsys.readouterr().out
    bad = parser.parse_args([str(tmp_path / "ds2"), "--num-images", "0"])
    assert command.run(bad) == 2
    assert "num_images" in capsys.readouterr().err
