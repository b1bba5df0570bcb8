"""What every packed-dataset reader offers, and the checks every reader runs when it opens a folder.

A folder is a dataset only when `fastfeed.json` exists (the packer writes it last), carries this fastfeed's
a readable format version, names only files inside the folder, and every data file it lists exists with the
recorded size; `samples.npz` must match the manifest's checksum (version 2 and 3) and hold sane columns. Data files'
sha256 are not recomputed on open (that reads every byte); `fastfeed verify` does that. Every sample read
through `read()` is checked against its xxh3 checksum (version 2), so flipped bytes surface as a DatasetError
naming the file and the sample key instead of garbled pixels.

Every problem is a `DatasetError` (a ValueError) naming the file and, when known, the sample key.

Readers are not fork-safe once they have read data (open file handles, LMDB transactions): open them in the
process that reads, or call `close()` before forking.
"""
from __future__ import annotations

import io
import os
import stat
from typing import Iterator, Protocol, runtime_checkable

import numpy as np

from fastfeed.formats.fields import FieldExtents, columns
from fastfeed.formats.integrity import checksum, xxh3_hex
from fastfeed.image.jpeg import KIND_BASELINE
from fastfeed.types import MANIFEST_NAME, SAMPLES_NAME, DatasetError, Extents, ImageProfile, Manifest, Sample
from fastfeed.urls import has_scheme

__all__ = ["Dataset", "TableDataset", "load_manifest", "load_table", "data_path", "shard_root", "read_regular"]


@runtime_checkable
class Dataset(Protocol):
    manifest: Manifest

    def __len__(self) -> int: ...
    @property
    def labels(self) -> np.ndarray: ...
    @property
    def classes(self) -> list[str]: ...
    @property
    def keys(self) -> np.ndarray: ...
    @property
    def widths(self) -> np.ndarray: ...
    @property
    def heights(self) -> np.ndarray: ...
    @property
    def checksums(self) -> np.ndarray | None: ...
    def image_profile(self) -> ImageProfile: ...
    @property
    def orientations(self) -> np.ndarray: ...
    @property
    def pil_only(self) -> np.ndarray: ...
    def read(self, i: int, check: bool = True) -> bytes: ...
    def metadata(self, i: int) -> dict | None: ...
    def extents(self) -> Extents: ...
    def __iter__(self) -> Iterator[Sample]: ...
    def close(self) -> None: ...


def load_manifest(root: str) -> Manifest:
    path = os.path.join(root, MANIFEST_NAME)
    if not os.path.isdir(root):
        raise DatasetError(f"{root}: not a folder", path=root)
    if not os.path.exists(path):
        hint = ""
        if os.path.isdir(os.path.join(root, ".fastfeed-pack")):
            hint = " (an interrupted pack: finish it with `fastfeed pack ... --resume`)"
        elif any(n.startswith("part-") for n in os.listdir(root)):
            hint = " (packed in parts: join them with `fastfeed merge`)"
        raise DatasetError(f"{root}: no {MANIFEST_NAME}, so this is not a complete fastfeed dataset{hint}", path=path)
    try:
        text = read_regular(path).decode("utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise DatasetError(f"{path}: unreadable ({e})", path=path) from None
    manifest = Manifest.from_json(text, where=path)
    if remote_shards(manifest):  # read through the shard cache, which checks each one's size and sha256
        return manifest
    # Shards `fastfeed index` adopted where they lay, in another folder: say where they were looked for.
    moved = (f" (looked for in {manifest.data_root}, where `fastfeed index` adopted the shards: they must stay there; "
             "put them back, or index them again where they are now)") if manifest.data_root else ""
    adopted = manifest.created_by == "fastfeed index"
    for shard in manifest.shards:
        p = data_path(shard_root(root, manifest), shard.path, where=path)
        try:
            st = os.stat(p)
            size = st.st_size if stat.S_ISREG(st.st_mode) else -1
        except OSError:
            raise DatasetError(f"{root}: data file {shard.path} listed in the manifest is missing{moved}",
                               path=p) from None
        if size != shard.bytes:
            # Not opened, not even by `fastfeed verify`: a mapped file shorter than its samples would fault on read.
            raise DatasetError(f"{root}: data file {p if moved else shard.path} is {size} bytes, the manifest says "
                               f"{shard.bytes}: truncated or modified since it was {'indexed' if adopted else 'packed'}"
                               " (an interrupted copy or download?); restore it from the original, or "
                               f"{'index the shards' if adopted else 'pack the dataset'} again", path=p)
    return manifest


def read_regular(path: str) -> bytes:
    """The whole file, refusing anything but a regular file (opening a FIFO put in a dataset's place would block
    forever)."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(f"not a regular file: {path}")
        with os.fdopen(fd, "rb", closefd=False) as f:
            return f.read()
    finally:
        os.close(fd)


def remote_shards(manifest: Manifest) -> bool:
    """Whether the data files are at a URL (`fastfeed index` of shards at a URL wrote this dataset elsewhere)."""
    return has_scheme(manifest.data_root)


def shard_root(root: str, manifest: Manifest) -> str:
    """The folder the manifest's data file paths are relative to: the dataset folder (for a dataset read through
    the shard cache, its mirror there), or the folder `fastfeed index` found the shards in when it wrote the
    dataset elsewhere (`data_root`)."""
    return root if remote_shards(manifest) else manifest.data_root or root


def data_path(root: str, rel: str, where: str = MANIFEST_NAME) -> str:
    """`root/rel` for a data file named by the manifest, refusing names that leave the dataset folder (absolute
    paths, `..`): a dataset is read where it lies, and a copied or downloaded manifest must not make the reader
    open arbitrary files. Symlinks inside the folder are the owner's choice and are followed."""
    norm = os.path.normpath(rel)
    if os.path.isabs(rel) or norm == ".." or norm.startswith(".." + os.sep) or "\0" in rel or norm == ".":
        raise DatasetError(f"{where}: data file {rel!r} is outside the dataset folder; refused", path=where)
    return os.path.join(root, norm)


def load_table(root: str, manifest: Manifest, required: tuple[str, ...]) -> dict[str, np.ndarray]:
    """Read `samples.npz`, check it against the manifest's checksum (version 2) and its columns' lengths."""
    path = os.path.join(root, SAMPLES_NAME)
    try:
        raw = read_regular(path)
    except OSError as e:
        raise DatasetError(f"{path}: unreadable sample table ({e})", path=path) from None
    if manifest.samples_xxh3 and xxh3_hex(raw) != manifest.samples_xxh3:
        raise DatasetError(f"{path}: checksum {xxh3_hex(raw)} differs from the manifest's {manifest.samples_xxh3} "
                           f"(the sample table was modified or damaged)", path=path)
    try:
        with np.load(io.BytesIO(raw), allow_pickle=False) as z:
            table = {k: z[k] for k in z.files}
    except Exception as e:  # noqa: BLE001 - zipfile, zlib, numpy's format parser: all mean "damaged table"
        raise DatasetError(f"{path}: unreadable sample table ({type(e).__name__}: {e})", path=path) from None
    missing = [c for c in required if c not in table]
    if missing:
        raise DatasetError(f"{path}: missing columns {missing}", path=path)
    n = {len(v) if v.ndim == 1 else -1 for v in table.values()}
    if n != {manifest.num_samples} and not (manifest.num_samples == 0 and n <= {0}):
        raise DatasetError(f"{path}: column lengths {sorted(n)} differ from the manifest's {manifest.num_samples}",
                           path=path)
    return table


def _check_columns(path: str, table: dict[str, np.ndarray], num_classes: int) -> None:
    """Cheap whole-column checks, so a damaged version-1 table (no checksum) fails here, by name, rather than as
    an IndexError or a wild pread later."""
    for name, kind in _COLUMN_KINDS.items():
        if name in table and table[name].dtype.kind not in kind:
            raise DatasetError(f"{path}: column {name!r} has dtype {table[name].dtype}", path=path)
    if "checksum" in table and table["checksum"].dtype != np.uint64:
        raise DatasetError(f"{path}: column 'checksum' has dtype {table['checksum'].dtype}", path=path)

    def first_bad(mask: np.ndarray, what: str) -> None:
        if mask.any():
            i = int(np.flatnonzero(mask)[0])
            key = str(table["key"][i])
            raise DatasetError(f"{path}: sample {key}: {what}", path=path, key=key)

    labels = table["label"]
    first_bad((labels < -1) | (labels >= max(num_classes, 0)) & (labels != -1),
              f"label out of range for {num_classes} classes")
    first_bad(table["size"] < 0, "negative size")
    first_bad((table["width"] <= 0) | (table["height"] <= 0), "non-positive width/height")


_COLUMN_KINDS = {"label": "iu", "width": "iu", "height": "iu", "size": "iu", "offset": "iu", "shard": "iu",
                 "meta_offset": "iu", "meta_size": "iu", "orientation": "u", "key": "U", "pil_only": "b"}


class TableDataset:
    """The part of a reader that comes from the manifest and `samples.npz`, and the byte access both formats
    share: every image is `size` bytes at `offset` of one data file (`_paths[_file_index[i]]`), read with pread
    and checked against its checksum. Formats supply the locations (`_locate`) and their own records."""

    REQUIRED = ("key", "label", "width", "height", "jpeg", "transcoded", "size")

    def __init__(self, root: str, kind: str, extra_columns: tuple[str, ...] = ()):
        self.root = os.path.abspath(root)
        self._fds: dict[int, int] = {}
        self.manifest = load_manifest(self.root)
        if self.manifest.kind != kind:
            raise DatasetError(f"{root}: a {self.manifest.kind!r} dataset, not {kind!r}", path=self.root)
        self.table_path = os.path.join(self.root, SAMPLES_NAME)
        self._table = load_table(self.root, self.manifest, self.REQUIRED + extra_columns)
        _check_columns(self.table_path, self._table, len(self.manifest.classes))
        self._sums = self._table.get("checksum")
        self._paths, self._file_index, self._offset = self._locate()
        self._check_extents()

    # ---- what formats provide -------------------------------------------------------------------------------

    def _locate(self) -> tuple[list[str], np.ndarray, np.ndarray]:
        """(data file paths, int32 file index per sample, int64 image offset per sample)."""
        raise NotImplementedError

    # ---- columns --------------------------------------------------------------------------------------------

    def __len__(self) -> int:
        return self.manifest.num_samples

    @property
    def labels(self) -> np.ndarray:
        return self._table["label"]

    @property
    def classes(self) -> list[str]:
        return list(self.manifest.classes)

    @property
    def task(self) -> str:
        """What the samples hold: "classify" (a label each), "detect" (an annotation each in its JSON member,
        fastfeed/targets.py; format version 3) or "semantic" (a class-id mask each in its `seg.png` member; format
        version 5)."""
        return self.manifest.task

    @property
    def keys(self) -> np.ndarray:
        return self._table["key"]

    @property
    def widths(self) -> np.ndarray:
        return self._table["width"]

    @property
    def heights(self) -> np.ndarray:
        return self._table["height"]

    @property
    def sizes(self) -> np.ndarray:
        return self._table["size"]

    @property
    def jpeg_kinds(self) -> np.ndarray:
        return self._table["jpeg"]

    @property
    def transcoded(self) -> np.ndarray:
        return self._table["transcoded"]

    @property
    def sources(self) -> np.ndarray | None:
        return self._table.get("source")

    @property
    def checksums(self) -> np.ndarray | None:
        """uint64 xxh3_64 of each stored image (`fastfeed.formats.integrity.checksum`); None for format version 1
        datasets, which have none (per-sample checks are then skipped)."""
        return self._sums

    def image_profile(self) -> ImageProfile:
        """Median size, the share of samples the hardware JPEG decoder cannot take (`hw_decodable`; tables without
        that column count baseline JPEGs as decodable) and the size at the 99th percentile of pixels."""
        pixels = np.asarray(self.widths, np.float64) * np.asarray(self.heights, np.float64)
        hw = self._table.get("hw_decodable")
        if hw is None:
            hw = np.asarray(self.jpeg_kinds) == KIND_BASELINE
        share = 1.0 - float(np.count_nonzero(hw)) / max(1, len(self))
        pil = float(np.count_nonzero(self.pil_only)) / max(1, len(self))
        if not len(pixels):
            return ImageProfile(median_pixels=0.0, cpu_decode_share=share, pil_only_share=pil)
        k = min(len(pixels) - 1, int(0.99 * len(pixels)))
        at = int(np.argpartition(pixels, k)[k])  # the 99th percentile's sample, in linear time
        return ImageProfile(median_pixels=float(np.median(pixels)), cpu_decode_share=share,
                            large_size=(int(self.widths[at]), int(self.heights[at])), pil_only_share=pil)

    @property
    def orientations(self) -> np.ndarray:
        """uint8 EXIF orientation tag (1..8) of each stored image; all 1 when the table has no such column."""
        o = self._table.get("orientation")
        if o is None:
            o = self._table["orientation"] = np.ones(len(self), dtype=np.uint8)
        return o

    @property
    def pil_only(self) -> np.ndarray:
        """bool per sample: only the decode contract's PIL decode reads the stored image as the contract says
        (pack/validate.py); the Loader routes these there on every path. All False in tables without the column
        (every image in them is a JPEG or PNG all decoders read)."""
        p = self._table.get("pil_only")
        if p is None:
            p = self._table["pil_only"] = np.zeros(len(self), dtype=bool)
        return p

    @property
    def fields(self) -> list[str]:
        """What `Loader(fields=...)` can ask for besides the image: "cls" when the samples have labels, and the
        members the samples carry (fastfeed/formats/fields.py)."""
        names = list(self.manifest.fields)
        return names if "cls" in names or not self.manifest.classes else ["cls", *names]

    def field_extents(self, name: str) -> FieldExtents:
        """Where field `name` (one of `fields`, except "cls") lies, sample by sample, in each sample's data file."""
        if name not in self.manifest.fields:
            raise KeyError(f"{self.root}: no field {name!r}; the samples carry {self.fields}")
        off, size, check = (self._table.get(c) for c in columns(name))
        if off is None or size is None:
            raise DatasetError(f"{self.table_path}: field {name!r} has no offset/size columns", path=self.table_path)
        return FieldExtents(name, off.astype(np.int64), size.astype(np.int64),
                            None if check is None else check.astype(np.uint64))

    @property
    def changes(self) -> np.ndarray | None:
        """Per-sample change code of the pack's validator ("" = stored as the source file); None in version 1."""
        return self._table.get("change")

    # ---- bytes ----------------------------------------------------------------------------------------------

    def extents(self) -> Extents:
        return Extents(list(self._paths), self._file_index.copy(), self._offset.copy(),
                       self.sizes.astype(np.int64))

    def describe(self, i: int) -> str:
        """How reports name sample i: its key, position and source path."""
        src = self.sources
        return f"key {self.keys[i]} (sample {i}" + (f", source {src[i]})" if src is not None else ")")

    def check_layout(self, damaged: set[str], unavailable: frozenset[str] = frozenset()
                     ) -> tuple[list[str], list[str], list[str]]:
        """`fastfeed verify`'s cross-check of the format's own records against samples.npz: (errors, notes,
        names of what was checked). `damaged`: manifest paths of data files whose sha256 is wrong; `unavailable`:
        those among them not to be read at all (a remote shard that could not be fetched)."""
        return [], [], []

    def file_of(self, i: int) -> str:
        """The data file holding sample i's image."""
        return self._paths[int(self._file_index[i])]

    def read(self, i: int, check: bool = True) -> bytes:
        """Sample i's stored image bytes. With `check` (and a version-2 dataset) the bytes must match the pack's
        checksum, else DatasetError naming the file and the sample key."""
        i = self._index(i)
        data = self._pread(i)
        if check:
            self.check(i, data)
        return data

    def check(self, i: int, data) -> None:
        """Raise DatasetError when `data` is not what the pack stored for sample i (no-op without checksums)."""
        if self._sums is not None and checksum(data) != int(self._sums[i]):
            key = str(self.keys[i])
            raise DatasetError(f"{self.file_of(i)}: sample {key}: checksum mismatch (bytes damaged after packing; "
                               f"run `fastfeed verify`)", path=self.file_of(i), key=key)

    def read_range(self, i: int, offset: int, size: int) -> bytes:
        """`size` bytes at `offset` of sample i's data file (its image and members together: Loader(fields=...)),
        unchecked."""
        return self._pread(self._index(i), offset, size)

    def _pread(self, i: int, off: int | None = None, size: int | None = None) -> bytes:
        f = int(self._file_index[i])
        off = int(self._offset[i]) if off is None else off
        size = int(self.sizes[i]) if size is None else size
        path, key = self._paths[f], str(self.keys[i])
        try:
            fd = self._fds.get(f)
            if fd is None:
                fd = self._open_fd(f)
            data = os.pread(fd, size, off)
        except OSError as e:
            raise DatasetError(f"{path}: sample {key}: unreadable ({e.strerror or e})", path=path, key=key) from None
        if len(data) != size:
            raise DatasetError(f"{path}: sample {key}: short read at offset {off} (file truncated?)",
                               path=path, key=key)
        return data

    def _open_fd(self, f: int) -> int:
        """The shared read-only descriptor of data file f (readers may call read() from several threads: the
        loser of a race closes its own descriptor)."""
        fd = os.open(self._paths[f], os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        kept = self._fds.setdefault(f, fd)
        if kept != fd:
            os.close(fd)
        return kept

    def _check_extents(self) -> None:
        """Every image must lie inside its data file (sizes from the manifest, already checked against disk)."""
        if not len(self):
            return
        nfiles = len(self._paths)
        fi = self._file_index
        if fi.min() < 0 or fi.max() >= nfiles:
            i = int(np.flatnonzero((fi < 0) | (fi >= nfiles))[0])
            raise DatasetError(f"{self.table_path}: sample {self.keys[i]} refers to data file {fi[i]}, the manifest "
                               f"lists {nfiles}", path=self.table_path, key=str(self.keys[i]))
        file_bytes = np.array([os.path.getsize(p) for p in self._paths], dtype=np.int64)
        end = self._offset + self.sizes.astype(np.int64)
        bad = (self._offset < 0) | (end > file_bytes[fi])
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise DatasetError(f"{self.table_path}: sample {self.keys[i]}: offset {self._offset[i]} + size "
                               f"{self.sizes[i]} lies outside {os.path.basename(self._paths[fi[i]])}",
                               path=self.table_path, key=str(self.keys[i]))
        for name in self.manifest.fields:
            f = self.field_extents(name)
            has = f.size >= 0
            bad = has & ((f.offset < 0) | (f.offset + f.size > file_bytes[fi]))
            if bad.any():
                i = int(np.flatnonzero(bad)[0])
                raise DatasetError(f"{self.table_path}: sample {self.keys[i]}: field {name!r} lies outside "
                                   f"{os.path.basename(self._paths[fi[i]])}", path=self.table_path,
                                   key=str(self.keys[i]))

    def _index(self, i: int) -> int:
        n = len(self)
        i = int(i)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(f"sample index {i} out of range for {n} samples")
        return i

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        fds, self._fds = self._fds, {}
        for fd in fds.values():
            os.close(fd)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.root!r}, {len(self)} samples, {len(self.manifest.classes)} classes)"
