"""Symlink policy of the source scan: follow links like torchvision's ImageFolder (also out of the tree), count
them for the pack summary, never loop."""
from __future__ import annotations

import io
import os

import numpy as np
import pytest
from PIL import Image

from fastfeed.pack import PackOptions, pack
from fastfeed.pack.sources import scan_source


def _jpeg(seed: int) -> bytes:
    rng = np.random.default_rng(seed)
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 255, (24, 32, 3), dtype=np.uint8)).save(buf, "JPEG", quality=80)
    return buf.getvalue()


@pytest.fixture()
def linked_tree(tmp_path):
    """src/ with real files, a class folder that is a link out of the tree, a file link out of the tree and a
    folder link inside a class to a folder outside; `outside/` holds the link targets."""
    src, outside = tmp_path / "src", tmp_path / "outside"
    (src / "cat").mkdir(parents=True)
    (outside / "dogs").mkdir(parents=True)
    (outside / "more").mkdir()
    for i in range(2):
        (src / "cat" / f"c{i}.jpg").write_bytes(_jpeg(i))
        (outside / "dogs" / f"d{i}.jpg").write_bytes(_jpeg(10 + i))
        (outside / "more" / f"m{i}.jpg").write_bytes(_jpeg(20 + i))
    (outside / "single.jpg").write_bytes(_jpeg(30))
    os.symlink(outside / "dogs", src / "dog")  # a whole class out of the tree
    os.symlink(outside / "single.jpg", src / "cat" / "linked.jpg")  # a file out of the tree
    os.symlink(outside / "more", src / "cat" / "more")  # a folder out of the tree
    os.symlink(src / "cat" / "c0.jpg", src / "cat" / "inside_link.jpg")  # a link inside the tree
    return src


def test_scan_matches_torchvision_imagefolder_and_counts_links(linked_tree):
    from torchvision.datasets import ImageFolder

    src = scan_source(str(linked_tree))
    tv = ImageFolder(str(linked_tree))
    assert src.classes == tv.classes
    assert sorted((e.path, e.label) for e in src.entries) == sorted(tv.samples)
    assert src.rejected == []
    # dog/d0, dog/d1, cat/linked.jpg, cat/more/m0, cat/more/m1, cat/inside_link.jpg
    assert src.symlinks == 6 and src.symlinks_outside == 5
    assert "6 file(s) (5 outside the source folder)" in src.symlink_note()


def test_folder_loops_are_never_entered(linked_tree):
    cat = linked_tree / "cat"
    os.symlink(cat, cat / "self_loop")  # a link to its own parent
    (linked_tree / "x").mkdir()
    (linked_tree / "x" / "x.jpg").write_bytes(_jpeg(40))
    os.symlink(linked_tree / "x", cat / "to_x")  # cat -> x ...
    os.symlink(cat, linked_tree / "x" / "to_cat")  # ... and x -> cat: a loop through two folders
    os.symlink(linked_tree / "cat" / "f2.jpg", cat / "f1.jpg")  # a file link loop
    os.symlink(cat / "f1.jpg", cat / "f2.jpg")
    src = scan_source(str(linked_tree))
    loops = {os.path.relpath(r["path"], linked_tree) for r in src.rejected if "symlink loop" in r["reason"]}
    assert {"cat/self_loop", "cat/to_x/to_cat", "x/to_cat/to_x", "x/to_cat/self_loop"} <= loops
    paths = [os.path.relpath(e.path, linked_tree) for e in src.entries]
    assert len(paths) == len(set(paths)) < 40  # finite, no path repeated through a loop
    assert "cat/to_x/x.jpg" in paths and "x/to_cat/c0.jpg" in paths


def test_pack_follows_links_and_reports_them_in_the_summary(linked_tree, tmp_path):
    os.symlink(linked_tree / "cat", linked_tree / "cat" / "loop")
    res = pack(str(linked_tree), str(tmp_path / "out"), PackOptions(workers=1))
    assert res.manifest.num_samples == 8
    assert [r["reason"] for r in res.rejected] == ["symlink loop (folder links to its own ancestor)"]
    assert "followed symlinks to 6 file(s) (5 outside the source folder)" in res.summary()


@pytest.fixture()
def two_images(tmp_path):
    for n in ("a", "b"):
        (tmp_path / f"{n}.jpg").write_bytes(_jpeg(ord(n)))
    return tmp_path


@pytest.mark.parametrize("name,text", [
    ("list.csv", "path,label\na.jpg,0\nb.jpg,1\n"),
    ("list.jsonl", '{"path": "a.jpg", "label": 0}\n{"path": "b.jpg", "label": 1}\n'),
])
def test_a_list_saved_with_a_bom_reads_whole(two_images, name, text):
    """Spreadsheet exports start with a UTF-8 BOM: it must not hide the CSV's 'path' column or the first row."""
    (two_images / name).write_bytes(b"\xef\xbb\xbf" + text.encode())
    src = scan_source(str(two_images / name))
    assert src.rejected == [] and [(e.rel, e.label) for e in src.entries] == [("a.jpg", 0), ("b.jpg", 1)]


def test_bad_csv_rows_are_reported_and_bad_csv_files_refused(two_images, tmp_path):
    lst = two_images / "list.csv"
    lst.write_bytes(b"path,label\na.jpg,0,spare,fields\nb\x00.jpg,1\nb.jpg,1\n")
    src = scan_source(str(lst))
    assert [e.rel for e in src.entries] == ["b.jpg"]
    assert [r["reason"] for r in src.rejected] == ["bad list row: 4 fields where the header has 2",
                                                    "bad list row: the path holds a NUL byte"]
    # a quote never closed would swallow every later row into one caption
    lst.write_text('path,label,caption\na.jpg,0,"never closed\nb.jpg,1,fine\n')
    with pytest.raises(ValueError, match=r"list.csv' is not valid CSV after line \d+: unexpected end of data"):
        scan_source(str(lst))
    lst.write_text("path,label,path\na.jpg,0,b.jpg\n")
    with pytest.raises(ValueError, match="the CSV header names 'path' more than once"):
        scan_source(str(lst))


def test_a_jsonl_path_with_a_nul_byte_is_a_reported_row_not_a_crash(two_images, tmp_path):
    lst = two_images / "list.jsonl"
    lst.write_text('{"path": "a.jpg\\u0000x", "label": 0}\n{"path": "b.jpg", "label": 1}\n')
    r = pack(str(lst), str(tmp_path / "out"), PackOptions())
    assert r.manifest.num_samples == 1
    assert r.rejected == [{"path": f"{lst}:1", "reason": "bad list row: the path holds a NUL byte"}]
