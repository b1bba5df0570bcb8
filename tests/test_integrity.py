"""Per-sample checksums, the table checksum, reproducible packs, change counts: format version 2's integrity.

Speed of `bad_checksums` is measured in benchmarks/bench_integrity.py, not here.
"""
from __future__ import annotations

import hashlib
import os

import numpy as np
import pytest
import xxhash

import fastfeed
from fastfeed.cli import main as cli
from fastfeed.formats import READERS, DatasetError
from fastfeed.formats.integrity import bad_checksums, checksum
from fastfeed.pack import table as tbl
from fastfeed.pack.base import WRITERS
from fastfeed.types import FORMAT_VERSION


def _tree_digest(root) -> dict[str, str]:
    out = {}
    for dirpath, _, files in os.walk(root):
        for f in files:
            if f == "lock.mdb":  # LMDB's reader table (pids of the writer): runtime state, not data
                continue
            p = os.path.join(dirpath, f)
            with open(p, "rb") as fh:
                out[os.path.relpath(p, root)] = hashlib.sha256(fh.read()).hexdigest()
    return out


@pytest.mark.parametrize("fmt", ["wds", "lmdb"])
def test_table_has_checksums_of_the_stored_bytes(packed, fmt):
    with fastfeed.open_dataset(packed[fmt]) as ds:
        assert ds.manifest.version == FORMAT_VERSION == 2
        assert ds.checksums.dtype == np.uint64 and len(ds.checksums) == len(ds)
        assert ds.orientations.dtype == np.uint8 and (ds.orientations == 1).all()  # the demo JPEGs have no EXIF
        for i in range(len(ds)):
            assert checksum(ds.read(i)) == xxhash.xxh3_64_intdigest(ds.read(i)) == int(ds.checksums[i])
        with open(os.path.join(packed[fmt], "samples.npz"), "rb") as f:
            assert xxhash.xxh3_64_hexdigest(f.read()) == ds.manifest.samples_xxh3
        assert ds.manifest.changes == {} and (ds.changes == "").all()


@pytest.mark.parametrize("fmt", ["wds", "lmdb"])
def test_bad_checksums_finds_exactly_the_damaged_positions(packed, fmt):
    with fastfeed.open_dataset(packed[fmt]) as ds:
        idx = np.array([7, 3, 90, 12, 45])
        ext = ds.extents()
        # the ring's form: uint8 views into one batch buffer
        buf = np.concatenate([np.frombuffer(ds.read(int(i)), dtype=np.uint8) for i in idx])
        ends = np.cumsum(ext.size[idx])
        views = [buf[e - s : e] for e, s in zip(ends.tolist(), ext.size[idx].tolist())]
        assert bad_checksums(ds, idx, views) == []
        assert bad_checksums(ds, idx.tolist(), [ds.read(int(i)) for i in idx]) == []  # bytes, list indices
        views[1] = views[1].copy()
        views[1][len(views[1]) // 2] ^= 1  # one bit
        views[4] = np.empty(0, dtype=np.uint8)  # a failed read
        views[2] = memoryview(ds.read(int(idx[2])))
        assert bad_checksums(ds, idx, views) == [1, 4]
        digests = np.array([xxhash.xxh3_64_intdigest(v) for v in views], dtype=np.uint64)
        assert bad_checksums(ds, idx, views, digests=digests) == [1, 4]
        # the same batch, samples swapped: the checksums belong to the indices, not to the batch
        assert bad_checksums(ds, idx[[1, 0]], [ds.read(7), ds.read(3)]) == [0, 1]


def test_two_packs_of_one_tree_are_byte_identical(demo_tree, tmp_path, pack_cli):
    for fmt in ("wds", "lmdb"):
        a, b = tmp_path / f"{fmt}-a", tmp_path / f"{fmt}-b"
        pack_cli(demo_tree, a, "--format", fmt, "--shard-size", "4MB")
        pack_cli(demo_tree, b, "--format", fmt, "--shard-size", "4MB", "--workers", "1")
        da, db = _tree_digest(a), _tree_digest(b)
        assert "samples.npz" in da and "fastfeed.json" in da
        assert da == db, fmt


@pytest.mark.parametrize("fmt", ["wds", "lmdb"])
def test_merged_parts_carry_checksums_and_verify(demo_tree, tmp_path, pack_cli, packed, fmt):
    from fastfeed.pack import merge

    out = tmp_path / "parts"
    for i in range(2):
        pack_cli(demo_tree, out, "--format", fmt, "--shard-size", "4MB", "--num-parts", "2", "--part", str(i))
    merge(str(out))
    with fastfeed.open_dataset(out) as m, fastfeed.open_dataset(packed[fmt]) as single:
        assert (m.checksums == single.checksums).all() and (m.keys == single.keys).all()
        assert m.manifest.samples_xxh3 and m.manifest.changes == {}
    assert cli(["verify", "--quick", str(out)]) == 0


def test_every_reader_has_a_writer():
    assert set(WRITERS) == set(READERS)
    for kind, w in WRITERS.items():
        assert w.kind == kind


def test_change_codes_are_counted_in_the_manifest_and_shown_by_inspect(tmp_path, capsys):
    """The validator's change code per sample (Loaded.change) becomes the `change` column; the one manifest builder
    counts it. Built here from a real table, as pack and merge build theirs."""
    table = tbl.rows_to_table({**{c: [] for c in tbl.COLUMNS}, "offset": []}, {"offset": np.int64})
    n = 5
    table = {k: np.resize(v, n) if v.size else np.zeros(n, dtype=v.dtype) for k, v in table.items()}
    table["key"] = np.array([f"{i:08d}" for i in range(n)])
    table["width"][:] = table["height"][:] = 10
    table["change"] = np.array(["", "trimmed_trailing_data", "converted_to_png", "trimmed_trailing_data", ""])
    m = tbl.write_dataset(str(tmp_path), "lmdb", table, [], [], classes=[], class_to_idx={}, source="/x",
                          source_kind="flat", options={}, part=None, created_by="test", extra={})
    assert m.changes == {"trimmed_trailing_data": 2, "converted_to_png": 1}
    assert cli(["inspect", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "converted_to_png 1, trimmed_trailing_data 2" in out
    assert tbl.change_counts(None) == {} and tbl.change_counts(np.array(["", ""])) == {}


def test_dataset_error_is_a_value_error_with_path_and_key(packed, copy_dataset):
    root = copy_dataset(packed["wds"])
    os.unlink(root / "samples.npz")
    with pytest.raises(ValueError) as ei:
        fastfeed.open_dataset(root)
    assert isinstance(ei.value, DatasetError) and ei.value.path.endswith("samples.npz") and ei.value.key is None


def test_full_verify_accepts_what_pil_only_warns_about(demo_tree, tmp_path):
    """A JPEG whose EXIF block lies about a tag's length: PIL warns ("Truncated File Read") and decodes it, the
    packer accepts it, so verify must too, even with warnings turned into errors (pytest's config here)."""
    import io
    import shutil
    import struct
    import warnings

    from PIL import Image

    from fastfeed.pack import PackOptions, pack
    from fastfeed.pack.verify import verify

    src = tmp_path / "src" / "a"
    src.mkdir(parents=True)
    for p in sorted((demo_tree / "class_000").iterdir())[:3]:
        shutil.copy(p, src / p.name)
    tiff = b"II*\x00" + struct.pack("<IH", 8, 1) + struct.pack("<HHII", 0x010E, 2, 100, 26) + struct.pack("<I", 0)
    buf = io.BytesIO()
    Image.new("RGB", (48, 64), (200, 30, 30)).save(buf, "JPEG", exif=b"Exif\x00\x00" + tiff)
    (src / "zz_bad_exif.jpg").write_bytes(buf.getvalue())
    with pytest.raises(UserWarning):  # the premise: PIL does warn on it
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            Image.open(io.BytesIO(buf.getvalue())).load()
    res = pack(str(tmp_path / "src"), str(tmp_path / "out"), PackOptions(format="wds", jpeg_mode="keep"))
    assert res.manifest.num_samples == 4
    report = verify(str(tmp_path / "out"), workers=2)
    assert report.ok, report.errors
    assert "full decode" in report.checked
