"""Files that are not pictures though a picture may sit inside them (an archive, a document, a video): pack looks for
a JPEG behind a few bytes of junk, and such a file would pass for one. Each is rejected by what it is instead."""
from __future__ import annotations

import struct

__all__ = ["is_tar", "container", "TAR_REASON"]

# (signature at the start, what the rejection calls it); tar's is at offset 257 (is_tar)
_CONTAINERS = ((b"%PDF", "a PDF document"), (b"PK\x03\x04", "a ZIP archive"), (b"Rar!", "a RAR archive"),
               (b"7z\xbc\xaf", "a 7-Zip archive"), (b"\x1f\x8b", "a gzip file"),
               (b"RIFF", "a RIFF file (AVI, WAV, ...)"), (b"\x1aE\xdf\xa3", "a Matroska/WebM video"))
TAR_REASON = ("not an image: a tar archive (WebDataset shards are not packed: `fastfeed index` adopts them in place, "
              "as they are)")


def is_tar(data) -> bool:
    """Whether `data` starts with a POSIX or GNU tar header: "ustar" at offset 257 and the header's checksum right
    (the sum of its 512 bytes, the checksum field counted as spaces; unsigned or signed, as tarfile accepts)."""
    if len(data) < 512 or bytes(data[257:262]) != b"ustar":
        return False
    head = bytes(data[:512])
    try:
        stored = int(head[148:156].split(b"\0", 1)[0].strip(), 8)
    except ValueError:  # not an octal number (an empty field included)
        return False
    spaces = 8 * ord(" ")
    return stored in (spaces + sum(struct.unpack_from("148B8x356B", head)),
                      spaces + sum(struct.unpack_from("148b8x356b", head)))


def container(head: bytes) -> str | None:
    """What container other than tar (is_tar) a file starting with `head` is, or None."""
    for magic, what in _CONTAINERS:
        if head.startswith(magic):
            return what
    return "an ISO media file (MP4, MOV, ...)" if head[4:8] == b"ftyp" else None
