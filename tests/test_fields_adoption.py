"""Odd members in adopted shards and odd values in fields: arrays torch has no tensor for, JSON numbers, labels that
are ids, read-only shard folders, shards that are compressed files, link members and keys whose members are apart.

Shards are written member by member with `tarfile`, so each case holds exactly the members it names, in that order.
Every image is a flat colour that names its sample, so a decoded batch says which sample each position holds.
"""
from __future__ import annotations

import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from torch.utils.data import default_collate

import fastfeed
from fastfeed.formats.fields import FieldError, decode_value
from fastfeed.formats.tarwalk import walk_tar
from fastfeed.loader.fields import collate
from fastfeed.constants import MAX_CLASSES
from fastfeed.pack.index import index_shards
from fastfeed.pack.verify import verify
from fastfeed.types import DatasetError

SIZE = 16


def colour(i: int) -> tuple[int, int, int]:
    return (20 + 9 * i, 230 - 7 * i, (60 + 41 * i) % 256)


def jpeg(i: int) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (SIZE, SIZE), colour(i)).save(buf, format="JPEG", quality=95)
    return buf.getvalue()


def npy(a: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, a)
    return buf.getvalue()


def write_tar(path: Path, members, mode: str = "w") -> Path:
    """members: (name, bytes), or (name, ("hard" | "sym", target)) for a link member."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, mode) as tar:
        for name, data in members:
            ti = tarfile.TarInfo(name)
            if isinstance(data, tuple):
                ti.type = tarfile.LNKTYPE if data[0] == "hard" else tarfile.SYMTYPE
                ti.linkname = data[1]
                tar.addfile(ti)
            else:
                ti.size = len(data)
                tar.addfile(ti, io.BytesIO(data))
    return path


def which(images: torch.Tensor, n: int) -> list[int]:
    means = images.float().mean(dim=(2, 3)).numpy()
    table = np.array([colour(i) for i in range(n)], dtype=np.float64)
    return [int(np.argmin(((table - m) ** 2).sum(1))) for m in means]


def loader(path, **kw) -> fastfeed.Loader:
    kw = {"batch_size": 8, "image_size": SIZE, "device": "cpu", "decoder": "cpu", "dtype": torch.uint8,
          "train": False, **kw}
    return fastfeed.Loader(path, **kw)


def test_arrays_torch_cannot_hold_are_bad_records_and_big_endian_ones_load(tmp_path):
    """A big-endian float array is the same values in native order; a text, structured or datetime array has no
    tensor: its sample is a bad record (skipped and counted, or raised on by name), never a failed collation."""
    odd = {2: np.arange(3, dtype=">f4") + 2, 4: np.array(["a", "b", "c"]),
           5: np.zeros(3, dtype=[("x", "<f4"), ("y", "<f4")]), 6: np.zeros(3, dtype="datetime64[s]")}
    members = []
    for i in range(8):
        members += [(f"s{i}.jpg", jpeg(i)), (f"s{i}.npy", npy(odd.get(i, np.arange(3, dtype=np.float32) + i)))]
    src = tmp_path / "s"
    write_tar(src / "a.tar", members)
    index_shards(str(src))
    with loader(src, fields=["npy"]) as ld:
        (b,) = list(ld)
        stats = ld.stats()["skipped"]
    ids = which(b["images"], 8)
    assert not {4, 5, 6} & set(ids) and 2 in ids
    assert b["npy"].dtype == torch.float32
    for p, i in enumerate(ids):
        assert b["npy"][p].tolist() == [i, i + 1, i + 2]
    assert stats["by_reason"] == {"bad_field": 3}
    assert (b["labels"] == fastfeed.IGNORE_INDEX).sum() == 3
    with loader(src, fields=["npy"], on_error="raise") as ld:
        with pytest.raises(fastfeed.LoaderError, match=r"s4.*\.npy: an array of dtype <U1, which torch has no tensor"):
            list(ld)


def test_fields_no_sample_carries_together_are_refused_by_name(tmp_path):
    """Found by an adversarial run: each field is somewhere, but no sample has both; the Loader said every batch
    was undecodable images and sent the user to `fastfeed verify`, which passes."""
    src = tmp_path / "s"
    write_tar(src / "a.tar", [("k0.jpg", jpeg(0)), ("k0.a", b"x"), ("k1.jpg", jpeg(1)), ("k1.b", b"y")])
    index_shards(str(src))
    with pytest.raises(ValueError, match=r"no sample carries every requested field \['a', 'b'\].*\.a 1, \.b 1"):
        loader(src, fields=["a", "b"])


def test_a_batch_of_samples_without_a_field_says_so_and_what_to_do(tmp_path):
    """Every sample of a batch lacks a requested member and so does the rest of the epoch: the error names each
    sample's reason (not a decode failure), counts only other samples, and does not send the user to verify."""
    src = tmp_path / "s"
    k3 = jpeg(3)
    members = [(f"k{i}.jpg", jpeg(i)) for i in range(3)] + [("k3.jpg", k3), ("k3.txt", b"only one")]
    tar = write_tar(src / "a.tar", members)
    index_shards(str(src))
    data = bytearray(tar.read_bytes())  # the one sample with a caption changed after indexing: its checksum fails
    at = data.find(k3) + len(k3) // 2
    data[at] ^= 0xFF
    tar.write_bytes(bytes(data))
    with loader(src, fields=["txt"], batch_size=1, train=True, shuffle=False) as ld:
        with pytest.raises(fastfeed.LoaderError) as err:
            next(iter(ld))
    msg = str(err.value)
    assert "k0: missing_field: no .txt member" in msg and "none of 3 other samples" in msg, msg
    assert "verify" not in msg and "Loader(path).dataset.fields" in msg, msg


def test_cls_as_a_field_is_missing_where_a_sample_has_no_label(tmp_path):
    """fields=["cls"] asks for the label member: a sample without one is a bad record, like any missing field,
    not a batch value of -1."""
    src = tmp_path / "s"
    members = []
    for i in range(4):
        members += [(f"s{i}.jpg", jpeg(i))] + ([(f"s{i}.cls", b"%d" % (i + 1))] if i != 2 else [])
    write_tar(src / "a.tar", members)
    index_shards(str(src))
    with loader(src, fields=["cls"], batch_size=4) as ld:
        (b,) = list(ld)
        stats = ld.stats()["skipped"]
    ids = which(b["images"], 4)
    assert 2 not in ids and stats["by_reason"] == {"missing_field": 1}
    for p, i in enumerate(ids):
        if b["labels"][p] != fastfeed.IGNORE_INDEX:  # the position holding a copy in its place is not scored
            assert b["cls"][p] == i + 1


def test_values_that_fit_no_tensor_are_field_errors():
    with pytest.raises(FieldError, match="does not fit an int64"):
        decode_value("int", b"99999999999999999999")
    assert decode_value("int", b" -9223372036854775808\n") == -(1 << 63)
    buf = io.BytesIO()
    np.savez(buf, a=np.zeros(2))
    with pytest.raises(FieldError, match="not a .npy array"):
        decode_value("npy", buf.getvalue())
    with pytest.raises(FieldError, match="float128|longdouble"):
        decode_value("npy", npy(np.zeros(2, dtype=np.longdouble)))
    same = decode_value("npy", npy(np.arange(6, dtype=">i8").reshape(2, 3)))
    assert same.dtype == np.int64 and same.dtype.isnative and same.tolist() == [[0, 1, 2], [3, 4, 5]]


def _npy_header(header: str, body: bytes = b"") -> bytes:
    """A version 1.0 .npy member with this header dict, as np.save lays it out (padded to 64 bytes)."""
    text = header.encode("latin1")
    text += b" " * (63 - (10 + len(text)) % 64) + b"\n"
    return b"\x93NUMPY\x01\x00" + len(text).to_bytes(2, "little") + text + body


def test_members_python_refuses_with_other_errors_are_bad_records(tmp_path):
    """Found by an adversarial run: JSON nested deeper than Python's recursion limit (json.loads raises
    RecursionError), a .npy whose header declares an array far larger than the member (np.load allocates it before
    reading: MemoryError) and one with a bool in its shape (np.load: TypeError) stopped the Loader with on_error="skip"
    and made `fastfeed verify` crash; each is a bad record, skipped and counted, and verify names it."""
    odd = {1: ("json", b"[" * 100_000 + b"]" * 100_000),
           3: ("npy", _npy_header("{'descr': '<f8', 'fortran_order': False, 'shape': (10**18,), }", bytes(8))),
           4: ("npy", _npy_header("{'descr': '<f8', 'fortran_order': False, 'shape': (1000000000000000000,), }",
                                  bytes(8))),
           6: ("npy", _npy_header("{'descr': '<i4', 'fortran_order': False, 'shape': (True,), }", bytes(4)))}
    members = []
    for i in range(8):
        ext, data = odd.get(i, ("npy", npy(np.arange(2, dtype=np.int32) + i)))
        members += [(f"s{i}.jpg", jpeg(i)), (f"s{i}.{ext}", data)]
    src = write_tar(tmp_path / "s" / "a.tar", members).parent
    index_shards(str(src))
    with pytest.raises(FieldError, match="RecursionError"):
        decode_value("json", odd[1][1])
    with pytest.raises(FieldError, match=r"declares a float64 array of shape \(1000000000000000000,\).*only 8 bytes"):
        decode_value("npy", odd[4][1])
    with loader(src, fields=["npy"]) as ld:
        (b,) = list(ld)
        stats = ld.stats()["skipped"]
    ids = which(b["images"], 8)
    assert not {1, 3, 4, 6} & set(ids) and stats["by_reason"] == {"missing_field": 1, "bad_field": 3}
    for p, i in enumerate(ids):
        assert b["npy"][p].tolist() == [i, i + 1]
    report = verify(str(src))
    assert not report.ok and {int(m.group(1)) for m in re.finditer(r"key s(\d)", str(report.errors))} == {1, 3, 4, 6}


@pytest.mark.parametrize("values", [[1, 2], [0.5, 1.5], [True, False], [3, 4.5], [-(1 << 63), 0]])
def test_numbers_collate_as_default_collate_makes_them(values):
    got, ref = collate(values), default_collate(values)
    # default_collate types a batch by its first value: [3, 4.5] is float32 there; here floats are float64 always.
    want = torch.float64 if any(isinstance(v, float) for v in values) else ref.dtype
    assert got.dtype == want and got.tolist() == ref.tolist()


@pytest.mark.parametrize("values", [[True, 1], [True, 1.5], [1 << 63, 1], [10 ** 400, 0.5], [None, 1.5], ["a", "b"],
                                    [{"a": 1}, {"a": 2}], [[1], [2]]])
def test_anything_else_collates_as_a_list(values):
    assert collate(values) == values


def test_json_numbers_keep_their_type_from_batch_to_batch(tmp_path):
    vals = [1, 2, 0.5, 1.5, True, False, 3, 4.5]
    members = []
    for i, v in enumerate(vals):
        members += [(f"s{i}.jpg", jpeg(i)), (f"s{i}.json", json.dumps(v).encode())]
    src = write_tar(tmp_path / "s" / "a.tar", members).parent
    index_shards(str(src))
    with loader(src, fields=["json"], batch_size=2) as ld:
        got = [(b["json"].dtype, b["json"].tolist()) for b in ld]
    assert got == [(torch.int64, [1, 2]), (torch.float64, [0.5, 1.5]), (torch.bool, [True, False]),
                   (torch.float64, [3.0, 4.5])]


@pytest.mark.integration
def test_a_read_only_shard_folder_is_refused_before_any_shard_is_read(tmp_path):
    src = write_tar(tmp_path / "ro" / "a.tar", [("s0.jpg", jpeg(0))]).parent
    os.chmod(src, 0o555)
    # As root, the folder's mode binds only once the capabilities that override it are gone.
    drop = ["setpriv", "--bounding-set=-dac_override,-dac_read_search,-fowner"] if os.geteuid() == 0 else []
    if drop and shutil.which("setpriv") is None:
        pytest.skip("running as root without setpriv: a folder's mode does not bind")
    script = ("import sys, fastfeed.pack.index as m\n"
              "def read(*a, **k): raise AssertionError('a shard was read')\n"
              "m._index_shard = read\n"
              "from fastfeed.cli import main\n"
              "sys.exit(main(sys.argv[1:]))\n")
    try:
        proc = subprocess.run([*drop, sys.executable, "-c", script, "index", str(src)], capture_output=True,
                              text=True, timeout=120)
        named = subprocess.run([*drop, sys.executable, "-c", script, "index", str(src), str(src / "out")],
                               capture_output=True, text=True, timeout=120)
    finally:
        os.chmod(src, 0o755)
    assert proc.returncode == 2, proc.stderr
    assert f"{src}: cannot write the dataset's files into this folder (Permission denied)" in proc.stderr
    assert "`fastfeed index SHARDS OUT`" in proc.stderr
    assert named.returncode == 2 and f"{src / 'out'}: cannot write" in named.stderr, named.stderr
    assert "SHARDS OUT" not in named.stderr  # it was named
    assert sorted(p.name for p in src.iterdir()) == ["a.tar"]


def test_a_cls_past_the_class_bound_is_rejected_by_name(tmp_path):
    """A cls is a class index: the manifest names every class up to the largest. One that is an id (past
    MAX_CLASSES, or past int64) is rejected with its value, not made into a list of millions of names."""
    cls = {"k0": b"3", "k1": str(MAX_CLASSES).encode(), "k2": str(1 << 70).encode(), "k3": b"x", "k4": b" 1\n",
           "k5": str(MAX_CLASSES - 1).encode()}
    members = [m for i, (k, c) in enumerate(cls.items()) for m in ((f"{k}.jpg", jpeg(i)), (f"{k}.cls", c))]
    src = write_tar(tmp_path / "s" / "a.tar", members).parent
    report = index_shards(str(src), str(tmp_path / "ds"))
    reasons = {r["key"]: r["reason"] for r in report.rejected}
    assert set(reasons) == {"k1", "k2", "k3"}
    assert reasons["k1"].startswith(f"k1.cls holds label {MAX_CLASSES}, past the {MAX_CLASSES:,} classes")
    assert reasons["k2"].startswith(f"k2.cls holds label {1 << 70}, past")
    assert "not an integer label" in reasons["k3"]
    assert len(report.manifest.classes) == MAX_CLASSES
    labels = np.load(tmp_path / "ds" / "samples.npz")["label"]
    assert labels.tolist() == [3, 1, MAX_CLASSES - 1]


@pytest.mark.parametrize("mode,name,magic", [("w:gz", "gzip", "1f 8b"), ("w:bz2", "bzip2", "42 5a 68"),
                                             ("w:xz", "xz", "fd 37 7a 58 5a 00")])
def test_a_compressed_file_named_tar_is_said_to_be_one(tmp_path, mode, name, magic):
    src = tmp_path / "s"
    write_tar(src / "a.tar", [("k0.jpg", jpeg(0))])
    write_tar(src / "b.tar", [("k1.jpg", jpeg(1))], mode)
    members, _, problem = walk_tar((src / "b.tar").read_bytes())
    assert members == []
    assert problem.startswith(f"not a tar archive but a {name}-compressed file (it starts with {name}'s magic "
                              f"bytes {magic})") and "decompress it" in problem
    report = index_shards(str(src))
    assert report.manifest.num_samples == 1
    assert [r["source"] for r in report.rejected] == ["b.tar"] and report.rejected[0]["reason"] == problem


def test_link_members_are_rejected_by_name_with_their_target(tmp_path):
    """tarfile and webdataset skip a link member without a word, leaving its sample without that member."""
    src = write_tar(tmp_path / "s" / "a.tar", [
        ("s0.jpg", jpeg(0)), ("s0.txt", b"zero"),
        ("s1.jpg", ("hard", "s0.jpg")), ("s1.txt", b"one"),
        ("s2.jpg", jpeg(2)), ("s2.txt", ("sym", "s0.txt")),
    ]).parent
    report = index_shards(str(src))
    reasons = {r["source"]: r["reason"] for r in report.rejected}
    assert reasons["a.tar:s1.jpg"].startswith("a hard link to s0.jpg: a link holds no bytes of its own")
    assert reasons["a.tar:s2.txt"].startswith("a symbolic link to s0.txt: a link holds no bytes of its own")
    assert reasons["a.tar:s1"] == "no image member (members: txt)"
    assert report.manifest.num_samples == 2


@pytest.mark.skipif(shutil.which("tar") is None, reason="needs GNU tar")
def test_a_sparse_member_is_rejected_by_name_and_the_rest_of_the_shard_adopted(tmp_path):
    """Found by an adversarial run: GNU tar -S stores a mostly-empty file without its holes; index adopted the
    stored regions as the member's bytes, or (old GNU, over 4 regions) lost every sample after it."""
    src = tmp_path / "src"
    src.mkdir()
    names = []
    for i in range(4):
        (src / f"{i:03d}.jpg").write_bytes(jpeg(i))
        names.append(f"{i:03d}.jpg")
    with open(src / "001.npy", "wb") as f:
        for r in range(8):
            f.seek(r << 20)
            f.write(b"D" * 4096)
        f.truncate(8 << 20)
    names.insert(2, "001.npy")
    for fmt in ("gnu", "posix"):
        shard = tmp_path / fmt / "s.tar"
        shard.parent.mkdir()
        subprocess.run(["tar", f"--format={fmt}", "-S", "-cf", str(shard), "-C", str(src), *names], check=True)
        report = index_shards(str(shard.parent))
        assert [(r["source"], r["reason"][:26]) for r in report.rejected] == [("s.tar:001.npy",
                                                                               "sparse file: not supported")]
        ds = fastfeed.open_dataset(shard.parent)
        assert list(ds.keys) == ["000", "001", "002", "003"] and ds.fields == []


def test_members_whose_names_are_not_utf8_are_rejected_by_name(tmp_path):
    """Found by an adversarial run: a tar written under a Latin-1 locale (a raw 0xE9 in a name) failed the whole
    index at its end, on writing the table."""
    shard = tmp_path / "s" / "a.tar"
    shard.parent.mkdir()
    with tarfile.open(shard, "w", format=tarfile.GNU_FORMAT, encoding="latin-1") as tar:
        for i in range(4):
            key = "caf\u00e9_1" if i == 1 else f"s{i}"
            for ext, data in (("jpg", jpeg(i)), ("txt", f"caption {i}".encode())):
                ti = tarfile.TarInfo(f"{key}.{ext}")
                ti.size = len(data)
                tar.addfile(ti, io.BytesIO(data))
    report = index_shards(str(shard.parent))
    assert [r["source"] for r in report.rejected] == ["a.tar:caf\\xe9_1.jpg", "a.tar:caf\\xe9_1.txt"]
    assert all(r["reason"].startswith("member name is not UTF-8") for r in report.rejected)
    assert report.manifest.num_samples == 3 and verify(str(shard.parent)).ok
    with loader(shard.parent, fields=["txt"]) as ld:
        assert sorted(t for b in ld for t in b["txt"]) == ["caption 0", "caption 2", "caption 3"]


def test_a_member_whose_extension_cannot_name_a_field_is_rejected(tmp_path):
    """Found by an adversarial run: a member named `k3.` (webdataset reads it as field '') made index write a
    manifest that nothing then opened."""
    odd = {1: "k1.a+b", 2: "k2.txt.", 3: "k3."}
    src = write_tar(tmp_path / "s" / "a.tar", [
        m for i in range(4) for m in ((f"k{i}.jpg", jpeg(i)), (f"k{i}.txt", b"t"), *([(odd[i], b"x")] if i else []))
    ]).parent
    report = index_shards(str(src))
    assert [(r["source"], r["reason"]) for r in report.rejected] == [
        ("a.tar:k1.a+b", "extension 'a+b' cannot name a field (letters, digits, '_' and '-', in parts joined by "
                         "single dots)"),
        ("a.tar:k2.txt.", "extension 'txt.' cannot name a field (letters, digits, '_' and '-', in parts joined by "
                          "single dots)"),
        ("a.tar:k3.", "no extension (the name ends in a dot)")]
    assert report.manifest.fields == ["txt"] and report.manifest.num_samples == 4 and verify(str(src)).ok


def test_a_shard_whose_member_names_hold_whitespace_gets_no_dali_index(tmp_path):
    """Found by an adversarial run: a key with a space ('my photo 1') was written into the shard's .idx, which DALI
    then refused as malformed (its format is whitespace-separated) and verify called corrupt. The samples stay for
    the Loader; that shard alone has no .idx, said by index, the manifest and verify."""
    keys = ["photo0", "my photo 1", "photo2"]
    src = write_tar(tmp_path / "s" / "a.tar", [m for i, k in enumerate(keys)
                                               for m in ((f"{k}.jpg", jpeg(i)), (f"{k}.txt", k.encode()))]).parent
    write_tar(src / "b.tar", [("photo3.jpg", jpeg(3)), ("photo3.txt", b"photo3")])
    (src / "a.idx").write_text("v1.2 0\n")  # an earlier index's: stale
    report = index_shards(str(src), overwrite=True)
    assert report.manifest.num_samples == 4 and not report.rejected
    assert list(report.manifest.extra["no_dali_index"]) == ["a.tar"]
    assert "whitespace" in report.manifest.extra["no_dali_index"]["a.tar"]
    assert not (src / "a.idx").exists() and (src / "b.idx").exists()
    checked = verify(str(src), quick=True)
    assert checked.ok, checked.errors
    assert any(n.startswith("a.tar: no DALI index (member 'my photo 1.jpg' has whitespace") for n in checked.notes)
    with loader(src, fields=["txt"]) as ld:
        assert sorted(t for b in ld for t in b["txt"]) == sorted(keys + ["photo3"])


def test_a_label_is_read_one_way_by_index_verify_and_the_loader(tmp_path):
    """Found by an adversarial run: index read `007` as label 7 and verify then compared the bytes with b'7',
    calling the fresh dataset corrupt. Each reads a .cls as webdataset does (int(): zeros, sign, underscores)."""
    raws = [b"007", b"+2", b"1_0", b"0\r\n", b" 3 "]
    src = write_tar(tmp_path / "s" / "a.tar", [m for i, raw in enumerate(raws)
                                               for m in ((f"s{i}.jpg", jpeg(i)), (f"s{i}.cls", raw))]).parent
    report = index_shards(str(src))
    assert report.manifest.num_samples == 5 and not report.rejected
    assert list(fastfeed.open_dataset(src).labels) == [int(raw) for raw in raws] == [7, 2, 10, 0, 3]
    for quick in (True, False):
        checked = verify(str(src), quick=quick)
        assert checked.ok, checked.errors
    with loader(src, fields=["cls"]) as ld:
        assert all(b["cls"].tolist() == b["labels"].tolist() for b in ld)


def test_colons_in_a_shard_path_or_a_key_are_verified(tmp_path):
    """Found by an adversarial run: a shard under a folder named by a timestamp ('2024-01-01T10:00/a.tar') made
    verify call every sample corrupt (it split the recorded 'SHARD:MEMBER' at its first colon)."""
    src = tmp_path / "s"
    write_tar(src / "2024-01-01T10:00" / "a.tar", [m for i, k in enumerate(["s0", "t:1"])
                                                   for m in ((f"{k}.jpg", jpeg(i)), (f"{k}.txt", b"t"))])
    report = index_shards(str(src), str(tmp_path / "ds"))
    assert report.manifest.num_samples == 2 and not report.rejected
    checked = verify(str(tmp_path / "ds"), quick=True)
    assert checked.ok, checked.errors


def test_a_key_whose_members_are_apart_is_rejected_saying_so(tmp_path):
    """webdataset groups consecutive members by key: k1.jpg, k2.jpg, k1.txt reads as a k1 without its caption and a
    k1 without an image."""
    src = write_tar(tmp_path / "s" / "a.tar", [
        ("k1.jpg", jpeg(1)), ("k2.jpg", jpeg(2)), ("k1.txt", b"one"), ("k2.txt", b"two"),
        ("k3.jpg", jpeg(3)), ("k3.txt", b"three"), ("k1.json", b"{}"),
    ]).parent
    report = index_shards(str(src))
    reasons = {r["key"]: r["reason"] for r in report.rejected}
    assert set(reasons) == {"k1", "k2"}
    assert reasons["k1"] == ("members of key k1 are not next to each other in the shard (webdataset groups "
                             "consecutive members, so it reads 3 samples named k1: jpg; txt; json); write each "
                             "sample's members together")
    assert "2 samples named k2: jpg; txt" in reasons["k2"]
    ds = fastfeed.open_dataset(src)
    assert list(ds.keys) == ["k3"]
    # A shard of nothing else: no usable sample, and the error says why.
    apart = write_tar(tmp_path / "t" / "a.tar", [("k1.jpg", jpeg(1)), ("k2.jpg", jpeg(2)), ("k1.txt", b"one"),
                                                 ("k2.txt", b"two")]).parent
    with pytest.raises(DatasetError, match="first: members of key k1 are not next to each other"):
        index_shards(str(apart))


def test_a_bad_sample_is_named_by_its_shard_and_key_where_another_shard_reuses_the_key(tmp_path, caplog):
    """Shards written apart (two webdataset runs, each counting its keys from 0) reuse keys: each bad sample is
    logged once, as FILE:KEY, and its stats example and the raised error name its shard."""
    import webdataset as wds

    src = tmp_path / "s"
    src.mkdir()
    for part in range(2):
        with wds.TarWriter(str(src / f"part{part}.tar")) as sink:
            for i in range(4):
                j = 4 * part + i
                sink.write({"__key__": f"{i:06d}", "jpg": jpeg(j),
                            "json": b"{not json" if i == 1 else json.dumps({"id": j}).encode()})
    index_shards(str(src))
    with caplog.at_level("WARNING", logger="fastfeed"), loader(src, fields=["json"]) as ld:
        batches = list(ld)
        stats = ld.stats()["skipped"]
    for b in batches:  # each position's JSON is its own image's
        assert [v["id"] for v in b["json"]] == which(b["images"], 8)
    files = [str(src / "part0.tar"), str(src / "part1.tar")]
    logged = [r.getMessage() for r in caplog.records if "replaced by another sample" in r.getMessage()]
    assert sorted(logged) == [f"fastfeed: sample {f}:000001 replaced by another sample of its batch (bad_field: "
                              ".json: not a valid json member (JSONDecodeError: Expecting property name enclosed in "
                              "double quotes: line 1 column 2 (char 1)))" for f in files]
    assert sorted((e["file"], e["key"]) for e in stats["examples"]) == [(f, "000001") for f in files]
    with loader(src, fields=["json"], on_error="raise") as ld:
        with pytest.raises(fastfeed.LoaderError, match=re.escape(f"{files[0]}:000001")):
            list(ld)


def test_full_verify_names_each_member_the_loader_would_refuse(tmp_path):
    """Members whose checksums hold but whose values `Loader(fields=...)` refuses (JSON that does not parse, a
    pickled object array, text that is not UTF-8) fail a full verify, each by shard, key and field, as the Loader
    skips them; --quick checks bytes only."""
    import webdataset as wds

    from fastfeed.pack.verify import verify

    src = tmp_path / "s"
    src.mkdir()
    pickled = io.BytesIO()
    np.save(pickled, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    odd = {1: ("json", b"{not json"), 2: ("npy", pickled.getvalue()), 3: ("txt", b"\xff\xfe caption")}
    with wds.ShardWriter(str(src / "shard-%03d.tar"), maxcount=3, verbose=0) as sink:
        for i in range(6):
            sample = {"__key__": f"k{i}", "jpg": jpeg(i), "txt": f"caption {i}", "json": json.dumps({"id": i}),
                      "npy": npy(np.arange(2) + i)}
            if i in odd:
                sample[odd[i][0]] = odd[i][1]
            sink.write(sample)
    index_shards(str(src))
    assert verify(str(src), quick=True).ok
    report = verify(str(src))
    assert len(report.errors) == 3, report.errors
    for err, (i, (name, _)), shard in zip(sorted(report.errors), sorted(odd.items()), ["000", "000", "001"]):
        assert err.startswith(f"shard-{shard}.tar: key k{i} ") and f".{name} member is a bad record" in err, err
    with loader(src, fields=["txt", "json", "npy"]) as ld:
        list(ld)
        assert ld.stats()["skipped"]["by_reason"] == {"bad_field": 3}


def test_shards_moved_or_changed_after_indexing_elsewhere_are_said_where_they_were_looked_for(tmp_path):
    """Found by an adversarial run: shards indexed into another folder and then moved made the Loader and verify say
    only "data file a.tar listed in the manifest is missing", and the dataset folder never held it; the error names
    the folder the shards were adopted in, and a shard rewritten since says to index again, not to pack."""
    src = write_tar(tmp_path / "s" / "a.tar", [("k0.jpg", jpeg(0)), ("k0.txt", b"zero")]).parent
    index_shards(str(src), str(tmp_path / "ds"))
    src.rename(tmp_path / "moved")
    with pytest.raises(DatasetError, match=re.escape(f"a.tar listed in the manifest is missing (looked for in {src}, "
                                                     "where `fastfeed index` adopted the shards")):
        loader(tmp_path / "ds", fields=["txt"])
    (tmp_path / "moved").rename(src)
    write_tar(src / "a.tar", [("k0.jpg", jpeg(0)), ("k0.txt", bytes(20_000))])  # written again: another size
    with pytest.raises(DatasetError, match=re.escape(str(src / "a.tar")) + r" is \d+ bytes.*since it was indexed.*"
                                           "or index the shards again"):
        fastfeed.open_dataset(tmp_path / "ds")


def test_a_key_with_dots_is_rejected_saying_how_webdataset_splits_it(tmp_path):
    """Found by an adversarial run: ShardWriter with `__key__` "a.b.c" (a file name's stem used as key) writes
    a.b.c.jpg, which webdataset reads as key "a" with member "b.c.jpg"; index rejected it as "no image member
    (members: b.c.jpg, b.c.txt)", which does not say why a .jpg is not an image. The reason now says how the name was
    split and what to do; keys without dots beside it are adopted."""
    src = write_tar(tmp_path / "s" / "a.tar", [("a.b.c.jpg", jpeg(0)), ("a.b.c.txt", b"zero"),
                                               ("d/k1.jpg", jpeg(1)), ("d/k1.txt", b"one"),
                                               ("d/k.2.jpg", jpeg(2)), ("d/k.2.txt", b"two")]).parent
    report = index_shards(str(src))
    assert report.manifest.num_samples == 1
    reasons = {r["key"]: r["reason"] for r in report.rejected}
    assert set(reasons) == {"a", "d/k"}
    assert "so a.b.c.jpg is key a with member b.c.jpg; the writer's keys hold dots" in reasons["a"]
    assert "so d/k.2.jpg is key d/k with member 2.jpg" in reasons["d/k"]
