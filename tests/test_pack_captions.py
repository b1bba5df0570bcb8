"""`fastfeed pack` of an image-text list: a CSV or JSONL with a path column, a caption column and any others. The
caption becomes each sample's `KEY.txt` member, the other columns its `KEY.json`, so nothing in the list is lost,
and `Loader(fields=["txt", "json"])` hands them out with the images, as webdataset's readers see them too."""
from __future__ import annotations

import csv
import io
import json
import tarfile

import numpy as np
import pytest
from conftest import run_pack
from PIL import Image

import fastfeed
from fastfeed.cli import main as cli
from fastfeed.pack import verify, wds_native
from fastfeed.pack.native import HAVE_NATIVE_WRITER

CAPTIONS = ["a red bus, ünïcode", "", "two dogs\nand a line break", 'quotes "and, commas"', "x" * 3000, "end"]


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    root = tmp_path_factory.mktemp("captions")
    rng = np.random.default_rng(0)
    for i in range(len(CAPTIONS)):
        Image.fromarray(rng.integers(0, 255, (30 + i, 40, 3), dtype=np.uint8)).save(root / f"im{i}.jpg", quality=90)
    return root


def write_csv(root, rows, header=("path", "caption", "label", "url", "width")):
    with open(root / "list.csv", "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(header)
        w.writerows(rows)
    return root / "list.csv"


def members(out) -> dict[str, bytes]:
    """Every member of every shard, by name."""
    got = {}
    for shard in sorted(out.glob("*.tar")):
        with tarfile.open(shard) as tar:
            got.update({m.name: tar.extractfile(m).read() for m in tar.getmembers()})
    return got


@pytest.mark.parametrize("native", [False, True] if HAVE_NATIVE_WRITER else [False], ids=["python", "native"])
def test_a_csv_list_keeps_its_captions_and_columns(photos, tmp_path, monkeypatch, native):
    monkeypatch.setattr(wds_native, "ENABLED", native)
    rows = [[f"im{i}.jpg", c, i % 2, f"http://x/{i}", 40] for i, c in enumerate(CAPTIONS)]
    src = write_csv(photos, rows)
    out = tmp_path / "out"
    run_pack(src, out, "--format", "wds")
    got = members(out)
    for i, caption in enumerate(CAPTIONS):  # keys are the rows' positions, zero-padded
        key = next(n[:-4] for n in got if n.endswith(".txt") and got[n] == caption.encode())
        assert json.loads(got[key + ".json"]) == {"url": f"http://x/{i}", "width": "40"}
        assert got[key + ".cls"] == b"%d" % (i % 2)
    assert sum(n.endswith(".txt") for n in got) == len(CAPTIONS)
    assert fastfeed.open_dataset(out).fields == ["cls", "txt", "json"]
    loader = fastfeed.Loader(out, batch_size=4, image_size=32, device="cpu", train=False, fields=["txt", "json"])
    seen = {}
    for batch in loader:
        for text, meta, label in zip(batch["txt"], batch["json"], batch["labels"].tolist()):
            seen[text] = (meta["url"], label)
    assert seen == {c: (f"http://x/{i}", i % 2) for i, c in enumerate(CAPTIONS)}
    loader.close()
    assert verify(str(out)).ok


def test_jsonl_rows_without_the_caption_are_rejected_by_name(photos, tmp_path):
    lines = [{"path": f"im{i}.jpg", "text": c, "score": i / 10} for i, c in enumerate(CAPTIONS)]
    del lines[2]["text"]
    src = photos / "list.jsonl"
    src.write_text("".join(json.dumps(x) + "\n" for x in lines))
    out = tmp_path / "out"
    run_pack(src, out, "--format", "wds")
    rejected = [json.loads(x) for x in (out / "rejected.jsonl").read_text().splitlines()]
    assert len(rejected) == 1 and rejected[0]["path"] == "im2.jpg" and "no caption" in rejected[0]["reason"]
    got = members(out)
    assert sorted(v.decode() for n, v in got.items() if n.endswith(".txt")) == sorted(
        c for i, c in enumerate(CAPTIONS) if i != 2)
    assert all(set(json.loads(v)) == {"score"} for n, v in got.items() if n.endswith(".json"))


def test_captions_need_webdataset_shards_and_columns_must_not_clash(photos, tmp_path):
    src = write_csv(photos, [["im0.jpg", "a", 0, "u", 1]])
    with pytest.raises(Exception, match="WebDataset shards"):
        run_pack(src, tmp_path / "lmdb", "--format", "lmdb")
    src = write_csv(photos, [["im0.jpg", "a", '{"url": "v"}', "u"], ["im1.jpg", "b", "", "w"]],
                    header=("path", "caption", "metadata", "url"))
    out = tmp_path / "clash"
    run_pack(src, out, "--format", "wds")
    rejected = [json.loads(x) for x in (out / "rejected.jsonl").read_text().splitlines()]
    assert len(rejected) == 1 and "also keys of its metadata" in rejected[0]["reason"]


def make_img2dataset_files(root, photos, n_shards: int = 2, per_shard: int = 3) -> dict[str, str]:
    """img2dataset's `files` output (output_format="files"): per shard a folder NNNNN of KEY.jpg, KEY.txt, KEY.json
    and, at the top, NNNNN_stats.json and NNNNN.parquet. Returns each image's caption by its path in the tree."""
    import shutil

    captions, k = {}, 0
    for s in range(n_shards):
        folder = root / f"{s:05d}"
        folder.mkdir(parents=True)
        for _ in range(per_shard):
            key = f"{s:05d}{k:04d}"
            shutil.copy(photos / f"im{k % len(CAPTIONS)}.jpg", folder / f"{key}.jpg")
            (folder / f"{key}.txt").write_text(CAPTIONS[k % len(CAPTIONS)], encoding="utf-8")
            (folder / f"{key}.json").write_text(json.dumps({"url": f"http://x/{k}", "key": key, "status": "success",
                                                            "width": 40}))
            captions[f"{s:05d}/{key}.jpg"] = CAPTIONS[k % len(CAPTIONS)]
            k += 1
        (root / f"{s:05d}_stats.json").write_text(json.dumps({"count": per_shard, "successes": per_shard}))
        (root / f"{s:05d}.parquet").write_bytes(b"PAR1 not read")
    return captions


def make_img2dataset_webdataset(root, photos, n_shards: int = 2, per_shard: int = 5) -> None:
    """img2dataset's default `webdataset` output: per shard NNNNN.tar of KEY.jpg, KEY.txt, KEY.json, with
    NNNNN.parquet and NNNNN_stats.json beside it."""
    root.mkdir(parents=True)
    for s in range(n_shards):
        with tarfile.open(root / f"{s:05d}.tar", "w") as tar:
            for j in range(per_shard):
                key = f"{s:05d}{j:04d}"
                for ext, data in (("jpg", (photos / f"im{j % len(CAPTIONS)}.jpg").read_bytes()),
                                  ("txt", f"caption {key}".encode()), ("json", json.dumps({"key": key}).encode())):
                    info = tarfile.TarInfo(f"{key}.{ext}")
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
        (root / f"{s:05d}_stats.json").write_text(json.dumps({"count": per_shard, "successes": per_shard}))
        (root / f"{s:05d}.parquet").write_bytes(b"PAR1 not read")


def test_img2dataset_webdataset_output_is_refused_and_indexed_instead(photos, tmp_path, capsys):
    """Its shards are tars, not images: --source img2dataset names the format and `fastfeed index`, 'auto' rejects
    each tar by name and fails with nothing packed (no empty dataset either way); `fastfeed index` then adopts every
    sample with its caption."""
    src = tmp_path / "i2d"
    make_img2dataset_webdataset(src, photos)
    assert cli(["pack", str(src), str(tmp_path / "out"), "--source", "img2dataset", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "img2dataset's webdataset output" in err and f"`fastfeed index {src}`" in err
    assert not (tmp_path / "out").exists()
    assert cli(["pack", str(src), str(tmp_path / "auto"), "--quiet"]) == 2
    assert "nothing was packed" in capsys.readouterr().err
    assert not (tmp_path / "auto" / "fastfeed.json").exists()
    reasons = {json.loads(x)["path"]: json.loads(x)["reason"]
               for x in (tmp_path / "auto" / "rejected.jsonl").read_text().splitlines()}
    assert all("tar archive" in reasons[str(src / f"{s:05d}.tar")] for s in range(2))

    assert cli(["index", str(src)]) == 0
    with fastfeed.open_dataset(src) as ds:
        assert len(ds) == 10
    loader = fastfeed.Loader(src, batch_size=5, image_size=32, device="cpu", train=False, fields=["txt"])
    assert sorted(t for batch in loader for t in batch["txt"]) == [f"caption {s:05d}{j:04d}" for s in range(2)
                                                                   for j in range(5)]
    loader.close()


def test_img2dataset_source_without_shard_folders_is_an_error(tmp_path):
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "00000_stats.json").write_text("{}")
    with pytest.raises(RuntimeError, match="not img2dataset's \"files\" output: no numbered shard folders"):
        run_pack(tmp_path / "src", tmp_path / "out", "--source", "img2dataset")


def test_img2dataset_files_output_packs_with_captions_and_json(photos, tmp_path):
    """Recognised by its layout; each image with its caption (.txt, byte for byte) and JSON; a caption without its
    image, an image without its caption and a broken JSON are rejections naming the file."""
    src = tmp_path / "i2d"
    captions = make_img2dataset_files(src, photos)
    (src / "00000" / "000000099.txt").write_text("an orphan caption")
    (src / "00001" / "000010004.txt").unlink()  # its image stays, without a caption
    (src / "00001" / "000010005.json").write_text("{broken")
    out = tmp_path / "out"
    run_pack(src, out, "--format", "wds")
    lines = (out / "rejected.jsonl").read_text().splitlines()
    rejected = {json.loads(x)["path"]: json.loads(x)["reason"] for x in lines}
    assert rejected == {str(src / "00000" / "000000099.txt"): "no image beside it",
                        str(src / "00001" / "000010004.jpg"): "no caption (.txt) beside it",
                        str(src / "00001" / "000010005.json"): rejected[str(src / "00001" / "000010005.json")]}
    assert rejected[str(src / "00001" / "000010005.json")].startswith("unreadable JSON")
    got = members(out)
    texts = sorted(v for n, v in got.items() if n.endswith(".txt"))
    assert texts == sorted(captions[p].encode() for p in captions if not p.endswith(("10004.jpg", "10005.jpg")))
    loader = fastfeed.Loader(out, batch_size=2, image_size=32, device="cpu", train=False, fields=["txt", "json"])
    pairs = {meta["key"]: text for batch in loader for text, meta in zip(batch["txt"], batch["json"])}
    assert pairs == {p.split("/")[1][:-4]: c for p, c in captions.items() if not p.endswith(("10004.jpg", "10005.jpg"))}
    loader.close()


def test_a_parquet_list_is_read_as_jsonl_is(photos, tmp_path):
    """img2dataset's and HF's list format: the same columns as CSV and JSONL (needs pyarrow)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.table({"path": [f"im{i}.jpg" for i in range(len(CAPTIONS))], "caption": CAPTIONS,
                      "label": [i % 2 for i in range(len(CAPTIONS))], "similarity": [i / 10 for i in range(6)]})
    src = photos / "list.parquet"
    pq.write_table(table, src)
    out = tmp_path / "out"
    run_pack(src, out, "--format", "wds")
    loader = fastfeed.Loader(out, batch_size=3, image_size=32, device="cpu", train=False, fields=["txt", "json"])
    seen = {text: (meta["similarity"], label) for batch in loader
            for text, meta, label in zip(batch["txt"], batch["json"], batch["labels"].tolist())}
    assert seen == {c: (i / 10, i % 2) for i, c in enumerate(CAPTIONS)}  # numbers stay numbers
    loader.close()
    (photos / "broken.parquet").write_bytes(b"PAR1 not parquet")
    with pytest.raises(Exception, match="not a readable Parquet file"):
        run_pack(photos / "broken.parquet", tmp_path / "broken", "--format", "wds")


def test_a_parquet_label_column_of_whole_floats_is_read_as_integers(photos, tmp_path):
    """Found by an adversarial run: pandas writes an integer column with nulls as floats, and every row of such a
    list was rejected ('got float'). 2.0 is label 2, a null or NaN no label, 1.5 a rejection saying so."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    labels = [0.0, 2.0, None, float("nan"), 1.5, 1.0]
    pq.write_table(pa.table({"path": [f"im{i}.jpg" for i in range(6)], "caption": [f"c{i}" for i in range(6)],
                             "label": pa.array(labels, pa.float64())}), photos / "floats.parquet")
    out = tmp_path / "out"
    run_pack(photos / "floats.parquet", out, "--format", "wds")
    rejected = [json.loads(x) for x in (out / "rejected.jsonl").read_text().splitlines()]
    assert [(r["path"].rsplit(":", 1)[1], r["reason"]) for r in rejected] == [
        ("5", "bad list row: label 1.5 is not a whole number")]
    with fastfeed.Loader(out, batch_size=5, image_size=32, device="cpu", train=False, fields=["txt"]) as ld:
        got = {t: int(lab) for b in ld for t, lab in zip(b["txt"], b["labels"].tolist())}
    assert got == {"c0": 0, "c1": 2, "c2": -1, "c3": -1, "c5": 1}


def test_a_nan_in_a_list_s_metadata_is_written_as_null(photos, tmp_path):
    """Found by an adversarial run: a NaN cell (a null in a pandas float column) went into the sample's .json as
    `NaN`, which is not JSON; an infinity, which JSON cannot hold either, rejects its row by column."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"path": [f"im{i}.jpg" for i in range(3)], "caption": ["a", "b", "c"],
                             "score": [0.5, float("nan"), float("inf")],
                             "nested": [{"x": float("nan")}, {"x": 1.0}, {"x": 2.0}]}), photos / "nan.parquet")
    out = tmp_path / "out"
    run_pack(photos / "nan.parquet", out, "--format", "wds")
    rejected = [json.loads(x) for x in (out / "rejected.jsonl").read_text().splitlines()]
    assert [(r["path"].rsplit(":", 1)[1], r["reason"]) for r in rejected] == [
        ("3", "bad list row: 'score' holds inf, which JSON cannot hold")]
    texts = {n: v for n, v in members(out).items() if n.endswith(".json")}
    metas = [json.loads(v, parse_constant=lambda c: pytest.fail(f"non-standard JSON {c}")) for v in texts.values()]
    want = [{"score": 0.5, "nested": {"x": None}}, {"score": None, "nested": {"x": 1.0}}]
    assert sorted(json.dumps(m, sort_keys=True) for m in metas) == sorted(json.dumps(m, sort_keys=True) for m in want)


def test_a_csv_row_with_too_few_fields_is_rejected_like_one_with_too_many(photos, tmp_path):
    """Found by an adversarial run: a short row's missing cells became an empty caption and null columns."""
    src = tmp_path / "l"
    src.mkdir()
    for i in range(3):
        (src / f"im{i}.jpg").write_bytes((photos / f"im{i}.jpg").read_bytes())
    (src / "list.csv").write_text("path,caption,id\nim0.jpg,zero,0\nim1.jpg,one\nim2.jpg\n", encoding="utf-8")
    out = tmp_path / "out"
    run_pack(src / "list.csv", out, "--format", "wds")
    rejected = [json.loads(x) for x in (out / "rejected.jsonl").read_text().splitlines()]
    assert [(r["path"].rsplit(":", 1)[1], r["reason"]) for r in rejected] == [
        ("3", "bad list row: 2 fields where the header has 3"), ("4", "bad list row: 1 fields where the header has 3")]
    assert [v for n, v in members(out).items() if n.endswith(".txt")] == [b"zero"]


def test_parquet_dates_and_decimals_become_json_text_and_bytes_a_named_rejection(photos, tmp_path):
    """Found by an adversarial run: a timestamp column ended the pack in a traceback."""
    import datetime
    import decimal

    import pyarrow as pa
    import pyarrow.parquet as pq

    when = datetime.datetime(2024, 5, 17, 8, 30, 1)
    table = pa.table({"path": ["im0.jpg", "im1.jpg"], "caption": ["a", "b"],
                      "taken": pa.array([when, when], pa.timestamp("s")),
                      "day": pa.array([when.date(), when.date()], pa.date32()),
                      "price": pa.array([decimal.Decimal("12.50"), decimal.Decimal("0.10")], pa.decimal128(5, 2))})
    pq.write_table(table, photos / "dated.parquet")
    out = tmp_path / "out"
    run_pack(photos / "dated.parquet", out, "--format", "wds")
    with fastfeed.Loader(out, batch_size=2, image_size=32, device="cpu", train=False, fields=["txt", "json"]) as ld:
        metas = {text: meta for batch in ld for text, meta in zip(batch["txt"], batch["json"])}
    assert metas["a"] == {"taken": "2024-05-17T08:30:01", "day": "2024-05-17", "price": "12.50"}
    assert metas["b"]["price"] == "0.10"
    pq.write_table(pa.table({"path": ["im0.jpg"], "caption": ["a"], "blob": [b"\x00\x01"]}), photos / "blob.parquet")
    with pytest.raises(Exception, match="nothing was packed"):
        run_pack(photos / "blob.parquet", tmp_path / "blob", "--format", "wds")


def test_img2dataset_images_sharing_a_stem_and_captions_not_utf8_are_rejected_by_name(photos, tmp_path):
    """Found by an adversarial run: of two images with one stem the last was packed silently; a caption that is not
    UTF-8 packed, then failed verify and every epoch as a bad record."""
    src = tmp_path / "i2d"
    captions = make_img2dataset_files(src, photos)
    (src / "00000" / "000000000.png").write_bytes(_png(photos / "im0.jpg"))
    (src / "00000" / "000000001.txt").write_bytes(b"caf\xe9")
    out = tmp_path / "out"
    run_pack(src, out, "--format", "wds")
    lines = (out / "rejected.jsonl").read_text().splitlines()
    rejected = {json.loads(x)["path"]: json.loads(x)["reason"] for x in lines}
    assert set(rejected) == {str(src / "00000" / "000000000.jpg"), str(src / "00000" / "000000000.png"),
                             str(src / "00000" / "000000001.txt")}
    assert "share the stem" in rejected[str(src / "00000" / "000000000.png")]
    assert rejected[str(src / "00000" / "000000001.txt")].startswith("unreadable caption")
    assert len([n for n in members(out) if n.endswith(".txt")]) == len(captions) - 2
    assert verify(str(out)).ok


def _png(jpeg_path) -> bytes:
    buf = io.BytesIO()
    Image.open(jpeg_path).save(buf, "PNG")
    return buf.getvalue()
