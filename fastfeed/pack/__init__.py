"""`fastfeed pack`: scan a source, validate cheaply, write WebDataset shards or LMDB, then the manifest.

    pack(src, out, PackOptions(...)) -> PackResult        one pack (or one part of a --num-parts pack)
    merge(out) -> Manifest                                join out/part-NNNNN into the files one pack writes
    verify(path, quick=False) -> VerifyReport             checksums, cross-checks (+ full decode unless quick)
"""
from __future__ import annotations

from fastfeed.pack import lmdb as _lmdb_writer  # noqa: F401 - registers the format writers in pack.base.WRITERS
from fastfeed.pack import wds as _wds_writer  # noqa: F401
from fastfeed.pack.base import PackError
from fastfeed.pack.merge import merge
from fastfeed.pack.run import PackOptions, PackResult, pack
from fastfeed.pack.verify import VerifyReport, verify
from fastfeed.types import parse_size

__all__ = ["pack", "PackOptions", "PackResult", "PackError", "merge", "verify", "VerifyReport", "parse_size"]

