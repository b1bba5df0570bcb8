"""Readers refuse anything that is not a complete dataset of this format version, with a clear message."""
from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest

import fastfeed
from fastfeed.demo_data import make_dataset
from fastfeed.pack import PackOptions, pack, parse_size
from fastfeed.types import READABLE_VERSIONS, DatasetError


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    root = tmp_path_factory.mktemp("fmt")
    make_dataset(root / "src", num_images=16, num_classes=2, seed=1, workers=1)
    for fmt in ("wds", "lmdb"):
        pack(str(root / "src"), str(root / fmt), PackOptions(format=fmt, shard_size=parse_size("500KB")))
    return root


def _copy(packed, fmt, tmp_path):
    dst = tmp_path / fmt
    shutil.copytree(packed / fmt, dst)
    return dst


@pytest.mark.parametrize("fmt", ["wds", "lmdb"])
def test_reader_interface(packed, fmt):
    with fastfeed.open_dataset(packed / fmt) as ds:
        assert len(ds) == 16 and ds.classes == ["class_000", "class_001"]
        assert ds.labels.dtype == np.int64 and set(ds.labels.tolist()) == {0, 1}
        assert ds.widths.dtype == np.int32 and ds.heights.dtype == np.int32 and (ds.widths >= 300).all()
        assert ds.read(-1) == ds.read(15)
        assert ds.metadata(0) is None
        with pytest.raises(IndexError):
            ds.read(16)
        assert ds.manifest.kind == fmt


@pytest.mark.parametrize("fmt", ["wds", "lmdb"])
def test_refuses_missing_manifest(packed, tmp_path, fmt):
    d = _copy(packed, fmt, tmp_path)
    os.unlink(d / "fastfeed.json")
    with pytest.raises(DatasetError, match="no fastfeed.json"):
        fastfeed.open_dataset(d)


@pytest.mark.parametrize("fmt", ["wds", "lmdb"])
def test_refuses_other_version(packed, tmp_path, fmt):
    d = _copy(packed, fmt, tmp_path)
    m = json.loads((d / "fastfeed.json").read_text())
    m["version"] = max(READABLE_VERSIONS) + 1
    (d / "fastfeed.json").write_text(json.dumps(m))
    with pytest.raises(DatasetError, match="format version"):
        fastfeed.open_dataset(d)


@pytest.mark.parametrize("fmt", ["wds", "lmdb"])
def test_refuses_missing_or_resized_data_file(packed, tmp_path, fmt):
    d = _copy(packed, fmt, tmp_path)
    data = d / ("shard-000001.tar" if fmt == "wds" else "data.lmdb/data.mdb")
    with open(data, "ab") as f:
        f.write(b"\0" * 512)
    with pytest.raises(DatasetError, match="manifest says") as e:
        fastfeed.open_dataset(d)
    assert "restore it" in str(e.value) and "fastfeed verify" not in str(e.value)  # verify refuses it too
    os.unlink(data)
    with pytest.raises(DatasetError, match="missing"):
        fastfeed.open_dataset(d)


def test_refuses_garbage_manifest_and_non_folder(packed, tmp_path):
    d = _copy(packed, "wds", tmp_path)
    (d / "fastfeed.json").write_text("{ nope")
    with pytest.raises(DatasetError, match="not valid JSON"):
        fastfeed.open_dataset(d)
    with pytest.raises(DatasetError, match="not a folder"):
        fastfeed.open_dataset(tmp_path / "absent")


def test_samples_table_has_the_contract_columns(packed):
    with np.load(packed / "wds" / "samples.npz", allow_pickle=False) as z:
        assert z["key"].dtype.kind == "U" and z["label"].dtype == np.int64
        assert z["width"].dtype == np.int32 and z["jpeg"].dtype == np.uint8 and z["transcoded"].dtype == bool
        assert z["shard"].dtype == np.int32 and z["offset"].dtype == np.int64 and z["size"].dtype == np.int64
        # offset/size are the image member's data: the tar header of KEY.jpg sits 512 bytes before it.
        with open(packed / "wds" / "shard-000000.tar", "rb") as f:
            i = int(np.flatnonzero(z["shard"] == 0)[0])
            header = os.pread(f.fileno(), 512, int(z["offset"][i]) - 512)
            assert header.split(b"\0")[0].decode() == f"{z['key'][i]}.jpg"
