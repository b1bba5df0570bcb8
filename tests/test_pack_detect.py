"""`fastfeed pack` of detection sources (fastfeed/pack/annotations/): YOLO, COCO and Pascal VOC layouts written by
hand with real images, packed through the CLI as WebDataset and LMDB, read back with `fastfeed.open_dataset`: each
stored annotation is the source's, converted to XYXY pixels; negatives are kept; every bad record is in
rejected.jsonl with its reason and the pack still succeeds; the manifest says task/classes/version 3; parts merge to
the single pack byte for byte; classification packs stay version 2 without the new manifest fields."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image, PngImagePlugin

import fastfeed
from fastfeed.cli import main
from fastfeed.formats import read_targets
from fastfeed.pack import merge
from fastfeed.pack.annotations import parse_yaml_names
from fastfeed.pack.annotations.data_yaml import _tiny_yaml_names, _tiny_yaml_value

FORMATS = ["wds", "lmdb"]


def image(path: Path, w: int, h: int, seed: int = 0) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    px = np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)
    Image.fromarray(px).save(path, quality=90) if path.suffix == ".jpg" else Image.fromarray(px).save(path)
    return path


def write(path: Path, text: str | bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    return path


def pack(src: Path, out: Path, *args: str) -> dict:
    from conftest import run_pack

    run_pack(src, out, "--shard-size", "64KB", *args)
    return json.loads((out / "fastfeed.json").read_text())


def rejected(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "rejected.jsonl").read_text().splitlines()]


def stored(out: Path) -> dict[str, dict]:
    """{source rel path: stored annotation} of every sample."""
    with fastfeed.open_dataset(out) as ds:
        assert (ds.labels == -1).all()
        return {str(ds.sources[i]): ds.metadata(i) for i in range(len(ds))}


def assert_boxes(got: list, want: list, tol: float = 1e-3) -> None:
    assert np.asarray(got, np.float64).shape == np.asarray(want, np.float64).reshape(-1, 4).shape
    np.testing.assert_allclose(np.asarray(got, np.float64).reshape(-1, 4), np.asarray(want, np.float64).reshape(-1, 4),
                               atol=tol)


def files(root: Path) -> dict[str, bytes]:
    """Every file under `root` but LMDB's lock.mdb (process state, not data)."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and p.name != "lock.mdb"}


# ---- YOLO -----------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def yolo(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("yolo")
    write(root / "data.yaml", "path: .\ntrain: images/train\nval: images/val\nnames:\n  0: cat\n  1: dog  # a comment\n"
                              "  2: 'bird'\n")
    tr_i, tr_l = root / "images" / "train", root / "labels" / "train"
    image(tr_i / "a.jpg", 64, 48, 1)
    write(tr_l / "a.txt", "0 0.5 0.5 0.25 0.5\n1 0.1 0.1 0.4 0.1 0.4 0.3\n")
    image(tr_i / "b.png", 40, 30, 2)  # no label file: a negative
    image(tr_i / "c.jpg", 32, 32, 3)
    write(tr_l / "c.txt", "\n")  # empty: a negative
    image(tr_i / "d.jpg", 50, 40, 4)
    write(tr_l / "d.txt", "7 0.5 0.5 0.1 0.1\n0 0.5 0.5\n1 0.5 0.5 0 0.2\n2 0.9 0.9 0.4 0.4\n0 1.5 1.5 0.1 0.1\n")
    image(tr_i / "e.jpg", 20, 20, 5)
    write(tr_l / "e.txt", b"\xff\xfe not utf-8\n")  # unreadable: e.jpg is not packed
    write(tr_l / "orphan.txt", "0 0.5 0.5 0.1 0.1\n")
    image(root / "images" / "val" / "v.jpg", 30, 20, 6)
    write(root / "labels" / "val" / "v.txt", "2 0.5 0.5 0.5 0.5\n")
    return root


@pytest.mark.parametrize("fmt", FORMATS)
def test_yolo_pack_converts_labels_to_pixels(yolo, tmp_path, fmt):
    out = tmp_path / "out"
    m = pack(yolo, out, "--format", fmt, "--split", "train")
    assert (m["task"], m["version"], m["classes"], m["source_kind"]) == ("detect", 3, ["cat", "dog", "bird"], "yolo")
    got = stored(out)
    assert sorted(got) == ["images/train/a.jpg", "images/train/b.png", "images/train/c.jpg", "images/train/d.jpg"]
    a = got["images/train/a.jpg"]
    assert a["labels"] == [0, 1]
    assert_boxes(a["boxes"], [[24, 12, 40, 36], [6.4, 4.8, 25.6, 14.4]])
    assert a["polygons"][0] == []
    np.testing.assert_allclose(a["polygons"][1][0], [6.4, 4.8, 25.6, 4.8, 25.6, 14.4], atol=1e-3)
    assert got["images/train/b.png"] == {"boxes": [], "labels": []}
    assert got["images/train/c.jpg"] == {"boxes": [], "labels": []}
    d = got["images/train/d.jpg"]  # kept without its three bad lines; stored boxes are the source's, unclipped
    assert d["labels"] == [2, 0]
    assert_boxes(d["boxes"], [[35, 28, 55, 44], [72.5, 58, 77.5, 62]])

    recs = rejected(out)
    assert m["rejected"] == len(recs)
    assert any(r["path"].endswith("orphan.txt") and r["reason"] == "label file without an image" for r in recs)
    d_lines = sorted((r["path"].rsplit(":", 1)[1], r["reason"]) for r in recs if "d.txt:" in r["path"])
    assert [n for n, _ in d_lines] == ["1", "2", "3"]
    assert "unknown class id 7" in d_lines[0][1] and "malformed" in d_lines[1][1] and "zero size" in d_lines[2][1]
    assert all(r["image"] == "images/train/d.jpg" for r in recs if "d.txt:" in r["path"])
    assert any(r["path"].endswith("e.jpg") and "unreadable" in r["reason"] for r in recs)
    issues = sorted((r["object"], r["reason"].rsplit(": ", 1)[1]) for r in recs if "object" in r)
    assert issues == [(0, "clipped"), (1, "dropped")]
    assert all(r["path"] == "images/train/d.jpg" for r in recs if "object" in r)
    assert m["changes"] == {"clipped_boxes": 1, "dropped_boxes": 1}
    assert m["objects"]["images_with_objects"] == 2 and m["objects"]["images_without_objects"] == 2
    assert m["objects"]["per_image"] == {"min": 0, "mean": 1.0, "max": 2} and m["objects"]["per_class"] == [2, 1, 1]

    with fastfeed.open_dataset(out) as ds:  # the Loader's table: d's box outside the image is dropped
        t = read_targets(ds)
        assert sum(t.count(i) for i in range(len(ds))) == 3


def test_yolo_split_selection(yolo, tmp_path):
    m = pack(yolo, tmp_path / "val", "--split", "val")
    assert m["num_samples"] == 1 and m["rejected"] == 0
    assert_boxes(stored(tmp_path / "val")["images/val/v.jpg"]["boxes"], [[7.5, 5, 22.5, 15]])
    # without --split a split layout is refused, naming the splits
    code = main(["pack", str(yolo), str(tmp_path / "all"), "--quiet"])
    assert code == 2


def test_yolo_flat_layout_without_names_and_roboflow_split(tmp_path):
    root = tmp_path / "flat"
    image(root / "images" / "x.jpg", 40, 40)
    # the second box ends 0.0000005 past the right edge: the rounding of a 6-decimal file, read as the edge
    write(root / "labels" / "x.txt", "3 0.5 0.5 0.5 0.5\n1 0.9 0.5 0.200001 0.5\n")
    m = pack(root, tmp_path / "out")
    assert m["classes"] == ["0", "1", "2", "3"] and m["num_samples"] == 1
    assert stored(tmp_path / "out")["images/x.jpg"]["boxes"][1][2] == 40.0
    assert m["rejected"] == 0 and m["changes"] == {}
    # Roboflow: ROOT/train/images + ROOT/train/labels, data.yaml in ROOT with a flow list
    rf = tmp_path / "rf"
    write(rf / "data.yaml", "nc: 2\nnames: ['a b', \"c\"]\n")
    image(rf / "train" / "images" / "y.jpg", 40, 20)
    write(rf / "train" / "labels" / "y.txt", "1 0.25 0.5 0.5 1.0\n")
    m = pack(rf, tmp_path / "out2", "--split", "train")
    assert m["classes"] == ["a b", "c"]
    assert stored(tmp_path / "out2")["train/images/y.jpg"] == {"boxes": [[0.0, 0.0, 20.0, 20.0]], "labels": [1]}


def test_labelimgs_names_file_beside_the_labels_names_the_classes(tmp_path):
    """LabelImg's YOLO mode writes classes.txt into the labels folder: it names the classes (all of them, not just
    those up to the largest id used) and is no label file without an image; an image named classes keeps it as
    its labels, and a data.yaml's names come first."""
    root = tmp_path / "li"
    image(root / "images" / "a.jpg", 40, 40)
    write(root / "labels" / "a.txt", "1 0.5 0.5 0.5 0.5\n")
    write(root / "labels" / "classes.txt", "dog\nperson\ncat\n")
    m = pack(root, tmp_path / "out")
    assert m["classes"] == ["dog", "person", "cat"] and m["rejected"] == 0
    assert stored(tmp_path / "out")["images/a.jpg"]["labels"] == [1]
    write(root / "data.yaml", "names: [x, y]\n")
    assert pack(root, tmp_path / "yaml")["classes"] == ["x", "y"]
    (root / "data.yaml").unlink()
    image(root / "images" / "classes.jpg", 40, 40)  # labels/classes.txt is its label file: 'dog' is malformed
    m = pack(root, tmp_path / "img")
    assert m["classes"] == ["0", "1"] and sorted(stored(tmp_path / "img")) == ["images/a.jpg", "images/classes.jpg"]
    assert [r["path"].rsplit("/", 1)[1] for r in rejected(tmp_path / "img")] == ["classes.txt:1", "classes.txt:2",
                                                                                 "classes.txt:3"]


def test_a_data_yaml_split_may_be_a_list_of_images(tmp_path, capsys):
    """data.yaml's `train: autosplit_train.txt` (ultralytics' autosplit, COCO's train2017.txt): the split is the
    images the list names, one path a line ("./" and bare paths from the list's folder, absolute ones as they are),
    each with the label file of its path with `images` made `labels`. Without --split the pack names the splits
    instead of packing both together; a listed image that is missing is a rejection naming the line."""
    root = tmp_path / "auto"
    for n in "abc":
        image(root / "images" / f"{n}.jpg", 40, 20)
    write(root / "labels" / "a.txt", "0 0.25 0.5 0.5 1.0\n")
    write(root / "labels" / "c.txt", "1 0.75 0.5 0.5 1.0\n")  # (b has none: a negative)
    outside = image(tmp_path / "elsewhere" / "images" / "d.jpg", 40, 20)
    write(tmp_path / "elsewhere" / "labels" / "d.txt", "1 0.5 0.5 0.5 0.5\n")
    write(root / "autosplit_train.txt", f"./images/a.jpg\nimages/b.jpg\n{outside}\n./images/gone.jpg\n")
    write(root / "autosplit_val.txt", "./images/c.jpg\n")
    write(root / "data.yaml", "train: autosplit_train.txt\nval: autosplit_val.txt\nnames: [x, y]\n")
    assert main(["pack", str(root), str(tmp_path / "none"), "--quiet"]) == 2
    assert "split into train (autosplit_train.txt), val (autosplit_val.txt): pass --split NAME" in \
        capsys.readouterr().err
    m = pack(root, tmp_path / "train", "--split", "train")
    got = stored(tmp_path / "train")
    assert sorted(got) == ["../elsewhere/images/d.jpg", "images/a.jpg", "images/b.jpg"] and m["num_samples"] == 3
    assert got["images/a.jpg"] == {"boxes": [[0.0, 0.0, 20.0, 20.0]], "labels": [0]}
    assert got["images/b.jpg"] == {"boxes": [], "labels": []}
    assert got["../elsewhere/images/d.jpg"] == {"boxes": [[10.0, 5.0, 30.0, 15.0]], "labels": [1]}
    recs = rejected(tmp_path / "train")
    assert [(r["path"].rsplit("/", 1)[1], Path(r["image"]).name) for r in recs] == [("autosplit_train.txt:4",
                                                                                     "gone.jpg")]
    pack(root, tmp_path / "val", "--split", "val")
    assert stored(tmp_path / "val") == {"images/c.jpg": {"boxes": [[20.0, 0.0, 40.0, 20.0]], "labels": [1]}}
    assert rejected(tmp_path / "val") == []


def test_a_data_yaml_kept_apart_from_its_dataset_is_a_source(tmp_path, capsys, monkeypatch):
    """ultralytics keeps coco8.yaml and coco128.yaml apart from the datasets they name (`path: ../datasets/coco128`,
    `train: images/train2017`): given as SRC, the YAML packs the split its key names, with its class names (all
    80 of them, not the ids the labels use); as --classes it names the classes of the dataset's folder. One whose
    path or split names no folder is refused, saying what to pass instead."""
    root = tmp_path / "datasets" / "coco128"
    image(root / "images" / "train2017" / "a.jpg", 40, 20)
    write(root / "labels" / "train2017" / "a.txt", "17 0.25 0.5 0.5 1.0\n")
    names = "".join(f"  {i}: name{i}\n" for i in range(80))
    data = write(tmp_path / "cfg" / "coco128.yaml", "path: ../datasets/coco128\ntrain: images/train2017\n"
                 f"val: images/train2017\ntest:  # none\n\nnames:\n{names}")
    monkeypatch.chdir(tmp_path)  # path: is tried from the working directory first: here it names nothing
    want = {"images/train2017/a.jpg": {"boxes": [[0.0, 0.0, 20.0, 20.0]], "labels": [17]}}
    for args, out in (([str(data), "--split", "train"], "from-yaml"),
                      ([str(root), "--split", "train2017", "--classes", str(data)], "classes")):
        m = pack(Path(args[0]), tmp_path / out, *args[1:])
        assert m["classes"] == [f"name{i}" for i in range(80)] and stored(tmp_path / out) == want
    assert main(["pack", str(data), str(tmp_path / "none"), "--split", "test", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "coco128.yaml: a data.yaml" in err and f"--classes {data}" in err and not (tmp_path / "none").exists()


def test_data_yaml_nc_is_the_number_of_classes(tmp_path, capsys):
    """nc alone gives that many classes (a label past them is an unknown class, reported); an nc other than the
    number of names stops the pack before anything is written, as ultralytics refuses it."""
    def yolo_set(name: str, yaml: str) -> Path:
        root = tmp_path / name
        write(root / "data.yaml", yaml)
        image(root / "images" / "x.png", 50, 50)
        write(root / "labels" / "x.txt", "0 0.5 0.5 0.2 0.2\n1 0.5 0.5 0.2 0.2\n4 0.5 0.5 0.2 0.2\n")
        return root

    m = pack(yolo_set("nc3", "nc: 3\n"), tmp_path / "o3")
    assert m["classes"] == ["0", "1", "2"]
    assert stored(tmp_path / "o3")["images/x.png"]["labels"] == [0, 1]
    recs = rejected(tmp_path / "o3")
    assert len(recs) == 1 and recs[0]["path"].endswith("x.txt:3") and "unknown class id 4" in recs[0]["reason"]
    m = pack(yolo_set("nc6", "nc: 6\n"), tmp_path / "o6")
    assert m["classes"] == ["0", "1", "2", "3", "4", "5"] and m["rejected"] == 0
    assert stored(tmp_path / "o6")["images/x.png"]["labels"] == [0, 1, 4]

    bad = yolo_set("nc5", "nc: 5\nnames: [a, b]\n")
    capsys.readouterr()
    assert main(["pack", str(bad), str(tmp_path / "o5"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert str(bad / "data.yaml") in err and "nc: 5" in err and "2 classes" in err
    assert not (tmp_path / "o5").exists()


@pytest.fixture(scope="module")
def split_first(tmp_path_factory) -> Path:
    """The "split first" export of Roboflow and ultralytics: ROOT/{train,valid,test}/{images,labels}, and a data.yaml
    whose paths are written from one level down (`../train/images`), as Roboflow writes them."""
    root = tmp_path_factory.mktemp("split_first")
    write(root / "data.yaml", "train: ../train/images\nval: ../valid/images\ntest: ../test/images\n\nnc: 2\n"
                              "names: ['cat', 'dog']\n")
    for n, split in enumerate(("train", "valid", "test")):
        image(root / split / "images" / f"{split}_0.jpg", 64, 48, n)
        write(root / split / "labels" / f"{split}_0.txt", f"{n % 2} 0.5 0.5 0.25 0.5\n")
    image(root / "train" / "images" / "train_1.jpg", 40, 40, 9)
    write(root / "train" / "labels" / "train_1.txt", "1 0.25 0.25 0.5 0.5\n")
    return root


def test_split_first_export_is_a_yolo_dataset_split_by_its_data_yaml(split_first, tmp_path, capsys):
    # Without --split: refused, naming the splits (as for images/train + images/val), under 'auto' and 'yolo' alike.
    for source in ("auto", "yolo"):
        assert main(["pack", str(split_first), str(tmp_path / source), "--source", source, "--quiet"]) == 2
        err = capsys.readouterr().err
        assert "split into train (train/images), val (valid/images), test (test/images): pass --split NAME" in err
        assert not (tmp_path / source).exists()
    # A split by its data.yaml key or by its folder's name: the same files.
    m = pack(split_first, tmp_path / "val", "--split", "val")
    assert (m["task"], m["source_kind"], m["classes"], m["num_samples"]) == ("detect", "yolo", ["cat", "dog"], 1)
    assert m["rejected"] == 0
    assert stored(tmp_path / "val") == {"valid/images/valid_0.jpg": {"boxes": [[24.0, 12.0, 40.0, 36.0]],
                                                                     "labels": [1]}}
    pack(split_first, tmp_path / "valid", "--split", "valid")
    same = [name for name in files(tmp_path / "val") if name != "fastfeed.json"]  # (which records the --split)
    assert [files(tmp_path / "valid")[n] for n in same] == [files(tmp_path / "val")[n] for n in same]
    pack(split_first, tmp_path / "train", "--split", "train")
    assert stored(tmp_path / "train") == {"train/images/train_0.jpg": {"boxes": [[24.0, 12.0, 40.0, 36.0]],
                                                                       "labels": [0]},
                                          "train/images/train_1.jpg": {"boxes": [[0.0, 0.0, 20.0, 20.0]],
                                                                       "labels": [1]}}
    assert main(["pack", str(split_first), str(tmp_path / "bogus"), "--split", "bogus", "--quiet"]) == 2
    assert "there is no split 'bogus'" in capsys.readouterr().err
    # One split folder packed on its own still finds the names in its parent's data.yaml.
    m = pack(split_first / "test", tmp_path / "test")
    assert m["classes"] == ["cat", "dog"] and list(stored(tmp_path / "test")) == ["images/test_0.jpg"]


def test_data_yaml_path_key_is_where_the_splits_are(tmp_path):
    """`path:` (relative to data.yaml's folder here, where ultralytics would take the working directory) is the
    root of the train/val keys; a data.yaml naming folders without labels beside them is no YOLO dataset."""
    root = tmp_path / "root"
    write(root / "data.yaml", "path: ds\ntrain: images/train2017\nval: images/val2017\nnames: [a]\n")
    image(root / "ds" / "images" / "val2017" / "v.jpg", 20, 10)
    write(root / "ds" / "labels" / "val2017" / "v.txt", "0 0.5 0.5 0.5 0.5\n")
    image(root / "ds" / "images" / "train2017" / "t.jpg", 20, 10)
    write(root / "ds" / "labels" / "train2017" / "t.txt", "0 0.5 0.5 1 1\n")
    pack(root, tmp_path / "out", "--split", "val")
    assert stored(tmp_path / "out") == {"ds/images/val2017/v.jpg": {"boxes": [[5.0, 2.5, 15.0, 7.5]], "labels": [0]}}
    pack(root, tmp_path / "out2", "--split", "train2017")  # the folder's name picks it too
    assert list(stored(tmp_path / "out2")) == ["ds/images/train2017/t.jpg"]

    tree = tmp_path / "tree"  # an ImageFolder tree whose data.yaml names folders with no labels: classification
    write(tree / "data.yaml", "train: ../train/images\nnames: [a]\n")
    image(tree / "train" / "images" / "x.jpg", 20, 10)
    m = pack(tree, tmp_path / "out3")
    assert "task" not in m and m["classes"] == ["train"]  # a classification manifest


@pytest.mark.parametrize("text, want", [
    ("names:\n  - cat\n  - dog\n", ["cat", "dog"]),
    ("names: [cat, 'hot dog']  # x\nnc: 2\n", ["cat", "hot dog"]),
    ("nc: 3\nnames:\n  0: a\n  2: c\ntrain: x\n", ["a", "1", "c"]),
    ("names: {0: a, 1: 'b, c'}\n", ["a", "b, c"]),
    ("train: images\n", None),
    ("nc: 3\ntrain: images\n", ["0", "1", "2"]),
])
def test_data_yaml_names(text, want, monkeypatch):
    assert parse_yaml_names(text) == want
    # the same without PyYAML (not a dependency): the small parser
    import builtins

    real = builtins.__import__

    def no_yaml(name, *a, **k):
        if name == "yaml":
            raise ImportError("no yaml")
        return real(name, *a, **k)

    monkeypatch.setattr(builtins, "__import__", no_yaml)
    assert parse_yaml_names(text) == want
    assert _tiny_yaml_names("names:\n- a\n- b\n") == ["a", "b"]


# ---- COCO -----------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def coco(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("coco")
    imgs = root / "images"
    image(imgs / "x.jpg", 64, 48, 1)
    image(imgs / "y.jpg", 50, 40, 2)
    image(imgs / "sub" / "z.png", 30, 30, 3)
    for k in range(6):  # negatives, listed without annotations
        image(imgs / f"n{k}.jpg", 24, 24, 10 + k)
    image(imgs / "unlisted.jpg", 20, 20, 4)  # not in the JSON: not packed
    rle = {"size": [48, 64], "counts": [1000, 72, 2000]}
    doc = {
        "categories": [{"id": 3, "name": "car"}, {"id": 1, "name": "person"}, {"id": 7, "name": "bike"}],
        "images": [{"id": 1, "file_name": "x.jpg", "width": 64, "height": 48},
                   {"id": 2, "file_name": "y.jpg", "width": 40, "height": 50},  # declared rotated
                   {"id": 3, "file_name": "sub/z.png", "width": 30, "height": 30},
                   {"id": 4, "file_name": "missing.jpg", "width": 10, "height": 10}]
                  + [{"id": 100 + k, "file_name": f"n{k}.jpg", "width": 24, "height": 24} for k in range(6)],
        "annotations": [
            {"id": 10, "image_id": 1, "category_id": 3, "bbox": [4, 5, 10, 20], "iscrowd": 0,
             "segmentation": [[4, 5, 14, 5, 14, 25]], "area": 100},
            {"id": 11, "image_id": 1, "category_id": 1, "bbox": [0.5, 1.5, 2.25, 3], "iscrowd": 1,
             "segmentation": rle},
            {"id": 12, "image_id": 2, "category_id": 99, "bbox": [1, 1, 5, 5], "iscrowd": 0},
            {"id": 13, "image_id": 2, "category_id": 7, "bbox": [1, 1, 0, 5], "iscrowd": 0},
            {"id": 14, "image_id": 2, "category_id": 7, "bbox": [45, 30, 10, 20], "iscrowd": 0, "segmentation": []},
            {"id": 15, "image_id": 999, "category_id": 1, "bbox": [1, 1, 5, 5], "iscrowd": 0},
            {"id": 16, "image_id": 3, "category_id": 1, "bbox": [1, 1, 5, 5], "iscrowd": 0,
             "segmentation": [[1, 2, 3]]},
            {"id": 17, "image_id": 2, "category_id": 7, "bbox": [50, 10, -10, 20], "iscrowd": 0},
        ],
    }
    ann = write(root / "instances.json", json.dumps(doc))
    return imgs, ann


@pytest.mark.parametrize("fmt", FORMATS)
def test_coco_pack(coco, tmp_path, fmt):
    imgs, ann = coco
    out = tmp_path / "out"
    m = pack(imgs, out, "--format", fmt, "--annotations", str(ann))
    assert (m["task"], m["version"], m["source_kind"]) == ("detect", 3, "coco")
    assert m["classes"] == ["person", "car", "bike"] and m["objects"]["source_ids"] == [1, 3, 7]
    got = stored(out)
    assert sorted(got) == sorted(["x.jpg", "y.jpg", "sub/z.png"] + [f"n{k}.jpg" for k in range(6)])
    assert got["x.jpg"] == {"boxes": [[4, 5, 14, 25], [0.5, 1.5, 2.75, 4.5]], "labels": [1, 0], "iscrowd": [0, 1],
                            "polygons": [[[4, 5, 14, 5, 14, 25]], []],
                            "rle": [None, {"size": [48, 64], "counts": [1000, 72, 2000]}]}
    assert got["y.jpg"] == {"boxes": [[45, 30, 55, 50]], "labels": [2], "iscrowd": [0]}
    assert got["sub/z.png"] == {"boxes": [[1, 1, 6, 6]], "labels": [0], "iscrowd": [0]}
    assert got["n0.jpg"] == {"boxes": [], "labels": [], "iscrowd": []}

    recs = rejected(out)
    by_id = {r.get("annotation_id"): r["reason"] for r in recs if "annotation_id" in r}
    assert "unknown category id 99" in by_id[12] and "zero size" in by_id[13] and "negative size" in by_id[17]
    assert "image id 999 is not in 'images'" in by_id[15] and "polygon 0" in by_id[16]
    assert any(r["path"].endswith("missing.jpg") and "not found" in r["reason"] for r in recs)
    assert any(r["path"] == "y.jpg" and "50x40" in r["reason"] and "40x50" in r["reason"] and "object" not in r
               for r in recs)
    assert [(r["path"], r["object"]) for r in recs if "object" in r] == [("y.jpg", 0)]  # 55x50 box in 50x40: clipped
    assert m["changes"] == {"clipped_boxes": 1} and m["rejected"] == len(recs) == 8
    assert m["objects"]["images_with_objects"] == 3 and m["objects"]["objects"] == 4


def test_coco_iscrowd_may_be_a_json_boolean(tmp_path):
    """Some exporters write "iscrowd": false / true; pycocotools takes them as 0 and 1, and so does pack."""
    imgs = tmp_path / "i"
    image(imgs / "x.png", 50, 40)
    crowd = {1: False, 2: True, 3: 0, 4: 1, 5: "yes"}
    doc = {"categories": [{"id": 1, "name": "a"}],
           "images": [{"id": 1, "file_name": "x.png", "width": 50, "height": 40}],
           "annotations": [{"id": k, "image_id": 1, "category_id": 1, "bbox": [2 + 8 * k, 2, 5, 5], "iscrowd": c}
                           for k, c in crowd.items()]}
    out = tmp_path / "out"
    pack(imgs, out, "--annotations", str(write(tmp_path / "a.json", json.dumps(doc))))
    got = stored(out)["x.png"]
    assert got["iscrowd"] == [0, 1, 0, 1] and all(type(v) is int for v in got["iscrowd"])
    assert got["boxes"] == [[2 + 8 * k, 2, 7 + 8 * k, 7] for k in (1, 2, 3, 4)]
    assert [(r["annotation_id"], "iscrowd 'yes'" in r["reason"]) for r in rejected(out)] == [(5, True)]


def test_coco_file_names_written_on_windows_find_their_images(tmp_path):
    """An export written on Windows separates folders by backslashes (sub\\a.png): the image is found where the
    folders say, and one missing under either spelling is still a rejection by name."""
    imgs = tmp_path / "i"
    image(imgs / "sub" / "a.png", 50, 40)
    doc = {"categories": [{"id": 1, "name": "a"}],
           "images": [{"id": 1, "file_name": "sub\\a.png", "width": 50, "height": 40},
                      {"id": 2, "file_name": "sub\\gone.png", "width": 50, "height": 40}],
           "annotations": [{"id": 1, "image_id": 1, "category_id": 1, "bbox": [2, 2, 5, 5], "iscrowd": 0}]}
    out = tmp_path / "out"
    pack(imgs, out, "--annotations", str(write(tmp_path / "a.json", json.dumps(doc))))
    assert stored(out) == {"sub/a.png": {"boxes": [[2, 2, 7, 7]], "labels": [0], "iscrowd": [0]}}
    recs = rejected(out)
    assert len(recs) == 1 and recs[0]["path"].endswith("gone.png") and "not found" in recs[0]["reason"]


def test_a_box_with_no_width_in_float32_is_a_zero_size_rejection(tmp_path):
    """The Loader's table holds boxes in float32: a width that only float64 sees (1e-4 px at x = 5000, 1e-9 px)
    is a box of zero size in rejected.jsonl, as any other, not a box stored and then silently dropped."""
    imgs = tmp_path / "c"
    image(imgs / "wide.png", 6000, 8)
    bboxes = {1: [5000.0, 1.0, 0.0001, 5.0], 2: [-5.0, 1.0, 10.0, 5.0], 3: [10.0, 1.0, 1e-9, 5.0],
              4: [20.0, 1.0, 0.01, 5.0]}
    doc = {"categories": [{"id": 1, "name": "a"}],
           "images": [{"id": 1, "file_name": "wide.png", "width": 6000, "height": 8}],
           "annotations": [{"id": k, "image_id": 1, "category_id": 1, "bbox": b, "iscrowd": 0}
                           for k, b in bboxes.items()]}
    out = tmp_path / "out"
    pack(imgs, out, "--annotations", str(write(tmp_path / "c.json", json.dumps(doc))))
    no_width = {k for k, (x, _, w, _) in bboxes.items() if not np.float32(x + w) > np.float32(x)}
    assert no_width == {1, 3}
    recs = rejected(out)
    assert {r["annotation_id"] for r in recs if "zero size" in r["reason"]} == no_width
    assert stored(out)["wide.png"]["boxes"] == [[-5.0, 1.0, 5.0, 6.0], [20.0, 1.0, 20.01, 6.0]]
    with fastfeed.Loader(out, batch_size=1, train=False, image_size=64, device="cpu", decoder="cpu") as ld:
        assert len(ld.targets.boxes) == 2  # every stored box reaches training (the first clipped)


@pytest.mark.parametrize("fmt", FORMATS)
def test_coco_parts_merge_to_the_single_pack(coco, tmp_path, fmt):
    from conftest import run_pack

    imgs, ann = coco
    one, parts = tmp_path / "one", tmp_path / "parts"
    pack(imgs, one, "--format", fmt, "--annotations", str(ann))
    for i in range(2):
        run_pack(imgs, parts, "--shard-size", "64KB", "--format", fmt, "--annotations", str(ann), "--num-parts", "2",
                 "--part", str(i))
    m = merge(str(parts))
    assert (m.task, m.version) == ("detect", 3) and m.objects["source_ids"] == [1, 3, 7]
    assert files(one) == files(parts)
    assert stored(one) == stored(parts)


# ---- Pascal VOC ------------------------------------------------------------------------------------------------


def voc_xml(filename: str, w: int, h: int, objects: list[tuple]) -> str:
    objs = "".join(f"<object><name>{n}</name><difficult>{d}</difficult><bndbox><xmin>{b[0]}</xmin><ymin>{b[1]}</ymin>"
                   f"<xmax>{b[2]}</xmax><ymax>{b[3]}</ymax></bndbox></object>" for n, b, d in objects)
    return (f"<annotation><filename>{filename}</filename><size><width>{w}</width><height>{h}</height>"
            f"<depth>3</depth></size>{objs}</annotation>")


@pytest.fixture(scope="module")
def voc(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("voc")
    jp, an = root / "JPEGImages", root / "Annotations"
    image(jp / "v1.jpg", 40, 30, 1)
    write(an / "v1.xml", voc_xml("v1.jpg", 40, 30, [("dog", (1, 2, 10, 20), 1), ("cat", (5, 5, 40, 30), 0)]))
    image(jp / "v2.jpg", 40, 30, 2)
    write(an / "v2.xml", voc_xml("v2.jpg", 40, 30, [("person", ("x", 2, 10, 20), 0), ("person", (3, 3, 8, 8), 0),
                                                     ("cat", (9, 9, 8, 12), 0)]))
    image(jp / "v3.jpg", 40, 30, 3)
    write(an / "v3.xml", "<annotation><object>")  # unreadable: v3 is not packed
    write(an / "v4.xml", voc_xml("v4.jpg", 40, 30, [("dog", (1, 1, 5, 5), 0)]))  # no image
    image(jp / "v5.jpg", 40, 30, 5)  # no annotation file: a negative
    write(root / "ImageSets" / "Main" / "train.txt", "v1\nv5\n")
    return root


@pytest.mark.parametrize("fmt", FORMATS)
def test_voc_pack(voc, tmp_path, fmt):
    out = tmp_path / "out"
    m = pack(voc, out, "--format", fmt)
    assert (m["task"], m["version"], m["source_kind"]) == ("detect", 3, "voc")
    assert m["classes"] == ["cat", "dog", "person"]
    got = stored(out)
    assert sorted(got) == ["JPEGImages/v1.jpg", "JPEGImages/v2.jpg", "JPEGImages/v5.jpg"]
    assert got["JPEGImages/v1.jpg"] == {"boxes": [[0, 1, 10, 20], [4, 4, 40, 30]], "labels": [1, 0],
                                        "difficult": [1, 0]}
    assert got["JPEGImages/v2.jpg"] == {"boxes": [[2, 2, 8, 8]], "labels": [2], "difficult": [0]}
    assert got["JPEGImages/v5.jpg"] == {"boxes": [], "labels": [], "difficult": []}
    recs = rejected(out)
    objs = sorted((r["object"], r["reason"]) for r in recs if r["path"].endswith("v2.xml"))
    assert [k for k, _ in objs] == [0, 2] and "malformed" in objs[0][1] and "zero size" in objs[1][1]
    assert any(r["path"].endswith("v3.jpg") and "unreadable" in r["reason"] for r in recs)
    assert any(r["path"].endswith("v4.xml") and r["reason"] == "annotation file without an image" for r in recs)
    assert len(recs) == 4 and m["changes"] == {}


def test_voc_classes_file_and_split(voc, tmp_path):
    names = write(tmp_path / "names.txt", "# VOC subset\ndog\nperson\n")
    m = pack(voc, tmp_path / "out", "--classes", str(names), "--split", "train")
    assert m["classes"] == ["dog", "person"] and m["options"]["split"] == "train"
    got = stored(tmp_path / "out")
    assert got == {"JPEGImages/v1.jpg": {"boxes": [[0, 1, 10, 20]], "labels": [0], "difficult": [1]},
                   "JPEGImages/v5.jpg": {"boxes": [], "labels": [], "difficult": []}}
    recs = rejected(tmp_path / "out")
    assert [(r["object"], "unknown class 'cat'" in r["reason"]) for r in recs] == [(1, True)]


def test_voc_records_number_objects_by_their_xml_element(tmp_path):
    """rejected.jsonl's "object" for a VOC image is the index of its <object> element, whether the object is
    rejected while reading the XML or clipped once the image is stored."""
    root = tmp_path / "voc"
    image(root / "JPEGImages" / "a.jpg", 40, 30)
    objects = [("cat", ("x", 1, 5, 5), 0), ("cat", (2, 2, 10, 10), 0), ("dog", (9, 9, 8, 12), 0),
               ("dog", (31, 21, 45, 35), 0)]  # malformed, kept, zero size, crossing the edge: clipped
    write(root / "Annotations" / "a.xml", voc_xml("a.jpg", 40, 30, objects))
    out = tmp_path / "out"
    m = pack(root, out)
    assert stored(out)["JPEGImages/a.jpg"]["boxes"] == [[1, 1, 10, 10], [30, 20, 45, 35]]
    got = sorted((r["object"], r["reason"]) for r in rejected(out))
    assert [k for k, _ in got] == [0, 2, 3] and m["changes"] == {"clipped_boxes": 1}
    assert "malformed" in got[0][1] and "zero size" in got[1][1]
    assert got[2][1].startswith("box 3 ") and got[2][1].endswith("clipped")


def test_voc_pairs_annotations_with_images_by_id_and_never_packs_an_image_twice(tmp_path):
    """<filename> goes stale in XMLs copied for augmented images: the id (the XML's stem) pairs them, as in
    torchvision's VOCDetection; <filename> only pairs an XML that has no image of its id, and an image one XML
    holds is never given to another."""
    root = tmp_path / "voc"
    jp, an = root / "JPEGImages", root / "Annotations"
    for stem, seed in (("img1", 1), ("img1_aug", 2), ("lone", 3)):
        image(jp / f"{stem}.jpg", 40, 30, seed)
    write(an / "img1.xml", voc_xml("img1.jpg", 40, 30, [("cat", (2, 2, 10, 10), 0)]))
    write(an / "img1_aug.xml", voc_xml("img1.jpg", 40, 30, [("cat", (21, 11, 30, 20), 0)]))  # stale <filename>
    write(an / "copy.xml", voc_xml("img1.jpg", 40, 30, [("dog", (1, 1, 5, 5), 0)]))  # no copy.*: img1.jpg is taken
    write(an / "zz.xml", voc_xml("lone.jpg", 40, 30, [("dog", (6, 6, 9, 9), 0)]))  # no zz.*, lone.jpg has no XML
    out = tmp_path / "out"
    m = pack(root, out)
    with fastfeed.open_dataset(out) as ds:
        sources = [str(ds.sources[i]) for i in range(len(ds))]
        got = {str(ds.sources[i]): (ds.metadata(i)["boxes"], ds.read(i)) for i in range(len(ds))}
    assert sorted(sources) == ["JPEGImages/img1.jpg", "JPEGImages/img1_aug.jpg", "JPEGImages/lone.jpg"]
    assert m["num_samples"] == 3
    for name, box in (("img1", [1, 1, 10, 10]), ("img1_aug", [20, 10, 30, 20]), ("lone", [5, 5, 9, 9])):
        assert got[f"JPEGImages/{name}.jpg"] == ([box], (jp / f"{name}.jpg").read_bytes())
    recs = rejected(out)
    assert len(recs) == 1 and recs[0]["path"] == str(an / "copy.xml")
    assert recs[0]["image"] == "JPEGImages/img1.jpg" and "Annotations/img1.xml" in recs[0]["reason"]


def test_voc_packs_one_image_of_an_id_and_rejects_the_others_by_name(tmp_path):
    """Images that share an id (a.jpg beside a.png) cannot both be what Annotations/a.xml describes: the one its
    <filename> names is packed (else ID.jpg, what torchvision's VOCDetection opens), every other is rejected by name,
    none dropped unreported."""
    root = tmp_path / "voc"
    jp, an = root / "JPEGImages", root / "Annotations"
    for name, seed in (("a.jpg", 1), ("a.png", 2), ("b.jpeg", 3), ("b.jpg", 4), ("c.bmp", 5), ("c.png", 6)):
        image(jp / name, 40, 30, seed)
    write(an / "a.xml", voc_xml("a.png", 40, 30, [("cat", (2, 2, 10, 10), 0)]))  # names the PNG
    write(an / "b.xml", voc_xml("elsewhere.jpg", 40, 30, [("dog", (1, 1, 5, 5), 0)]))  # names neither: b.jpg
    out = tmp_path / "out"  # c has no XML: c.bmp (the first by name) is a negative, c.png rejected
    m = pack(root, out)
    with fastfeed.open_dataset(out) as ds:
        got = {str(ds.sources[i]): (ds.metadata(i)["boxes"], ds.read(i)) for i in range(len(ds))}
    assert sorted(got) == ["JPEGImages/a.png", "JPEGImages/b.jpg", "JPEGImages/c.bmp"] and m["num_samples"] == 3
    assert got["JPEGImages/a.png"] == ([[1, 1, 10, 10]], (jp / "a.png").read_bytes())
    assert got["JPEGImages/b.jpg"] == ([[0, 0, 5, 5]], (jp / "b.jpg").read_bytes())
    recs = {Path(r["path"]).name: r["reason"] for r in rejected(out)}
    assert sorted(recs) == ["a.jpg", "b.jpeg", "c.png"]
    assert "a.png" in recs["a.jpg"] and "b.jpg" in recs["b.jpeg"] and "c.bmp" in recs["c.png"]


# ---- refusals, classification unchanged, inspect -----------------------------------------------------------------


def test_max_side_with_annotations_is_refused(coco, tmp_path, capsys):
    imgs, ann = coco
    code = main(["pack", str(imgs), str(tmp_path / "o"), "--quiet", "--annotations", str(ann), "--max-side", "32"])
    assert code == 2 and "--max-side" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_classification_manifest_has_no_detection_fields(tmp_path):
    src = tmp_path / "src"
    for c in ("a", "b"):
        image(src / c / "0.jpg", 16, 16)
    m = pack(src, tmp_path / "out")
    assert m["version"] == 2 and "task" not in m and "objects" not in m
    assert not {"annotations", "classes_file", "split", "orientation"} & set(m["options"])
    with fastfeed.open_dataset(tmp_path / "out") as ds:
        assert ds.manifest.task == "classify"


def test_a_pose_sets_lines_are_boxes_with_keypoints(tmp_path):
    """A YOLO pose set (data.yaml `kpt_shape: [2, 3]`): each line is a box and two keypoints (x, y, visibility). Its
    ten values would read as a five-point polygon, whose bounds are not the box; with kpt_shape they are the box,
    and the keypoints are kept in pixels. A line of another length is named; the Loader reads the set."""
    src = tmp_path / "pose"
    write(src / "data.yaml", "kpt_shape: [2, 3]  # two keypoints\nnames: [person]\n")
    image(src / "images" / "a.jpg", 100, 50)
    write(src / "labels" / "a.txt", "0 0.5 0.5 0.4 0.6 0.4 0.3 2 0.6 0.7 1\n0 0.5 0.5 0.4 0.6 0.4 0.3\n")
    m = pack(src, tmp_path / "out")
    a = stored(tmp_path / "out")["images/a.jpg"]
    assert_boxes(a["boxes"], [[30, 10, 70, 40]])
    np.testing.assert_allclose(a["keypoints"], [[40, 15, 2, 60, 35, 1]])
    (rec,) = rejected(tmp_path / "out")
    assert rec["path"].endswith("a.txt:2") and "2 keypoints of 3 values (kpt_shape)" in rec["reason"]
    assert m["rejected"] == 1
    assert _tiny_yaml_value("names: [a]\nkpt_shape: [17, 3]  # COCO\n", "kpt_shape") == [17, 3]  # without PyYAML
    loader = fastfeed.Loader(tmp_path / "out", batch_size=1, train=False, image_size=64, device="cpu")
    batch = next(iter(loader))
    np.testing.assert_allclose(batch["boxes"].numpy(), [[19.2, 6.4 + 16, 44.8, 25.6 + 16]], atol=1e-4)
    loader.close()


def tagged_jpeg(path: Path, w: int, h: int, tag: int, text_bytes: int = 0) -> Path:
    """A w x h JPEG (as stored; a PNG with its eXIf chunk for a .png path, after `text_bytes` of tEXt) with EXIF
    orientation `tag`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    exif = Image.Exif()
    exif[0x0112] = tag
    extra = {}
    if text_bytes:
        extra["pnginfo"] = PngImagePlugin.PngInfo()
        extra["pnginfo"].add_text("comment", "x" * text_bytes)
    Image.new("RGB", (w, h), (90, 90, 90)).save(path, exif=exif, **extra)
    return path


def test_annotations_are_in_the_displayed_frame_unless_told_otherwise(tmp_path):
    """A YOLO label of a photo stored 40x10 and turned by EXIF tag 6 is a fraction of the displayed 10x40 image
    (ultralytics': OpenCV rotates, `exif_size` swaps): its pixels are in that frame, and the manifest says so; with
    --orientation ignore, in the stored one. COCO's stated size is checked against the frame's, with a hint when it
    is the other frame's. The option is refused where nothing has a frame to give."""
    src = tmp_path / "yolo"
    # A PNG's EXIF (eXIf chunk) counts as the decoders read it, also past a large text chunk
    for name, text in (("a.jpg", 0), ("b.png", 0), ("c.png", 100 << 10)):
        tagged_jpeg(src / "images" / name, 40, 10, 6, text)
        write(src / "labels" / (name[0] + ".txt"), "0 0.5 0.5 0.5 0.5\n")
    m = pack(src, tmp_path / "shown")
    assert m["options"]["orientation"] == "exif" and m["rejected"] == 0
    for name in ("a.jpg", "b.png", "c.png"):
        assert_boxes(stored(tmp_path / "shown")[f"images/{name}"]["boxes"], [[2.5, 10, 7.5, 30]])
    m = pack(src, tmp_path / "as-stored", "--orientation", "ignore")
    assert m["options"]["orientation"] == "ignore" and m["rejected"] == 0
    assert_boxes(stored(tmp_path / "as-stored")["images/a.jpg"]["boxes"], [[10, 2.5, 30, 7.5]])

    imgs = tmp_path / "coco"
    tagged_jpeg(imgs / "a.jpg", 40, 10, 6)
    ann = write(tmp_path / "instances.json", json.dumps({
        "images": [{"id": 1, "file_name": "a.jpg", "width": 40, "height": 10}],
        "annotations": [{"id": 1, "image_id": 1, "category_id": 3, "bbox": [1, 1, 4, 4]}],
        "categories": [{"id": 3, "name": "cat"}]}))
    pack(imgs, tmp_path / "coco-shown", "--annotations", str(ann))
    (rec,) = rejected(tmp_path / "coco-shown")
    assert "displayed image is 10x40" in rec["reason"] and "--orientation ignore" in rec["reason"]
    pack(imgs, tmp_path / "coco-stored", "--annotations", str(ann), "--orientation", "ignore")
    assert rejected(tmp_path / "coco-stored") == []

    with pytest.raises(RuntimeError, match="--orientation applies to detection and segmentation"):
        pack(imgs, tmp_path / "classes", "--orientation", "exif")


def test_the_scanners_frame_is_the_sample_tables_on_every_odd_image(tmp_path):
    """YOLO's fractions become pixels by the size and EXIF tag the scan reads (annotations/common.py `_probe_size`);
    the Loader shows each image by the size and tag pack's validation stores: on every accepted file of the odd-image
    corpus (EXIF tags the readers disagree on, formats only PIL reads, large headers) the two are the same."""
    from odd_images.build import build_corpus

    from fastfeed.pack.annotations.common import _probe_size
    from fastfeed.pack.validate import LoadOptions, load_image

    checked = 0
    for case in build_corpus(str(tmp_path / "odd")):
        res = load_image(case.path, LoadOptions())
        if case.expect != "accept" or res.change is not None:  # a changed file is not what the scan reads
            continue
        assert _probe_size(case.path) == (res.width, res.height, res.orientation), case.name
        checked += 1
    assert checked > 40

def test_inspect_and_summary_say_what_a_detection_dataset_holds(coco, tmp_path, capsys):
    imgs, ann = coco
    assert main(["pack", str(imgs), str(tmp_path / "o"), "--annotations", str(ann)]) == 0
    summary = capsys.readouterr().out
    assert "task detect: 3 classes (person, car, bike)" in summary and "6 without" in summary
    assert "clips to the image: 1" in summary and "stored differently" not in summary
    assert main(["inspect", str(tmp_path / "o")]) == 0
    text = capsys.readouterr().out
    assert "task:        detect" in text and "3 images with objects, 6 without" in text
    assert "format version 3" in text and "frame:       each image as displayed" in text


def test_interrupted_detection_pack_resumes_to_the_same_files(coco, tmp_path, monkeypatch):
    from conftest import run_pack, run_pack_interrupted

    imgs, ann = coco
    args = ("--annotations", str(ann), "--shard-size", "8KB")
    run_pack(imgs, tmp_path / "ref", *args)
    run_pack_interrupted(imgs, tmp_path / "out", *args, monkeypatch=monkeypatch, after=6)
    assert not (tmp_path / "out" / "fastfeed.json").exists()
    journal = tmp_path / "out" / ".fastfeed-pack" / "journal.jsonl"
    assert journal.read_text().count("\n") >= 2  # the fingerprint and at least one commit
    run_pack(imgs, tmp_path / "out", *args, "--resume")
    assert files(tmp_path / "out") == files(tmp_path / "ref")
