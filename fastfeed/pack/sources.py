"""Find the files to pack: an ImageFolder tree, a flat folder, or a CSV/JSONL list.

Detection layouts (YOLO, COCO, Pascal VOC) are scanned by fastfeed/pack/annotations/ into the same `Source`.

The result is deterministic (sorted), so every part of a `--num-parts` pack and every `--resume` sees the same
list. Problems found while scanning (symlink loops, unreadable folders, bad list rows) are returned as
rejections, never raised: the packer reports them and carries on.

ImageFolder class indices are exactly torchvision's `ImageFolder.class_to_idx`: the sorted names of the
first-level folders. Files directly under an ImageFolder root are rejected ("not inside a class folder"), as
torchvision ignores them. Hidden entries (name starting with '.') are skipped and counted, like torchvision.

Symlinks (docs/user-guide.md, "What pack writes"): followed, files and folders, wherever they point -- also out of
the source tree -- because that is what ImageFolder does (`os.walk(followlinks=True)`), so a tree of links into a
shared image store packs the same images a torchvision run would read. Unlike os.walk, a folder link back to one of
its own ancestors is never entered (rejected as "symlink loop"); a file-link loop or a dangling link is rejected
when read. `Source.symlinks` counts the entries reached through a link and `Source.symlinks_outside` those whose
target lies outside the source folder; the pack summary reports both (`Source.symlink_note()`).
"""
from __future__ import annotations

import csv
import datetime
import decimal
import json
import math
import os
from dataclasses import dataclass, field

from fastfeed.constants import MAX_CLASSES

__all__ = ["SourceEntry", "Source", "scan_source", "SOURCE_KINDS"]

SOURCE_KINDS = ("auto", "imagefolder", "flat", "list")


@dataclass(frozen=True)
class SourceEntry:
    path: str  # absolute path to read
    rel: str  # path relative to the source root, for reports
    label: int
    metadata: dict | None = None
    # Detection sources (fastfeed/pack/annotations/): the (width, height) the annotations were made for, checked
    # against the stored image once it is stored.
    size: tuple[int, int] | None = None
    # Detection sources whose objects have numbers of their own in the annotation file: each stored object's (VOC:
    # its <object> element's index), so that rejected.jsonl's "object" means one thing for a file's objects.
    object_ids: tuple[int, ...] | None = None
    # Members stored beside the image as `KEY.ext`: (ext, absolute path) for a file stored byte for byte (a
    # semantic source's mask: fastfeed/pack/annotations/masks.py) or (ext, bytes) for a value (a list's caption);
    # every entry of a source carries the same exts.
    members: tuple[tuple[str, str | bytes], ...] = ()


@dataclass
class Source:
    root: str  # absolute path of the folder or list file
    kind: str  # 'imagefolder' | 'flat' | 'list'
    entries: list[SourceEntry]
    classes: list[str]
    class_to_idx: dict[str, int]
    rejected: list[dict] = field(default_factory=list)  # {"path", "reason"}
    hidden_skipped: int = 0
    symlinks: int = 0  # entries reached through a symlink (the file itself or a folder above it)
    symlinks_outside: int = 0  # ... of which the real file lies outside the source folder
    # "detect": entries carry fastfeed/targets.py annotations as their metadata; "semantic": a mask member each
    task: str = "classify"
    class_ids: list[int] | None = None  # COCO: the category id of each class, in class order
    fields: tuple[str, ...] = ()  # the exts of the entries' `members`: the dataset's fields

    def symlink_note(self) -> str | None:
        """The pack summary's line about followed symlinks, or None when there were none."""
        if not self.symlinks:
            return None
        return (f"followed symlinks to {self.symlinks} file(s) ({self.symlinks_outside} outside the source folder), "
                f"as torchvision's ImageFolder does")


def scan_source(src: str, kind: str = "auto") -> Source:
    if kind not in SOURCE_KINDS:
        raise ValueError(f"source kind must be one of {SOURCE_KINDS}, got {kind!r}")
    root = os.path.abspath(src)
    if not os.path.exists(root):
        raise FileNotFoundError(f"source {src!r} does not exist")
    if kind == "auto":
        if os.path.isfile(root):
            kind = "list"
        else:
            kind = "imagefolder" if _has_subdirs(root) else "flat"
    if kind == "list":
        return _scan_list(root)
    if not os.path.isdir(root):
        raise NotADirectoryError(f"source {src!r} is not a folder")
    return _scan_imagefolder(root) if kind == "imagefolder" else _scan_flat(root)


def _has_subdirs(root: str) -> bool:
    with os.scandir(root) as it:
        return any(e.is_dir() and not e.name.startswith(".") for e in it)


def _scan_flat(root: str) -> Source:
    src = Source(root, "flat", [], [], {})
    for name, is_dir in _listdir(root, src):
        if is_dir:
            src.rejected.append({"path": os.path.join(root, name), "reason": "folder inside a flat source"})
        else:
            path = os.path.join(root, name)
            if os.path.islink(path):
                _count_link(src, path)
            src.entries.append(SourceEntry(path, name, -1))
    return src


def _count_link(src: Source, path: str) -> None:
    src.symlinks += 1
    real_root = os.path.realpath(src.root)
    if os.path.commonpath([os.path.realpath(path), real_root]) != real_root:
        src.symlinks_outside += 1


def _scan_imagefolder(root: str) -> Source:
    src = Source(root, "imagefolder", [], [], {})
    dirs = []
    for name, is_dir in _listdir(root, src):
        if is_dir:
            dirs.append(name)
        else:
            src.rejected.append({"path": os.path.join(root, name), "reason": "not inside a class folder"})
    src.classes = sorted(dirs)
    src.class_to_idx = {c: i for i, c in enumerate(src.classes)}
    for cls in src.classes:
        label = src.class_to_idx[cls]
        top = os.path.join(root, cls)
        for path, via_link in _walk_files(top, src):
            if via_link:
                _count_link(src, path)
            src.entries.append(SourceEntry(path, path[len(root) + 1 :], label))
    return src


def _listdir(folder: str, src: Source) -> list[tuple[str, bool]]:
    """Sorted (name, is_dir) of a folder; is_dir follows symlinks (broken links count as files)."""
    out = []
    try:
        with os.scandir(folder) as it:
            for e in it:
                if e.name.startswith("."):
                    src.hidden_skipped += 1
                    continue
                try:
                    is_dir = e.is_dir()
                except OSError:  # a symlink loop: is_dir() follows it
                    is_dir = False
                out.append((e.name, is_dir))
    except OSError as e:
        src.rejected.append({"path": folder, "reason": f"unreadable folder: {e.strerror or e}"})
    out.sort()
    return out


def _walk_files(top: str, src: Source) -> list[tuple[str, bool]]:
    """(path, reached through a symlink) of every file below `top`, following symlinked folders (as torchvision
    does) but never into a loop."""
    files: list[tuple[str, bool]] = []

    def visit(folder: str, ancestors: frozenset, via_link: bool) -> None:
        try:
            st = os.stat(folder)
        except OSError as e:
            src.rejected.append({"path": folder, "reason": f"unreadable folder: {e.strerror or e}"})
            return
        ident = (st.st_dev, st.st_ino)
        if ident in ancestors:
            src.rejected.append({"path": folder, "reason": "symlink loop (folder links to its own ancestor)"})
            return
        inner = ancestors | {ident}
        for name, is_dir in _listdir(folder, src):
            path = os.path.join(folder, name)
            linked = via_link or os.path.islink(path)
            if is_dir:
                visit(path, inner, linked)
            else:
                files.append((path, linked))

    visit(top, frozenset(), os.path.islink(top))
    return files


# A list's caption column, stored as each sample's `KEY.txt` (webdataset's and OpenCLIP's caption member).
CAPTION_COLUMNS = ("caption", "text", "txt")
_LIST_COLUMNS = ("path", "label", "metadata")


def _scan_list(path: str) -> Source:
    """CSV with a header (`path,label[,metadata]`, metadata a JSON object), JSONL (`{"path", "label",
    "metadata"}` per line) or Parquet (those columns; needs pyarrow). Relative paths are relative to the list
    file's folder. Labels are integers or class names; names are indexed in sorted order like ImageFolder. A
    missing/empty label is -1. A caption column (CAPTION_COLUMNS, the first there is) becomes each sample's `.txt`
    member; any other column joins the metadata (`.json`), so that nothing in the list is lost. JSONL and Parquet
    rows must all have the caption or none."""
    base = os.path.dirname(path)
    src = Source(path, "list", [], [], {})
    rows: list[tuple[str, object, dict | None, str | None]] = []
    lower = path.lower()
    try:
        if lower.endswith(".parquet"):
            _read_parquet(path, rows, src)
        else:
            _read_list_text(path, lower, rows, src)
    except UnicodeDecodeError as e:
        raise ValueError(f"list file {path!r} is not UTF-8: {e}") from None
    _finish_list(src, rows, base)
    return src


def _read_list_text(path: str, lower: str, rows: list, src: Source) -> None:
    # utf-8-sig: spreadsheet exports start with a BOM, which would otherwise hide the header's first column name
    with open(path, encoding="utf-8-sig", newline="") as f:
        if lower.endswith((".jsonl", ".ndjson")):
            _read_jsonl(f, path, rows, src)
        elif lower.endswith(".csv"):
            _read_csv(f, path, rows, src)
        else:
            raise ValueError(f"list file {path!r}: expected a .csv, .jsonl or .parquet file")


def _finish_list(src: Source, rows: list, base: str) -> None:
    """The list's rows as entries: class names indexed, the caption made a member."""
    path = src.root
    captioned = [c is not None for _, _, _, c in rows]
    if any(captioned) and not all(captioned):  # JSONL, Parquet: every sample carries the same members
        kept = []
        for row, has in zip(rows, captioned):
            if has:
                kept.append(row)
            else:
                src.rejected.append({"path": row[0], "reason": "bad list row: no caption "
                                     f"({', '.join(CAPTION_COLUMNS)}) where the other rows have one"})
        rows = kept
    if any(captioned):
        src.fields = ("txt",)
    raw_labels = [lab for _, lab, _, _ in rows]
    names = sorted({lab for lab in raw_labels if isinstance(lab, str)})
    if names and any(isinstance(lab, int) and lab >= 0 for lab in raw_labels):
        raise ValueError(f"list file {path!r} mixes integer labels and class names")
    if names:
        src.classes = names
    else:
        top = max((lab for lab in raw_labels if isinstance(lab, int)), default=-1)
        if top >= MAX_CLASSES:  # an id, not a class index: its list of names would be as long as the id
            raise ValueError(f"list file {path!r}: label {top} is past the {MAX_CLASSES:,} classes a dataset takes "
                             "(a label is a class index, 0 to the number of classes - 1, or a class name); put ids "
                             "of another kind in another column, which goes into each sample's json")
        src.classes = [str(i) for i in range(top + 1)]
    src.class_to_idx = {c: i for i, c in enumerate(src.classes)}
    for p, lab, meta, caption in rows:
        label = src.class_to_idx[lab] if isinstance(lab, str) else int(lab)
        full = p if os.path.isabs(p) else os.path.join(base, p)
        members = (("txt", caption.encode("utf-8")),) if caption is not None else ()
        src.entries.append(SourceEntry(os.path.abspath(full), p, label, meta, members=members))


def _row_path(p: str) -> str:
    """A list row's path, checked: no file has an empty name or one with a NUL byte (os calls refuse it)."""
    if not p:
        raise ValueError("empty path")
    if "\0" in p:
        raise ValueError("the path holds a NUL byte")
    return p


def _parse_label(value: object) -> object:
    if value is None or value == "" or (isinstance(value, float) and math.isnan(value)):  # NaN: pandas' null
        return -1
    if isinstance(value, bool):
        raise ValueError("label must be an integer or a class name")
    if isinstance(value, float):  # an integer column with nulls, as pandas writes it: 3.0 is label 3
        if not value.is_integer():
            raise ValueError(f"label {value} is not a whole number")
        return _parse_label(int(value))
    if isinstance(value, int):
        if value < -1:
            raise ValueError(f"label {value} is negative")
        return value
    if isinstance(value, str):
        s = value.strip()
        if s.lstrip("-").isdigit():
            return _parse_label(int(s))
        return s
    raise ValueError(f"label must be an integer or a class name, got {type(value).__name__}")


def _with_columns(meta: dict | None, columns: dict) -> dict | None:
    """The row's metadata with its other columns added (a name in both is the row's error)."""
    if not columns:
        return meta
    clash = sorted(set(columns) & set(meta or {}))
    if clash:
        raise ValueError(f"column(s) {clash} are also keys of its metadata")
    return {**(meta or {}), **columns}


def _standard_json(value, where: str = ""):
    """A row's metadata as standard JSON holds it: NaN (a null in pandas' float columns, and Python's json reads the
    token) is null; an infinity has no JSON form (ValueError naming where it is)."""
    if isinstance(value, float) and not math.isfinite(value):
        if math.isnan(value):
            return None
        raise ValueError(f"{where or 'metadata'} holds {value}, which JSON cannot hold")
    if isinstance(value, dict):
        return {k: _standard_json(v, f"{where}.{k}" if where else repr(k)) for k, v in value.items()}
    if isinstance(value, list):
        return [_standard_json(v, where) for v in value]
    return value


def _read_csv(f, path: str, rows: list, src: Source) -> None:
    reader = csv.DictReader(f, strict=True)
    if not reader.fieldnames or "path" not in reader.fieldnames:
        raise ValueError(f"list file {path!r}: the CSV header must name a 'path' column (and optionally "
                         f"'label', 'metadata')")
    twice = sorted({c for c in reader.fieldnames if reader.fieldnames.count(c) > 1})
    if twice:  # DictReader would keep the last of them and drop the others
        raise ValueError(f"list file {path!r}: the CSV header names {', '.join(map(repr, twice))} more than once")
    caption = next((c for c in CAPTION_COLUMNS if c in reader.fieldnames), None)
    others = [c for c in reader.fieldnames if c not in _LIST_COLUMNS and c != caption]
    try:
        for row in reader:
            _read_csv_row(reader, row, path, rows, src, caption, others)
    except csv.Error as e:  # strict: a quote never closed would otherwise swallow every later row into one field
        raise ValueError(f"list file {path!r} is not valid CSV after line {reader.line_num}: {e}") from None


def _read_csv_row(reader: csv.DictReader, row: dict, path: str, rows: list, src: Source, caption: str | None,
                  others: list[str]) -> None:
    where = f"{path}:{reader.line_num}"
    try:
        if None in row:  # DictReader's key for the fields past the header's columns
            raise ValueError(f"{len(reader.fieldnames) + len(row[None])} fields where the header has "
                             f"{len(reader.fieldnames)}")
        given = sum(row[c] is not None for c in reader.fieldnames)  # DictReader fills a short row's end with None
        if given < len(reader.fieldnames):
            raise ValueError(f"{given} fields where the header has {len(reader.fieldnames)}")
        p = _row_path((row.get("path") or "").strip())
        meta_text = (row.get("metadata") or "").strip()
        meta = json.loads(meta_text) if meta_text else None
        if meta is not None and not isinstance(meta, dict):
            raise ValueError("metadata must be a JSON object")
        meta = _standard_json(_with_columns(meta, {c: row.get(c) for c in others}))
        text = None if caption is None else (row.get(caption) or "")
        rows.append((p, _parse_label(row.get("label")), meta, text))
    except ValueError as e:
        src.rejected.append({"path": where, "reason": f"bad list row: {e}"})


def _read_jsonl(f, path: str, rows: list, src: Source) -> None:
    for n, line in enumerate(f, 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except ValueError as e:
            src.rejected.append({"path": f"{path}:{n}", "reason": f"bad list row: {e}"})
            continue
        _read_object(obj, f"{path}:{n}", rows, src)


def _read_parquet(path: str, rows: list, src: Source) -> None:
    """A Parquet list (img2dataset writes one per shard): its rows as JSONL's objects, row n named `path:n`."""
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise ValueError(f"list file {path!r}: reading Parquet needs pyarrow (pip install pyarrow)") from None
    try:
        table = pq.read_table(path)
    except Exception as e:  # noqa: BLE001 - pyarrow's errors are many; any of them means the file is unreadable
        raise ValueError(f"list file {path!r} is not a readable Parquet file: {e}") from None
    for n, obj in enumerate(table.to_pylist(), 1):
        try:
            obj = {k: v if k == "path" else _json_value(v, k) for k, v in obj.items()}
        except ValueError as e:
            src.rejected.append({"path": f"{path}:{n}", "reason": f"bad list row: {e}"})
            continue
        _read_object(obj, f"{path}:{n}", rows, src)


def _json_value(value, column: str):
    """A Parquet cell as the sample's JSON holds it: dates, times and timestamps as ISO 8601 text, a duration in
    seconds, a decimal as its exact text; bytes have no JSON form (ValueError naming the column)."""
    if isinstance(value, (datetime.datetime, datetime.date, datetime.time)):
        return value.isoformat()
    if isinstance(value, datetime.timedelta):
        return value.total_seconds()
    if isinstance(value, decimal.Decimal):
        return str(value)
    if isinstance(value, (bytes, bytearray)):
        raise ValueError(f"column {column!r} holds bytes, which a sample's JSON cannot hold (drop the column, or "
                         "store such data as a member of its own)")
    if isinstance(value, dict):
        return {k: _json_value(v, column) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_value(v, column) for v in value]
    return value


def _read_object(obj, where: str, rows: list, src: Source) -> None:
    """One list row given as an object (a JSONL line, a Parquet row)."""
    try:
        if not isinstance(obj, dict) or not isinstance(obj.get("path"), str) or not obj["path"]:
            raise ValueError("each row must be an object with a non-empty 'path'")
        _row_path(obj["path"])
        meta = obj.get("metadata")
        if meta is not None and not isinstance(meta, dict):
            raise ValueError("metadata must be a JSON object")
        caption = next((c for c in CAPTION_COLUMNS if c in obj), None)
        text = None if caption is None else obj[caption]
        if text is not None and not isinstance(text, str):
            raise ValueError(f"'{caption}' must be a string")
        meta = _standard_json(_with_columns(meta, {k: v for k, v in obj.items()
                                                    if k not in _LIST_COLUMNS and k != caption}))
        rows.append((obj["path"], _parse_label(obj.get("label")), meta, text))
    except ValueError as e:
        src.rejected.append({"path": where, "reason": f"bad list row: {e}"})
