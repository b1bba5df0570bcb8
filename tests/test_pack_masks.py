"""`fastfeed pack` of semantic segmentation sources (fastfeed/pack/annotations/masks.py): an ADE20K-like tree, an image
folder with `--masks` and Pascal VOC's SegmentationClass, written with PIL and packed through the CLI. Each mask is
stored byte for byte as its image's `KEY.seg.png` member with its own field columns; every bad pair (a mask of
another size, an RGB mask, an image without its mask, a mask without its image) is a line of rejected.jsonl naming
both files; the Python and the native tar writers write the same files; `fastfeed verify` passes and catches a
damaged mask; parts merge and an interrupted pack resumes to the single pack's files; `fastfeed.Loader(OUT)` picks
task "semantic" from the manifest and batches the masks."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from conftest import run_pack, run_pack_interrupted
from PIL import Image

import fastfeed
from fastfeed.cli import main
from fastfeed.pack import PackOptions, merge, pack, verify
from fastfeed.pack import wds_native
from fastfeed.pack.native import HAVE_NATIVE_WRITER
from fastfeed.types import DatasetError, Manifest

IGNORE = 255


def image(path: Path, w: int, h: int, seed: int) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    px = np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)
    Image.fromarray(px).save(path, **({"quality": 90} if path.suffix == ".jpg" else {}))
    return path


def mask(path: Path, w: int, h: int, seed: int, mode: str = "L", ids=(0, 1, 2, 3)) -> Path:
    """A mask of class ids `ids`: mode L, P (the ids as palette indices, as VOC stores them) or RGB (refused)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    a = np.random.default_rng(seed).choice(np.asarray(ids, np.uint8), (h, w))
    if mode == "P":
        img = Image.frombytes("P", (w, h), a.tobytes())
        img.putpalette([v for i in range(256) for v in (i, (i * 7) % 256, (i * 13) % 256)])
    else:
        img = Image.fromarray(a).convert(mode)
    img.save(path)
    return path


def files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def rejected(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "rejected.jsonl").read_text().splitlines()]


def stored_masks(out: Path) -> dict[str, bytes]:
    """{source image rel path: its stored seg.png bytes}, read through the dataset's field extents."""
    with fastfeed.open_dataset(out) as ds:
        assert ds.fields == ["seg.png"] and ds.task == "semantic" and (ds.labels == -1).all()
        fe = ds.field_extents("seg.png")
        assert fe.checksum is not None and (fe.size > 0).all()
        return {str(ds.sources[i]): ds.read_range(i, int(fe.offset[i]), int(fe.size[i])) for i in range(len(ds))}


@pytest.fixture(scope="module")
def ade(tmp_path_factory) -> Path:
    """ADE20K's layout: images/training + annotations/training (and a validation split)."""
    root = tmp_path_factory.mktemp("ade")
    img, ann = root / "images" / "training", root / "annotations" / "training"
    for i in range(8):  # good pairs: JPEG and PNG images, L and P masks, sizes 40-75 x 30-44
        ext = ".png" if i % 4 == 3 else ".jpg"
        w, h = 40 + 5 * i, 30 + 2 * i
        image(img / f"ok{i}{ext}", w, h, i)
        mask(ann / f"ok{i}.png", w, h, 100 + i, "P" if i % 2 else "L", ids=(0, 1, 2, 3) if i % 2 else (0, 4, 9))
    image(img / "small.jpg", 50, 40, 20)
    mask(ann / "small.png", 50, 38, 21)  # another size than its image
    image(img / "rgb.jpg", 50, 40, 22)
    mask(ann / "rgb.png", 50, 40, 23, "RGB")
    image(img / "lonely.jpg", 50, 40, 24)  # no mask
    mask(ann / "orphan.png", 50, 40, 25)  # no image
    (ann / "notes.txt").write_text("not a mask")
    image(root / "images" / "validation" / "v0.jpg", 32, 32, 30)
    mask(root / "annotations" / "validation" / "v0.png", 32, 32, 31)
    return root


def source_mask(root: Path, rel: str) -> Path:
    """The mask file of image `rel` (images/SPLIT/x.ext) in the ADE tree."""
    p = Path(rel)
    return root / "annotations" / p.parent.relative_to("images") / (p.stem + ".png")


@pytest.mark.parametrize("native", [True, False] if HAVE_NATIVE_WRITER else [False], ids=lambda n: f"native={n}")
def test_ade20k_pack_stores_masks_byte_for_byte(ade, tmp_path, monkeypatch, native):
    monkeypatch.setattr(wds_native, "ENABLED", native)
    out = tmp_path / "out"
    run_pack(ade, out, "--split", "training", "--shard-size", "16KB")
    m = json.loads((out / "fastfeed.json").read_text())
    assert (m["task"], m["version"], m["fields"], m["source_kind"]) == ("semantic", 5, ["seg.png"], "ade20k")
    assert m["classes"] == [] and m["options"]["split"] == "training" and len(m["shards"]) > 1
    ann, img = ade / "annotations" / "training", ade / "images" / "training"
    recs = {Path(r["path"]).name: r for r in rejected(out)}
    assert recs["small.jpg"] == {"path": str(img / "small.jpg"), "mask": str(ann / "small.png"),
                                 "reason": "the mask is 50x38, its image 50x40"}
    assert recs["rgb.jpg"]["mask"] == str(ann / "rgb.png") and "RGB image" in recs["rgb.jpg"]["reason"]
    assert recs["lonely.jpg"] == {"path": str(img / "lonely.jpg"), "mask": str(ann / "lonely.png"),
                                  "reason": "no mask"}
    assert recs["orphan.png"]["mask"] == str(ann / "orphan.png")
    assert recs["orphan.png"]["reason"].startswith("mask without an image")
    assert "not a .png file" in recs["notes.txt"]["reason"]
    assert len(recs) == m["rejected"] == 5
    got = stored_masks(out)
    assert sorted(got) == [f"images/training/ok{i}{'.png' if i % 4 == 3 else '.jpg'}" for i in range(8)]
    for rel, data in got.items():
        assert data == source_mask(ade, rel).read_bytes(), rel
    report = verify(str(out))
    assert report.ok, report.errors
    assert "member checksums" in report.checked


@pytest.mark.skipif(not HAVE_NATIVE_WRITER, reason="native core built without the tar writer")
def test_python_and_native_writers_write_identical_files(ade, tmp_path, monkeypatch):
    for native in (True, False):
        monkeypatch.setattr(wds_native, "ENABLED", native)
        run_pack(ade, tmp_path / str(native), "--split", "training", "--shard-size", "16KB")
    assert files(tmp_path / "True") == files(tmp_path / "False")


def test_loader_reads_the_packed_masks_as_task_semantic(ade, tmp_path):
    out = tmp_path / "out"
    run_pack(ade, out, "--split", "training")
    ids = set()
    for rel in stored_masks(out):
        ids |= set(np.unique(np.asarray(Image.open(source_mask(ade, rel)))).tolist())
    loader = fastfeed.Loader(out, batch_size=2, image_size=64, device="cpu", train=False)
    assert (loader.settings.task, loader.settings.mask) == ("semantic", "seg.png")
    seen, values = 0, set()
    for batch in loader:
        assert batch["masks"].shape == (2, 64, 64) and batch["images"].shape == (2, 3, 64, 64)
        values |= set(np.unique(batch["masks"].numpy()).tolist())
        seen += int(batch["valid"].sum())
    loader.close()
    assert seen == 8
    assert values <= ids | {IGNORE} and len(values & ids) >= 4 and IGNORE in values  # letterboxed: padding


def test_verify_catches_a_damaged_mask(ade, tmp_path):
    out = tmp_path / "out"
    run_pack(ade, out, "--split", "training")
    with fastfeed.open_dataset(out) as ds:
        fe = ds.field_extents("seg.png")
        shard = out / ds.manifest.shards[int(ds._table["shard"][3])].path
        key, at = str(ds.keys[3]), int(fe.offset[3]) + int(fe.size[3]) // 2
    data = bytearray(shard.read_bytes())
    data[at] ^= 0xFF
    shard.write_bytes(bytes(data))
    report = verify(str(out), quick=True)
    assert any(f"key {key}" in e and ".seg.png member checksum mismatch" in e for e in report.errors), report.errors


def test_masks_folder_pairs_by_relative_path(tmp_path):
    imgs, masks = tmp_path / "photos", tmp_path / "labels"
    image(imgs / "a" / "b.jpg", 40, 30, 1)
    mask(masks / "a" / "b.png", 40, 30, 2)
    image(imgs / "c.png", 24, 20, 3)
    mask(masks / "c.png", 24, 20, 4, "P")
    image(imgs / "a" / "nomask.jpg", 40, 30, 5)
    run_pack(imgs, tmp_path / "out", "--masks", str(masks))
    m = json.loads((tmp_path / "out" / "fastfeed.json").read_text())
    assert (m["task"], m["source_kind"], m["options"]["masks"]) == ("semantic", "masks", str(masks))
    got = stored_masks(tmp_path / "out")
    assert got == {"a/b.jpg": (masks / "a" / "b.png").read_bytes(), "c.png": (masks / "c.png").read_bytes()}
    assert [(r["path"], r["reason"]) for r in rejected(tmp_path / "out")] == [(str(imgs / "a" / "nomask.jpg"),
                                                                               "no mask")]
    assert verify(str(tmp_path / "out")).ok


def test_voc_segmentation_layout_and_split(tmp_path):
    root = tmp_path / "VOC2012"
    for i in range(4):
        image(root / "JPEGImages" / f"2007_{i}.jpg", 40, 30, i)  # 2007_3: a detection image, no mask
    for i in range(3):
        mask(root / "SegmentationClass" / f"2007_{i}.png", 40, 30, 10 + i, "P", ids=(0, 5, 15, 255))
    (root / "ImageSets" / "Segmentation").mkdir(parents=True)
    (root / "ImageSets" / "Segmentation" / "train.txt").write_text("2007_0\n2007_2\n2007_3\n")
    run_pack(root, tmp_path / "all")  # recognised: JPEGImages/ + SegmentationClass/, no Annotations/
    assert sorted(stored_masks(tmp_path / "all")) == [f"JPEGImages/2007_{i}.jpg" for i in range(3)]
    assert rejected(tmp_path / "all") == []  # images without a mask are the detection set's, not rejections
    run_pack(root, tmp_path / "train", "--source", "voc-seg", "--split", "train")
    assert sorted(stored_masks(tmp_path / "train")) == ["JPEGImages/2007_0.jpg", "JPEGImages/2007_2.jpg"]
    assert [(Path(r["path"]).name, r["reason"]) for r in rejected(tmp_path / "train")] == [("2007_3.jpg", "no mask")]


def test_a_second_image_of_a_voc_segmentation_id_is_a_rejection(tmp_path):
    """JPEGImages/a.jpg and a.png share the id a, whose mask pairs with one image (the first by name): the other is
    a line in rejected.jsonl, not left out without a word."""
    root = tmp_path / "VOC2012"
    image(root / "JPEGImages" / "a.jpg", 40, 30, 1)
    image(root / "JPEGImages" / "a.png", 40, 30, 2)
    image(root / "JPEGImages" / "b.jpg", 40, 30, 3)  # (a detection image: no mask, not a rejection)
    mask(root / "SegmentationClass" / "a.png", 40, 30, 4, "P")
    run_pack(root, tmp_path / "out", "--source", "voc-seg")
    assert sorted(stored_masks(tmp_path / "out")) == ["JPEGImages/a.jpg"]
    recs = rejected(tmp_path / "out")
    assert [Path(r["path"]).name for r in recs] == ["a.png"] and "a.jpg has its id 'a'" in recs[0]["reason"]


def test_cityscapes_layout_pairs_by_name_and_prefers_train_ids(tmp_path, capsys):
    """leftImg8bit/SPLIT/CITY/NAME_leftImg8bit.png with gtFine/SPLIT/CITY/NAME_gtFine_labelTrainIds.png (ids 0-18,
    255 ignored); gtFine's other files are passed over; with no labelTrainIds in the split, the labelIds masks."""
    root = tmp_path / "cityscapes"
    names = [("aachen", "aachen_000000_000019"), ("aachen", "aachen_000001_000019"), ("bochum", "bochum_000000_000313")]
    for i, (city, name) in enumerate(names):
        image(root / "leftImg8bit" / "train" / city / f"{name}_leftImg8bit.png", 64, 32, i)
        gt = root / "gtFine" / "train" / city
        mask(gt / f"{name}_gtFine_labelIds.png", 64, 32, 10 + i, ids=(0, 7, 26, 33))
        mask(gt / f"{name}_gtFine_instanceIds.png", 64, 32, 20 + i, ids=(0, 7, 26))
        mask(gt / f"{name}_gtFine_color.png", 64, 32, 30 + i, "RGB")
        (gt / f"{name}_gtFine_polygons.json").write_text("{}")
        if i < 2:
            mask(gt / f"{name}_gtFine_labelTrainIds.png", 64, 32, 40 + i, ids=(0, 13, 18, 255))
    image(root / "leftImg8bit" / "val" / "lindau" / "lindau_000000_000019_leftImg8bit.png", 64, 32, 9)
    assert main(["pack", str(root), str(tmp_path / "nosplit"), "--quiet"]) == 2
    assert "pass --split NAME, one of train, val" in capsys.readouterr().err
    out = tmp_path / "out"
    run_pack(root, out, "--split", "train")  # recognised: leftImg8bit/ + gtFine/
    m = json.loads((out / "fastfeed.json").read_text())
    assert (m["task"], m["source_kind"]) == ("semantic", "cityscapes")
    gt = root / "gtFine" / "train"
    assert stored_masks(out) == {
        f"leftImg8bit/train/{city}/{name}_leftImg8bit.png":
            (gt / city / f"{name}_gtFine_labelTrainIds.png").read_bytes() for city, name in names[:2]}
    assert [(Path(r["path"]).name, r["reason"]) for r in rejected(out)] == [
        ("bochum_000000_000313_leftImg8bit.png", "no mask")]
    for city, name in names[:2]:
        (gt / city / f"{name}_gtFine_labelTrainIds.png").unlink()
    run_pack(root, tmp_path / "label-ids", "--source", "cityscapes", "--split", "train")
    assert stored_masks(tmp_path / "label-ids") == {
        f"leftImg8bit/train/{city}/{name}_leftImg8bit.png": (gt / city / f"{name}_gtFine_labelIds.png").read_bytes()
        for city, name in names}


def test_ade20k_without_split_folders_and_the_split_is_asked_for(ade, tmp_path, capsys):
    flat = tmp_path / "flat"
    shutil.copytree(ade / "images" / "validation", flat / "images")
    shutil.copytree(ade / "annotations" / "validation", flat / "annotations")
    run_pack(flat, tmp_path / "out")
    assert list(stored_masks(tmp_path / "out")) == ["images/v0.jpg"]
    assert main(["pack", str(ade), str(tmp_path / "o"), "--quiet"]) == 2
    assert "pass --split NAME" in capsys.readouterr().err


def test_refusals(ade, tmp_path, capsys):
    with pytest.raises(ValueError, match="seg.png: masks, captions. are stored in WebDataset shards; use --format wds"):
        pack(str(ade), str(tmp_path / "lmdb"), PackOptions(format="lmdb", split="training"))
    assert not (tmp_path / "lmdb").exists()
    for args, said in ((["--max-side", "32", "--split", "training"], "--max-side"),
                       (["--source", "masks"], "--source masks needs --masks"),
                       (["--masks", str(ade / "annotations"), "--source", "yolo"], "does not apply to --source yolo"),
                       (["--masks", str(ade / "annotations")], "inside one another"),
                       (["--classes", str(ade / "x.txt"), "--split", "training"], "--classes does not apply")):
        assert main(["pack", str(ade), str(tmp_path / "o"), "--quiet", *args]) == 2
        assert said in capsys.readouterr().err, args


def test_parts_merge_and_resume_give_the_single_pack(ade, tmp_path, monkeypatch):
    args = ("--split", "training", "--shard-size", "8KB")
    run_pack(ade, tmp_path / "one", *args)
    for i in range(2):
        run_pack(ade, tmp_path / "parts", *args, "--num-parts", "2", "--part", str(i))
    m = merge(str(tmp_path / "parts"))
    assert (m.task, m.version, m.fields) == ("semantic", 5, ["seg.png"])
    assert files(tmp_path / "parts") == files(tmp_path / "one")

    run_pack_interrupted(ade, tmp_path / "resumed", *args, monkeypatch=monkeypatch, after=5)
    assert (tmp_path / "resumed" / ".fastfeed-pack" / "journal.jsonl").read_text().count("\n") >= 2
    run_pack(ade, tmp_path / "resumed", *args, "--resume")
    assert files(tmp_path / "resumed") == files(tmp_path / "one")


def test_manifest_versions_mark_the_task(ade, tmp_path):
    """Version 5 is for semantic datasets only, and a semantic manifest must say version 5."""
    run_pack(ade, tmp_path / "out", "--split", "training")
    raw = json.loads((tmp_path / "out" / "fastfeed.json").read_text())
    for change in ({"task": "classify"}, {"version": 4}, {"version": 3}):
        with pytest.raises(DatasetError, match="format version"):
            Manifest.from_json(json.dumps(dict(raw, **change)))
