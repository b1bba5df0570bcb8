"""`fastfeed index`: adopt WebDataset shards written by anyone (webdataset's ShardWriter, img2dataset, tarp) where
they lie, without rewriting a byte of them.

It reads every shard once and writes what `fastfeed pack` would have written beside its own shards: the sample
table (each sample's image and every other member as a named field: offsets, sizes, xxh3), DALI's `.idx` per shard,
the rejected-sample report and the manifest (format version 4), last. Into the shards' folder by default, or into
another folder (`out`) when the shards' folder is read-only; the manifest then names the shards' folder
(`data_root`). Shards at an fsspec URL (s3://, gs://, ...) are read once each, through a temporary file; their
dataset goes beside them, or into a local folder or another URL, and the Loader reads the shards through the shard
cache (fastfeed/remote/dataset.py).

Samples follow webdataset's rule: consecutive members whose names share the part before the first dot of the base
name form one sample, and the rest of the name is the member's extension (lower-cased). The image is the sample's
`jpg`, `jpeg` or `png` member, else its first image member of another format (`webp`, `tif`, ...), or `image_ext`;
`cls` is its label. The image gets pack's checks (fastfeed/pack/validate.py), and pack's decision: one that only
the decode contract's PIL decode reads as stored (a CMYK JPEG, a 16-bit PNG, a WebP, ...) is marked `pil_only`, as
pack marks it. One that pack would fix (junk before a marker, arithmetic coding) is adopted as it is, `pil_only`,
when PIL decodes it, else rejected with the reason: a shard is never rewritten. Trailing bytes after an image's end
marker are left in the shard and outside the image's extent.
"""
from __future__ import annotations

import contextlib
import glob
import hashlib
import mmap
import os
import posixpath
import re
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass, field

import numpy as np
import xxhash

from fastfeed.constants import IMAGE_EXTS, MAX_CLASSES, ORIENTATIONS
from fastfeed.formats.fields import columns, int_member, value_kind
from fastfeed.formats.tarwalk import walk_tar
from fastfeed.image import transcode
from fastfeed.pack.table import new_rows, rows_to_table, write_dataset
from fastfeed.pack.validate import TRIMMED, Loaded, LoadOptions, check_for_pil, check_image
from fastfeed.pack.wds import WdsWriter
from fastfeed.pack.writers import atomic_write
from fastfeed.remote.store import is_url, join, missing_bucket, retrying, url_to_fs
from fastfeed.types import ADOPTED_FORMAT_VERSION, FIELD_NAME, MANIFEST_NAME, DatasetError, Manifest, ShardInfo
from fastfeed.world import usable_cpus

__all__ = ["index_shards", "IndexReport", "IMAGE_EXTS", "find_shards"]

_KEY_EXT = re.compile(r"^((?:.*/|)[^./]+)\.([^/]*)$")  # webdataset's base_plus_ext
_IDX_VERSION = "v1.2"


@dataclass
class _Sample:
    key: str
    members: list  # [(ext, offset, size, name)] in tar order


@dataclass
class _ShardResult:
    rows: dict = field(default_factory=lambda: new_rows(WdsWriter.columns))
    fields: list = field(default_factory=list)  # per accepted sample: {ext: (offset, size, xxh3)}
    idx_lines: list = field(default_factory=list)
    no_idx: str = ""  # why the shard gets no DALI index
    rejected: list = field(default_factory=list)
    sha256: str = ""
    bytes: int = 0


@dataclass(frozen=True)
class IndexReport:
    manifest: Manifest
    out: str
    rejected: list


def find_shards(src: str, storage_options: dict | None = None) -> tuple[str, list[str]]:
    """(the shards' folder, their paths relative to it) for a folder (every `.tar` or `.TAR` in it and below,
    sorted), a glob (`data/*.tar`) or a brace pattern (`data/shard-{000000..000099}.tar`), on this machine or at an
    fsspec URL (`s3://bucket/shards/`, `gs://bucket/shard-{0000..0099}.tar`; the folder is then a URL)."""
    src = os.fspath(src)
    if is_url(src):
        return _find_remote(src, storage_options)
    if os.path.isdir(src):
        root = os.path.abspath(src)
        found = sorted(glob.glob(os.path.join(root, "**", "*"), recursive=True))
        rels = [os.path.relpath(p, root) for p in found if p.lower().endswith(".tar")]
        _refuse_compressed(src, found)
    else:
        paths = [p for pattern in _braces(src) for p in (sorted(glob.glob(pattern)) if glob.has_magic(pattern)
                                                       else [pattern])]
        _refuse_compressed(src, paths)
        _check_found(src, [p for p in paths if not os.path.isfile(p)])
        paths = [os.path.abspath(p) for p in paths]
        root = os.path.commonpath([os.path.dirname(p) for p in paths]) if paths else os.path.abspath(".")
        rels = [os.path.relpath(p, root) for p in paths]
    if not rels:
        raise DatasetError(f"{src}: no .tar shards found", path=src)
    return root, rels


def _find_remote(src: str, storage_options: dict | None) -> tuple[str, list[str]]:
    fs, base = url_to_fs(src.rstrip("/"), storage_options)
    _check_bucket(fs, src, base)
    if retrying(lambda: fs.isdir(base), f"list {src}"):
        root = base.rstrip("/")
        found = sorted(retrying(lambda: fs.find(root), f"list {src}"))
        paths = [p for p in found if p.lower().endswith(".tar")]
        _refuse_compressed(src, found)
    else:
        paths = []
        for pattern in _braces(base):
            if glob.has_magic(pattern):
                paths.extend(sorted(retrying(lambda: fs.glob(pattern), f"list {src}")))
            else:
                paths.append(pattern)
        _refuse_compressed(src, paths)
        _check_found(src, [p for p in paths if not retrying(lambda: fs.isfile(p), f"list {src}")])
        root = posixpath.commonpath([posixpath.dirname(p) for p in paths]) if paths else base
    if not paths:
        raise DatasetError(f"{src}: no .tar shards found", path=src)
    return fs.unstrip_protocol(root), [posixpath.relpath(p, root) for p in paths]


def _check_bucket(fs, url: str, base: str) -> None:
    problem = missing_bucket(fs, url, base)
    if problem:
        raise DatasetError(problem, path=url)


# webdataset reads these too, but a compressed member has no byte range to read in place.
_COMPRESSED = (".tar.gz", ".tgz", ".tar.bz2", ".tar.xz", ".tar.zst", ".tar.lz4")


def _refuse_compressed(src: str, paths) -> None:
    """A compressed shard cannot be adopted: the Loader and DALI read each member's bytes at its offset in the
    shard. Said by name rather than as a damaged tar, as no shards at all, or (beside .tar shards in a folder) by
    leaving its samples out unsaid."""
    bad = [p for p in paths if p.lower().endswith(_COMPRESSED)]
    if bad:
        raise DatasetError(f"{src}: {bad[0]}" + (f" (and {len(bad) - 1} more)" if len(bad) > 1 else "")
                           + " is a compressed tar; fastfeed reads each sample's bytes in place, which needs "
                           "uncompressed shards: decompress them (gunzip, zstd -d, ...: the members stay as they are) "
                           "and index those, name only the .tar ones (a glob: 'data/*.tar'), or `fastfeed pack` the "
                           "samples", path=bad[0])


def _check_found(src: str, missing: list[str]) -> None:
    if missing:
        raise DatasetError(f"{src}: no such shard {missing[0]}" + (f" (and {len(missing) - 1} more)"
                                                                   if len(missing) > 1 else ""), path=missing[0])


def _braces(pattern: str) -> list[str]:
    """webdataset's brace notation: `{000..012}` (zero padding kept) and `{a,b}`, nested left to right."""
    m = re.search(r"\{([^{}]*)\}", pattern)
    if m is None:
        return [pattern]
    body, head, tail = m.group(1), pattern[:m.start()], pattern[m.end():]
    r = re.fullmatch(r"(\d+)\.\.(\d+)", body)
    items = ([str(i).zfill(len(r.group(1))) for i in range(int(r.group(1)), int(r.group(2)) + 1)] if r
             else body.split(","))
    return [p for item in items for p in _braces(head + item + tail)]


def index_shards(src: str, out: str | None = None, *, image_ext: str | None = None, threads: int | None = None,
                 scan_check: bool = True, overwrite: bool = False, storage_options: dict | None = None,
                 orientation: str | None = None) -> IndexReport:
    """Adopt the shards `src` names (find_shards) as a fastfeed dataset written to `out` (default: the shards'
    folder). Shards at a URL are read once each (downloaded to a temporary file, indexed, removed); `out` is then
    a local folder or a URL (written locally, then uploaded, its manifest last). `orientation`: the frame the
    samples' masks are in ("exif": each image as displayed), recorded when given; without it, as stored (the
    shards are someone else's: nothing says how their masks were drawn). Raises DatasetError when no sample is
    usable or `out` already holds a dataset (unless `overwrite`)."""
    if image_ext is not None and image_ext not in IMAGE_EXTS:
        raise ValueError(f"image_ext must be one of {IMAGE_EXTS}, got {image_ext!r}")
    if orientation is not None and orientation not in ORIENTATIONS:
        raise ValueError(f"orientation must be one of {ORIENTATIONS}, got {orientation!r}")
    options = {"image_ext": image_ext, "scan_check": scan_check}
    if orientation is not None:
        options["orientation"] = orientation
    root, rels = find_shards(src, storage_options)
    out = root if not out else out.rstrip("/") if is_url(out) else os.path.abspath(out)
    if is_url(out) and not is_url(root):
        raise DatasetError(f"{out}: a dataset at a URL reads its shards from a URL: upload the shards, or index "
                           "into a local folder", path=out)
    _refuse_existing(out, overwrite, storage_options, named=out != root)
    opts = LoadOptions(scan_check=scan_check)
    cores = usable_cpus()
    workers = threads or min(8, cores)
    # Shards at a URL are downloaded next to the dataset's files when those are local: a shard is up to gigabytes,
    # /tmp is often small. Local shards need no folder (theirs may be read-only).
    downloads = (tempfile.TemporaryDirectory(prefix=".fastfeed-index-", dir=None if is_url(out) else out)
                 if is_url(root) else contextlib.nullcontext())
    fs, base = url_to_fs(root, storage_options) if is_url(root) else (None, root)  # one client for every shard
    # Every shard's scan check in chunks on one pool of a thread per core (native calls, GIL released): the cores
    # stay busy to the last chunk, however few shards are left.
    scans = ThreadPoolExecutor(max_workers=cores, thread_name_prefix="fastfeed-index-scan") if scan_check else None
    with downloads as tmp, scans or contextlib.nullcontext():
        # A shard's tar walk and header probes hold the GIL; its hash and scan check do not. One shard at a time,
        # each shard's scan starts as soon as its own walk ends and runs beside the next shard's walk: side by side,
        # the walks would share the GIL and every scan would wait for all of them.
        python_steps = threading.Lock()

        def one(a):
            shard, rel = a
            if fs is None:
                return _index_shard(os.path.join(root, rel), rel, shard, image_ext, opts, scans, python_steps)
            local = os.path.join(tmp, f"{shard:08d}.tar")  # at most `workers` of them at a time
            retrying(lambda: fs.get_file(join(base, rel), local), f"download {root}/{rel}")
            try:
                return _index_shard(local, rel, shard, image_ext, opts, scans, python_steps)
            finally:
                os.remove(local)

        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="fastfeed-index") as pool:
            results = list(pool.map(one, enumerate(rels)))
        folder = os.path.join(tmp, "out") if is_url(out) else out
        manifest, rejected = _write(folder, src, root, rels, results, options,
                                    data_root="" if out == root else root)
        if is_url(out):
            from fastfeed.pack.remote import upload_dataset

            upload_dataset(folder, out, storage_options)
    return IndexReport(manifest, out, rejected)


def _refuse_existing(out: str, overwrite: bool, storage_options: dict | None, named: bool) -> None:
    """Refuse an `out` that already holds a dataset (unless `overwrite`) or, on this machine, one that cannot be
    written: said before any shard is read, not by the first file written at the end. `named`: `out` was given,
    rather than being the shards' folder."""
    if is_url(out):
        fs, base = url_to_fs(out.rstrip("/"), storage_options)
        _check_bucket(fs, out, base)
        there = retrying(lambda: fs.exists(join(base, MANIFEST_NAME)), f"look at {out}")
    else:
        there = os.path.exists(os.path.join(out, MANIFEST_NAME))
    if there and not overwrite:
        raise DatasetError(f"{out}: already holds a dataset ({MANIFEST_NAME}); pass overwrite=True (--overwrite) to "
                           "index again", path=out)
    if is_url(out):
        return
    try:
        os.makedirs(out, exist_ok=True)
        with tempfile.TemporaryFile(dir=out):  # gone once closed, even if this process dies first
            pass
    except OSError as e:
        hint = ("" if named else "; the dataset's files go beside the shards unless you name another folder for "
                "them: `fastfeed index SHARDS OUT` (index_shards(src, out))")
        raise DatasetError(f"{out}: cannot write the dataset's files into this folder ({e.strerror or e}){hint}",
                           path=out) from None


def _write(out: str, src: str, root: str, rels: list[str], results: list, options: dict,
           data_root: str) -> tuple[Manifest, list]:
    """The dataset's files into the local folder `out`, the manifest last: (the manifest, the rejections)."""
    os.makedirs(out, exist_ok=True)
    rejected = [r for res in results for r in res.rejected]
    rows = {c: [v for res in results for v in res.rows[c]] for c in results[0].rows}
    per_sample = [f for res in results for f in res.fields]
    if not per_sample:
        raise DatasetError(f"{src}: no usable sample in {len(rels)} shard(s) ({len(rejected)} rejected; first: "
                           f"{rejected[0]['reason'] if rejected else 'no members'})", path=root)
    table_names = sorted({ext for f in per_sample for ext in f})
    table = _table(rows, per_sample, table_names)
    labels = table["label"]
    classes = [str(i) for i in range(int(labels.max()) + 1)] if (labels >= 0).any() else []
    # A cls that is -1 everywhere (pack's own detection and segmentation shards) labels nothing: not a field to offer.
    names = table_names if classes else [n for n in table_names if n != "cls"]
    # Shards where only some samples carry a cls: the others' label -1 would stop a loss mid-epoch, so it is said.
    unlabelled = int((labels < 0).sum()) if classes else 0
    # Fields some samples lack: Loader(fields=[...]) skips those samples as bad records, so inspect says how many.
    lacking = {n: int((table[columns(n)[1]] < 0).sum()) for n in names if n != "cls"}
    extra = {"without_field": {n: k for n, k in lacking.items() if k}} if any(lacking.values()) else {}
    if unlabelled:
        extra["without_cls"] = unlabelled
    no_idx = {rel: res.no_idx for rel, res in zip(rels, results) if res.no_idx}
    if no_idx:
        extra["no_dali_index"] = no_idx
    for rel, res in zip(rels, results):
        idx_path = os.path.join(out, rel[: -len(".tar")] + ".idx")
        if res.no_idx:
            with contextlib.suppress(FileNotFoundError):  # one an earlier index wrote would be stale
                os.remove(idx_path)
            continue
        idx = f"{_IDX_VERSION} {len(res.idx_lines)}\n" + "".join(line + "\n" for line in res.idx_lines)
        os.makedirs(os.path.dirname(idx_path), exist_ok=True)
        atomic_write(idx_path, idx.encode("utf-8"))
    shards = [ShardInfo(rel, res.bytes, res.sha256, len(res.idx_lines)) for rel, res in zip(rels, results)]
    manifest = write_dataset(
        out, "wds", table, shards, rejected, classes=classes, class_to_idx={c: i for i, c in enumerate(classes)},
        source=root, source_kind="shards", options=options, part=None, created_by="fastfeed index",
        extra=extra, fields=names, data_root=data_root,
        version=ADOPTED_FORMAT_VERSION)
    return manifest, rejected


def _table(rows: dict, per_sample: list[dict], names: list[str]) -> dict[str, np.ndarray]:
    table = rows_to_table(rows, WdsWriter.columns)  # pack's columns: an adopted table reads like a packed one
    for name in names:
        cells = [f.get(name, (-1, -1, 0)) for f in per_sample]
        off_col, size_col, sum_col = columns(name)
        table[off_col] = np.array([c[0] for c in cells], dtype=np.int64)
        table[size_col] = np.array([c[1] for c in cells], dtype=np.int64)
        table[sum_col] = np.array([c[2] for c in cells], dtype=np.uint64)
    return table


def _index_shard(path: str, rel: str, shard: int, image_ext: str | None, opts: LoadOptions,
                 scans: ThreadPoolExecutor | None = None, python_steps=contextlib.nullcontext()) -> _ShardResult:
    res = _ShardResult()
    try:
        f = open(path, "rb")
    except OSError as e:
        raise DatasetError(f"{path}: unreadable ({e.strerror or e})", path=path) from None
    with f:
        size = os.fstat(f.fileno()).st_size
        res.bytes = size
        if size == 0:
            res.rejected.append({"source": rel, "reason": "empty file, not a tar archive"})
            res.sha256 = hashlib.sha256().hexdigest()
            return res
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            res.sha256 = hashlib.sha256(mm).hexdigest()  # releases the GIL: the shards hash side by side
            view = memoryview(mm)
            try:
                with python_steps:
                    samples, problem = _samples(mm, size, rel, res.rejected)
                    images = [_image_member(s, image_ext) for s in samples]
                    facts, jpegs = _jpeg_headers(view, images)
                if opts.scan_check:
                    _scan_jpegs(view, jpegs, facts, scans)
                for s, img, known in zip(samples, images, facts):
                    _add_sample(res, view, s, img, rel, shard, opts, known)
            finally:
                view.release()
    if problem:
        res.rejected.append({"source": rel, "reason": problem})
    return res


def _samples(buf, size: int, rel: str, rejected: list) -> tuple[list[_Sample], str | None]:
    """The shard's samples, grouped as webdataset groups them, and what stopped the walk early (a damaged header,
    a member cut short) or None. A key whose members are not together (seen again after another key) is rejected:
    webdataset reads it as several samples, each missing what the others hold."""
    members, skipped, problem = walk_tar(buf, size)
    for name, why in skipped:
        rejected.append({"source": f"{rel}:{_shown(name)}", "reason": why})
    samples: list[_Sample] = []
    for m in members:
        parts = _KEY_EXT.match(m.name)
        if parts is None:
            rejected.append({"source": f"{rel}:{_shown(m.name)}", "reason": "member name has no extension"})
            continue
        key, ext = parts.group(1), parts.group(2).lower()
        if samples and samples[-1].key == key:
            samples[-1].members.append((ext, m.offset, m.size, m.name))
        else:
            samples.append(_Sample(key, [(ext, m.offset, m.size, m.name)]))
    groups: dict[str, list[_Sample]] = {}
    for s in samples:
        groups.setdefault(s.key, []).append(s)
    apart = {key: g for key, g in groups.items() if len(g) > 1}
    for key, g in apart.items():
        where = "; ".join(", ".join(m[0] for m in s.members) for s in g[:4]) + ("; ..." if len(g) > 4 else "")
        rejected.append({"source": f"{rel}:{_shown(key)}", "key": _shown(key), "reason": (
            f"members of key {key} are not next to each other in the shard (webdataset groups consecutive "
            f"members, so it reads {len(g)} samples named {key}: {where}); write each sample's members together")})
    kept = []
    for s in samples:
        if s.key in apart:
            continue
        s.members = [m for m in s.members if not _refused(m, rel, rejected)]
        if s.members:
            kept.append(s)
    return kept, problem


def _refused(member: tuple, rel: str, rejected: list) -> bool:
    """Whether the member (ext, offset, size, name) cannot be a field, said in `rejected`: its sample is adopted
    without it. After grouping: webdataset groups it with its neighbours all the same."""
    ext, name = member[0], member[3]
    if _shown(name) != name:  # tarfile's surrogate escapes: the table, the manifest and DALI's index hold UTF-8
        rejected.append({"source": f"{rel}:{_shown(name)}", "reason": (
            "member name is not UTF-8 (shown with \\x escapes; a tar written under another locale?): a dataset's "
            "keys and field names are UTF-8 text; rename the members in UTF-8")})
        return True
    if not FIELD_NAME.fullmatch(ext):  # the manifest's field names: one it could not hold makes it unreadable
        rejected.append({"source": f"{rel}:{name}", "reason": "no extension (the name ends in a dot)" if not ext else (
            f"extension {ext!r} cannot name a field (letters, digits, '_' and '-', in parts joined by single dots)")})
        return True
    try:
        value_kind(ext)  # a pickled member: never read, not even hashed
    except ValueError as e:
        rejected.append({"source": f"{rel}:{name}", "reason": str(e)})
        return True
    return False


def _shown(name: str) -> str:
    """A member name as UTF-8 text: the bytes of a name that is not UTF-8 (the walk's surrogate escapes) as \\xNN."""
    return name.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def _image_member(s: _Sample, image_ext: str | None) -> tuple | str:
    """The sample's image member (ext, offset, size, name), or why it has none to adopt."""
    exts = [m[0] for m in s.members]
    dup = sorted({e for e in exts if exts.count(e) > 1})
    if dup:
        return f"duplicate member(s) {', '.join(s.key + '.' + e for e in dup)}"
    members = {m[0]: m for m in s.members}
    wanted = (image_ext,) if image_ext else IMAGE_EXTS
    img_ext = next((e for e in wanted if e in members), None)
    if img_ext is None:
        dotted = next((e for e in exts if "." in e and e.rsplit(".", 1)[1] in wanted), None)
        if dotted is not None:  # a writer's key with dots in it (`a.b.c` + `.jpg`): webdataset splits it at the first
            return (f"no image member (members: {', '.join(exts)}): a member's name is split at the first dot of its "
                    f"base name, as webdataset splits it, so {s.key}.{dotted} is key {s.key} with member {dotted}; "
                    "the writer's keys hold dots: write keys without them (replace each dot)")
        return f"no image member (members: {', '.join(exts)})"
    return members[img_ext]


def _jpeg_headers(view: memoryview, images: list) -> tuple[list, list]:
    """(per sample (its `_image_member`), what check_image's `facts` holds for a JPEG image the native header walk
    reads, else None; the (sample, offset, size) of those JPEGs, for `_scan_jpegs`)."""
    facts: list = [None] * len(images)
    jpegs: list = []
    if not transcode.HAVE_SCAN_CHECK:  # a native core built without libjpeg, or none: check_image walks alone
        return facts, jpegs
    from fastfeed import _native

    for i, img in enumerate(images):
        if isinstance(img, tuple) and bytes(view[img[1]:img[1] + 3]) == b"\xff\xd8\xff":
            with view[img[1]:img[1] + img[2]] as data:
                facts[i] = _native.probe_jpeg(data)
            if facts[i] is not None:
                jpegs.append((i, img[1], img[2]))
    return facts, jpegs


_SCAN_CHUNK = 16  # JPEGs a native call: ~16 ms of a core for photos, so a call's overhead is noise


def _scan_jpegs(view: memoryview, jpegs: list, facts: list, scans: ThreadPoolExecutor | None) -> None:
    """The scan check's answers into `facts` (`_jpeg_headers`'), in chunks on `scans` (None: here, one thread)."""
    if not jpegs:
        return
    spans = [view[off:off + size] for _, off, size in jpegs]
    try:
        chunks = [spans[i:i + _SCAN_CHUNK] for i in range(0, len(spans), _SCAN_CHUNK)]
        if scans is None:
            answers = [a for c in chunks for a in transcode.check_scans(c, 1)]
        else:
            futures = [scans.submit(transcode.check_scans, c, 1) for c in chunks]
            wait(futures)  # every chunk done with its views before they are released, a failed one too
            answers = [a for f in futures for a in f.result()]
    finally:
        for v in spans:  # the shard's map closes only once no view of it is left
            v.release()
    for (i, _, _), err in zip(jpegs, answers):
        facts[i] = (*facts[i][:6], err or "")


def _add_sample(res: _ShardResult, view: memoryview, s: _Sample, img: tuple | str, rel: str, shard: int,
                opts: LoadOptions, facts: tuple | None = None) -> None:
    """`img`: the sample's `_image_member`."""
    def reject(reason: str) -> None:
        res.rejected.append({"source": f"{rel}:{s.key}", "key": s.key, "reason": reason})

    if isinstance(img, str):
        return reject(img)
    members = {m[0]: m for m in s.members}
    img_ext, off, size, _ = img
    # A copy: a view of the shard's map kept alive by a checker's exception (traceback cycles wait for the
    # garbage collector) would keep the map from closing.
    data = bytes(view[off:off + size])
    got = check_image(data, opts, facts, name=img_ext)
    if isinstance(got, Loaded) and got.change not in (None, TRIMMED):  # pack would fix it; a shard is not changed
        fixed = got.change
        got = check_for_pil(data, opts)
        if not isinstance(got, Loaded):
            return reject(f"only readable once fixed ({fixed}), and `fastfeed index` never rewrites a shard; store "
                          f"it with `fastfeed pack` ({got.reason})")
    if not isinstance(got, Loaded):
        return reject(got.reason)
    size = len(got.data)  # TRIMMED: the image's extent ends at its end marker; the trailing bytes stay unread
    label = -1
    if "cls" in members:
        _, coff, csize, cname = members["cls"]
        try:
            label = int_member(view[coff:coff + csize])
        except ValueError:
            return reject(f"{cname} is not an integer label")
        if label < -1:  # -1 is pack's own "no class label" (detection and segmentation shards): as no cls
            return reject(f"{cname} holds a negative label ({label}; -1 alone means none)")
        if label >= MAX_CLASSES:
            return reject(f"{cname} holds label {label}, past the {MAX_CLASSES:,} classes an index takes (a cls is a "
                          "class index, 0 to the number of classes - 1, not an id)")
    fields = {}
    for ext, moff, msize, _ in s.members:
        if ext != img_ext:
            fields[ext] = (moff, msize, xxhash.xxh3_64_intdigest(view[moff:moff + msize]))
    rows = res.rows
    for c, v in (("key", s.key), ("label", label), ("width", got.width), ("height", got.height),
                 ("jpeg", got.jpeg_kind), ("transcoded", False), ("hw_decodable", got.hw_decodable),
                 ("size", size), ("source", f"{rel}:{s.key}.{img_ext}"),
                 ("checksum", xxhash.xxh3_64_intdigest(view[off:off + size])), ("orientation", got.orientation),
                 ("change", got.change or ""), ("pil_only", got.pil_only), ("shard", shard), ("offset", off),
                 ("meta_offset", -1), ("meta_size", 0)):
        rows[c].append(v)
    res.fields.append(fields)
    res.idx_lines.append(" ".join(f"{ext} {moff} {msize} {name}" for ext, moff, msize, name in s.members))
    spaced = next((name for *_, name in s.members if any(c.isspace() for c in name)), None)
    if spaced is not None and not res.no_idx:
        # DALI's index is whitespace-separated text: such a name cannot be written into it (nor read by wds2idx's).
        res.no_idx = (f"member {spaced!r} has whitespace in its name, which DALI's whitespace-separated index "
                      "cannot hold; fastfeed's Loader reads the shard all the same")
