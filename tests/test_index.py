"""`fastfeed index` on shards written by the webdataset library itself, and `Loader(fields=...)` on them.

The oracle is what was written: every sample's image is a flat colour that names it, so a decoded image says which
sample it is, and its caption, JSON, array and label must be that sample's, through shuffling, DDP shares, resume and
replaced bad records.
"""
from __future__ import annotations

import hashlib
import io
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import webdataset as wds
from PIL import Image

import fastfeed
from fastfeed.formats.base import load_manifest
from fastfeed.pack.index import find_shards, index_shards
from fastfeed.pack.verify import verify
from fastfeed.types import DatasetError

N, PER_SHARD, SIZE = 40, 16, 32


def colour(i: int) -> tuple[int, int, int]:
    return (40 + 5 * i, 200 - 4 * i, (90 + 37 * i) % 256)


def jpeg(i: int) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (SIZE + i % 5, SIZE), colour(i)).save(buf, format="JPEG", quality=95)
    return buf.getvalue()


def sample(i: int) -> dict:
    return {"__key__": f"img/{i:05d}", "jpg": jpeg(i), "txt": f"a photo of sample {i}",
            "json": {"id": i, "tags": ["x"] * (i % 3)}, "npy": np.arange(4, dtype=np.float32) + i, "cls": i % 3}


def write_shards(folder: Path, samples) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    with wds.ShardWriter(str(folder / "part-%04d.tar"), maxcount=PER_SHARD, verbose=0) as sink:
        for s in samples:
            sink.write(s)
    return folder


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> Path:
    return write_shards(tmp_path_factory.mktemp("wds") / "shards", (sample(i) for i in range(N)))


@pytest.fixture(scope="module")
def adopted(shards, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("adopted") / "ds"
    index_shards(str(shards), str(out))
    return out


def which(images: torch.Tensor) -> list[int]:
    """The sample each decoded image shows (its flat colour, the nearest of colour(i))."""
    means = images.float().mean(dim=(2, 3)).numpy()
    table = np.array([colour(i) for i in range(N)], dtype=np.float64)
    return [int(np.argmin(((table - m) ** 2).sum(1))) for m in means]


def check_batch(batch: dict) -> list[int]:
    ids = which(batch["images"])
    for p, i in enumerate(ids):
        assert batch["txt"][p] == f"a photo of sample {i}"
        assert batch["json"][p] == {"id": i, "tags": ["x"] * (i % 3)}
        assert torch.equal(batch["npy"][p], torch.arange(4, dtype=torch.float32) + i)
        assert int(batch["cls"][p]) == int(batch["labels"][p])
        assert int(batch["labels"][p]) in (i % 3, fastfeed.IGNORE_INDEX)  # evaluation: replaced positions ignored
    return ids


def loader(path, **kw) -> fastfeed.Loader:
    kw = {"batch_size": 8, "image_size": 16, "device": "cpu", "decoder": "cpu", "dtype": torch.uint8,
          "fields": ["txt", "json", "npy", "cls"], **kw}
    return fastfeed.Loader(path, **kw)


def test_index_adopts_the_shards_without_changing_a_byte(shards, tmp_path):
    before = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in shards.glob("*.tar")}
    mtimes = {p.name: p.stat().st_mtime_ns for p in shards.glob("*.tar")}
    report = index_shards(str(shards), str(tmp_path / "ds"))
    m = report.manifest
    assert (m.num_samples, len(m.shards), m.rejected) == (N, 3, 0)
    assert m.fields == ["cls", "json", "npy", "txt"] and m.classes == ["0", "1", "2"]
    assert m.data_root == str(shards) and m.version == 4
    assert [s.sha256 for s in m.shards] == [before[n] for n in sorted(before)]
    assert {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in shards.glob("*.tar")} == before
    assert {p.name: p.stat().st_mtime_ns for p in shards.glob("*.tar")} == mtimes
    ds = fastfeed.open_dataset(tmp_path / "ds")
    assert list(ds.keys[:2]) == ["img/00000", "img/00001"]
    for i in range(N):  # every image's bytes are the JPEG the writer was given
        assert ds.read(i) == jpeg(i)
    assert verify(str(tmp_path / "ds")).ok
    from fastfeed.doctor.checks import check_manifest

    assert check_manifest(str(tmp_path / "ds"), gpu=False)[0].status == "OK"  # the shards in data_root


def test_index_beside_the_shards(tmp_path):
    src = write_shards(tmp_path / "s", (sample(i) for i in range(5)))
    index_shards(str(src))  # default: next to the shards
    assert sorted(p.name for p in src.iterdir()) == ["fastfeed.json", "part-0000.idx", "part-0000.tar",
                                                     "rejected.jsonl", "samples.npz"]
    assert fastfeed.open_dataset(src).manifest.data_root == ""
    with loader(src, train=False) as ld:
        assert sorted(i for b in ld for i in check_batch(b)) == list(range(5))


def test_every_sample_comes_with_its_own_fields_shuffled_and_in_evaluation(adopted):
    for train in (True, False):
        with loader(adopted, train=train, drop_last=False) as ld:
            seen = [i for b in ld for i in check_batch(b)]
        assert sorted(seen) == list(range(N))


def test_ddp_shares_and_resume_keep_each_field_with_its_image(adopted):
    shares = []
    for rank in (0, 1):
        with loader(adopted, rank=rank, world_size=2, drop_last=False) as ld:
            shares.append([i for b in ld for i in check_batch(b)])
    assert sorted(shares[0] + shares[1]) == list(range(N)) and not set(shares[0]) & set(shares[1])

    with loader(adopted, seed=3) as ld:
        full = [check_batch(b) for b in ld]
    with loader(adopted, seed=3) as ld:
        it = iter(ld)
        first = [check_batch(next(it)) for _ in range(2)]
        state = ld.state_dict()
    with loader(adopted, seed=3) as ld:
        ld.load_state_dict(state)
        rest = [check_batch(b) for b in ld]
    assert first + rest == full


def test_ragged_arrays_and_other_members_come_as_lists(tmp_path):
    def s(i):
        return {"__key__": f"k{i}", "png": _png(i), "npy": np.zeros(i + 1, np.int16), "seg.png": _png(i + 1),
                "cls": i}
    src = write_shards(tmp_path / "s", (s(i) for i in range(3)))
    index_shards(str(src))
    with fastfeed.Loader(src, batch_size=3, train=False, image_size=8, device="cpu", decoder="cpu",
                         fields=["npy", "seg.png"]) as ld:
        (b,) = list(ld)
    assert [a.tolist() for a in b["npy"]] == [[0], [0, 0], [0, 0, 0]]
    assert b["seg.png"] == [_png(1), _png(2), _png(3)]  # a second image: its bytes, as stored


def _png(i: int) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (8, 8), colour(i)).save(buf, format="PNG")
    return buf.getvalue()


def test_broken_samples_are_rejected_by_name_and_the_rest_adopted(tmp_path):
    good = [sample(i) for i in range(4)]
    bad = [
        {"__key__": "no-image", "txt": "only a caption"},
        {"__key__": "cut", "jpg": jpeg(5)[:300], "cls": 1},
        {"__key__": "webp", "webp": b"RIFF\x00\x00\x00\x00WEBPVP8 ", "cls": 1},
        {"__key__": "bad-label", "jpg": jpeg(6), "cls": "seven"},
    ]
    src = write_shards(tmp_path / "s", good[:2] + bad + good[2:])
    report = index_shards(str(src))
    reasons = {r["key"]: r["reason"] for r in report.rejected}
    assert set(reasons) == {"no-image", "cut", "webp", "bad-label"}
    assert "no image member" in reasons["no-image"] and "webp" in reasons["webp"]
    assert "integer" in reasons["bad-label"]
    assert report.manifest.num_samples == 4 and report.manifest.rejected == 4
    rejected = [json.loads(line) for line in (src / "rejected.jsonl").read_text().splitlines()]
    assert {r["key"] for r in rejected} == set(reasons)


def test_verify_names_members_as_a_tar_reader_does(tmp_path):
    """Found by an adversarial run: webdataset (tarfile) writes a non-ASCII name as '?' in the header's own name
    field and the real one in a PAX record; verify called every such sample corrupt."""
    keys = ["plain", "café", "日本語"]
    src = write_shards(tmp_path / "s", ({**sample(i), "__key__": k} for i, k in enumerate(keys)))
    index_shards(str(src), str(tmp_path / "ds"))
    report = verify(str(tmp_path / "ds"), quick=True)
    assert report.ok, report.errors
    assert list(fastfeed.open_dataset(tmp_path / "ds").keys) == ["plain", "café", "日本語"]


def test_a_pickled_member_is_rejected_by_name_and_its_sample_adopted_without_it(tmp_path):
    """Found by an adversarial run: one `.pyd` (what ShardWriter writes for a Python object) anywhere failed the
    whole index, naming no shard or sample."""
    def s(i):
        extra = {"pyd": {"extra": i}} if i == 3 else {"pickle": [i]} if i == 5 else {}
        return {**sample(i), **extra}

    src = write_shards(tmp_path / "s", (s(i) for i in range(8)))
    report = index_shards(str(src))
    assert [(r["source"], r["reason"][:52]) for r in report.rejected] == [
        ("part-0000.tar:img/00003.pyd", "field 'pyd': pickled members are never read from a d"),
        ("part-0000.tar:img/00005.pickle", "field 'pickle': pickled members are never read from ")]
    assert report.manifest.num_samples == 8 and report.manifest.fields == ["cls", "json", "npy", "txt"]
    with loader(src, train=False) as ld:
        assert sorted(i for b in ld for i in check_batch(b)) == list(range(8))


def test_a_truncated_shard_keeps_the_samples_before_the_cut(tmp_path):
    src = write_shards(tmp_path / "s", (sample(i) for i in range(PER_SHARD)))
    tar = src / "part-0000.tar"
    data = tar.read_bytes()
    tar.write_bytes(data[: len(data) // 2])
    report = index_shards(str(src))
    assert 0 < report.manifest.num_samples < PER_SHARD
    assert any("truncated" in r["reason"] or "damaged" in r["reason"] for r in report.rejected)
    with loader(src, train=False) as ld:
        assert sorted(i for b in ld for i in check_batch(b)) == list(range(report.manifest.num_samples))


@pytest.mark.parametrize("decoder", ["cpu-pil", "cpu-dali"])
def test_images_only_pil_reads_are_adopted_as_they_are(tmp_path, decoder):
    """A CMYK or RGB-colour JPEG, a 16-bit or transparent PNG, a TIFF, a GIF, a TGA (no signature: its member's
    extension names it): adopted without a byte changed,
    marked `pil_only`, and decoded as torchvision reads them on every path (DALI's hands them to PIL); a JPEG only
    its fix makes readable is rejected by name, since a shard is never rewritten."""
    from odd_images.build import build_corpus
    from odd_images.reference import reference_eval

    cases = {c.name: c for c in build_corpus(str(tmp_path / "odd"))}
    names = ["jpeg_cmyk.jpg", "jpeg_rgb_adobe.jpg", "jpeg_baseline.jpg", "png_rgb16.png", "png_rgba.png",
             "tiff_cmyk.tif", "gif_animated.gif", "tga_rle.tga", "png_rgb.png", "jpeg_junk_after_soi.jpg"]
    ext = {".jpg": "jpg", ".png": "png", ".tif": "tif", ".gif": "gif", ".tga": "tga"}
    samples = [{"__key__": f"s{i}", ext[Path(n).suffix]: Path(cases[n].path).read_bytes(), "cls": i % 2}
               for i, n in enumerate(names)]
    src = write_shards(tmp_path / "s", samples)
    before = {p.name: p.read_bytes() for p in src.glob("*.tar")}
    report = index_shards(str(src))
    assert {p.name: p.read_bytes() for p in src.glob("*.tar")} == before
    assert [r["key"] for r in report.rejected] == ["s9"] and "never rewrites" in report.rejected[0]["reason"]
    adopted = names[:-1]
    assert report.manifest.pil_only == sum(cases[n].pil_only for n in adopted) == 7
    ds = fastfeed.open_dataset(src)
    assert [bool(v) for v in ds.pil_only] == [cases[n].pil_only for n in adopted]
    assert [ds.read(i) for i in range(len(ds))] == [Path(cases[n].path).read_bytes() for n in adopted]
    assert verify(str(src)).ok
    with fastfeed.Loader(src, batch_size=len(adopted), train=False, image_size=32, device="cpu", decoder=decoder,
                         dtype=torch.uint8, shuffle=False, drop_last=False, on_error="raise") as ld:
        images, _ = next(iter(ld))
    for img, n in zip(images.permute(0, 2, 3, 1).numpy().astype(np.int16), adopted):
        ref = reference_eval(Path(cases[n].path).read_bytes(), 32).astype(np.int16)
        assert np.abs(img - ref).mean() < 2.0, n


def test_a_missing_or_damaged_member_is_a_bad_record(tmp_path):
    samples = [sample(i) for i in range(8)]
    del samples[3]["txt"]
    src = write_shards(tmp_path / "s", samples)
    index_shards(str(src))
    ds = fastfeed.open_dataset(src)
    fe = ds.field_extents("json")
    k = 5
    with open(ds.file_of(k), "r+b") as f:  # flip a byte of sample 5's JSON after indexing
        f.seek(int(fe.offset[k]))
        f.write(b"X")
    img = ds.extents()
    with open(ds.file_of(6), "r+b") as f:  # and one in the middle of sample 6's image
        f.seek(int(img.offset[6] + img.size[6] // 2))
        f.write(bytes([f.read(1)[0] ^ 0xFF]))
    with loader(src, train=False, batch_size=8) as ld:
        (b,) = list(ld)
        stats = ld.stats()
    ids = which(b["images"])
    assert not {3, 5, 6} & set(ids)  # their positions hold other samples, with those samples' fields
    check_batch(b)
    assert stats["skipped"]["by_reason"] == {"missing_field": 1, "checksum": 2}
    assert (b["labels"] == fastfeed.IGNORE_INDEX).sum() == 3
    # the image checksums were the ring's digests of each read's image member
    assert stats["ring"]["digests"] is True and stats["ring"]["digest_seconds"] > 0
    with loader(src, train=False, batch_size=8, on_error="raise") as ld:
        with pytest.raises(fastfeed.LoaderError, match="img/00003"):
            list(ld)
    report = verify(str(src), quick=True)
    assert not report.ok and any("img/00005" in e and ".json" in e for e in report.errors)


def test_fields_are_checked_before_anything_is_read(adopted, wds_path, lmdb_path):
    with pytest.raises(ValueError, match=r"no \['caption'\] member; they carry \['cls', 'json', 'npy', 'txt'\]"):
        loader(adopted, fields=["caption"])
    with pytest.raises(ValueError, match="pickled"):
        loader(adopted, fields=["pyd"])
    with pytest.raises(ValueError, match="distinct"):
        loader(adopted, fields=["txt", "txt"])
    with pytest.raises(ValueError, match="WebDataset"):
        fastfeed.Loader(lmdb_path, batch_size=4, fields=["json"], device="cpu")
    with loader(wds_path, fields=["cls"], batch_size=4, train=False) as ld:  # a packed dataset's label as a field
        b = next(iter(ld))
    assert torch.equal(b["cls"], b["labels"])


def test_index_takes_globs_and_brace_patterns(shards):
    root, rels = find_shards(str(shards / "part-{0000..0002}.tar"))
    assert (root, rels) == (str(shards), ["part-0000.tar", "part-0001.tar", "part-0002.tar"])
    assert find_shards(str(shards / "part-000[01].tar"))[1] == ["part-0000.tar", "part-0001.tar"]
    with pytest.raises(DatasetError, match=r"no such shard .*part-0008.tar \(and 1 more\)"):
        find_shards(str(shards / "part-{0008..0009}.tar"))


def test_a_folder_s_shards_are_found_in_either_case(tmp_path):
    """Found by an adversarial run: a shard named `.TAR` in a folder was left out without a word."""
    write_shards(tmp_path / "s", (sample(i) for i in range(PER_SHARD + 2)))
    (tmp_path / "s" / "part-0001.tar").rename(tmp_path / "s" / "part-0001.TAR")
    assert find_shards(str(tmp_path / "s"))[1] == ["part-0000.tar", "part-0001.TAR"]
    report = index_shards(str(tmp_path / "s"))
    assert report.manifest.num_samples == PER_SHARD + 2 and (tmp_path / "s" / "part-0001.idx").exists()
    assert verify(str(tmp_path / "s"), quick=True).ok


def test_compressed_shards_are_refused_by_name(tmp_path):
    """webdataset reads .tar.gz shards; their members have no byte range to read in place, so index names the file
    and says what to do, from a folder, a pattern and a URL, rather than "no shards" or a damaged tar."""
    import fsspec

    folder = tmp_path / "gz"
    folder.mkdir()
    for k in range(2):
        with wds.TarWriter(str(folder / f"part-{k}.tar.gz")) as sink:
            sink.write(sample(k))
    for src in (str(folder), str(folder / "part-{0..1}.tar.gz")):
        with pytest.raises(DatasetError, match=r"part-0.tar.gz \(and 1 more\) is a compressed tar.*decompress"):
            index_shards(src, str(tmp_path / "out"))
    assert not (tmp_path / "out").exists()
    fs = fsspec.filesystem("memory")
    fs.pipe(f"/gz-{tmp_path.name}/part-0.tgz", (folder / "part-0.tar.gz").read_bytes())
    with pytest.raises(DatasetError, match=r"part-0.tgz is a compressed tar"):
        index_shards(f"memory:///gz-{tmp_path.name}/", str(tmp_path / "out"))
    # Beside .tar shards too: indexing only those would leave the compressed shards' samples out without a word.
    with wds.TarWriter(str(folder / "part-2.tar")) as sink:
        sink.write(sample(2))
    fs.pipe(f"/gz-{tmp_path.name}/part-2.tar", (folder / "part-2.tar").read_bytes())
    for src in (str(folder), f"memory:///gz-{tmp_path.name}/"):
        with pytest.raises(DatasetError, match=r"is a compressed tar.*name only the .tar ones"):
            index_shards(src, str(tmp_path / "out"))
    assert index_shards(str(folder / "*.tar"), str(tmp_path / "out")).manifest.num_samples == 1


def test_samples_without_a_cls_beside_labelled_ones_are_counted_and_warned(tmp_path):
    """Their label is -1, which a classification loss refuses mid-epoch: index says so up front."""
    samples = [dict(sample(i), **({} if i % 4 == 0 else {"cls": 1})) for i in range(8)]
    for s in samples[::4]:
        s.pop("cls")
    folder = write_shards(tmp_path / "s", samples)
    proc = subprocess.run([sys.executable, "-m", "fastfeed.cli", "index", str(folder), str(tmp_path / "ds")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "warning: 2 of 8 samples have no cls member: their label is -1" in proc.stderr
    m = load_manifest(str(tmp_path / "ds"))
    assert m.extra == {"without_cls": 2}
    labels = np.load(tmp_path / "ds" / "samples.npz")["label"]
    assert sorted(labels.tolist()) == [-1, -1] + [1] * 6
    # Image-text shards, no sample with a cls: nothing to warn about.
    folder = write_shards(tmp_path / "t", [{k: v for k, v in sample(i).items() if k != "cls"} for i in range(4)])
    assert index_shards(str(folder), str(tmp_path / "dt")).manifest.extra == {}


def test_fields_some_samples_lack_are_counted_and_inspect_says_so(tmp_path):
    """Loader(fields=["txt"]) skips a sample without its .txt as a bad record: inspect says how many lack it."""
    samples = [{k: v for k, v in sample(i).items() if not (k == "txt" and i % 3 == 0)} for i in range(9)]
    m = index_shards(str(write_shards(tmp_path / "s", samples)), str(tmp_path / "ds")).manifest
    assert m.extra == {"without_field": {"txt": 3}}
    proc = subprocess.run([sys.executable, "-m", "fastfeed.cli", "inspect", str(tmp_path / "ds")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "fields:      cls, json, npy, txt (missing in 3)" in proc.stdout, proc.stdout


def test_the_shards_pack_wrote_for_segmentation_are_adopted(tmp_path):
    """pack writes `cls` -1 ("no class label") into detection and segmentation shards: index adopts those shards as
    they are (copied without their manifest), and their masks load; another negative label is still rejected."""
    import shutil

    from conftest import run_pack
    from test_segment_loader import _png, check_masks_against_pixels, make_scene

    rng = np.random.default_rng(4)
    for d in ("img", "masks"):
        (tmp_path / d).mkdir()
    for i in range(6):
        img, mask = make_scene(rng, 70, 50)
        Image.fromarray(img).save(tmp_path / "img" / f"{i}.png")
        (tmp_path / "masks" / f"{i}.png").write_bytes(_png(mask))
    run_pack(tmp_path / "img", tmp_path / "out", "--masks", str(tmp_path / "masks"))
    (tmp_path / "copy").mkdir()
    for tar in (tmp_path / "out").glob("*.tar"):
        shutil.copy(tar, tmp_path / "copy")
    report = index_shards(str(tmp_path / "copy"), str(tmp_path / "ds"))
    assert len(report.manifest.shards) >= 1 and not report.rejected
    # their cls members (all -1) label nothing, so they are not offered as a field: the fields pack lists
    assert "cls" not in report.manifest.fields
    assert report.manifest.fields == load_manifest(str(tmp_path / "out")).fields
    loader = fastfeed.Loader(tmp_path / "ds", task="semantic", batch_size=3, image_size=64, train=False,
                             device="cpu", dtype=torch.uint8)
    assert sum(check_masks_against_pixels(b) for b in loader) > 100 and len(loader.dataset) == 6
    loader.close()
    samples = [dict(sample(i), cls=-2 if i == 0 else 1) for i in range(3)]
    got = index_shards(str(write_shards(tmp_path / "neg", samples)), str(tmp_path / "dn"))
    assert [r["reason"] for r in got.rejected] == ["img/00000.cls holds a negative label (-2; -1 alone means none)"]


@pytest.mark.integration
def test_cli_index(shards, tmp_path):
    cmd = [sys.executable, "-m", "fastfeed.cli", "index", str(shards), str(tmp_path / "ds")]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert f"indexed {N} samples in 3 shard(s), 3 classes, fields cls, json, npy, txt; 0 rejected" in proc.stdout
    again = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert again.returncode == 2 and "already holds a dataset" in again.stderr


def test_shards_at_a_url_are_adopted_where_they_lie(tmp_path, monkeypatch):
    """Shards at an fsspec URL (memory://, in this process; tests/test_remote.py does it on an S3 server): indexed
    into a local folder, into another URL, and beside them; each reads every sample with its own fields through the
    shard cache, `verify` passes, and no shard object is written."""
    import fsspec

    fs = fsspec.filesystem("memory")
    base = f"/adopt-{tmp_path.name}"
    local = write_shards(tmp_path / "s", (sample(i) for i in range(N)))
    for p in sorted(local.glob("*.tar")):
        fs.pipe(f"{base}/shards/{p.name}", p.read_bytes())
    before = {p: fs.cat(p) for p in fs.find(f"{base}/shards")}
    monkeypatch.setenv("FASTFEED_CACHE", str(tmp_path / "cache"))
    url = f"memory://{base}/shards"
    outs = [str(tmp_path / "ds"), f"memory://{base}/index", None]
    for out in outs:
        report = index_shards(url + "/", out)
        assert report.manifest.num_samples == N and report.manifest.data_root == ("" if out is None else url)
    assert {p: fs.cat(p) for p in fs.find(f"{base}/shards") if p.endswith(".tar")} == before
    from fastfeed.doctor.checks import run_checks

    doctor = {c.name: c for c in run_checks(str(tmp_path / "ds"))}
    assert doctor["manifest"].status == "OK" and f"{N} samples" in doctor["manifest"].message
    for where in (str(tmp_path / "ds"), f"memory://{base}/index", url):
        assert verify(where).ok, where
        with loader(where, train=False, shuffle=False, drop_last=False) as ld:
            assert sorted(i for b in ld for i in check_batch(b)) == list(range(N))
    with pytest.raises(DatasetError, match="open it with fastfeed.open_dataset"):
        from fastfeed.formats import open_local

        open_local(tmp_path / "ds")
    with pytest.raises(DatasetError, match="reads its shards from a URL"):
        index_shards(str(local), f"memory://{base}/elsewhere")
    with pytest.raises(DatasetError, match="no such shard"):
        index_shards(f"memory://{base}/shards/part-{{0000..0009}}.tar", str(tmp_path / "ds2"))
