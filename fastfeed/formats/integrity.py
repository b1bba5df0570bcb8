"""Checksums of a packed dataset: per sample (xxh3_64 of the stored image bytes, in `samples.npz`), of the sample
table itself (xxh3_64 of `samples.npz`, in the manifest) and of every data file (sha256, in the manifest).

Why two hashes: xxh3 runs at ~10+ GB/s per core, so the Loader can check every sample it reads and every open can
check the table; sha256 (~1.5 GB/s) is kept for whole data files, checked only by `fastfeed verify`, where a
cryptographic digest is what people compare against published values.
"""
from __future__ import annotations

import hashlib
from typing import Sequence

import numpy as np
import xxhash

__all__ = ["bad_checksums", "checksum", "xxh3_hex", "sha256_file", "xxh3_file"]

_CHUNK = 8 << 20


def checksum(data) -> int:
    """The per-sample checksum: xxh3_64 of the exact stored bytes (anything with the buffer protocol)."""
    return xxhash.xxh3_64_intdigest(data)


def xxh3_hex(data) -> str:
    return xxhash.xxh3_64_hexdigest(data)


def bad_checksums(dataset, indices: Sequence[int] | np.ndarray, samples: Sequence, *,
                  digests: np.ndarray | None = None) -> list[int]:
    """Positions p in the batch whose bytes `samples[p]` do not hash to the checksum the pack recorded for sample
    `indices[p]`; [] when the dataset has no per-sample checksums (format version 1).

    `samples` are the encoded records as read (bytes, memoryviews or uint8 numpy arrays, e.g. the ring's views);
    an empty record (a failed read) is reported too. `digests`: the records' xxh3_64 already computed elsewhere
    (e.g. by native reader threads right after the read, without the GIL); then only the comparison runs here.

    Cost: hashing here needs the GIL back once per sample (python-xxhash releases it only around buffers over
    64 KB), which a busy Python thread beside it can stretch far past the hash itself; with `digests` it is one numpy
    comparison. So the Loader passes the ring's digests (`PrefetchRing(digests=True)`; docs/design/ring.md#digests).
    """
    sums = dataset.checksums
    if sums is None:
        return []
    expected = sums[np.asarray(indices, dtype=np.int64)]
    if digests is not None:
        return np.flatnonzero(np.asarray(digests, dtype=np.uint64) != expected).tolist()
    h = xxhash.xxh3_64_intdigest
    return [p for p, (s, e) in enumerate(zip(samples, expected.tolist())) if h(s) != e]


def sha256_file(path: str) -> str:
    """sha256 hex digest of a whole file, read in 8 MB chunks (the one file hasher of pack, merge and verify)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def xxh3_file(path: str) -> str:
    h = xxhash.xxh3_64()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()
