"""`fastfeed pack` end to end on real JPEGs: byte-exact round trips, third-party readers, parts, resume."""
from __future__ import annotations

import gc
import glob
import json
import os
import signal
import subprocess
import sys
import time
import warnings

import numpy as np
import pytest
from PIL import Image

import fastfeed
from fastfeed.cli import main as cli
from fastfeed.demo_data import make_dataset
from fastfeed.pack import PackOptions, merge, pack, parse_size
from fastfeed.types import DatasetError


@pytest.fixture(scope="module")
def src(tmp_path_factory):
    root = tmp_path_factory.mktemp("src") / "images"
    make_dataset(root, num_images=48, num_classes=4, seed=3, workers=1)
    return str(root)


def _bytes(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def _originals(root: str) -> dict[str, bytes]:
    out = {}
    for p in glob.glob(os.path.join(root, "*", "*")):
        with open(p, "rb") as f:
            out[os.path.relpath(p, root)] = f.read()
    return out


def _check_round_trip(out: str, src_root: str) -> None:
    originals = _originals(src_root)
    from torchvision.datasets import ImageFolder

    class_to_idx = ImageFolder(src_root).class_to_idx
    with fastfeed.open_dataset(out) as ds:
        assert len(ds) == len(originals)
        assert ds.manifest.class_to_idx == class_to_idx
        assert ds.classes == sorted(class_to_idx)
        assert len(set(ds.keys.tolist())) == len(ds)
        seen = set()
        for i in range(len(ds)):
            rel = str(ds.sources[i])
            data = ds.read(i)
            assert data == originals[rel]  # byte-exact
            assert ds.labels[i] == class_to_idx[rel.split(os.sep)[0]]
            with Image.open(os.path.join(src_root, rel)) as im:
                assert (int(ds.widths[i]), int(ds.heights[i])) == im.size
            seen.add(rel)
        assert seen == set(originals)
        # Sequential iteration yields the same samples in the same order.
        samples = list(ds)
        assert [s.key for s in samples] == ds.keys.tolist()
        assert all(s.data == ds.read(i) and s.label == ds.labels[i] for i, s in enumerate(samples))
        # Extents: exactly the image bytes, where the native ring will pread them.
        ext = ds.extents()
        assert ext.file_index.dtype == np.int32 and ext.offset.dtype == np.int64 and ext.size.dtype == np.int64
        for i in range(len(ds)):
            with open(ext.paths[ext.file_index[i]], "rb") as f:
                assert os.pread(f.fileno(), int(ext.size[i]), int(ext.offset[i])) == ds.read(i)
        assert ds.labels.dtype == np.int64 and ds.widths.dtype == np.int32


@pytest.mark.parametrize("fmt", ["wds", "lmdb"])
def test_round_trip_is_byte_exact(src, tmp_path, fmt):
    out = str(tmp_path / "out")
    res = pack(src, out, PackOptions(format=fmt, shard_size=parse_size("1MB"), workers=2))
    m = res.manifest
    assert m.num_samples == 48 and m.rejected == 0
    assert m.source == os.path.abspath(src) and m.source_kind == "imagefolder"
    assert m.jpeg_mix["baseline"] + m.jpeg_mix["progressive"] == 48
    if fmt == "wds":
        assert len(m.shards) > 3 and sum(s.num_samples for s in m.shards) == 48
    assert not os.path.exists(os.path.join(out, ".fastfeed-pack"))
    _check_round_trip(out, src)


def test_pack_shuffles_classes_across_shards(src, tmp_path):
    out = str(tmp_path / "out")
    pack(src, out, PackOptions(shard_size=parse_size("1MB")))
    with fastfeed.open_dataset(out) as ds:
        first = ds.labels[: len(ds) // 4]
        assert len(set(first.tolist())) > 1  # sorted order would put one class first
    out2 = str(tmp_path / "sorted")
    pack(src, out2, PackOptions(shuffle_seed=None))
    with fastfeed.open_dataset(out2) as ds:
        assert np.all(np.diff(ds.labels) >= 0)


def test_webdataset_library_reads_our_shards(src, tmp_path):
    import webdataset as wds

    out = str(tmp_path / "out")
    pack(src, out, PackOptions(shard_size=parse_size("1MB")))
    with fastfeed.open_dataset(out) as ds:
        expected = {str(k): (ds.read(i), int(ds.labels[i])) for i, k in enumerate(ds.keys)}
        tars = [os.path.join(out, s.path) for s in ds.manifest.shards]
    got = {}
    with warnings.catch_warnings():
        # webdataset leaves its last shard's file to the garbage collector (its ResourceWarning, not ours).
        warnings.simplefilter("ignore", ResourceWarning)
        for sample in wds.WebDataset(tars, shardshuffle=False):
            got[sample["__key__"]] = (sample["jpg"], int(sample["cls"]))
        gc.collect()
    assert got == expected


def test_dali_index_is_what_wds2idx_writes(src, tmp_path):
    wds2idx = pytest.importorskip("wds2idx")
    out = str(tmp_path / "out")
    m = pack(src, out, PackOptions(shard_size=parse_size("1MB"))).manifest
    for shard in m.shards:
        ours = os.path.join(out, shard.path[:-4] + ".idx")
        theirs = str(tmp_path / "theirs.idx")
        with wds2idx.IndexCreator(os.path.join(out, shard.path), theirs, verbose=False) as ic:
            ic.create_index()
        with open(ours) as a, open(theirs) as b:
            assert a.read() == b.read()


def test_dali_webdataset_reader_accepts_our_index(src, tmp_path):
    pytest.importorskip("nvidia.dali")
    from nvidia.dali import fn, pipeline_def

    out = str(tmp_path / "out")
    m = pack(src, out, PackOptions(shard_size=parse_size("1MB"))).manifest
    tars = [os.path.join(out, s.path) for s in m.shards]

    @pipeline_def(batch_size=16, num_threads=1, device_id=None)
    def pipe():
        img, cls = fn.readers.webdataset(paths=tars, index_paths=[t[:-4] + ".idx" for t in tars],
                                         ext=["jpg", "cls"], random_shuffle=False, name="r")
        return img, cls

    p = pipe()
    p.build()
    images, labels = [], []
    for _ in range(3):
        a, b = p.run()
        images += [bytes(np.array(a.at(j))) for j in range(len(a))]
        labels += [int(bytes(np.array(b.at(j)))) for j in range(len(b))]
    with fastfeed.open_dataset(out) as ds:
        assert images == [ds.read(i) for i in range(48)]
        assert labels == ds.labels.tolist()


def test_plain_lmdb_reads_our_output(src, tmp_path):
    import lmdb

    out = str(tmp_path / "out")
    pack(src, out, PackOptions(format="lmdb"))
    with fastfeed.open_dataset(out) as ds:
        expected = {str(k): (ds.read(i), int(ds.labels[i])) for i, k in enumerate(ds.keys)}
    env = lmdb.open(os.path.join(out, "data.lmdb"), readonly=True, lock=False)
    with env.begin() as txn:
        for key, (data, label) in expected.items():
            assert txn.get(f"img/{key}".encode()) == data
            assert int(txn.get(f"cls/{key}".encode())) == label
        assert txn.stat()["entries"] == 2 * len(expected)
    env.close()


@pytest.mark.parametrize("fmt", ["wds", "lmdb"])
@pytest.mark.parametrize("kind", ["csv", "jsonl"])
def test_list_source_with_metadata(src, tmp_path, fmt, kind):
    files = sorted(glob.glob(os.path.join(src, "*", "*.jpg")))[:10]
    rows = [(f, ["cat", "dog"][i % 2], {"i": i, "caption": f"photo ü {i}"} if i % 3 else None)
            for i, f in enumerate(files)]
    lst = tmp_path / f"list.{kind}"
    if kind == "csv":
        import csv

        with open(lst, "w", newline="", encoding="utf-8") as f:
            w = csv.writer(f)
            w.writerow(["path", "label", "metadata"])
            for p, lab, meta in rows:
                w.writerow([os.path.relpath(p, tmp_path), lab, json.dumps(meta) if meta else ""])
    else:
        with open(lst, "w", encoding="utf-8") as f:
            for p, lab, meta in rows:
                f.write(json.dumps({"path": p, "label": lab, "metadata": meta}) + "\n")
    out = str(tmp_path / "out")
    pack(str(lst), out, PackOptions(format=fmt, shuffle_seed=None))
    with fastfeed.open_dataset(out) as ds:
        assert ds.classes == ["cat", "dog"] and ds.manifest.source_kind == "list"
        for i, (p, lab, meta) in enumerate(rows):
            assert ds.read(i) == _bytes(p)
            assert ds.labels[i] == ["cat", "dog"].index(lab)
            assert ds.metadata(i) == meta
        assert [s.metadata for s in ds] == [r[2] for r in rows]


def test_flat_folder_is_unlabelled(src, tmp_path):
    flat = tmp_path / "flat"
    flat.mkdir()
    for p in sorted(glob.glob(os.path.join(src, "class_000", "*.jpg"))):
        os.symlink(p, flat / os.path.basename(p))
    out = str(tmp_path / "out")
    m = pack(str(flat), out, PackOptions()).manifest
    assert m.source_kind == "flat" and m.classes == [] and m.num_samples == 12
    with fastfeed.open_dataset(out) as ds:
        assert (ds.labels == -1).all()


@pytest.mark.parametrize("fmt", ["wds", "lmdb"])
def test_num_parts_then_merge_equals_single_pack(src, tmp_path, fmt):
    single = str(tmp_path / "single")
    pack(src, single, PackOptions(format=fmt, shard_size=parse_size("1MB")))
    out = str(tmp_path / "parts")
    for i in (2, 0, 1):  # any order, as a job array would run them
        pack(src, out, PackOptions(format=fmt, shard_size=parse_size("1MB"), num_parts=3, part=i))
    with pytest.raises(DatasetError, match="merge"):
        fastfeed.open_dataset(out)
    m = merge(out)
    assert m.num_samples == 48 and m.part is None
    with fastfeed.open_dataset(single) as a, fastfeed.open_dataset(out) as b:
        assert a.keys.tolist() == b.keys.tolist()
        assert a.labels.tolist() == b.labels.tolist()
        assert [a.read(i) for i in range(48)] == [b.read(i) for i in range(48)]
        assert [s.data for s in b] == [s.data for s in a]
        assert a.manifest.jpeg_mix == b.manifest.jpeg_mix and a.manifest.classes == b.manifest.classes
    assert cli(["verify", out]) == 0


def test_merge_refuses_missing_part(src, tmp_path):
    out = str(tmp_path / "parts")
    pack(src, out, PackOptions(num_parts=3, part=0))
    pack(src, out, PackOptions(num_parts=3, part=2))
    with pytest.raises(RuntimeError, match=r"parts \[1\] of 3"):
        merge(out)


def _pack_cmd(src: str, out: str, *extra: str) -> list[str]:
    # --max-side re-encodes every image: slow enough (~10 ms/image on one thread) to be killed mid-pack.
    return [sys.executable, "-m", "fastfeed.cli", "pack", src, out, "--shard-size", "40KB", "--max-side", "200",
            "--workers", "1", "--quiet", *extra]


@pytest.mark.integration
@pytest.mark.parametrize("fmt", ["wds", "lmdb"])
def test_sigkill_mid_pack_then_resume(src, tmp_path, fmt):
    out = str(tmp_path / "out")
    journal = os.path.join(out, ".fastfeed-pack", "journal.jsonl")
    proc = subprocess.Popen(_pack_cmd(src, out, "--format", fmt))
    lines_needed = 3 if fmt == "wds" else 1
    deadline = time.monotonic() + 60
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            if os.path.exists(journal) and _bytes(journal).count(b"\n") >= lines_needed:
                break
            time.sleep(0.005)
        assert proc.poll() is None, "the pack finished before it could be killed"
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.wait()
    assert proc.returncode == -signal.SIGKILL
    assert not os.path.exists(os.path.join(out, "fastfeed.json"))
    with pytest.raises(DatasetError, match="--resume"):
        fastfeed.open_dataset(out)
    assert subprocess.run(_pack_cmd(src, out, "--format", fmt), capture_output=True).returncode == 2
    assert subprocess.run(_pack_cmd(src, out, "--format", fmt, "--resume")).returncode == 0
    ref = str(tmp_path / "ref")
    assert subprocess.run(_pack_cmd(src, ref, "--format", fmt)).returncode == 0
    with fastfeed.open_dataset(out) as a, fastfeed.open_dataset(ref) as b:
        assert len(a) == len(b) == 48
        assert a.keys.tolist() == b.keys.tolist()
        assert [a.read(i) for i in range(48)] == [b.read(i) for i in range(48)]
        assert a.manifest.transcoded == 48
        if fmt == "wds":  # shards are reproducible, so resumed shards are the very same files
            assert [s.sha256 for s in a.manifest.shards] == [s.sha256 for s in b.manifest.shards]
    assert cli(["verify", out]) == 0


def test_max_side_reencodes_large_images(src, tmp_path):
    out = str(tmp_path / "out")
    m = pack(src, out, PackOptions(max_side=256, quality=80)).manifest
    assert m.transcoded == 48 and m.image_stats["width"]["max"] <= 256 and m.image_stats["height"]["max"] <= 256
    assert cli(["verify", out]) == 0


def test_cli_refuses_to_clobber_and_overwrites_only_its_files(src, tmp_path, capsys):
    out = tmp_path / "out"
    assert cli(["pack", src, str(out), "--quiet"]) == 0
    assert cli(["pack", src, str(out), "--quiet"]) == 2
    assert "--overwrite" in capsys.readouterr().err
    assert cli(["pack", src, str(out), "--overwrite"]) == 0
    assert "packed 48 files" in capsys.readouterr().out
    (out / "precious.txt").write_text("mine")
    assert cli(["pack", src, str(out), "--overwrite", "--quiet"]) == 2
    assert (out / "precious.txt").read_text() == "mine"
    assert cli(["inspect", str(out / "..")]) == 2
    assert cli(["inspect", str(out)]) == 0
    assert "samples:     48" in capsys.readouterr().out


def test_verify_names_the_corrupt_sample(src, tmp_path, capsys):
    out = str(tmp_path / "out")
    pack(src, out, PackOptions(shard_size=parse_size("1MB")))
    with fastfeed.open_dataset(out) as ds:
        ext = ds.extents()
        key = str(ds.keys[5])
        path, off, size = ext.paths[ext.file_index[5]], int(ext.offset[5]), int(ext.size[5])
    with open(path, "r+b") as f:  # scribble over the middle of one image's entropy-coded data
        f.seek(off + size // 3)
        f.write(b"\xff\xd9" + bytes(range(256)) * 8)
    assert cli(["verify", out]) == 1
    err = capsys.readouterr().err
    assert "sha256" in err and f"key {key}" in err


def test_parse_size():
    assert parse_size("64MB") == 64_000_000
    assert parse_size("1GiB") == 1 << 30
    assert parse_size("512K") == 512 << 10
    assert parse_size("1000") == 1000
    for bad in ("", "MB", "-1MB", "12XB"):
        with pytest.raises(ValueError):
            parse_size(bad)


def test_a_list_whose_labels_are_ids_is_refused(src, tmp_path):
    """Integer labels are class indices: the manifest names every class up to the largest, so a list labelling with
    ids (a species or product id) is refused by its largest label, not made into a list of millions of classes."""
    from fastfeed.constants import MAX_CLASSES

    files = sorted(glob.glob(os.path.join(src, "*", "*.jpg")))[:3]
    lst = tmp_path / "list.jsonl"
    lst.write_text("".join(json.dumps({"path": f, "label": lab}) + "\n"
                           for f, lab in zip(files, [0, MAX_CLASSES, 5])))
    with pytest.raises(ValueError, match=f"label {MAX_CLASSES} is past the 1,000,000 classes"):
        pack(str(lst), str(tmp_path / "out"), PackOptions(shuffle_seed=None))
    lst.write_text("".join(json.dumps({"path": f, "label": lab}) + "\n" for f, lab in zip(files, [0, 7, 5])))
    pack(str(lst), str(tmp_path / "ok"), PackOptions(shuffle_seed=None))
    with fastfeed.open_dataset(str(tmp_path / "ok")) as ds:
        assert len(ds.classes) == 8
