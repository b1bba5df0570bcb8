"""`pack()`: source -> validated samples -> shards/LMDB -> samples.npz, rejected.jsonl, and the manifest last.

The plan is a pure function of the source listing and the options: entries sorted, keyed by their position in
that sorted list (`key` = zero-padded index, so keys stay unique whatever the basenames), shuffled with
`default_rng(shuffle_seed)`, then cut into `num_parts` contiguous slices. The same plan is rebuilt by every part
and by `--resume`, which is what makes parts mergeable and resumes byte-identical to an uninterrupted pack.

Files are read and checked on a thread pool in batches of up to 32 (fastfeed/pack/reader.py: reads, libjpeg and
PIL release the GIL; the tar records are built there too) and written by this thread strictly in plan order, one
writev per batch; a helper thread hashes the shards (writers.ShardHasher), another fsyncs finished shards.
WebDataset packs go through the native tar writer instead when the core has it (pack/wds_native.py: native
threads read, frame and hash; the same validation runs in its check hook; the same files, byte for byte).

JPEG mode: `jpeg_mode=None` (the default) means 'baseline' when the native core has libjpeg
(`fastfeed.image.transcode.HAVE_TRANSCODE`) and 'keep' otherwise: a few ms of CPU per progressive file at pack time
buy the GPU's hardware decoder for it at every epoch (docs/design/decoders.md#hw-decodable). Asking for 'baseline'
or 'reencode' explicitly without libjpeg is an error.

Detection sources (YOLO, COCO, VOC: pack/annotations/) store each sample's annotation as its JSON member and write
format version 3 (`Manifest.task` "detect"). As each sample is stored, its boxes are checked against the stored
image's size with the Loader's own rule (annotations.sample_issues): what the Loader will clip or drop goes to
rejected.jsonl (and the manifest's `changes`), while the stored boxes stay the source's.

Semantic segmentation sources (ADE20K, VOC's SegmentationClass, `--masks`: pack/annotations/masks.py) store each
image's mask file byte for byte as the member `KEY.seg.png`, a field with its own table columns (offset, size,
xxh3), and write format version 5 (`Manifest.task` "semantic"). A mask is read and checked with its image on the
reader threads (pack/members.py); a sample whose mask is unusable is rejected whole, naming both files.
"""
from __future__ import annotations

import collections
import hashlib
import json
import os
import shutil
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace

import numpy as np

from fastfeed.constants import DEFAULT_ANNOTATION_ORIENTATION, __version__
from fastfeed.formats.integrity import checksum
from fastfeed.image import transcode as _transcode
from fastfeed.pack import table as tbl
from fastfeed.pack.annotations import MASK_MEMBER, annotation_stats, sample_issues
from fastfeed.pack.annotations import scan as scan_source
from fastfeed.pack.base import WRITERS, FormatWriter, PackError
from fastfeed.pack.journal import JOURNAL_DIR, Journal
from fastfeed.pack.options import (NO_SCAN_CHECK_NOTE, PackOptions, check_annotated, check_options, check_out,
                                   recorded_options, resolve_jpeg_mode)
from fastfeed.pack.reader import BatchItem, BatchResult
from fastfeed.pack.sources import Source
from fastfeed.pack.validate import LoadOptions, Loaded
from fastfeed.pack.wds_native import NativeWdsWriter, pack_native, use_native
from fastfeed.pack.writers import meta_bytes
from fastfeed.types import MANIFEST_NAME, Manifest, ShardInfo
from fastfeed.world import usable_cpus

__all__ = ["PackOptions", "PackResult", "PackError", "pack", "part_folder", "clear_folder", "resolve_jpeg_mode",
           "OWNED_NAMES"]

# Everything `--overwrite` may delete; anything else in OUT makes the pack refuse to touch the folder.
OWNED_NAMES = ("fastfeed.json", "samples.npz", "rejected.jsonl", "data.lmdb", JOURNAL_DIR)
_BATCH_FILES = 4


@dataclass(frozen=True)
class PackResult:
    folder: str
    manifest: Manifest
    rejected: list[dict]
    seconds: float
    hidden_skipped: int
    symlink_note: str | None = None  # Source.symlink_note(): links followed, how many out of the source folder

    def summary(self) -> str:
        m = self.manifest
        total = m.image_stats["bytes"]["total"]
        s = max(self.seconds, 1e-9)
        line = (f"packed {m.num_samples} files, {total / 1e6:.1f} MB into {len(m.shards)} {m.kind} file(s); "
                f"rejected {m.rejected}; transcoded {m.transcoded}; {m.num_samples / s:.0f} files/s, "
                f"{total / 1e6 / s:.1f} MB/s ({self.seconds:.2f} s) -> {self.folder}")
        failed = m.extra.get("jpeg_actions", {}).get("transcode_failed", 0)
        if failed:
            line += (f"\n{failed} JPEG(s) libjpeg found corrupt were stored untouched "
                     f"(listed under extra.transcode_failed in {MANIFEST_NAME})")
        if m.task == "detect":
            line += "\n" + detect_summary(m)
        elif m.task == "semantic":
            line += f"\ntask semantic: each image's mask stored as its .{', .'.join(m.fields)} member"
        changes = {k: v for k, v in m.changes.items() if k not in _BOX_CHANGES}
        if changes:
            changed = ", ".join(f"{k} {v}" for k, v in sorted(changes.items()))
            line += f"\nstored differently from the source: {changed}"
        if m.options.get("jpeg_note"):
            line += f"\nnote: {m.options['jpeg_note']}"
        if self.symlink_note:
            line += f"\n{self.symlink_note}"
        return line


_BOX_CHANGES = ("clipped_boxes", "dropped_boxes")  # counted in `changes`, but the stored boxes are the source's


def detect_summary(m: Manifest) -> str:
    """What a detection dataset holds, for pack's summary and `fastfeed inspect`."""
    ob = m.objects or {}
    per = ob.get("per_image", {})
    names = ", ".join(m.classes[:5]) + (", ..." if len(m.classes) > 5 else "")
    text = (f"task detect: {len(m.classes)} classes ({names}); {ob.get('objects', 0)} objects; "
            f"{ob.get('images_with_objects', 0)} images with objects, {ob.get('images_without_objects', 0)} without; "
            f"objects per image min {per.get('min', 0)} / mean {per.get('mean', 0)} / max {per.get('max', 0)}")
    clipped, dropped = (m.changes.get(k, 0) for k in _BOX_CHANGES)
    if clipped or dropped:
        text += (f"\nboxes the Loader clips to the image: {clipped}, drops (no area left inside it): {dropped} "
                 f"(stored as the source gave them; listed in rejected.jsonl)")
    return text


def part_folder(out: str, part: int) -> str:
    return os.path.join(out, f"part-{part:05d}")


def _member_ids(members) -> list:
    """A sample's members as the fingerprint sees them: a file by its path, a value by its sha256."""
    return [[ext, src if isinstance(src, str) else hashlib.sha256(src).hexdigest()] for ext, src in members]


def clear_folder(folder: str) -> None:
    """`--overwrite`: delete fastfeed's files (OWNED_NAMES, shards, parts) in `folder`; refuse if it holds others."""
    if not os.path.isdir(folder):
        return
    strangers = [n for n in os.listdir(folder) if not _owned(n)]
    if strangers:
        raise PackError(f"{folder} holds files fastfeed did not write ({', '.join(sorted(strangers)[:3])}...); "
                        f"refusing to overwrite it")
    for n in os.listdir(folder):
        p = os.path.join(folder, n)
        shutil.rmtree(p) if os.path.isdir(p) and not os.path.islink(p) else os.unlink(p)


def _prepare_folder(folder: str, o: PackOptions, journal: Journal) -> None:
    if o.overwrite:
        clear_folder(folder)
    os.makedirs(folder, exist_ok=True)
    if os.path.exists(os.path.join(folder, MANIFEST_NAME)):
        raise PackError(f"{folder} already holds a packed dataset; pass --overwrite to replace it")
    if journal.exists():
        if not o.resume:
            raise PackError(f"{folder} holds an interrupted pack; pass --resume to finish it or --overwrite")
    elif o.resume:
        raise PackError(f"--resume: {folder} holds no interrupted pack to resume")
    elif os.listdir(folder):
        raise PackError(f"{folder} is not empty; pass --overwrite (only fastfeed's own files are deleted)")


def _owned(name: str) -> bool:
    return (name in OWNED_NAMES or name.startswith(("shard-", "part-")) or name.endswith(".tmp"))


def _plan(src: Source, o: PackOptions) -> tuple[np.ndarray, int]:
    n = len(src.entries)
    order = np.arange(n, dtype=np.int64)
    if o.shuffle_seed is not None:
        order = np.random.default_rng(o.shuffle_seed).permutation(n)
    lo, hi = n * o.part // o.num_parts, n * (o.part + 1) // o.num_parts
    return order[lo:hi], max(8, len(str(max(n - 1, 0))))


def _fingerprint(src: Source, o: PackOptions) -> dict:
    h = hashlib.sha256()
    for e in src.entries:
        h.update(f"{e.rel}\0{e.label}\0".encode("utf-8", "surrogateescape"))
    fp = {"source": src.root, "entries": len(src.entries), "entries_sha256": h.hexdigest(),
          "options": recorded_options(o),
          # the journal's rows hold these columns: a version of fastfeed with other columns cannot finish them
          "columns": sorted(tbl.COLUMNS)}
    if src.task != "classify":  # a resume must not mix samples annotated differently
        a = hashlib.sha256()
        for e in src.entries:
            ann = [e.metadata, e.size] + ([_member_ids(e.members)] if e.members else [])  # a pairing too
            a.update(json.dumps(ann, sort_keys=True).encode() + b"\n")
        fp.update(task=src.task, classes=src.classes, annotations_sha256=a.hexdigest())
    elif src.fields:  # a list's captions and metadata: a resume must not mix two versions of them
        a = hashlib.sha256()
        for e in src.entries:
            a.update(json.dumps([e.metadata, _member_ids(e.members)], sort_keys=True).encode() + b"\n")
        fp.update(members_sha256=a.hexdigest())
    return fp


def pack(src_path: str, out: str, o: PackOptions) -> PackResult:
    """Pack `src_path` into `out` (or `out/part-NNNNN` with num_parts > 1). Raises PackError on refusal."""
    check_options(o)
    check_out(src_path, out)
    mode, jpeg_note = resolve_jpeg_mode(o.jpeg_mode, _transcode.HAVE_TRANSCODE)
    o = replace(o, jpeg_mode=mode)
    if o.scan_check and not _transcode.HAVE_SCAN_CHECK:
        jpeg_note = "; ".join(n for n in (jpeg_note, NO_SCAN_CHECK_NOTE) if n)
    t0 = time.perf_counter()
    o = replace(o, **{k: os.path.abspath(getattr(o, k)) for k in ("annotations", "classes_file", "masks")
                      if getattr(o, k) is not None})
    src = scan_source(src_path, o.source_kind, o.annotations, o.classes_file, o.split, o.masks,
                      o.orientation or DEFAULT_ANNOTATION_ORIENTATION)
    check_annotated(src, o)
    if src.task != "classify":  # the frame is recorded: the Loader decodes the images in it
        o = replace(o, orientation=o.orientation or DEFAULT_ANNOTATION_ORIENTATION)
    folder = part_folder(out, o.part) if o.num_parts > 1 else os.path.abspath(out)
    if o.num_parts > 1 and os.path.exists(os.path.join(out, MANIFEST_NAME)):  # merged already: parts are gone
        raise PackError(f"{os.path.abspath(out)} already holds a packed dataset; a part cannot be added to it "
                        f"(delete it, or pack into another folder)")
    journal = Journal(folder)
    _prepare_folder(folder, o, journal)
    plan, key_width = _plan(src, o)
    fp = _fingerprint(src, o)
    commits: list[dict] = []
    if o.resume:
        old_fp, commits = journal.load()
        if old_fp != fp:
            raise PackError("--resume: the source listing or options differ from the interrupted pack's (or a "
                            "version of fastfeed with another sample table started it); re-run with the same "
                            "arguments or use --overwrite")
        journal.rewrite(fp, commits)
    else:
        journal.start(fp)
    start = commits[-1]["pos"] if commits else 0
    shards = [ShardInfo(**c["shard"]) for c in commits if c.get("shard")]
    WRITERS[o.format].drop_stale(folder, len(shards))

    native = use_native(o.format)
    writer = _Writer(folder, o, journal, len(shards), native, src.task, src.fields)
    load_opts = LoadOptions(o.jpeg_mode, o.quality, o.max_side, o.max_pixels, o.scan_check, o.orientation or "ignore")
    bar = _progress(len(plan), start, o.progress)
    workers = o.workers or usable_cpus()
    # Small batches keep the bytes in cache between read, write and hash (larger ones cost wall time:
    # benchmarks/README.md, pack); small packs still spread over every worker.
    batch = max(1, min(_BATCH_FILES, (len(plan) - start) // (4 * workers)))
    try:
        if native:  # the native tar writer reads, frames and hashes on its own threads (pack/wds_native.py)
            pack_native(writer, src, plan, start, key_width, load_opts, bar)
        else:
            _pack_python(writer, src, plan, start, key_width, load_opts, bar, workers, batch)
        writer.close(len(plan))
    except BaseException:
        try:
            writer.abort()
        finally:
            journal.close()
        raise
    finally:
        if bar is not None:
            bar.close()

    _, commits = journal.load()
    try:
        result = _finish(folder, src, o, commits, t0, jpeg_note)
    except tbl.NothingPacked:
        journal.remove()  # the pack ran to its end: nothing is left to --resume, only its rejected.jsonl
        raise
    journal.remove()
    return result


def _pack_python(writer: "_Writer", src: Source, plan, start: int, key_width: int, load_opts: LoadOptions, bar,
                 workers: int, batch: int) -> None:
    """The Python writers: a pool reads and checks batches, this thread writes them in plan order."""
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="fastfeed-pack-read") as pool:
        pending: collections.deque = collections.deque()
        pos = start
        while pos < len(plan) or pending:
            while pos < len(plan) and len(pending) < 2 * workers:
                idxs = [int(i) for i in plan[pos : pos + batch]]
                pending.append((pos, idxs, pool.submit(writer.load, src, idxs, key_width, load_opts)))
                pos += len(idxs)
            first, idxs, fut = pending.popleft()
            writer.put_batch(src, idxs, key_width, first, fut.result())
            if bar is not None:
                bar.update(len(idxs))
                bar.set_postfix_str(f"{writer.bytes_in / 1e6 / max(bar.format_dict['elapsed'], 1e-9):.0f} MB/s",
                                    refresh=False)


def _progress(total: int, initial: int, enabled: bool):
    if not enabled:
        return None
    from tqdm import tqdm

    return tqdm(total=total, initial=initial, unit="file", dynamic_ncols=True, file=sys.stderr)


class _Writer:
    """Feeds loaded samples into the format's writer (pack/base.py FormatWriter), gathers the samples.npz rows
    and journals each durable commit the format writer announces through `cut`."""

    def __init__(self, folder: str, o: PackOptions, journal: Journal, next_shard: int, native: bool = False,
                 task: str = "classify", fields: tuple[str, ...] = ()):
        self.o, self.journal, self.task = o, journal, task
        self.bytes_in = 0
        self._finisher = ThreadPoolExecutor(max_workers=1, thread_name_prefix="fastfeed-shard-finish")
        self._finishing = None
        self.fmt: FormatWriter = (NativeWdsWriter(folder, o.shard_size, next_shard, self.cut, o.workers or 0) if native
                                  else WRITERS[o.format](folder, o.shard_size, next_shard, self.cut))
        self.columns = tbl.table_columns(WRITERS[o.format], fields)
        self.rows = tbl.new_rows(self.columns)
        self.rejected: list[dict] = []
        self.notes: list[dict] = []  # stored untouched although the mode asked for a change (transcode_failed)

    def load(self, src: Source, idxs: list[int], key_width: int, opts: LoadOptions) -> BatchResult:
        """Worker side: read and check one batch."""
        items = [BatchItem(src.entries[i].path, f"{i:0{key_width}d}", src.entries[i].label,
                           meta_bytes(src.entries[i].metadata), src.entries[i].members) for i in idxs]
        return self.fmt.load(items, opts)

    def put_batch(self, src: Source, idxs: list[int], key_width: int, first_pos: int, batch: BatchResult) -> None:
        for j, (i, (res, rec)) in enumerate(zip(idxs, batch.results)):
            self.put(src.entries[i], f"{i:0{key_width}d}", res, first_pos + j + 1, rec)
        self.fmt.end_batch(batch)

    def put(self, entry, key: str, res, done_pos: int, rec=None) -> None:
        if not isinstance(res, Loaded):
            self.reject(entry, res.reason)
            return
        self.fmt.start_sample(len(res.data), done_pos - 1)
        meta = meta_bytes(entry.metadata) if rec is None else None
        extra = self.fmt.add(key, res.ext, res.data, entry.label, meta, rec)
        self.row(entry, key, res, len(res.data), checksum(res.data), extra)
        self.fmt.end_sample(done_pos)

    def reject(self, entry, reason: str) -> None:
        rec = {"path": entry.path, "reason": reason}
        for ext, path in entry.members:  # a mask: the record names both files
            if isinstance(path, str):
                rec["mask" if ext == MASK_MEMBER else ext] = path
        self.rejected.append(rec)

    def row(self, entry, key: str, res: Loaded, size: int, xxh3: int, extra: dict) -> None:
        """Record one stored sample: `size` and `xxh3` (the checksum column) are of the bytes stored."""
        # After start_sample: the note belongs to the commit that holds the sample (a resume redoes it otherwise).
        if res.note is not None:
            self.notes.append({"source": entry.rel, "reason": res.note})
        if self.task == "detect":
            # What the Loader will clip or drop, known now that the stored size is: in plan order, in this
            # sample's commit, so parts merge (and resumes finish) to the same rejected.jsonl as one pack.
            self.rejected.extend(sample_issues(entry, res.width, res.height, int(getattr(res, "orientation", 1) or 1),
                                               self.o.orientation))
        self.bytes_in += size
        # `orientation` and `change` come from the validator (pack/validate.py); older validators lack them.
        change = getattr(res, "change", None)
        r = self.rows
        for col, v in (("key", key), ("label", entry.label), ("width", res.width), ("height", res.height),
                       ("jpeg", res.jpeg_kind), ("transcoded", res.transcoded), ("hw_decodable", res.hw_decodable),
                       ("size", size), ("source", entry.rel), ("checksum", xxh3),
                       ("orientation", int(getattr(res, "orientation", 1) or 1)), ("change", change or ""),
                       ("pil_only", res.pil_only),
                       *extra.items()):
            r[col].append(v)

    def cut(self, pos: int, finish=None, background: bool = False) -> None:
        """Journal everything gathered so far as one commit reaching plan position `pos`, after `finish()` (the
        format's durability step, returning the shard as a dict or None) has run. One helper thread runs the
        background commits, so the journal stays in order."""
        rows, rejected, notes = self.rows, self.rejected, self.notes
        self.rows, self.rejected, self.notes = tbl.new_rows(self.columns), [], []

        def commit() -> None:
            shard = finish() if finish is not None else None
            self.journal.append({"pos": pos, "shard": shard, "rows": rows, "rejected": rejected, "notes": notes})

        self._wait_finisher()
        if background:
            self._finishing = self._finisher.submit(commit)
        else:
            commit()

    def _wait_finisher(self) -> None:
        if self._finishing is not None:
            f, self._finishing = self._finishing, None
            f.result()  # re-raises a failed fsync/rename here, on the packing thread

    def close(self, end: int) -> None:
        self.fmt.close(end)
        self._wait_finisher()
        if any(self.rows.values()) or self.rejected or self.notes:  # e.g. rejections after the last shard
            self.cut(end)
        self._finisher.shutdown()
        self.fmt.shutdown()

    def abort(self) -> None:
        try:
            self._wait_finisher()
        finally:
            self._finisher.shutdown()
            self.fmt.abort()


def _finish(folder: str, src: Source, o: PackOptions, commits: list[dict], t0: float,
            jpeg_note: str | None) -> PackResult:
    fmt = WRITERS[o.format]
    columns = tbl.table_columns(fmt, src.fields)
    rows = tbl.new_rows(columns)
    rejected = list(src.rejected) if o.part == 0 else []  # scan-time problems are reported once, by part 0
    notes: list[dict] = []
    shards = []
    for c in commits:
        for col, vals in c["rows"].items():
            rows[col].extend(vals)
        rejected.extend(c["rejected"])
        notes.extend(c.get("notes", []))
        if c.get("shard"):
            shards.append(ShardInfo(**c["shard"]))
    table = tbl.rows_to_table(rows, columns)
    shards = fmt.data_files(folder, table, shards)
    manifest = tbl.write_dataset(
        folder, o.format, table, shards, rejected,
        classes=src.classes, class_to_idx=src.class_to_idx, source=src.root, source_kind=src.kind,
        options=dict(recorded_options(o), **({"jpeg_note": jpeg_note} if jpeg_note else {})),
        part={"index": o.part, "count": o.num_parts} if o.num_parts > 1 else None,
        created_by=f"fastfeed {__version__}",
        extra=tbl.jpeg_extra(int(table["transcoded"].sum()), notes, len(notes)),
        task=src.task, objects=_objects(src, table), fields=list(src.fields),
    )
    return PackResult(folder, manifest, rejected, time.perf_counter() - t0, src.hidden_skipped, src.symlink_note())


def _objects(src: Source, table: dict[str, np.ndarray]) -> dict | None:
    """The manifest's `objects` of a detection pack, from the annotations of the samples stored (key = the
    entry's index in the source listing)."""
    if src.task != "detect":
        return None
    stats = annotation_stats((src.entries[int(k)].metadata for k in table["key"]), len(src.classes))
    if src.class_ids is not None:
        stats["source_ids"] = list(src.class_ids)
    return stats
