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

__all__ = ["pack", "PackOptions", "PackResult", "PackError", "merge", "verify", "VerifyReport", "parse_size"]


def parse_size(text: str) -> int:
    """'64MB' -> 64_000_000, '1GiB' -> 2**30, '512K' -> 512 * 2**10, '1000' -> 1000 bytes."""
    s = str(text).strip().replace(" ", "")
    units = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
             "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40,
             "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}
    i = len(s)
    while i and not (s[i - 1].isdigit() or s[i - 1] == "."):
        i -= 1
    num, unit = s[:i], s[i:].upper()
    if unit not in units or not num:
        raise ValueError(f"cannot parse size {text!r}: use e.g. 64MB, 1GiB, 500000")
    try:
        value = float(num)
    except ValueError:
        raise ValueError(f"cannot parse size {text!r}") from None
    if value <= 0:
        raise ValueError(f"size must be positive, got {text!r}")
    return int(value * units[unit])
