"""The members of a tar archive held in memory (an mmap of a shard): name, data offset and size, one pass over the
headers without reading the data.

Python's `tarfile` does the same with a TarInfo per header and every field parsed, which made it most of
`fastfeed index`'s time (webdataset's ShardWriter writes a PAX header before each member: two headers per member).
This reads only what adoption needs (name, size, type), follows what tarfile follows (ustar prefix, PAX (and Solaris
X) `path` and `size`, global PAX headers, GNU long names, base-256 sizes, old GNU sparse headers' extension blocks)
and checks every header's checksum at the end, in one numpy pass. Unlike tarfile, which ends the walk silently at a
damaged header after the first, it says where the archive stops being readable, and names what it is when it is a
compressed file rather than a tar. A link member (hard or symbolic) holds no bytes of its own: tarfile and
webdataset skip it without a word; this lists it, with its target, among the members not read, and so is a sparse
file (GNU tar --sparse: its holes are not stored), by its real name.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["TarMember", "walk_tar", "read_header"]

_BLOCK = 512
_ZERO = bytes(_BLOCK)
_FILE_TYPES = (b"0", b"\0", b"7")  # regular file (and its old and "contiguous" spellings): tarfile's isfile()
_LINK_TYPES = {b"1": "a hard link", b"2": "a symbolic link"}
# Magic bytes of what a shard named .tar may be instead: (magic, name, how to decompress it).
_COMPRESSED = ((b"\x1f\x8b", "gzip", "gzip -dc"), (b"BZh", "bzip2", "bzip2 -dc"), (b"\xfd7zXZ\x00", "xz", "xz -dc"),
               (b"\x28\xb5\x2f\xfd", "zstd", "zstd -dc"), (b"\x04\x22\x4d\x18", "lz4", "lz4 -dc"))
_POSIX_MAGIC = b"ustar\x0000"
# Tar readers rebuild a sparse file from its data regions and map; no byte range of the shard holds it.
_SPARSE = ("sparse file: not supported (the shard stores its data regions without the holes between them, so no "
           "byte range of the shard holds it to read in place); store it as a regular file (GNU tar without "
           "--sparse)")
_CHUNK = 1 << 15  # headers checksummed per numpy pass: 16 MB of copies at most


@dataclass(frozen=True)
class TarMember:
    name: str
    offset: int  # of its data
    size: int


class _Damaged(Exception):
    pass


def walk_tar(buf, size: int | None = None) -> tuple[list[TarMember], list[tuple[str, str]], str | None]:
    """(regular-file members in archive order, [(name, why)] of members not read as files (a sparse file, a link),
    the reason the walk stopped early or None). `buf` supports slicing to bytes (an mmap, bytes); `size` its
    length. Members whose data runs past the end are not listed; the reason says so."""
    size = len(buf) if size is None else size
    members: list[TarMember] = []
    skipped: list[tuple[str, str]] = []
    headers: list[int] = []  # every header's offset, for the checksum pass
    stored: list[int] = []  # the checksum each header states
    problem = None
    pending: dict = {}  # PAX records (or a GNU long name) for the next header
    global_pax: dict = {}
    pos = 0
    try:
        while True:
            if pos == size:  # tarfile calls this damaged too: a shard cut at a member's end looks like this
                raise _Damaged("it ends without the end-of-archive marker: cut short after its last member?")
            if pos + _BLOCK > size:
                raise _Damaged(f"a header cut short at offset {pos}")
            hdr = buf[pos:pos + _BLOCK]
            if hdr == _ZERO:  # the end-of-archive marker
                after = _first_data_after(buf, pos + _BLOCK, size)
                if after is not None:
                    problem = (f"data after the end-of-archive marker (from offset {after}: another archive "
                               "appended to this one?) is not read, as webdataset and DALI do not read it; split "
                               "the file into its archives")
                break
            stored.append(_octal(hdr[148:156], pos, "checksum"))
            headers.append(pos)
            length = _size(hdr[124:136], pos)
            kind = hdr[156:157]
            data = pos + _BLOCK
            if data + length > size:
                name = pending.get("path") or _name(hdr)
                raise _Damaged(f"member {name} runs past the end of the file (truncated shard)")
            if kind in (b"x", b"X", b"g"):  # X: Solaris's extended header, read as PAX's x (tarfile does)
                records = _pax(buf[data:data + length], pos)
                if kind == b"g":
                    global_pax.update(records)
                else:
                    pending.update(records)
            elif kind in (b"L", b"K"):
                pending["path" if kind == b"L" else "linkpath"] = _cstr(buf[data:data + length])
            else:
                info = {**global_pax, **pending}
                pending = {}
                name = info.get("path") or _name(hdr)
                if "size" in info:
                    length = _pax_size(info["size"], pos)
                    if data + length > size:
                        raise _Damaged(f"member {name} runs past the end of the file (truncated shard)")
                if kind == b"S":  # old GNU sparse: its map may go on in extension blocks before the data
                    data = _after_sparse_extensions(buf, hdr, data, size)
                    if data + length > size:
                        raise _Damaged(f"member {name} runs past the end of the file (truncated shard)")
                if kind == b"S" or "sparse" in info:  # PAX GNU.sparse.* records: formats 0.0, 0.1 and 1.0
                    skipped.append((pos, info.get("sparse_name") or name, _SPARSE))
                elif kind in _FILE_TYPES and not name.endswith("/"):
                    members.append(TarMember(name, data, length))
                elif kind in _LINK_TYPES:
                    target = info.get("linkpath") or _cstr(hdr[157:257])
                    skipped.append((pos, name, f"{_LINK_TYPES[kind]} to {target}: a link holds no bytes of its own "
                                               "to read in place (webdataset skips it too); store the file itself "
                                               "(GNU tar: --hard-dereference, --dereference)"))
            pos = data + length + (-length % _BLOCK)
    except _Damaged as e:
        problem = f"damaged tar archive ({e}); the members after the last good one are lost"
    bad = _first_bad_checksum(buf, size, headers, stored)
    if bad is not None:
        members = [m for m in members if m.offset < bad]
        skipped = [s for s in skipped if s[0] < bad]
        problem = (f"damaged tar archive (a header's checksum is wrong at offset {bad}); the members after the "
                   "last good one are lost")
    if problem and not members:
        problem = _compressed(buf[:8]) or problem
    return members, [(name, why) for _, name, why in skipped], problem


def _after_sparse_extensions(buf, hdr: bytes, data: int, size: int) -> int:
    """Where an old GNU sparse member's data starts: after the extension blocks its header's `isextended` flag
    (byte 482) announces, each announcing the next at its byte 504."""
    extended = hdr[482]
    while extended:
        if data + _BLOCK > size:
            raise _Damaged(f"a sparse member's map cut short at offset {data}")
        extended = buf[data + 504]
        data += _BLOCK
    return data


def _first_data_after(buf, pos: int, size: int, chunk: int = 1 << 20) -> int | None:
    """The offset of the first non-zero byte from `pos` on, or None: an archive ends in zero blocks, padded with
    zeros to its record size, so anything else there is data no tar reader reads."""
    while pos < size:
        block = bytes(buf[pos:min(size, pos + chunk)])
        stripped = block.lstrip(b"\0")
        if stripped:
            return pos + len(block) - len(stripped)
        pos += len(block)
    return None


def read_header(block: bytes) -> tuple[str, int] | None:
    """(member name, size) of one header block read on its own (fastfeed verify's spot checks), None when its
    checksum is wrong or a field is garbage. The name is the header's own (with a ustar prefix), not a PAX one."""
    if len(block) != _BLOCK:
        return None
    try:
        want, size = _octal(block[148:156], 0, "checksum"), _size(block[124:136], 0)
    except _Damaged:
        return None
    if _first_bad_checksum(block, _BLOCK, [0], [want]) is not None:
        return None
    return _name(block), size


def _name(hdr: bytes) -> str:
    name = hdr[:100].split(b"\0", 1)[0]
    if hdr[257:265] == _POSIX_MAGIC:
        prefix = hdr[345:500].split(b"\0", 1)[0]
        if prefix:
            name = prefix + b"/" + name
    return name.decode("utf-8", "surrogateescape")


def _cstr(field: bytes) -> str:
    return bytes(field).split(b"\0", 1)[0].decode("utf-8", "surrogateescape")


def _compressed(head: bytes) -> str | None:
    """What a file that is no tar from its first header on says it is, when its magic bytes name a compressor."""
    head = bytes(head)
    for magic, name, tool in _COMPRESSED:
        if head.startswith(magic):
            return (f"not a tar archive but a {name}-compressed file (it starts with {name}'s magic bytes "
                    f"{magic.hex(' ')}); fastfeed reads each member's bytes in place, which needs an uncompressed "
                    f"tar: decompress it ({tool} SHARD > UNCOMPRESSED.tar; the members stay as they are) and "
                    "index that")
    return None


def _octal(field: bytes, pos: int, what: str) -> int:
    try:
        return int(field.split(b"\0", 1)[0].strip() or b"0", 8)
    except ValueError:
        raise _Damaged(f"the header at offset {pos} has no valid {what}") from None


def _size(field: bytes, pos: int) -> int:
    if field[0] in (0x80, 0xFF):  # base-256 (GNU): big sizes
        if field[0] == 0xFF:
            raise _Damaged(f"the header at offset {pos} has a negative size")
        return int.from_bytes(field[1:], "big")
    return _octal(field, pos, "size")


def _pax(data: bytes, pos: int) -> dict:
    """PAX records ("LEN key=value\\n" each); only the keys adoption uses are kept."""
    out = {}
    data = bytes(data)
    i = 0
    while i < len(data) and data[i:i + 1] not in (b"\0", b""):
        space = data.find(b" ", i)
        try:
            n = int(data[i:space])
        except ValueError:
            raise _Damaged(f"the PAX header at offset {pos} is malformed") from None
        record = data[space + 1:i + n]
        if n <= 0 or not record.endswith(b"\n") or b"=" not in record:
            raise _Damaged(f"the PAX header at offset {pos} is malformed")
        key, value = record[:-1].split(b"=", 1)
        if key in (b"path", b"size", b"linkpath"):
            out[key.decode()] = value.decode("utf-8", "surrogateescape")
        elif key.startswith(b"GNU.sparse."):
            out["sparse"] = True
            if key == b"GNU.sparse.name":  # format 1.0 names the member GNUSparseFile.NNN/NAME, its real name here
                out["sparse_name"] = value.decode("utf-8", "surrogateescape")
        i += n
    return out


def _pax_size(value: str, pos: int) -> int:
    try:
        n = int(value)
    except ValueError:
        raise _Damaged(f"the PAX size before offset {pos} is not a number") from None
    if n < 0:
        raise _Damaged(f"the PAX size before offset {pos} is negative")
    return n


def _first_bad_checksum(buf, size: int, headers: list[int], stored: list[int]) -> int | None:
    """The offset of the first header whose checksum (unsigned byte sum with the checksum field as spaces; tarfile
    also accepts the signed sum) is wrong, or None."""
    if not headers:
        return None
    # Headers start on 512-byte boundaries: pick them as rows of the archive seen as blocks, a bounded number at a
    # time (each row is copied).
    rows = np.frombuffer(buf, dtype=np.uint8, count=size // _BLOCK * _BLOCK).reshape(-1, _BLOCK)
    at_all = np.asarray(headers, dtype=np.int64)
    want_all = np.asarray(stored, dtype=np.int64)
    for lo in range(0, len(at_all), _CHUNK):
        at, want = at_all[lo:lo + _CHUNK], want_all[lo:lo + _CHUNK]
        blocks = rows[at // _BLOCK]
        field = blocks[:, 148:156]
        ok = blocks.sum(axis=1, dtype=np.int64) - field.sum(axis=1, dtype=np.int64) + 8 * 32 == want
        if not ok.all():
            signed = blocks.view(np.int8)
            ok |= (signed.sum(axis=1, dtype=np.int64) - signed[:, 148:156].sum(axis=1, dtype=np.int64) + 8 * 32
                   == want)
            bad = np.flatnonzero(~ok)
            if len(bad):
                return int(at[bad[0]])
    return None
