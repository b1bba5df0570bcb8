"""`fastfeed merge OUT`: join the parts `OUT/part-NNNNN` of a `--num-parts K` pack into one dataset at OUT.

Every part must be complete (its own manifest), and all K must come from the same source listing and options.
Because each part holds a contiguous slice of the same shuffled plan, concatenating parts in order gives exactly
the sample order (keys, labels, bytes) of a single pack.

How the data files are joined is the format writer's `merge` (pack/wds.py: shards stay in their part folders;
pack/lmdb.py: records copied into one `OUT/data.lmdb`); the manifest comes from the same builder as a pack's
(pack/table.py `write_dataset`).
"""
from __future__ import annotations

import hashlib
import json
import os

import numpy as np

from fastfeed.formats.base import load_manifest, load_table
from fastfeed.pack import table as tbl
from fastfeed.pack.base import PackError, writer_for
from fastfeed.types import MANIFEST_NAME, REJECTED_NAME, DatasetError, Manifest

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
    first = parts[0][1]
    fmt = writer_for(first.kind)
    loaded, rejected = [], []
    for name, m in parts:
        folder = os.path.join(out, name)
        loaded.append((name, load_table(folder, m, ("key", "label"))))
        with open(os.path.join(folder, REJECTED_NAME), encoding="ascii") as f:
            rejected.extend(json.loads(line) for line in f if line.strip())
    tables, shards = fmt.merge(out, loaded, [m.shards for _, m in parts])
    table = {c: np.concatenate([t[c] for t in tables]) for c in tables[0]}
    shards = fmt.data_files(out, table, shards)
    return tbl.write_dataset(
        out, first.kind, table, shards, rejected,
        classes=first.classes, class_to_idx=first.class_to_idx, source=first.source,
        source_kind=first.source_kind, options=dict(first.options, part=0, num_parts=1), part=None,
        created_by=first.created_by,
        extra={**_merged_notes(parts), "merged_from": [n for n, _ in parts],
               "parts_sha256": hashlib.sha256("".join(s.sha256 for s in shards).encode()).hexdigest()},
    )


def _merged_notes(parts) -> dict:
    """The parts' transcode_failed reports, joined (see fastfeed/pack/run.py `_finish`)."""
    failed = [f for _, m in parts for f in m.extra.get("transcode_failed", [])]
    counts: dict[str, int] = {}
    for _, m in parts:
        for k, v in m.extra.get("jpeg_actions", {}).items():
            counts[k] = counts.get(k, 0) + int(v)
    return {"jpeg_actions": counts, "transcode_failed": failed} if counts else {}
