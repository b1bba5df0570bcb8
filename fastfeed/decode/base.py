"""What every decoder shares: the result type, the corrupt-sample error, replacement policy and output buffers.

Replacement policy (on_error="skip"): a corrupt position takes a copy of the next good position of the same batch
(cyclically), so the batch keeps its shape and the choice is deterministic. A batch with no good sample cannot be
filled and raises CorruptSampleError whatever the policy.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple, Sequence

import numpy as np

from fastfeed.constants import DTYPE_NAMES
from fastfeed.image.headers import PNG_SIGNATURE

__all__ = ["DecodeResult", "Replaced", "CorruptSampleError", "ON_ERROR", "DTYPES", "NOT_IMAGE", "DECODE_ERROR",
           "MISSING_FIELD", "BAD_FIELD", "replacement_map", "check_common", "is_image"]

ON_ERROR = ("skip", "raise")
# Skip codes every decoder uses (the epoch adds "read_error" and "checksum"): the same input gives the same code
# on every path; `detail` carries the decoder's own message.
NOT_IMAGE = "not_image"  # no known image signature (empty, text, ...): caught before decoding
DECODE_ERROR = "decode_error"  # the signature is an image's but the decoder failed on it
MISSING_FIELD = "missing_field"  # Loader(fields=...) or a mask: the sample has no such member
BAD_FIELD = "bad_field"  # the member's bytes are not a value of its kind (not UTF-8, JSON, .npy, a mask, ...)


class Replaced(NamedTuple):
    """A corrupt record whose batch slot holds a copy of another sample (see replacement_map)."""

    position: int
    code: str  # NOT_IMAGE | DECODE_ERROR
    detail: str


@dataclass
class DecodeResult:
    """images: torch.Tensor [B, 3, S, S] on the decoder's device (NHWC memory when channels_last);
    replaced: a Replaced(position, code, detail) for each corrupt record, by position."""

    images: object
    replaced: list = field(default_factory=list)


class CorruptSampleError(ValueError):
    """A record of the batch could not be decoded. `position` is the first bad batch position; `positions`,
    `codes` and `details` list all of them (the loader maps positions to sample keys)."""

    def __init__(self, positions: Sequence[int], codes: Sequence[str], details: Sequence[str] | None = None):
        self.positions = [int(p) for p in positions]
        self.codes = list(codes)
        self.details = list(details) if details is not None else [""] * len(self.positions)
        self.position = self.positions[0] if self.positions else -1
        text = "; ".join(f"position {p}: {c}: {d}" for p, c, d in zip(self.positions, self.codes, self.details))
        super().__init__(f"corrupt sample(s) in batch: {text}")

    @property
    def reasons(self) -> list[str]:
        return [f"{c}: {d}" for c, d in zip(self.codes, self.details)]


def replacement_map(bad: Sequence[int], batch_size: int) -> dict[int, int]:
    """bad position -> the good position whose output it copies (next good one, cyclically)."""
    bad_set = set(int(b) for b in bad)
    good = [i for i in range(batch_size) if i not in bad_set]
    if not good:
        return {}
    good_arr = np.asarray(good)
    out = {}
    for b in sorted(bad_set):
        k = int(np.searchsorted(good_arr, b))
        out[b] = int(good_arr[k % len(good_arr)])
    return out


def resolve_errors(bad: dict[int, tuple[str, str]], batch_size: int, on_error: str) -> dict[int, int]:
    """Apply the on_error policy to {position: (code, detail)}: raise, or return the replacement map."""
    if not bad:
        return {}
    positions = sorted(bad)
    codes = [bad[p][0] for p in positions]
    if on_error == "raise":
        raise CorruptSampleError(positions, codes, [bad[p][1] for p in positions])
    repl = replacement_map(positions, batch_size)
    if not repl:
        raise CorruptSampleError(positions, codes,
                                 [bad[p][1] + " (no good sample left in the batch)" for p in positions])
    return repl


def replaced_list(bad: dict[int, tuple[str, str]]) -> list[Replaced]:
    return [Replaced(p, bad[p][0], bad[p][1]) for p in sorted(bad)]


def _torch_dtypes():
    import torch

    return {torch.float16: "float16", torch.bfloat16: "bfloat16", torch.float32: "float32", torch.uint8: "uint8"}


DTYPES = DTYPE_NAMES


def check_common(image_size, dtype, mean, std, on_error, batch_size, num_threads, orientation="ignore") -> str:
    """Validate the constructor arguments every decoder takes; returns the dtype's name."""
    from fastfeed.decode.crop import ORIENTATIONS

    if orientation not in ORIENTATIONS:
        raise ValueError(f"orientation must be one of {ORIENTATIONS}, got {orientation!r}")
    names = _torch_dtypes()
    if dtype not in names:
        raise ValueError(f"dtype must be one of torch.float16/bfloat16/float32/uint8, got {dtype!r}")
    if int(image_size) < 1:
        raise ValueError(f"image_size must be >= 1, got {image_size}")
    if len(mean) != 3 or len(std) != 3 or any(float(s) <= 0 for s in std):
        raise ValueError("mean and std need 3 values each, std > 0")
    if on_error not in ON_ERROR:
        raise ValueError(f"on_error must be one of {ON_ERROR}, got {on_error!r}")
    if int(batch_size) < 1 or int(num_threads) < 1:
        raise ValueError("batch_size and num_threads must be >= 1")
    return names[dtype]


_MAGIC = (
    b"\xff\xd8\xff",  # JPEG
    PNG_SIGNATURE,
    b"GIF87a",
    b"GIF89a",
    b"BM",
    b"II*\x00",  # TIFF little-endian
    b"MM\x00*",
    b"II+\x00", b"MM\x00+",  # BigTIFF
    # what only PIL decodes, as pack stores it (pack/validate.py _sniff)
    b"P5", b"P6",  # PGM, PPM
    b"\x00\x00\x01\x00",  # ICO
    b"8BPS",  # PSD
    b"\x00\x00\x00\x0cjP  ", b"\xffO\xffQ",  # JPEG 2000
)


def starts_with_png(sample) -> bool:
    """Whether the record starts with PNG's signature."""
    return bytes(sample[:8]) == PNG_SIGNATURE


def is_image(sample: np.ndarray, pil_only: bool = False) -> bool:
    """Cheap signature check (no decode): catches empty and non-image records before they fail a whole batch.
    `pil_only` (samples.npz): pack decoded the sample with PIL, which is trusted, as some formats PIL reads (TGA)
    have no signature; its checksum still guards its bytes."""
    if pil_only:
        return len(sample) > 0
    head = bytes(sample[:12])
    if head.startswith(_MAGIC):
        return True
    return len(head) >= 12 and (head[:4] == b"RIFF" and head[8:12] == b"WEBP" or
                                head[4:12] in (b"ftypheic", b"ftypheix", b"ftypmif1", b"ftypavif"))


def apply_replacements(images, repl: dict[int, int]) -> None:
    """Copy each replacement's output into the corrupt slot (on torch's current stream for CUDA tensors)."""
    if not repl:
        return
    import torch

    dst = torch.as_tensor(list(repl.keys()), device=images.device)
    src = torch.as_tensor(list(repl.values()), device=images.device)
    images[dst] = images[src]
