"""`fastfeed merge OUT`: join the parts `OUT/part-NNNNN` of a `--num-parts K` pack into one dataset at OUT, byte for
byte the dataset a single-process `fastfeed pack` with the same options writes (same shard files, same
samples.npz, rejected.jsonl and fastfeed.json); the part folders are deleted once its manifest is written.

Every part must be complete (its own manifest), and all K must come from the same source listing and options.
Each part holds a contiguous slice of the same shuffled plan, and every per-sample decision (key, label, what
is stored, what is rejected) depends on the file alone, so the parts' samples concatenated in part order are
the single pack's samples in its order.

Why re-cut the data here rather than plan the parts on the single pack's shard boundaries: a boundary falls
where the *stored* sizes of the accepted samples before it add up to `--shard-size`, and those sizes (after
transcoding, conversion, trimming, rejection) are known only once every earlier file has been read and
validated; no plan can place them up front without doing the pack twice. So the parts pack independently and
the merge streams their stored samples, in plan order, through the format's own writer (`FormatWriter.add`,
pack/wds.py, pack/lmdb.py): the writer's cutting rule (`WdsWriter.start_sample`, the LMDB writer's commit size)
decides the boundaries exactly as in a single pack, with no second copy of that rule. The cost is one sequential
copy of the data; nothing is read from the source or validated again (each sample's xxh3 is checked on the way).

An interrupted merge leaves the parts untouched and no manifest; running it again starts over.
"""
from __future__ import annotations

import json
import os
import shutil
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np

from fastfeed.formats.base import load_manifest, load_table
from fastfeed.formats.fields import columns as field_columns
from fastfeed.formats.integrity import checksum
from fastfeed.pack import table as tbl
from fastfeed.pack.annotations import annotation_stats
from fastfeed.pack.base import FormatWriter, PackError, writer_for
from fastfeed.types import MANIFEST_NAME, REJECTED_NAME, DatasetError, Manifest, ShardInfo

__all__ = ["merge", "part_names"]


def part_names(names) -> list[str]:
    """The `part-NNNNN` entries among `names` (a folder listing), sorted."""
    return sorted(n for n in names if n.startswith("part-") and n[5:].isdigit())


def _parts(out: str) -> list[tuple[str, Manifest]]:
    names = [n for n in part_names(os.listdir(out)) if os.path.isdir(os.path.join(out, n))]
    if not names:
        raise PackError(f"{out}: no part-NNNNN folders to merge")
    parts = []
    for n in names:
        try:
            parts.append((n, load_manifest(os.path.join(out, n))))
        except DatasetError as e:
            raise PackError(f"cannot merge: part {n} is not complete: {e}") from None
    first = parts[0][1]
    count = (first.part or {}).get("count")
    if count is None:
        raise PackError(f"{out}/{names[0]} is not part of a --num-parts pack")
    have = {m.part["index"] for _, m in parts if m.part}
    missing = sorted(set(range(count)) - have)
    if missing:
        raise PackError(f"cannot merge: parts {missing} of {count} are missing or unfinished")

    def same(m: Manifest) -> tuple:
        opts = {k: v for k, v in m.options.items() if k != "part"}
        return (m.kind, m.version, m.source, m.classes, opts, (m.part or {}).get("count"), m.created_by, m.task,
                list(m.fields))

    for n, m in parts:
        if same(m) != same(first):
            raise PackError(f"cannot merge: {n} was packed from another source, with other options or by another "
                            f"fastfeed version")
    parts.sort(key=lambda p: p[1].part["index"])
    return parts


def merge(out: str) -> Manifest:
    out = os.path.abspath(out)
    if os.path.exists(os.path.join(out, MANIFEST_NAME)):
        raise PackError(f"{out} already holds a merged dataset; delete {MANIFEST_NAME} to merge again")
    parts = _parts(out)
    first = parts[0][1]
    fmt = writer_for(first.kind)
    tables, rejected, notes, failed = [], [], [], 0
    for name, m in parts:
        folder = os.path.join(out, name)
        tables.append(load_table(folder, m, tuple(tbl.new_rows(fmt.columns))))
        with open(os.path.join(folder, REJECTED_NAME), encoding="ascii") as f:
            rejected.extend(json.loads(line) for line in f if line.strip())
        notes.extend(m.extra.get("transcode_failed", []))
        failed += int(m.extra.get("jpeg_actions", {}).get("transcode_failed", 0))
    _check_disjoint(parts, tables)
    _drop_stale(out)
    try:
        metas: list | None = [] if first.task == "detect" else None
        table, shards = _rewrite(out, fmt, int(first.options["shard_size"]), parts, tables, metas, first.fields)
        shards = fmt.data_files(out, table, shards)
        objects = None
        if metas is not None:  # recounted from the stored annotations: the single pack counts the same ones
            objects = annotation_stats(metas, len(first.classes))
            if "source_ids" in first.objects:
                objects["source_ids"] = list(first.objects["source_ids"])
        manifest = tbl.write_dataset(
            out, first.kind, table, shards, rejected,
            classes=first.classes, class_to_idx=first.class_to_idx, source=first.source,
            source_kind=first.source_kind, options=dict(first.options, part=0, num_parts=1), part=None,
            created_by=first.created_by, extra=tbl.jpeg_extra(int(table["transcoded"].sum()), notes, failed),
            task=first.task, objects=objects, fields=first.fields,
        )
    except BaseException as e:
        # A failed merge leaves the parts as they were, and nothing else; one that found nothing to store leaves the
        # rejected.jsonl its error points at (the next merge drops it first).
        if not os.path.exists(os.path.join(out, MANIFEST_NAME)) and not isinstance(e, tbl.NothingPacked):
            _drop_stale(out)
        raise
    for name, _ in parts:  # the merged dataset holds every byte of them now
        shutil.rmtree(os.path.join(out, name))
    return manifest


def _check_disjoint(parts: list[tuple[str, Manifest]], tables: list[dict[str, np.ndarray]]) -> None:
    """A key is a position in the source listing, so parts of one plan never share one. Parts that do were packed
    from different listings (files added or removed between them): merged, they would repeat some images and lose
    others."""
    seen: dict[str, str] = {}
    for (name, _), t in zip(parts, tables):
        for k in t["key"].tolist():
            if seen.setdefault(k, name) != name:
                raise PackError(f"cannot merge: {seen[k]} and {name} both hold sample {k}: the source changed "
                                f"between their packs; re-pack every part with --overwrite")


def _drop_stale(out: str) -> None:
    """What an interrupted merge may have written at OUT (never a manifest, so never a dataset)."""
    for n in os.listdir(out):
        if n.startswith("shard-") or n.endswith(".tmp") or n in ("data.lmdb", "samples.npz", REJECTED_NAME):
            p = os.path.join(out, n)
            shutil.rmtree(p) if os.path.isdir(p) and not os.path.islink(p) else os.unlink(p)


def _rewrite(out: str, fmt: type, shard_size: int, parts: list[tuple[str, Manifest]],
             tables: list[dict[str, np.ndarray]], metas: list | None = None, fields=()
             ) -> tuple[dict[str, np.ndarray], list[ShardInfo]]:
    """Feed every part's stored samples, in order, to a fresh format writer at OUT, as run.py's pack loop does
    (start_sample / add / end_sample, then close). Returns the merged table and the writer's shards; `metas`, when
    given, gets each sample's stored JSON member, parsed (None without one). `fields`: the members stored beside
    each image (a semantic pack's mask), copied with it; their columns come from the new writer."""
    sink = _Commits()
    w: FormatWriter = fmt(out, shard_size, 0, sink.cut)
    dtypes = tbl.table_columns(fmt, fields)
    columns: dict[str, list] = {c: [] for c in dtypes}
    pos = 0
    try:
        for (name, m), t in zip(parts, tables):
            keys, labels, sums = t["key"], t["label"], t["checksum"]
            try:
                for i, s in enumerate(fmt.stored(os.path.join(out, name), t, m.shards)):
                    if checksum(s.data) != int(sums[i]):
                        raise ValueError(f"sample {keys[i]}: stored bytes do not match their checksum")
                    for ext, data in s.members:  # the new writer hashes them again: check what it is given
                        if checksum(data) != int(t[field_columns(ext)[2]][i]):
                            raise ValueError(f"sample {keys[i]}: its .{ext} member does not match its checksum")
                    if metas is not None:
                        metas.append(json.loads(s.meta) if s.meta else None)
                    w.start_sample(len(s.data), pos)
                    for c, v in w.add(str(keys[i]), s.ext, s.data, int(labels[i]), s.meta, None, s.members).items():
                        columns[c].append(v)
                    pos += 1
                    w.end_sample(pos)
            except (OSError, ValueError) as e:
                raise PackError(f"cannot merge: part {name} is damaged ({e}); re-pack it with --overwrite") from None
        w.close(pos)
        shards = sink.wait()
        w.shutdown()
    except BaseException:
        try:
            sink.wait()
        except BaseException:  # noqa: BLE001 - the first failure is the one to report
            pass
        w.abort()
        raise
    finally:
        sink.shutdown()
    # The common columns come from the parts (np.concatenate widens strings to the widest, as np.array(all
    # values) in a single pack does); the format's own columns (offsets, shard numbers) from the new writer.
    table = {c: np.concatenate([t[c] for t in tables]) for c in tbl.COLUMNS}
    table.update({c: np.asarray(columns[c], dtype=d) for c, d in dtypes.items()})
    return table, shards


class _Commits:
    """The `cut` a format writer calls when data becomes durable (pack/base.py): a merge keeps no journal, it only
    collects the finished shards, finishing them (fsync + rename) on one helper thread, in order, as run.py does."""

    def __init__(self):
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="fastfeed-merge-finish")
        self._pending: Future | None = None
        self.shards: list[ShardInfo] = []

    def cut(self, pos: int, finish=None, background: bool = False) -> None:
        self.wait()  # one shard finishing at a time, like run.py's _Writer
        if finish is None:
            return
        if background:
            self._pending = self._pool.submit(finish)
        else:
            self.shards.append(ShardInfo(**finish()))

    def wait(self) -> list[ShardInfo]:
        if self._pending is not None:
            f, self._pending = self._pending, None
            self.shards.append(ShardInfo(**f.result()))
        return self.shards

    def shutdown(self) -> None:
        self._pool.shutdown()
