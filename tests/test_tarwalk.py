"""formats/tarwalk.py against Python's tarfile on archives tarfile writes in each of its formats (long names, ustar
prefixes, PAX and GNU headers, global PAX headers, directories and links among the files), and on damaged ones:
the same members, names, data offsets and sizes, each link named with its target, and a reason wherever the archive
stops being readable."""
from __future__ import annotations

import io
import shutil
import subprocess
import tarfile

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fastfeed.formats import tarwalk
from fastfeed.formats.tarwalk import read_header, walk_tar

FORMATS = {"ustar": tarfile.USTAR_FORMAT, "gnu": tarfile.GNU_FORMAT, "pax": tarfile.PAX_FORMAT}


def archive(entries, fmt, pax_headers=None) -> bytes:
    """entries: (name, bytes | "dir" | "link")."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=fmt, pax_headers=pax_headers or {}) as tar:
        for name, data in entries:
            ti = tarfile.TarInfo(name)
            if data == "dir":
                ti.type = tarfile.DIRTYPE
                tar.addfile(ti)
            elif data == "link":
                ti.type, ti.linkname = tarfile.SYMTYPE, "elsewhere/" + "l" * 120
                tar.addfile(ti)
            else:
                ti.size = len(data)
                tar.addfile(ti, io.BytesIO(data))
    return buf.getvalue()


def tarfile_members(data: bytes) -> list[tuple[str, int, int]]:
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tar:
        return [(ti.name, ti.offset_data, ti.size) for ti in tar if ti.isfile()]


def walked(data: bytes):
    members, skipped, problem = walk_tar(data)
    return [(m.name, m.offset, m.size) for m in members], skipped, problem


names = st.one_of(
    st.from_regex(r"[a-z0-9_]{1,12}/[a-z0-9]{1,20}\.(jpg|txt|json|cls)", fullmatch=True),
    st.from_regex(r"[a-zé]{1,8}(/[a-z]{30,60}){2,4}\.[a-z]{2,4}", fullmatch=True),  # over 100 bytes: prefix/pax/GNU
)
entries = st.lists(st.tuples(names, st.one_of(st.binary(max_size=3000), st.just("dir"), st.just("link"))),
                   min_size=1, max_size=12)


@settings(max_examples=60, deadline=None)
@given(entries=entries, fmt=st.sampled_from(sorted(FORMATS)))
def test_the_members_are_tarfiles(entries, fmt):
    try:
        data = archive(entries, FORMATS[fmt])
    except ValueError:  # a name ustar cannot hold: tarfile refuses to write it
        return
    got, skipped, problem = walked(data)
    assert problem is None and [name for name, _ in skipped] == [name for name, d in entries if d == "link"]
    assert all(why.startswith("a symbolic link to elsewhere/" + "l" * 120 + ":") for _, why in skipped)
    assert got == tarfile_members(data)


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_an_archive_appended_after_the_end_marker_is_reported_not_read(fmt):
    """Found by an adversarial run: two tars concatenated (`cat a.tar b.tar`) read as the first alone in tarfile,
    webdataset and DALI; the walk lists the first's members too, and says the rest of the file was not read."""
    first = archive([("a.jpg", b"1" * 700), ("a.txt", b"one")], FORMATS[fmt])
    second = archive([("b.jpg", b"2" * 700)], FORMATS[fmt])
    got, _, problem = walked(first + second)
    assert got == tarfile_members(first) == tarfile_members(first + second)
    assert problem is not None and f"from offset {len(first)}" in problem and "not read" in problem
    assert walked(first + bytes(4096))[2] is None  # zeros after the marker are padding, not data


def test_a_global_pax_header_and_utf8_names():
    data = archive([("d/é" * 40 + ".txt", b"x" * 700), ("k.cls", b"3")], tarfile.PAX_FORMAT,
                   pax_headers={"comment": "global"})
    got, _, problem = walked(data)
    assert problem is None and got == tarfile_members(data) and got[0][0].startswith("d/é")


def test_a_solaris_extended_header_is_read_as_pax():
    """Found by an adversarial run: an 'X' header (Solaris tar's extended header, which tarfile reads as PAX's 'x')
    was passed over, so the member after it got its header's truncated name."""
    data = bytearray(archive([("s0.jpg", b"a" * 600), ("L" * 120 + ".jpg", b"b" * 700), ("é.txt", b"c")],
                             tarfile.PAX_FORMAT))
    for off in range(0, len(data), 512):  # every 'x' header made an 'X', its checksum recomputed
        hdr = data[off:off + 512]
        if hdr[257:263] == b"ustar\x00" and hdr[156:157] == b"x":
            hdr[156:157], hdr[148:156] = b"X", b" " * 8
            hdr[148:156] = b"%06o\x00 " % sum(hdr)
            data[off:off + 512] = hdr
    data = bytes(data)
    got, _, problem = walked(data)
    assert problem is None and got == tarfile_members(data)
    assert [name for name, _, _ in got] == ["s0.jpg", "L" * 120 + ".jpg", "é.txt"]


def test_a_base256_size_is_read():
    """GNU writes sizes over 8 GiB in base-256; a small one written that way reads the same."""
    data = bytearray(archive([("a.bin", b"y" * 1000)], tarfile.GNU_FORMAT))
    data[124:136] = b"\x80" + (1000).to_bytes(11, "big")
    data[148:156] = b"        "
    data[148:156] = b"%06o\0 " % sum(data[:512])
    data = bytes(data)
    assert walked(data)[0] == tarfile_members(data) == [("a.bin", 512, 1000)]


def three(fmt=tarfile.PAX_FORMAT) -> bytes:
    return archive([(f"s/{i:03d}.jpg", bytes([i]) * (600 + i)) for i in range(3)], fmt)


@pytest.mark.parametrize("fmt", sorted(FORMATS))
@pytest.mark.parametrize("chunk", [1, 2, 1 << 15])  # headers per checksum pass: the bad one in a later pass too
def test_a_damaged_header_ends_the_walk_there_with_its_offset(fmt, chunk, monkeypatch):
    monkeypatch.setattr(tarwalk, "_CHUNK", chunk)
    data = three(FORMATS[fmt])
    good = walked(data)[0]
    victim = good[1][1] - 512  # the second member's own header
    damaged = bytearray(data)
    damaged[victim + 20] ^= 0x01  # in its name
    got, _, problem = walked(bytes(damaged))
    assert got == good[:1]
    assert f"checksum is wrong at offset {victim}" in problem


def test_a_shard_cut_in_a_member_in_a_header_or_after_a_member_says_so():
    data = three()
    members = walked(data)[0]
    cases = {
        "runs past the end": data[:members[2][1] + 100],  # in the last member's data
        "cut short at offset": data[:members[2][1] - 300],  # in the last member's header
        "without the end-of-archive marker": data[:members[1][1] + 1024],  # right after the second member
    }
    for why, cut in cases.items():
        got, _, problem = walked(cut)
        assert problem is not None and why in problem, (why, problem)
        assert got == members[:2], why
    # where tarfile ends the walk without a word (a header cut short)
    assert len(tarfile_members(cases["cut short at offset"])) == 2


def test_an_archive_of_garbage_is_damaged_not_a_crash():
    got, _, problem = walked(b"not a tar" * 200)
    assert got == [] and "damaged" in problem


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_one_header_read_on_its_own(fmt):
    """read_header (verify's spot check): the member's name and size from its own header; None once damaged."""
    data = archive([("s/a" * 20 + ".jpg", b"z" * 900), ("s/b.txt", b"hi")], FORMATS[fmt])
    members = walked(data)[0]
    name, off, size = members[1]
    assert read_header(data[off - 512:off]) == (name, size)
    first = read_header(data[members[0][1] - 512:members[0][1]])
    assert first[1] == 900 and (first[0] == members[0][0] or fmt != "ustar")  # GNU/PAX: the long name is elsewhere
    bad = bytearray(data[off - 512:off])
    bad[3] ^= 0x20
    assert read_header(bytes(bad)) is None and read_header(b"short") is None


@pytest.mark.skipif(shutil.which("tar") is None, reason="needs GNU tar")
@pytest.mark.parametrize("fmt,version", [("gnu", None), ("posix", "0.0"), ("posix", "0.1"), ("posix", "1.0")])
def test_a_sparse_file_is_listed_by_its_name_and_the_walk_goes_on(tmp_path, fmt, version):
    """Found by an adversarial run: GNU tar --sparse stores a file's data regions without its holes (old GNU: a
    type 'S' member whose map goes on in extension blocks past 4 regions; PAX: GNU.sparse.* records on a regular
    member, format 1.0 naming it GNUSparseFile.NNN/NAME). The walk took the stored regions for the member's bytes,
    or lost the rest of the archive at the first extension block."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.jpg").write_bytes(b"a" * 700)
    with open(src / "b.bin", "wb") as f:  # 8 data regions: old GNU needs extension blocks past 4
        for r in range(8):
            f.seek(r << 20)
            f.write(b"D" * 4096)
        f.truncate(8 << 20)
    (src / "c.jpg").write_bytes(b"c" * 900)
    shard = tmp_path / "s.tar"
    args = ["--sparse"] + ([f"--sparse-version={version}"] if version else [])
    subprocess.run(["tar", f"--format={fmt}", *args, "-cf", str(shard), "-C", str(src), "a.jpg", "b.bin", "c.jpg"],
                   check=True)
    data = shard.read_bytes()
    with tarfile.open(shard) as tar:
        assert [ti.name for ti in tar if ti.issparse()] == ["b.bin"]  # GNU tar stored it sparse
    got, skipped, problem = walked(data)
    assert problem is None
    assert got == [m for m in tarfile_members(data) if m[0] != "b.bin"] and [m[0] for m in got] == ["a.jpg", "c.jpg"]
    assert [name for name, _ in skipped] == ["b.bin"] and skipped[0][1].startswith("sparse file: not supported")
