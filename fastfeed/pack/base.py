"""The interface every format writer of `fastfeed pack` implements, mirroring `fastfeed/formats/` on the read side:
pack/wds.py writes what formats/wds.py reads, pack/lmdb.py what formats/lmdb.py reads. run.py and merge.py hold
no format switches: they look the writer up in `WRITERS` (filled by pack/__init__.py's imports) and call these.

Threading: `load` runs on the pack's reader pool; every other method on the packing thread, in plan order.
Durability: a writer calls `cut(pos, finish, background)` (given at construction) whenever the data of everything
added so far is, or after `finish()` will be, durable; run.py then journals that commit (see pack/journal.py).
"""
from __future__ import annotations

from typing import Callable, ClassVar, Iterator, NamedTuple, Protocol

import numpy as np

from fastfeed.pack.reader import BatchItem, BatchResult
from fastfeed.pack.validate import LoadOptions
from fastfeed.types import ShardInfo

__all__ = ["FormatWriter", "Stored", "Cut", "WRITERS", "writer_for", "PackError"]


class PackError(RuntimeError):
    """The pack (or merge) cannot start (output folder state, options); the message says what to do."""


# cut(pos, finish=None, background=False): journal everything gathered so far as one commit reaching plan position
# `pos`; `finish()` (optional) makes the data durable and returns the shard's ShardInfo as a dict.
Cut = Callable[..., None]


class FormatWriter(Protocol):
    kind: ClassVar[str]
    columns: ClassVar[dict[str, type]]  # this format's own samples.npz columns (name -> dtype)
    stores_fields: ClassVar[bool]  # whether `add` takes members (SourceEntry.members) as fields

    def __init__(self, folder: str, shard_size: int, next_shard: int, cut: Cut) -> None: ...

    def load(self, items: list[BatchItem], opts: LoadOptions) -> BatchResult:
        """Worker side: read and check one batch (and frame the records when the format wants them)."""

    def start_sample(self, nbytes: int, pos: int) -> None:
        """Before a sample of `nbytes` is added; `pos` is the plan position just before it (a shard may end)."""

    def add(self, key: str, ext: str, data, label: int, meta: bytes | None, rec, members=()) -> dict:
        """Store one accepted sample; returns its values for `columns` (and for its fields' columns: the
        `members`, (ext, bytes) pairs stored after the image, or those `rec` holds)."""

    def end_sample(self, pos: int) -> None:
        """After the sample's row is recorded; `pos` is the plan position just after it."""

    def end_batch(self, batch: BatchResult) -> None: ...

    def close(self, end: int) -> None:
        """Everything is added: make it durable (through `cut`)."""

    def shutdown(self) -> None:
        """Release helper threads after close(); raises a failure they hit."""

    def abort(self) -> None: ...

    @staticmethod
    def drop_stale(folder: str, keep_shards: int) -> None:
        """Before a resume: remove data written after the last commit."""

    @staticmethod
    def data_files(folder: str, table: dict[str, np.ndarray], shards: list[ShardInfo]) -> list[ShardInfo]:
        """When every commit is in: the manifest's data files (and any table column only known now)."""

    @staticmethod
    def stored(folder: str, table: dict[str, np.ndarray], shards: list[ShardInfo]) -> Iterator[Stored]:
        """The samples of a finished dataset written by this format (its `samples.npz` table and manifest data
        files), in table order, exactly as `add` was given them: what `fastfeed merge` feeds to `add` again."""


class Stored(NamedTuple):
    """One stored sample read back from a finished dataset: the image member's extension, the image bytes, the
    `.json` metadata bytes (None when the sample has none) and its other members as (ext, bytes) pairs."""

    ext: str
    data: bytes | memoryview
    meta: bytes | None
    members: tuple = ()


WRITERS: dict[str, type] = {}


def writer_for(kind: str) -> type:
    try:
        return WRITERS[kind]
    except KeyError:
        raise ValueError(f"unknown dataset format {kind!r}; choose from {sorted(WRITERS)}") from None
