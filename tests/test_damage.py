"""Damage matrix: datasets packed by the real CLI, then damaged the ways disks, copies and hand edits damage them.

Every damage must end in a `DatasetError` (exactly that type) whose message names the damaged file, and the
sample key when the damage is per sample, at the first place that can notice it:
  open   - `open_dataset` refuses the folder (and `fastfeed verify` exits 2, and `Loader` raises, with the same
           message);
  read   - the folder opens, reading the damaged sample raises (its checksum), other samples still read;
  verify - the bytes the readers use are intact (a tar header, a DALI index, an unchecked v1 label), so only
           `fastfeed verify --quick` can see it, and it names the file and the sample.
Never a crash, a hang, a raw lmdb/numpy/zipfile exception, or silently different data.

Tests damage private copies (conftest `copy_dataset`: hard links), so every damage replaces a file rather than
writing into it.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

import fastfeed
from fastfeed.cli import main as cli
from fastfeed.formats import DatasetError
from fastfeed.pack.verify import verify

SAMPLE = 5  # the sample that per-sample damages hit


@dataclass
class Damage:
    stage: str  # "open" | "read" | "verify"
    file: str  # a name the message must contain
    key: str | None = None  # the sample key the message must contain


def _rewrite(path: Path, data: bytes) -> None:
    """Replace a (possibly hard-linked) file with new contents, leaving the original dataset untouched."""
    os.unlink(path)
    with open(path, "wb") as f:
        f.write(data)


def _flip(path: Path, at: int, n: int) -> None:
    b = bytearray(path.read_bytes())
    for j in range(at, at + n):
        b[j] ^= 0x5A
    _rewrite(path, bytes(b))


def _sample(root: Path, i: int = SAMPLE) -> tuple[str, str, int, int]:
    """(key, data file path, offset, size) of sample i (SAMPLE unless given)."""
    with fastfeed.open_dataset(root) as ds:
        ext = ds.extents()
        return str(ds.keys[i]), ext.paths[ext.file_index[i]], int(ext.offset[i]), int(ext.size[i])


def _manifest(root: Path) -> dict:
    return json.loads((root / "fastfeed.json").read_text())


def _write_manifest(root: Path, m: dict) -> None:
    _rewrite(root / "fastfeed.json", json.dumps(m).encode())


def _table(root: Path) -> dict:
    with np.load(root / "samples.npz", allow_pickle=False) as z:
        return {k: z[k] for k in z.files}


def _write_table(root: Path, t: dict) -> None:
    os.unlink(root / "samples.npz")
    np.savez(root / "samples.npz", **t)


def to_version1(root: Path) -> None:
    """What a format-version-1 pack wrote: no checksum/orientation/change (nor LMDB offset) columns, no table
    checksum or change counts in the manifest."""
    t = _table(root)
    for c in ("checksum", "orientation", "change"):
        t.pop(c)
    if _manifest(root)["kind"] == "lmdb":
        t.pop("offset")
    _write_table(root, t)
    m = _manifest(root)
    m["version"] = 1
    del m["samples_xxh3"], m["changes"]
    _write_manifest(root, m)


# ---- the damages --------------------------------------------------------------------------------------------


def manifest_bad_json(root, fmt):
    _rewrite(root / "fastfeed.json", b'{"kind": "wds", "shards": [')
    return Damage("open", "fastfeed.json")


def manifest_missing_keys(root, fmt):
    m = _manifest(root)
    del m["shards"], m["num_samples"]
    _write_manifest(root, m)
    return Damage("open", "fastfeed.json")


def manifest_wrong_types(root, fmt):
    m = _manifest(root)
    m["num_samples"] = "160"
    _write_manifest(root, m)
    return Damage("open", "fastfeed.json")


def manifest_shard_outside_relative(root, fmt):
    # a real file of the right size sits at ../x.tar: the refusal must not depend on it being absent
    m = _manifest(root)
    src = root / m["shards"][0]["path"]
    outside = root.parent / "x.tar"
    os.link(src, outside)
    m["shards"][0]["path"] = "../x.tar"
    _write_manifest(root, m)
    return Damage("open", "../x.tar")


def manifest_shard_outside_absolute(root, fmt):
    m = _manifest(root)
    src = root / m["shards"][0]["path"]
    m["shards"][0]["path"] = str(src.resolve())
    _write_manifest(root, m)
    return Damage("open", str(src.resolve()))


def manifest_missing(root, fmt):
    os.unlink(root / "fastfeed.json")
    return Damage("open", "fastfeed.json")


def data_file_missing(root, fmt):
    rel = "shard-000001.tar" if fmt == "wds" else "data.lmdb/data.mdb"
    os.unlink(root / rel)
    return Damage("open", rel)


def data_file_truncated(root, fmt):
    rel = "shard-000001.tar" if fmt == "wds" else "data.lmdb/data.mdb"
    data = (root / rel).read_bytes()
    _rewrite(root / rel, data[: len(data) // 2])
    return Damage("open", rel)


def table_replaced_by_fifo(root, fmt):
    os.unlink(root / "samples.npz")
    os.mkfifo(root / "samples.npz")  # opening it for reading would block forever
    return Damage("open", "samples.npz")


def idx_replaced_by_fifo(root, fmt):
    os.unlink(root / "shard-000000.idx")
    os.mkfifo(root / "shard-000000.idx")
    return Damage("verify", "shard-000000.idx")


def table_labels_changed(root, fmt):
    t = _table(root)
    t["label"][SAMPLE] = (t["label"][SAMPLE] + 1) % 4
    _write_table(root, t)
    return Damage("open", "samples.npz")


def table_truncated(root, fmt):
    data = (root / "samples.npz").read_bytes()
    _rewrite(root / "samples.npz", data[: len(data) // 2])
    return Damage("open", "samples.npz")


def table_missing(root, fmt):
    os.unlink(root / "samples.npz")
    return Damage("open", "samples.npz")


def v1_table_truncated(root, fmt):
    to_version1(root)  # no table checksum: the npz parser's own failure must still become a DatasetError
    data = (root / "samples.npz").read_bytes()
    _rewrite(root / "samples.npz", data[: len(data) - 300])
    return Damage("open", "samples.npz")


def v1_table_offsets_outside(root, fmt):
    # no table checksum in version 1: the column checks still catch an extent past the end of its file
    to_version1(root)
    t = _table(root)
    key = str(t["key"][SAMPLE])
    t["size"][SAMPLE] = 1 << 40
    _write_table(root, t)
    return Damage("open", "samples.npz", key)


def v1_table_labels_changed(root, fmt):
    # no table checksum in version 1: verify's cross-check with the stored .cls records catches it
    to_version1(root)
    t = _table(root)
    key = str(t["key"][SAMPLE])
    t["label"][SAMPLE] = (t["label"][SAMPLE] + 1) % 4
    _write_table(root, t)
    return Damage("verify", ".cls" if fmt == "wds" else "data.mdb", key)


def image_bytes_flipped(root, fmt):
    key, path, off, size = _sample(root)
    _flip(Path(path), off + size // 2, 16)
    return Damage("read", os.path.basename(path), key)


def tar_header_damaged(root, fmt):
    key, path, off, size = _sample(root)
    _flip(Path(path), off - 512, 8)  # the image member's name field
    return Damage("verify", os.path.basename(path), key)


def idx_offsets_edited(root, fmt):
    key, path, off, size = _sample(root)
    idx = Path(path[: -len(".tar")] + ".idx")
    text = idx.read_text()
    assert f" {off} {size} {key}." in text
    _rewrite(idx, text.replace(f" {off} {size} {key}.", f" {off + 512} {size} {key}.").encode())
    return Damage("verify", idx.name, key)


def idx_missing(root, fmt):
    os.unlink(root / "shard-000000.idx")
    return Damage("verify", "shard-000000.idx")


def lmdb_meta_pages_flipped(root, fmt):
    _flip(root / "data.lmdb" / "data.mdb", 16, 4096 * 2 - 32)  # both meta pages: liblmdb refuses the file
    return Damage("verify", "data.mdb")


def lmdb_v1_meta_pages_flipped(root, fmt):
    to_version1(root)  # version 1 resolves offsets through liblmdb at open
    _flip(root / "data.lmdb" / "data.mdb", 16, 4096 * 2 - 32)
    return Damage("open", "data.mdb")


def lmdb_v1_tree_page_flipped(root, fmt):
    to_version1(root)
    _flip(root / "data.lmdb" / "data.mdb", 4096 * 2 + 16, 4000)
    return Damage("open", "data.mdb")


def lmdb_tree_page_flipped(root, fmt):
    _flip(root / "data.lmdb" / "data.mdb", 4096 * 2 + 16, 4000)  # the first data page (B-tree)
    return Damage("verify", "data.mdb")


COMMON = [manifest_bad_json, manifest_missing_keys, manifest_wrong_types, manifest_shard_outside_relative,
          manifest_shard_outside_absolute, manifest_missing, data_file_missing, data_file_truncated,
          table_labels_changed, table_truncated, table_missing, v1_table_truncated, v1_table_offsets_outside,
          v1_table_labels_changed, table_replaced_by_fifo, image_bytes_flipped]
WDS_ONLY = [tar_header_damaged, idx_offsets_edited, idx_missing, idx_replaced_by_fifo]
LMDB_ONLY = [lmdb_meta_pages_flipped, lmdb_v1_meta_pages_flipped, lmdb_tree_page_flipped, lmdb_v1_tree_page_flipped]
CASES = ([("wds", d) for d in COMMON + WDS_ONLY] + [("lmdb", d) for d in COMMON + LMDB_ONLY])


def _names(msg: str, d: Damage) -> None:
    assert d.file in msg, f"{d.file!r} not named in: {msg}"
    if d.key is not None:
        assert d.key in msg, f"sample {d.key!r} not named in: {msg}"


@pytest.mark.parametrize("fmt,damage", CASES, ids=[f"{f}-{d.__name__}" for f, d in CASES])
def test_damage(packed, copy_dataset, capsys, fmt, damage):
    root = copy_dataset(packed[fmt])
    d = damage(root, fmt)
    if d.stage == "open":
        with pytest.raises(DatasetError) as ei:
            fastfeed.open_dataset(root)
        assert type(ei.value) is DatasetError
        _names(str(ei.value), d)
        capsys.readouterr()
        assert cli(["verify", "--quick", str(root)]) == 2
        _names(capsys.readouterr().err, d)
        with pytest.raises(DatasetError) as ei:  # the Loader opens through open_dataset: the same error
            fastfeed.Loader(root, batch_size=8, device="cpu", decoder="cpu", num_threads=1)
        _names(str(ei.value), d)
        return
    with fastfeed.open_dataset(root) as ds:
        for i in range(len(ds)):
            if d.stage == "read" and i == SAMPLE:
                with pytest.raises(DatasetError) as ei:
                    ds.read(i)
                assert type(ei.value) is DatasetError
                _names(str(ei.value), d)
                assert ei.value.key == d.key
            else:
                ds.read(i)  # intact samples still read (and pass their checksums)
    report = verify(str(root), quick=True)
    assert not report.ok
    hits = [e for e in report.errors if d.file in e and (d.key is None or d.key in e)]
    assert hits, report.errors
    capsys.readouterr()
    assert cli(["verify", "--quick", str(root)]) == 1
    _names(capsys.readouterr().err, d)


@pytest.mark.parametrize("fmt", ["wds", "lmdb"])
def test_version1_dataset_opens_and_verify_says_checks_were_skipped(packed, copy_dataset, capsys, fmt):
    root = copy_dataset(packed[fmt])
    with fastfeed.open_dataset(root) as ds:
        expected = [ds.read(i) for i in range(len(ds))]
        labels = ds.labels.copy()
    to_version1(root)
    with fastfeed.open_dataset(root) as ds:
        assert ds.checksums is None
        assert ds.orientations.dtype == np.uint8 and (ds.orientations == 1).all() and len(ds.orientations) == len(ds)
        assert [ds.read(i) for i in range(len(ds))] == expected
        assert (ds.labels == labels).all()
        from fastfeed.formats.integrity import bad_checksums

        assert bad_checksums(ds, [0, 1], [b"x", b"y"]) == []
    assert cli(["verify", "--quick", str(root)]) == 0
    assert "no per-sample checksums" in capsys.readouterr().out


def test_full_verify_reports_undecodable_sample_and_accepts_the_rest(packed, copy_dataset, capsys):
    """An image whose bytes are damaged AND whose checksum was updated to match (a bad source the pack took):
    only the full decode can see it, and it names the file and key; quick mode passes."""
    from fastfeed.formats.integrity import checksum, sha256_file
    from fastfeed.pack import table as tbl

    root = copy_dataset(packed["wds"])
    key, path, off, size = _sample(root)
    data = bytearray(Path(path).read_bytes())
    data[off + 200 : off + size - 2] = b"\x00" * (size - 202)  # keep SOI ... EOI, destroy everything between
    _rewrite(Path(path), bytes(data))
    t = _table(root)
    t["checksum"][SAMPLE] = checksum(bytes(data[off : off + size]))
    m = _manifest(root)
    m["samples_xxh3"] = tbl.write_table(str(root), t)
    m["shards"] = [dict(s, sha256=sha256_file(str(root / s["path"]))) for s in m["shards"]]
    _write_manifest(root, m)
    assert verify(str(root), quick=True).ok
    report = verify(str(root), workers=2)
    assert len(report.errors) == 1 and key in report.errors[0] and os.path.basename(path) in report.errors[0]
    assert "does not decode" in report.errors[0]


@pytest.fixture(scope="module")
def packed_with_pngs(demo_tree, pack_cli, tmp_path_factory) -> Path:
    """The demo tree with 16 of its photos stored as PNG, packed by the CLI keeping each file's format."""
    import shutil

    from PIL import Image

    from conftest import DEMO_SHARD_SIZE

    src = tmp_path_factory.mktemp("pngs") / "src"
    shutil.copytree(demo_tree, src)
    for p in sorted(src.rglob("*.jpg"))[:16]:
        Image.open(p).save(p.with_suffix(".png"))
        p.unlink()
    out = src.parent / "wds"
    pack_cli(src, out, "--format", "wds", "--shard-size", DEMO_SHARD_SIZE, "--jpeg", "keep")
    return out


@pytest.mark.integration  # a child process
@pytest.mark.parametrize("damage,said", [("garbage", "bad image header: JPEG:"),
                                          ("cut", "truncated JPEG (no end-of-image marker)"),
                                          ("png", "truncated PNG (a chunk runs past the end of the file)")])
def test_a_broken_image_read_unchecked_is_reported_not_decoded(packed, packed_with_pngs, copy_dataset, damage,
                                                                 said):
    """With verify_checksums=False (or a dataset without checksums) damaged bytes reach the Loader unchecked. A JPEG
    whose first segments are followed by garbage crashed the process in DALI 2.4's CPU decoder (a segfault in its
    worker threads while the batch was bisected for the bad record, 4 runs of 6 at batch 64) and in its GPU decoder
    (on the first such batch, H200), a PNG so damaged crashed the CPU decoder in 2 runs of 5, and the GPU decoder
    gave a cut JPEG's missing rows as pixels. The Loader reports each as pack does (the reason, the sample's key)
    and decodes the rest; run in a child process, so that a crash fails this test instead of ending the suite."""
    import subprocess
    import sys

    pytest.importorskip("nvidia.dali")
    root = copy_dataset(packed_with_pngs if damage == "png" else packed["wds"])
    i = SAMPLE
    if damage == "png":
        with fastfeed.open_dataset(root) as ds:
            i = next(j for j in range(len(ds)) if bytes(ds.read(j)[:4]) == b"\x89PNG")
    key, path, offset, size = _sample(root, i)
    b = bytearray(Path(path).read_bytes())
    # The same length, so that the shard and its index still read: garbage after the first bytes, or the second
    # half zeroed (zeros after the end marker are padding some writers add; here they follow a cut scan).
    keep, fill = {"garbage": (200, 7), "cut": (size // 2, 0), "png": (60, 7)}[damage]
    b[offset + keep:offset + size] = bytes([fill]) * (size - keep)
    _rewrite(Path(path), bytes(b))
    child = f"""
import json
import fastfeed
with fastfeed.Loader({str(root)!r}, batch_size=64, image_size=64, device="cpu", decoder="cpu-dali", num_threads=2,
                     verify_checksums=False, shuffle=False, drop_last=False) as loader:
    n = sum(len(labels) for _, labels in loader)
    s = loader.stats()["skipped"]
print(json.dumps([n, s["by_reason"], s["examples"]]))
"""
    run = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    n, by_reason, examples = json.loads(run.stdout.strip().splitlines()[-1])
    assert n == 160 and by_reason == {"decode_error": 1}
    assert [e["key"] for e in examples] == [key]
    logged = [line for line in run.stderr.splitlines() if "replaced by another sample" in line]
    assert len(logged) == 1 and key in logged[0] and f"decode_error: {said}" in logged[0], logged
