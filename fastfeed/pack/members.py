"""What a sample stores beside its image (SourceEntry.members: a segmentation source's mask file, a list's caption),
read whole and checked on pack's reader threads; a sample is stored with all its members or not at all.

A mask (`seg.png`) is stored byte for byte, so it must already be what the Loader reads: a PNG (a lossy format
would hold ids the file never had) that decodes to one class id per pixel (mode 1, L, P, I;16 or I: fastfeed/detect/
masks.py `decode_mask`, the Loader's own rule) of its image's stored size. The read and the decode
(`read_members`) need no image, so both writers run them in parallel ahead of the image's check; the size is
compared once the image is checked (`members_problem`), so that a sample with a bad image and a bad mask is
rejected for its image on both writers.
"""
from __future__ import annotations

from dataclasses import dataclass

from fastfeed.image.headers import PNG_SIGNATURE, png_facts, swaps_axes
from fastfeed.pack.annotations.masks import MASK_MEMBER
from fastfeed.pack.validate import Rejected, _read

__all__ = ["MemberData", "read_members", "members_problem", "member_sizes", "member_pairs"]



@dataclass(frozen=True)
class MemberData:
    """One member's bytes as stored, and for a mask its (width, height)."""

    ext: str
    path: str
    data: bytes
    size: tuple[int, int] | None = None


def read_members(members) -> list[MemberData] | Rejected:
    """`members` ((ext, path) pairs read here, (ext, bytes) pairs as they are: a list's caption) and, for a mask,
    decoded; the first problem as a Rejected."""
    out = []
    for ext, path in members:
        if isinstance(path, (bytes, bytearray)):
            out.append(MemberData(ext, "", bytes(path)))
            continue
        data = _read(path) if ext == MASK_MEMBER else _read_any(path)  # a caption may be empty, a mask not
        if isinstance(data, Rejected):
            return Rejected(f"the mask is unreadable: {data.reason}" if ext == MASK_MEMBER else
                            f"member {ext} is unreadable: {data.reason}")
        size = None
        if ext == MASK_MEMBER:
            size = _mask_size(data)
            if isinstance(size, Rejected):
                return size
        out.append(MemberData(ext, path, data, size))
    return out


def _read_any(path: str) -> bytes | Rejected:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as e:
        return Rejected(f"{type(e).__name__}: {e}")


def _mask_size(data: bytes) -> tuple[int, int] | Rejected:
    from fastfeed.detect.masks import MaskError, decode_mask  # numba and the detection renderer: only when needed

    facts = png_facts(data) if data[:8] == PNG_SIGNATURE else "not a PNG file"
    if isinstance(facts, str):
        return Rejected(f"the mask is not a valid PNG ({facts}); masks are stored as they are, and a lossy format "
                        "would hold class ids the file never had")
    size = (facts.width, facts.height)
    try:
        decode_mask(data, size, native=False)  # a PNG's header size is the size PIL decodes
    except MaskError as e:
        return Rejected(str(e))
    return size


def members_problem(members: list[MemberData] | Rejected, width: int, height: int, tag: int = 1,
                    orientation: str = "ignore") -> str | None:
    """Why the sample of an accepted width x height image with EXIF orientation `tag` is still rejected for its
    members, or None. A mask must have its image's size in the `orientation` frame ("exif": as displayed)."""
    if isinstance(members, Rejected):
        return members.reason
    swap = orientation == "exif" and swaps_axes(tag)
    frame = (height, width) if swap else (width, height)
    for m in members:
        if m.size is not None and m.size != frame:
            what = "displayed image" if orientation == "exif" and tag != 1 else "image"
            hint = (f"; it fits the image as {'stored' if swap else 'displayed'}: pack with --orientation "
                    f"{'ignore' if swap else 'exif'}" if swaps_axes(tag) and m.size == frame[::-1] else "")
            return f"the mask is {m.size[0]}x{m.size[1]}, its {what} {frame[0]}x{frame[1]}{hint}"
    return None


def member_sizes(members: list[MemberData] | Rejected) -> list[int]:
    """The stored sizes of the members (none for a rejected set: the sample is not written)."""
    return [] if isinstance(members, Rejected) else [len(m.data) for m in members]


def member_pairs(members: list[MemberData] | Rejected) -> list[tuple[str, bytes]]:
    """(ext, bytes) of the members, as the tar writers take them (none for a rejected set)."""
    return [] if isinstance(members, Rejected) else [(m.ext, m.data) for m in members]
