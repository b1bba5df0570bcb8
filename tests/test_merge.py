"""`--num-parts K --part i` packs + `fastfeed merge` write the very files a single-process `fastfeed pack` with the
same options writes: every file of the two folders compared byte for byte (shards, DALI indexes, data.mdb,
samples.npz, rejected.jsonl, fastfeed.json), on a tree with rejected, trimmed, converted and transcoded files,
with shard sizes (and, for LMDB, a commit size) small enough that boundaries fall inside parts and across them.

LMDB: data.mdb is compared byte for byte too. It is reproducible because the merge replays the single pack's
puts in the same transactions (pack/merge.py); only lock.mdb, LMDB's reader table (runtime state that no
manifest lists and readers never open), is left out.
"""
from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from fastfeed.pack import PackError, PackOptions, merge, pack
from odd_images.tree import build_mixed_tree

pytestmark = pytest.mark.filterwarnings("ignore:Corrupt EXIF data:UserWarning")


@pytest.fixture(scope="module")
def tree(tmp_path_factory) -> Path:
    root = build_mixed_tree(tmp_path_factory.mktemp("merge") / "src", seed=2)
    for n, p in enumerate(sorted(root.glob("*/*.jpg"))[:3]):  # progressive JPEGs libjpeg refuses to transcode
        buf = io.BytesIO()
        Image.open(p).save(buf, "JPEG", progressive=True, quality=85)
        good = buf.getvalue()
        sos = good.index(b"\xff\xda")
        (root / "odd" / f"corrupt{n}.jpg").write_bytes(good[: sos + 400] + bytes(300) + good[sos + 700 :])
    return root


@pytest.fixture(scope="module")
def listing(tree, tmp_path_factory) -> Path:
    """A JSONL list with per-sample metadata (the `.json` members of WebDataset, `json/KEY` of LMDB)."""
    path = tmp_path_factory.mktemp("list") / "list.jsonl"
    files = sorted(p for p in tree.rglob("*.jpg") if p.stat().st_size)[:40]
    with open(path, "w") as f:
        for i, p in enumerate(files):
            f.write(json.dumps({"path": str(p), "label": i % 5, "metadata": {"i": i, "caption": "é" * (i % 7)}}) + "\n")
    return path


def files(root: Path) -> dict[str, bytes]:
    """Every file under `root` by relative path, except LMDB's lock.mdb (see the module docstring)."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and p.name != "lock.mdb"}


def assert_same_files(a: Path, b: Path) -> None:
    fa, fb = files(a), files(b)
    assert sorted(fa) == sorted(fb)
    different = [n for n in fa if fa[n] != fb[n]]
    assert different == [], different


CASES = [  # (format, options): shard/commit sizes that cut inside the parts, shuffled or not
    ("wds", dict(shard_size=300_000)),
    ("wds", dict(shard_size=64_000, shuffle_seed=7, jpeg_mode="keep")),
    ("wds", dict(shard_size=1 << 30, shuffle_seed=None)),
    ("lmdb", dict(shuffle_seed=3)),
]


@pytest.mark.parametrize("fmt,opts", CASES)
def test_parts_plus_merge_are_byte_identical_to_one_pack(tree, tmp_path, monkeypatch, fmt, opts):
    import fastfeed.pack.lmdb as lmdb_writer

    monkeypatch.setattr(lmdb_writer, "_COMMIT_BYTES", 1 << 20)  # several LMDB transactions, cut inside parts
    single = tmp_path / "single"
    m = pack(str(tree), str(single), PackOptions(format=fmt, **opts)).manifest
    assert m.rejected > 0 and m.changes
    assert m.extra["jpeg_actions"]["transcode_failed"] == (3 if m.options["jpeg_mode"] == "baseline" else 0)
    assert fmt == "lmdb" or opts["shard_size"] > 1e6 or len(m.shards) >= 3
    out = tmp_path / "parts"
    for i in (2, 0, 1):  # any order, as a job array runs them
        pack(str(tree), str(out), PackOptions(format=fmt, num_parts=3, part=i, **opts))
    merged = merge(str(out))
    assert merged == m
    assert_same_files(single, out)  # and the part folders are gone


@pytest.mark.parametrize("fmt", ["wds", "lmdb"])
def test_metadata_from_a_list_merges_byte_identically(listing, tmp_path, fmt):
    single, out = tmp_path / "single", tmp_path / "parts"
    pack(str(listing), str(single), PackOptions(format=fmt, shard_size=500_000))
    for i in range(4):
        pack(str(listing), str(out), PackOptions(format=fmt, shard_size=500_000, num_parts=4, part=i))
    merge(str(out))
    assert_same_files(single, out)


@pytest.mark.integration  # the CLI as a process
def test_cli_merge_and_an_interrupted_merge_run_again(tree, tmp_path):
    out = tmp_path / "parts"
    for i in range(2):
        pack(str(tree), str(out), PackOptions(shard_size=300_000, num_parts=2, part=i))
    (out / "shard-000000.tar").write_bytes(b"left by a merge killed mid-way")
    (out / "samples.npz.tmp").write_bytes(b"")
    proc = subprocess.run([sys.executable, "-m", "fastfeed.cli", "merge", str(out)], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("merged 2 parts: ")
    single = tmp_path / "single"
    pack(str(tree), str(single), PackOptions(shard_size=300_000))
    assert_same_files(single, out)


def test_a_damaged_part_is_refused_naming_the_part_and_sample(tree, tmp_path):
    out = tmp_path / "parts"
    for i in range(2):
        pack(str(tree), str(out), PackOptions(shard_size=300_000, num_parts=2, part=i))
    tar = out / "part-00001" / "shard-000000.tar"
    data = bytearray(tar.read_bytes())
    with np.load(out / "part-00001" / "samples.npz") as t:
        at, key = int(t["offset"][0] + t["size"][0] // 2), str(t["key"][0])
    data[at] ^= 0xFF  # inside the first image: sizes unchanged, so only the checksum can tell
    tar.unlink()
    tar.write_bytes(bytes(data))
    with pytest.raises(PackError, match=rf"part part-00001 is damaged \(sample {key}: stored bytes do not match"):
        merge(str(out))
    assert sorted(n for n in os.listdir(out) if not n.startswith("part-")) == []  # nothing half-written left
    assert (out / "part-00000" / "fastfeed.json").exists()


def test_parts_packed_from_a_changed_source_are_refused(tmp_path):
    """Files added between two parts' packs: the plans differ, so merged they would repeat some images and lose
    others. Each key is a position in the listing, so the parts' overlapping keys give it away."""
    src = tmp_path / "src"
    (src / "a").mkdir(parents=True)
    for i in range(40):
        Image.new("RGB", (8, 8), (i, 0, 0)).save(src / "a" / f"{i:02d}.png")
    out = tmp_path / "parts"
    pack(str(src), str(out), PackOptions(num_parts=2, part=0))
    for i in range(40, 50):
        Image.new("RGB", (8, 8), (i, 0, 0)).save(src / "a" / f"{i:02d}.png")
    pack(str(src), str(out), PackOptions(num_parts=2, part=1))
    with pytest.raises(PackError, match=r"part-00000 and part-00001 both hold sample \d+: the source changed"):
        merge(str(out))
    assert not (out / "fastfeed.json").exists()
