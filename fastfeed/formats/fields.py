"""Named fields: the members a sample carries besides its image (webdataset's convention: `KEY.txt`, `KEY.json`,
`KEY.npy`, ... beside `KEY.jpg`), where they lie and what their bytes mean.

Where: a dataset's table holds, per field, each sample's member extent in the image's data file and its xxh3
(`field.NAME.offset`, `field.NAME.size`, `field.NAME.checksum`; size -1 where a sample has no such member). A
packed dataset's `.json` member is field "json" and its label is field "cls".

What: the value of a member follows from its extension's last part, as webdataset's default decoders read them,
except that nothing is unpickled: `.pyd`, `.pickle`, `.pth` and `.pt` members are refused, and `.npy` is read with
`allow_pickle=False`. A value must also be one a batch can hold: an int field's value fits int64, and an array's
dtype is one torch has a tensor for (NPY_DTYPES; a big-endian one is brought to native byte order, the same values).
Any other extension (a second image, `.mp3`, ...) is handed over as its bytes.
"""
from __future__ import annotations

import io
import json
import math
from dataclasses import dataclass

import numpy as np

__all__ = ["FieldExtents", "FieldError", "columns", "value_kind", "int_member", "decode_value", "PICKLED",
           "INT_EXTS", "TEXT_EXTS", "JSON_EXTS", "NPY_DTYPES", "INT64_MIN", "INT64_MAX"]

INT_EXTS = ("cls", "cls2", "index", "inx", "id")
TEXT_EXTS = ("txt", "text", "transcript")
JSON_EXTS = ("json", "jsn")
PICKLED = ("pyd", "pickle", "pth", "pt")  # never read from a dataset
INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1
# The dtypes torch.from_numpy takes (uint16, uint32 and uint64 since torch 2.3), in native byte order: an array of any
# other (text, structured, datetime, float128, ...) has no tensor and would fail the batch that collates it.
NPY_DTYPES = tuple(np.dtype(t) for t in ("bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32",
                                         "uint64", "float16", "float32", "float64", "complex64", "complex128"))


class FieldError(ValueError):
    """A member's bytes are not what its extension says (not UTF-8, not JSON, not a numpy array, ...)."""


@dataclass(frozen=True)
class FieldExtents:
    """Field `name` of every sample: `size[i]` bytes at `offset[i]` of sample i's data file (size -1: absent);
    `checksum`: uint64 xxh3_64 of each member's bytes, None where the dataset has none."""

    name: str
    offset: np.ndarray  # int64[N]
    size: np.ndarray  # int64[N]
    checksum: np.ndarray | None  # uint64[N]


def columns(name: str) -> tuple[str, str, str]:
    """The table columns of field `name`: (offset, size, checksum)."""
    return f"field.{name}.offset", f"field.{name}.size", f"field.{name}.checksum"


def value_kind(name: str) -> str:
    """"int", "text", "json", "npy" or "bytes": what decode_value makes of the field's members."""
    last = name.rsplit(".", 1)[-1]
    if last in PICKLED:
        raise ValueError(f"field {name!r}: pickled members are never read from a dataset (they can run code); "
                         "store arrays as .npy, objects as .json")
    if last in INT_EXTS:
        return "int"
    if last in TEXT_EXTS:
        return "text"
    if last in JSON_EXTS:
        return "json"
    if last == "npy":
        return "npy"
    return "bytes"


def int_member(raw) -> int:
    """The integer a `.cls` (`.id`, ...) member's bytes hold, read as webdataset reads it (Python's int(): surrounding
    whitespace, a sign, leading zeros and digit-group underscores allowed), so that index, verify and the Loader read
    one label. ValueError when it holds none."""
    return int(bytes(raw))


def decode_value(kind: str, raw):
    """The value of one member's bytes (`raw`: bytes-like) for a field of `kind` (value_kind); FieldError when the
    bytes do not hold one a batch can hold."""
    try:
        if kind == "int":
            value = int_member(raw)
        elif kind == "text":
            return bytes(raw).decode("utf-8")
        elif kind == "json":
            return json.loads(bytes(raw))
        elif kind == "npy":
            value = _load_npy(bytes(raw))
        else:
            return bytes(raw)
    # UnicodeDecodeError and JSONDecodeError are ValueErrors. RecursionError: JSON nested deeper than Python's
    # recursion limit (valid JSON that json.loads cannot hold). TypeError: np.load on a header numpy's own checks let
    # through (a bool in its shape).
    except (ValueError, OSError, EOFError, RecursionError, TypeError) as e:
        raise FieldError(f"not a valid {kind} member ({type(e).__name__}: {str(e)[:200]})") from None
    if kind == "npy":
        return _array(value)
    if not INT64_MIN <= value <= INT64_MAX:
        raise FieldError(f"{value} does not fit an int64")
    return value


def _load_npy(raw: bytes):
    """np.load(allow_pickle=False) of one member, once its header is known to describe no more data than the member
    holds: np.load allocates the array its header declares before reading a byte of it, so a few bytes declaring
    shape (10**18,) would be a MemoryError (or, with memory overcommitted, gigabytes reserved) instead of a
    member that is cut short."""
    f = io.BytesIO(raw)
    version = np.lib.format.read_magic(f) if raw[:6] == np.lib.format.MAGIC_PREFIX and len(raw) >= 8 else None
    if version in ((1, 0), (2, 0), (3, 0)):  # else np.load says what it is (an .npz, another version, no array)
        # Version 3.0 differs from 2.0 only in the header's text encoding (UTF-8 field names of structured dtypes).
        read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        shape, _, dtype = read(f)
        declared = math.prod(shape) * dtype.itemsize
        if declared > len(raw) - f.tell():
            raise ValueError(f"its header declares a {dtype} array of shape {shape} ({declared:,} bytes), but "
                             f"only {len(raw) - f.tell():,} bytes follow it")
    f.seek(0)
    return np.load(f, allow_pickle=False)


def _array(value) -> np.ndarray:
    """A loaded .npy value as an array torch takes (NPY_DTYPES), in native byte order."""
    if not isinstance(value, np.ndarray):  # np.load reads an .npz archive too
        raise FieldError(f"not a .npy array but {type(value).__name__}")
    native = value.dtype.newbyteorder("=")
    if native not in NPY_DTYPES:
        raise FieldError(f"an array of dtype {value.dtype}, which torch has no tensor for (it takes "
                         f"{', '.join(map(str, NPY_DTYPES))})")
    return value if value.dtype == native else value.astype(native)
