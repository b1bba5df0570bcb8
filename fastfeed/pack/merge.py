"""`fastfeed merge OUT`: join the parts `OUT/part-NNNNN` of a `--num-parts K` pack into one dataset at OUT.

Every part must be complete (its own manifest), and all K must come from the same source listing and options.
Because each part holds a contiguous slice of the same shuffled plan, concatenating parts in order gives exactly
the sample order (keys, labels, bytes) of a single pack.

WebDataset: shards stay where they are; OUT's manifest lists them as `part-NNNNN/shard-MMMMMM.tar`.
LMDB: the parts' records are copied into one `OUT/data.lmdb` (the contract is one environment per dataset).
"""
from __future__ import annotations

import hashlib
import os

import numpy as np

from fastfeed.formats.base import load_manifest, load_table
from fastfeed.pack import table as tbl
from fastfeed.pack.run import PackError, _file_info
from fastfeed.types import MANIFEST_NAME, REJECTED_NAME, DatasetError, Manifest, ShardInfo

__all__ = ["merge"]


def _parts(out: str) -> list[tuple[str, Manifest]]:
    names = sorted(n for n in os.listdir(out) if n.startswith("part-") and os.path.isdir(os.path.join(out, n)))
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
        return (m.kind, m.source, m.classes, opts, (m.part or {}).get("count"))

    for n, m in parts:
        if same(m) != same(first):
            raise PackError(f"cannot merge: {n} was packed from another source or with other options")
    parts.sort(key=lambda p: p[1].part["index"])
    return parts


def merge(out: str) -> Manifest:
    out = os.path.abspath(out)
    if os.path.exists(os.path.join(out, MANIFEST_NAME)):
        raise PackError(f"{out} already holds a merged dataset; delete {MANIFEST_NAME} to merge again")
    parts = _parts(out)
    kind = parts[0][1].kind
    tables, shards, rejected_lines = [], [], []
    for name, m in parts:
        folder = os.path.join(out, name)
        t = load_table(folder, m, ("key", "label"))
        if kind == "wds":
            t["shard"] = t["shard"] + len(shards)
            shards.extend(ShardInfo(f"{name}/{s.path}", s.bytes, s.sha256, s.num_samples) for s in m.shards)
        tables.append(t)
        with open(os.path.join(folder, REJECTED_NAME), encoding="ascii") as f:
            rejected_lines.extend(line for line in f if line.strip())
    table = {c: np.concatenate([t[c] for t in tables]) for c in tables[0]}
    if kind == "lmdb":
        _merge_lmdb(out, [os.path.join(out, n, "data.lmdb") for n, _ in parts])
        shards = [_file_info(out, os.path.join("data.lmdb", "data.mdb"), len(table["key"]))]
    tbl.write_table(out, table)
    from fastfeed.pack.writers import atomic_write

    atomic_write(os.path.join(out, REJECTED_NAME), "".join(rejected_lines).encode("ascii"))
    first = parts[0][1]
    options = dict(first.options, part=0, num_parts=1)
    manifest = Manifest(
        kind=kind,
        num_samples=int(len(table["key"])),
        classes=list(first.classes),
        class_to_idx=dict(first.class_to_idx),
        shards=shards,
        image_stats=tbl.image_stats(table, table["size"]),
        jpeg_mix=tbl.jpeg_mix(table["jpeg"], table.get("hw_decodable")),
        transcoded=int(table["transcoded"].sum()),
        rejected=len(rejected_lines),
        source=first.source,
        source_kind=first.source_kind,
        options=options,
        part=None,
        created_by=first.created_by,
        extra={**_merged_notes(parts), "merged_from": [n for n, _ in parts],
               "parts_sha256": hashlib.sha256("".join(s.sha256 for s in shards).encode()).hexdigest()},
    )
    tbl.write_manifest(out, manifest)
    return manifest


def _merged_notes(parts) -> dict:
    """The parts' transcode_failed reports, joined (see fastfeed/pack/run.py `_finish`)."""
    failed = [f for _, m in parts for f in m.extra.get("transcode_failed", [])]
    counts: dict[str, int] = {}
    for _, m in parts:
        for k, v in m.extra.get("jpeg_actions", {}).items():
            counts[k] = counts.get(k, 0) + int(v)
    return {"jpeg_actions": counts, "transcode_failed": failed} if counts else {}


def _merge_lmdb(out: str, sources: list[str]) -> None:
    import lmdb

    dest = os.path.join(out, "data.lmdb")
    if os.path.exists(dest):
        raise PackError(f"{dest} exists from an earlier merge attempt; delete it and merge again")
    total = sum(os.path.getsize(os.path.join(s, "data.mdb")) for s in sources)
    env = lmdb.open(dest, map_size=max(1 << 30, 2 * total), subdir=True, meminit=True, readahead=False)
    try:
        for src in sources:
            senv = lmdb.open(src, readonly=True, lock=False, subdir=True)
            try:
                with senv.begin(buffers=True) as rtxn, env.begin(write=True) as wtxn:
                    for k, v in rtxn.cursor():
                        wtxn.put(bytes(k), bytes(v))
            finally:
                senv.close()
        env.sync(True)
    finally:
        env.close()
