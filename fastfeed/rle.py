"""COCO's run-length encoded masks (`{"size": [h, w], "counts": ...}`), decoded without pycocotools.

`counts` alternates runs of 0s and 1s, starting with 0s, over the mask in column-major order (down the first column,
then the next). It is a list of ints ("uncompressed RLE") or a string ("compressed": pycocotools' rleToString, each
count in 5-bit groups offset by 48, the counts from the third on stored as the difference to the count two before).
"""
from __future__ import annotations

import numpy as np

__all__ = ["RleError", "decode_rle", "rle_counts"]


class RleError(ValueError):
    """An RLE that is not a mask of its own size."""


def rle_counts(rle) -> tuple[int, int, np.ndarray]:
    """(height, width, counts int64) of an RLE dict, checked: the counts are non-negative and cover h * w pixels."""
    if not isinstance(rle, dict) or "size" not in rle or "counts" not in rle:
        raise RleError("an RLE mask is a {'size': [h, w], 'counts': ...} object")
    size = rle["size"]
    if (not isinstance(size, list) or len(size) != 2
            or not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in size)):
        raise RleError(f"RLE size {size!r:.40} is not [height, width]")
    h, w = size
    counts = rle["counts"]
    if isinstance(counts, str):
        counts = _from_string(counts)
    elif isinstance(counts, list) and all(isinstance(v, int) and not isinstance(v, bool) for v in counts):
        counts = np.asarray(counts, dtype=np.int64)
    else:
        raise RleError("RLE counts are a list of integers or a compressed string")
    if (counts < 0).any() or int(counts.sum()) != h * w:
        raise RleError(f"RLE counts cover {int(counts.sum())} pixels, its size {h}x{w} has {h * w}")
    return h, w, counts


def decode_rle(rle) -> np.ndarray:
    """The mask, uint8 [h, w] of 0 and 1. Raises RleError for a malformed RLE."""
    h, w, counts = rle_counts(rle)
    values = np.arange(len(counts), dtype=np.int64) % 2
    return np.repeat(values.astype(np.uint8), counts).reshape(w, h).T.copy()


def _from_string(s: str) -> np.ndarray:
    """pycocotools' rleFrString."""
    counts: list[int] = []
    p, n = 0, len(s)
    while p < n:
        x, k, more = 0, 0, True
        while more:
            if p >= n:
                raise RleError("compressed RLE counts end inside a number")
            c = ord(s[p]) - 48
            if not 0 <= c < 64:
                raise RleError(f"compressed RLE counts hold {s[p]!r}, outside '0'..'o'")
            x |= (c & 0x1F) << (5 * k)
            more = bool(c & 0x20)
            p += 1
            k += 1
            if not more and c & 0x10:
                x |= -1 << (5 * k)
        if len(counts) > 2:
            x += counts[-2]
        counts.append(x)
    return np.asarray(counts, dtype=np.int64)
