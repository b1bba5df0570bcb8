"""What pack refuses rather than packs wrong: an archive is never taken for the image it holds (a tar's first member
starts 512 bytes in, where "leading junk" before a JPEG would be dropped), and a pack that stores no sample fails
and leaves no manifest, so no reader or `fastfeed verify` takes the folder for a dataset."""
from __future__ import annotations

import io
import json
import tarfile
import zipfile

import numpy as np
import pytest
from PIL import Image

from fastfeed.cli import main as cli
from fastfeed.pack import PackError, PackOptions, merge, pack, wds_native
from fastfeed.pack.native import HAVE_NATIVE_WRITER
from fastfeed.types import MANIFEST_NAME

NATIVE = [False, True] if HAVE_NATIVE_WRITER else [False]


def _jpeg(seed: int, size=(40, 32)) -> bytes:
    buf = io.BytesIO()
    px = np.random.default_rng(seed).integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
    Image.fromarray(px).save(buf, "JPEG", quality=90)
    return buf.getvalue()


def _tar(members: dict[str, bytes], fmt: int) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=fmt) as t:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _zip(members: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as z:  # stored: the JPEG's bytes lie in the archive as is
        for name, data in members.items():
            z.writestr(name, data)
    return buf.getvalue()


def _rejected(out) -> dict[str, str]:
    return {json.loads(x)["path"].rsplit("/", 1)[1]: json.loads(x)["reason"]
            for x in (out / "rejected.jsonl").read_text().splitlines()}


@pytest.mark.parametrize("native", NATIVE, ids=lambda n: "native" if n else "python")
def test_archives_holding_a_jpeg_are_rejected_by_name_not_repaired(tmp_path, monkeypatch, native):
    """Each archive's JPEG lies within the first KB; the one real JPEG beside them is the only sample. A member
    named like a BMP ("BM...") makes the tar's first bytes a BMP signature too."""
    monkeypatch.setattr(wds_native, "ENABLED", native)
    src = tmp_path / "src"
    src.mkdir()
    photo = _jpeg(0)
    (src / "photo.jpg").write_bytes(photo)
    (src / "00000.tar").write_bytes(_tar({"000000000.jpg": _jpeg(1), "000000000.txt": b"a caption"},
                                         tarfile.USTAR_FORMAT))
    (src / "gnu.tar").write_bytes(_tar({"BM_0001.jpg": _jpeg(2)}, tarfile.GNU_FORMAT))
    (src / "pax.jpg").write_bytes(_tar({"x.jpg": _jpeg(3)}, tarfile.PAX_FORMAT))  # the name does not matter
    (src / "shots.zip").write_bytes(_zip({"a.jpg": _jpeg(4)}))
    # Not an archive: 512 bytes of zeros (no tar magic) before a JPEG stay junk that is dropped.
    (src / "padded.jpg").write_bytes(bytes(512) + _jpeg(5))
    out = tmp_path / "out"
    m = pack(str(src), str(out), PackOptions(shuffle_seed=None)).manifest
    assert m.num_samples == 2 and m.changes == {"dropped_leading_junk": 1}
    got = _rejected(out)
    assert sorted(got) == ["00000.tar", "gnu.tar", "pax.jpg", "shots.zip"]
    for name in ("00000.tar", "gnu.tar", "pax.jpg"):
        assert got[name].startswith("not an image: a tar archive") and "`fastfeed index`" in got[name], got[name]
    assert got["shots.zip"] == "not an image: a ZIP archive"
    table = np.load(out / "samples.npz")
    assert sorted(table["source"]) == ["padded.jpg", "photo.jpg"]
    stored = dict(zip(table["source"], table["size"]))
    assert stored["photo.jpg"] == len(photo)


def test_a_flat_folder_of_webdataset_shards_says_to_index_them(tmp_path, capsys):
    """`--source flat` (and 'auto', which reads a folder without subfolders as flat) over shards only: every file
    is rejected by name, so nothing is packed and the error quotes the reason."""
    src = tmp_path / "shards"
    src.mkdir()
    for s in range(2):
        (src / f"{s:05d}.tar").write_bytes(_tar({f"{s}{j:04d}.jpg": _jpeg(10 * s + j) for j in range(3)},
                                                tarfile.USTAR_FORMAT))
    for source in ("flat", "auto"):
        out = tmp_path / f"out-{source}"
        assert cli(["pack", str(src), str(out), "--source", source, "--quiet"]) == 2
        err = capsys.readouterr().err
        assert "nothing was packed" in err and "2 x not an image: a tar archive" in err and "fastfeed index" in err
        assert not (out / MANIFEST_NAME).exists()
        assert all("tar archive" in r for r in _rejected(out).values()) and len(_rejected(out)) == 2


@pytest.mark.parametrize("fmt", ["wds", "lmdb"])
def test_a_pack_that_stores_nothing_fails_and_leaves_no_dataset(tmp_path, capsys, fmt):
    src = tmp_path / "src"
    src.mkdir()
    (src / "notes.jpg").write_text("not a picture\n" * 10)
    (src / "empty.png").write_bytes(b"")
    out = tmp_path / "out"
    assert cli(["pack", str(src), str(out), "--format", fmt, "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "nothing was packed" in err and str(out / "rejected.jsonl") in err and "no dataset was written" in err
    assert _rejected(out) == {"notes.jpg": "not an image (unknown file signature)", "empty.png": "empty file (0 bytes)"}
    assert not (out / MANIFEST_NAME).exists() and not (out / "samples.npz").exists()
    assert not (out / ".fastfeed-pack").exists()  # finished: nothing for --resume to take up
    assert cli(["verify", str(out)]) != 0 and cli(["inspect", str(out)]) != 0
    capsys.readouterr()
    # The folder is fastfeed's: a second try needs --overwrite (and fails the same way); --resume has nothing to do.
    assert cli(["pack", str(src), str(out), "--format", fmt, "--quiet"]) == 2
    assert "--overwrite" in capsys.readouterr().err
    assert cli(["pack", str(src), str(out), "--format", fmt, "--quiet", "--resume"]) == 2
    assert "no interrupted pack" in capsys.readouterr().err
    assert cli(["pack", str(src), str(out), "--format", fmt, "--quiet", "--overwrite"]) == 2
    assert "nothing was packed" in capsys.readouterr().err
    # Once the source holds an image, --overwrite packs it.
    (src / "photo.jpg").write_bytes(_jpeg(0))
    assert cli(["pack", str(src), str(out), "--format", fmt, "--quiet", "--overwrite"]) == 0
    assert json.loads((out / MANIFEST_NAME).read_text())["num_samples"] == 1


def test_an_empty_source_is_an_error(tmp_path):
    (tmp_path / "src").mkdir()
    with pytest.raises(PackError, match="nothing was packed: the source holds no file to pack"):
        pack(str(tmp_path / "src"), str(tmp_path / "out"), PackOptions())
    assert not (tmp_path / "out" / MANIFEST_NAME).exists()


def test_a_part_may_store_nothing_but_the_merged_dataset_may_not(tmp_path):
    """Part 0's slice (unshuffled: the first file) is all rejected: the part is written, the merge holds part 1's
    sample. When every part is empty, the merge fails instead of writing an empty dataset."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.jpg").write_text("not a picture")
    (src / "b.jpg").write_bytes(_jpeg(0))
    out = tmp_path / "out"
    for part in range(2):
        pack(str(src), str(out), PackOptions(shuffle_seed=None, num_parts=2, part=part))
    assert json.loads((out / "part-00000" / MANIFEST_NAME).read_text())["num_samples"] == 0
    assert merge(str(out)).num_samples == 1

    (src / "b.jpg").write_text("not a picture either")
    out = tmp_path / "out2"
    for part in range(2):
        pack(str(src), str(out), PackOptions(shuffle_seed=None, num_parts=2, part=part))
    with pytest.raises(PackError, match="nothing was packed: every file was rejected"):
        merge(str(out))
    assert not (out / MANIFEST_NAME).exists()
    assert sorted(_rejected(out)) == ["a.jpg", "b.jpg"]
    assert (out / "part-00000" / MANIFEST_NAME).exists() and (out / "part-00001" / MANIFEST_NAME).exists()
