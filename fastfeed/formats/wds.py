"""Reader for WebDataset shards written by `fastfeed pack --format wds` (or adopted by `fastfeed index`).

Each sample is the tar members `KEY.jpg` (or `.png`), `KEY.cls` (decimal label), optionally `KEY.json` and, in a
semantic pack, its fields (`KEY.seg.png`, the mask), so the `webdataset` library reads the shards unchanged, and
`shard-NNNNNN.idx` is DALI's `wds2idx` index. Random access never parses tar headers: `samples.npz` already holds
each image's (shard, offset, size); `fastfeed verify` cross-checks those against the tar headers, the `.idx` files
and the `.cls` members.
"""
from __future__ import annotations

import json
import mmap
import os
from typing import Iterator

import numpy as np

from fastfeed.formats.fields import FieldExtents, columns, int_member
from fastfeed.formats.base import TableDataset, data_path, read_regular, shard_root
from fastfeed.formats.tarwalk import read_header, walk_tar
from fastfeed.types import ADOPTED_FORMAT_VERSION, DatasetError, Sample

__all__ = ["WdsDataset"]


class WdsDataset(TableDataset):
    """Args: root: a folder written by `fastfeed pack --format wds` (or merged by `fastfeed merge`)."""

    def __init__(self, root: str):
        super().__init__(root, "wds", ("shard", "offset", "meta_offset", "meta_size"))
        t = self._table
        has = t["meta_offset"] >= 0
        if has.any():
            end = t["meta_offset"][has] + t["meta_size"][has]
            sizes = np.array([s.bytes for s in self.manifest.shards], dtype=np.int64)
            bad = (t["meta_size"][has] < 0) | (end > sizes[t["shard"][has]])
            if bad.any():
                key = str(t["key"][has][np.flatnonzero(bad)[0]])
                raise DatasetError(f"{self.table_path}: sample {key}: metadata extent lies outside its shard",
                                   path=self.table_path, key=key)

    @property
    def fields(self) -> list[str]:
        names = super().fields
        if "json" not in names and (self._table["meta_offset"] >= 0).any():
            names.append("json")  # a packed dataset's metadata member
        return names

    def field_extents(self, name: str) -> FieldExtents:
        if name == "json" and "json" not in self.manifest.fields:
            t = self._table
            size = np.where(t["meta_offset"] >= 0, t["meta_size"], -1)
            return FieldExtents("json", t["meta_offset"].astype(np.int64), size.astype(np.int64), None)
        return super().field_extents(name)

    def _locate(self):
        paths = [data_path(shard_root(self.root, self.manifest), s.path) for s in self.manifest.shards]
        return paths, self._table["shard"].astype(np.int32), self._table["offset"].astype(np.int64)

    def metadata(self, i: int) -> dict | None:
        i = self._index(i)
        t = self._table
        if t["meta_offset"][i] < 0:
            return None
        f, off, size = int(t["shard"][i]), int(t["meta_offset"][i]), int(t["meta_size"][i])
        try:
            data = os.pread(self._fd(f, i), size, off)
        except OSError as e:
            raise self._error(i, f"metadata unreadable ({e.strerror or e})") from None
        return self._json(i, data)

    def _fd(self, f: int, i: int) -> int:
        fd = self._fds.get(f)
        if fd is None:
            try:
                fd = self._open_fd(f)
            except OSError as e:
                raise self._error(i, f"unreadable ({e.strerror or e})") from None
        return fd

    def _error(self, i: int, what: str) -> DatasetError:
        path, key = self.file_of(i), str(self.keys[i])
        return DatasetError(f"{path}: sample {key}: {what}", path=path, key=key)

    def _json(self, i: int, raw) -> dict:
        try:
            return json.loads(bytes(raw))
        except ValueError as e:
            raise self._error(i, f"metadata is not valid JSON ({e})") from None

    def __iter__(self) -> Iterator[Sample]:
        """Sequential, in storage order: one mmap per shard, so the kernel reads ahead. Checksums are checked."""
        t = self._table
        labels, keys = t["label"], t["key"]
        i, n = 0, len(self)
        while i < n:
            shard = int(t["shard"][i])
            try:
                f = open(self._paths[shard], "rb")
            except OSError as e:
                raise self._error(i, f"unreadable ({e.strerror or e})") from None
            with f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
                m.madvise(mmap.MADV_SEQUENTIAL)
                while i < n and t["shard"][i] == shard:
                    off, size = int(t["offset"][i]), int(t["size"][i])
                    meta = None
                    if t["meta_offset"][i] >= 0:
                        mo = int(t["meta_offset"][i])
                        meta = self._json(i, m[mo : mo + int(t["meta_size"][i])])
                    data = m[off : off + size]
                    if len(data) != size:
                        raise self._error(i, "short read (file truncated?)")
                    self.check(i, data)
                    yield Sample(str(keys[i]), data, int(labels[i]), meta)
                    i += 1

    def check_layout(self, damaged: set[str], unavailable: frozenset[str] = frozenset()
                     ) -> tuple[list[str], list[str], list[str]]:
        """Each shard's `.idx` (DALI reads it: a wrong offset there means wrong bytes on the DALI path; an adopted
        shard may have none, said in a note) and each image's tar header against samples.npz (name, offset, size),
        each `.cls` member against the label."""
        errors: list[str] = []
        notes = [f"{path}: no DALI index ({why})" for path, why in self.no_dali_index.items()]
        t = self._table
        for s_idx, shard in enumerate(self.manifest.shards):
            if shard.path in unavailable:
                continue
            idx_rel = shard.path[: -len(".tar")] + ".idx"
            rows = np.flatnonzero(t["shard"] == s_idx)
            rows = rows[np.argsort(t["offset"][rows], kind="stable")]
            lines = None if shard.path in self.no_dali_index else self._idx_lines(idx_rel, errors)
            if lines is not None:
                head = lines[0].split() if lines else []
                if len(head) != 2 or head[1] != str(len(rows)) or len(lines) - 1 != len(rows):
                    errors.append(f"{idx_rel}: header {lines[0] if lines else ''!r} and {len(lines) - 1} entries, "
                                  f"samples.npz has {len(rows)} samples in {shard.path}")
            with open(self._paths[s_idx], "rb") as f:
                walked = _members_by_offset(f) if self._adopted else None
                for n, i in enumerate(rows.tolist()):
                    if lines is not None and n + 1 < len(lines):
                        problem = self._idx_problem(lines[n + 1], i)
                        if problem:
                            errors.append(f"{idx_rel}: {self.describe(i)}: {problem}")
                    problem = (self._adopted_tar_problem(walked, f.fileno(), i) if walked is not None
                               else self._tar_problem(f.fileno(), i))
                    if problem:
                        errors.append(f"{shard.path}: {self.describe(i)}: {problem}")
        return errors, notes, ["DALI indexes, tar headers and .cls labels"]

    @property
    def no_dali_index(self) -> dict[str, str]:
        """{shard path: why} of the shards `fastfeed index` wrote no DALI index for."""
        return self.manifest.extra.get("no_dali_index", {}) if self._adopted else {}

    def _idx_lines(self, idx_rel: str, errors: list[str]) -> list[str] | None:
        try:
            return read_regular(data_path(self.root, idx_rel)).decode("utf-8").splitlines()  # in the folder
        except (OSError, UnicodeDecodeError) as e:
            # Named by the dataset's own name for it; the path it was read from (for a dataset at a URL, a
            # copy in the shard cache) would only mislead.
            why = e.strerror if isinstance(e, OSError) and e.strerror else e
            errors.append(f"{idx_rel}: unreadable DALI index ({why})")
            return None

    @property
    def _adopted(self) -> bool:
        """Shards adopted by `fastfeed index` (any member layout), not written by pack (image, cls, json, fields)."""
        return self.manifest.version == ADOPTED_FORMAT_VERSION

    def _field_members(self, i: int) -> list[tuple[str, int, int]]:
        """(member name `KEY.field`, data offset, size) of each field sample i carries."""
        key, out = str(self.keys[i]), []
        for name in self.manifest.fields:
            fe_off, fe_size, _ = (self._table[c][i] for c in columns(name))
            if fe_size >= 0:
                out.append((f"{key}.{name}", int(fe_off), int(fe_size)))
        return out

    def _adopted_members(self, i: int) -> list[tuple[str, int, int]]:
        """(member name, data offset, size) of sample i's image and members, for a dataset of adopted shards."""
        key = str(self.keys[i])
        src = str(self.sources[i]) if self.sources is not None else ""
        shard = self.manifest.shards[int(self._table["shard"][i])].path + ":"  # SHARD:NAME; either may hold a colon
        img = src[len(shard):] if src.startswith(shard) else ""
        image = (img if img.startswith(key + ".") else key + ".?", int(self._offset[i]), int(self.sizes[i]))
        return [image, *self._field_members(i)]

    def _idx_problem(self, line: str, i: int) -> str | None:
        if self._adopted:  # every member the table names must be in the index
            f = line.split()
            entries = {(f[j + 1], f[j + 2]) for j in range(0, len(f) - 3, 4)}
            for name, off, size in self._adopted_members(i)[1:]:
                if (str(off), str(size)) not in entries:
                    return f"entry {line[:200]!r} has no {name} at offset {off}, {size} bytes"
            return None
        t = self._table
        key = str(t["key"][i])
        f = line.split()
        members = {f[j]: (f[j + 1], f[j + 2], f[j + 3]) for j in range(0, len(f) - 3, 4)}
        fields = self._field_members(i)
        want = {"cls"} | ({"json"} if int(t["meta_offset"][i]) >= 0 else set())
        want |= {name[len(key) + 1:] for name, _, _ in fields}
        img = [e for e in members if e not in ("cls", "json", *self.manifest.fields)]
        if len(f) % 4 or not want <= set(members) or len(img) != 1:
            return f"entry {line!r} lacks members"
        off, size, name = members[img[0]]
        if (off, size, name) != (str(t["offset"][i]), str(t["size"][i]), f"{key}.{img[0]}"):
            return (f"says {name} at offset {off}, {size} bytes; samples.npz says offset {t['offset'][i]}, "
                    f"{t['size'][i]} bytes")
        if "json" in want and members["json"][:2] != (str(t["meta_offset"][i]), str(t["meta_size"][i])):
            return "metadata member offset/size differ from samples.npz"
        for name, foff, fsize in fields:
            got = members[name[len(key) + 1:]]
            if got != (str(foff), str(fsize), name):
                return f"says {got[2]} at offset {got[0]}, {got[1]} bytes; samples.npz says {name} at {foff}, {fsize}"
        return None

    def _tar_problem(self, fd: int, i: int) -> str | None:
        t = self._table
        key, off, size, label = str(t["key"][i]), int(t["offset"][i]), int(t["size"][i]), int(t["label"][i])
        hdr = read_header(os.pread(fd, 512, off - 512)) if off >= 512 else None
        if hdr is None or hdr[1] != size or not hdr[0].startswith(key + "."):
            return (f"tar header before offset {off} is {'damaged' if hdr is None else repr(hdr)}, samples.npz "
                    f"says {key}.* of {size} bytes")
        cls_at = off + size + (-size % 512)
        chdr = read_header(os.pread(fd, 512, cls_at))
        if chdr is None or chdr[0] != f"{key}.cls":
            return f"no intact {key}.cls member after the image"
        problem = _label_problem(os.pread(fd, min(chdr[1], 4096), cls_at + 512), label)
        if problem:
            return f"{key}.cls {problem}"
        for name, foff, fsize in self._field_members(i):  # a semantic pack's mask
            hdr = read_header(os.pread(fd, 512, foff - 512)) if foff >= 512 else None
            if hdr != (name, fsize):
                return (f"tar header before offset {foff} is {'damaged' if hdr is None else repr(hdr)}, samples.npz "
                        f"says {name} of {fsize} bytes")
        return None


    def _adopted_tar_problem(self, walked: dict[int, tuple[str, int]], fd: int, i: int) -> str | None:
        """Each member against the shard's member whose data starts where the table says (`walked`:
        `_members_by_offset`; the image's may be longer: trailing bytes after its end marker are outside its
        extent), and the `.cls` member against the label."""
        for n, (name, off, size) in enumerate(self._adopted_members(i)):
            got = walked.get(off)
            # The extension is lower-cased in the table, as webdataset lower-cases it; the member keeps its own.
            if got is None or got[0].lower() != name.lower() or (got[1] < size if n == 0 else got[1] != size):
                return (f"the shard holds {'no member' if got is None else repr(got)} at offset {off}, samples.npz "
                        f"says {name} of {size} bytes")
            if name.endswith(".cls"):
                problem = _label_problem(os.pread(fd, size, off), int(self.labels[i]))
                if problem:
                    return f"{name} {problem}"
        return None


def _label_problem(raw: bytes, label: int) -> str | None:
    """What is wrong with a `.cls` member's bytes for the table's `label`, read as index and the Loader read it."""
    try:
        if int_member(raw) == label:
            return None
    except ValueError:
        pass
    return f"holds {raw[:20]!r}, samples.npz says label {label}"


def _members_by_offset(f) -> dict[int, tuple[str, int]]:
    """(name, size) of each regular member of the open shard `f` by its data offset, named as a tar reader names
    it (a PAX path, a GNU long name: a header's own name field may hold an ASCII stand-in or a truncation)."""
    size = os.fstat(f.fileno()).st_size
    if size == 0:
        return {}
    with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
        members = walk_tar(m, size)[0]
    return {m.offset: (m.name, m.size) for m in members}
