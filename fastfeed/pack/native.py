"""WebDataset shards written by the native core: file reads, tar framing, xxh3_64 and sha256 with the GIL released.

    from fastfeed.pack.native import NativeTarShardWriter, wds_sample

    w = NativeTarShardWriter(folder, index=0)                    # folder/shard-000000.tar.tmp until finish()
    results = w.add_samples([wds_sample("00000042", "/src/cat/1.jpg", "jpg", label=3, meta=b'{"a":1}'),
                             wds_sample("00000043", jpeg_bytes, "jpg", label=0)])      # bytes: stored as given
    for r in results:
        if r.ok:  r.image.offset, r.image.size, r.image.xxh3, r.meta (None without meta)
        else:     r.error (names the file), r.errno: nothing of that sample was written
    info = w.finish()                                          # ShardInfo(path, bytes, sha256, num_samples)

Output is byte-identical to fastfeed/pack/writers.py `TarShardWriter` for the same samples in the same order (tar,
`.idx` in DALI's wds2idx format, sha256), so either writer can produce or resume a dataset; tests/test_pack_native.py
checks that. `image.xxh3` is the `checksum` column of samples.npz (CONTRACTS item 1: xxh3_64 of the stored bytes).

How it is fast (csrc/tar_writer.h, NOTE [ Native tar writer ]): one `add_samples` call fans the files out to native
threads; each reads a file whole into a pooled, already-faulted buffer, frames it (headers, padding, xxh3) and, in
turn, writes it itself while the bytes are still in its cache; another native thread hashes the written bytes
(sha256). Python costs one tuple per sample, so pass many samples per call (hundreds to thousands); the call
blocks until they are written.

Validation stays in Python (pack/validate.py) through `add_samples(..., check=fn)`: fn sees each sample's image bytes
in the native buffer (no copy) before it is written and keeps, drops or replaces it (e.g. a transcoded JPEG), e.g.

    def check(i, data):                         # pack/validate.check_image on the bytes just read
        res = check_image(data, load_opts)
        if isinstance(res, Rejected): return res.reason
        loaded[i] = replace(res, data=None)     # keep the metadata, not the view (it pins the buffer)
        return None if res.data is data and res.ext == "jpg" else (res.ext, bytes(res.data))

What it does not do: choose shard boundaries (the caller starts a new writer when `bytes_written` plus
the next image would pass the shard size, as pack/run.py does; `write_shards` below is that loop for a list).
"""
from __future__ import annotations

import os
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Callable, NamedTuple, Sequence, Union

from fastfeed import _native
from fastfeed.pack.writers import atomic_write, fsync_dir, shard_name
from fastfeed.types import ShardInfo

__all__ = ["HAVE_NATIVE_WRITER", "NativeTarShardWriter", "WdsSample", "MemberInfo", "SampleResult", "wds_sample",
           "write_shards"]

HAVE_NATIVE_WRITER = bool(getattr(_native, "HAVE_TAR_WRITER", False))
_IDX_VERSION = "v1.2"  # DALI wds2idx
# check(sample index in the call, read-only memoryview of its first member) -> None | reason | (ext, bytes)
Check = Callable[[int, memoryview], Union[None, str, tuple[str, bytes]]]


class WdsSample(NamedTuple):
    """One sample: its key and its members in tar order, each (ext, source); source is a path (str/PathLike,
    read whole by the native threads) or bytes-like (stored as is). Member names are `key.ext`."""

    key: str
    members: Sequence[tuple[str, object]]


class MemberInfo(NamedTuple):
    ext: str
    offset: int  # of the data inside the tar
    size: int
    xxh3: int    # xxhash.xxh3_64_intdigest of the stored bytes


class SampleResult(NamedTuple):
    """`members` in the order given (None when the sample was not written); `error` names the file and the reason."""

    members: list[MemberInfo] | None
    error: str | None = None
    errno: int = 0

    @property
    def ok(self) -> bool:
        return self.members is not None

    @property
    def image(self) -> MemberInfo:
        """The first member (the image, for samples made by `wds_sample`)."""
        return self.members[0]

    @property
    def meta(self) -> MemberInfo | None:
        """The `json` member, or None."""
        return next((m for m in self.members if m.ext == "json"), None)


def wds_sample(key: str, image, ext: str, label: int, meta: bytes | None = None, members=()) -> WdsSample:
    """The members pack writes for one image: `KEY.ext` (path or bytes), `KEY.cls` (the label in decimal),
    when `meta` is given `KEY.json` (fastfeed.pack.writers.meta_bytes of the metadata dict), then `members`
    ((ext, path or bytes) pairs: a mask's `seg.png`), as pack/writers.py build_record orders them."""
    out = [(ext, image), ("cls", b"%d" % label)]
    if meta is not None:
        out.append(("json", meta))
    out.extend(members)
    return WdsSample(key, out)


class NativeTarShardWriter:
    """One WebDataset shard, `folder/shard-NNNNNN.tar` plus its `.idx`, written by native threads.

    Args:
        folder: output folder (exists).
        index: shard number (the file name, as writers.shard_name).
        num_threads: reader threads; 0 = one per CPU (at most 16).

    Same life cycle as writers.TarShardWriter: bytes go to `NAME.tmp`; `finish()` fsyncs, writes the `.idx`
    atomically, renames the tar into place and fsyncs the folder; `abort()` deletes the temporary file.
    `finish()` releases the GIL for the fsync, so calling it on a helper thread overlaps the next shard.
    """

    def __init__(self, folder: str, index: int, num_threads: int = 0):
        if not HAVE_NATIVE_WRITER:
            raise RuntimeError("fastfeed._native was built without the tar writer (OpenSSL headers missing at "
                               "build time); use fastfeed.pack.writers.TarShardWriter")
        self.name = shard_name(index)
        self.path = os.path.join(folder, self.name)
        self._tmp = self.path + ".tmp"
        self._w = _native.TarWriter(self._tmp, int(num_threads))
        self._idx_lines: list[str] = []
        self.num_samples = 0

    @property
    def bytes_written(self) -> int:
        return self._w.bytes_written

    def add_samples(self, samples: Sequence[WdsSample], check: Check | None = None, probe: bool = False,
                    scan_check: bool = False) -> list[SampleResult]:
        """Append samples in order (each all or nothing); one result per sample.

        `check(i, data)` (optional) runs on this thread, in order, for each sample i whose files were read, before
        it is written; `data` is a read-only memoryview of its first member's bytes (valid for as long as you keep
        it, but a kept view pins its buffer: drop it to let the writer reuse the memory). Return None to store the
        sample as is, a reason (str) to leave it out (its result then has `error` = reason, `errno` 0), or
        (ext, bytes) to store `bytes` as member `KEY.ext` instead (a converted image). While the check runs, the
        native threads keep reading the next files. If it raises, the exception propagates and the writer is
        unusable (call abort()).

        `probe=True`: the reader threads also read each first member's JPEG header (csrc/image_probe.h) and, with
        `scan_check`, run the JPEG scan check (transcode.check_scans) on it; `check` is then called as
        `check(i, data, facts)` with the facts tuple pack/validate.check_image takes (None when not a JPEG whose
        header walk succeeds).

        Raises OSError when the shard cannot be written (disk full...): the writer is then unusable, call abort().
        """
        exts: dict[int, str] = {}
        native_check = None
        if check is not None:
            def native_check(i, data, *facts):
                res = check(i, data, *facts)
                if res is None or isinstance(res, str):
                    return res
                ext, new = res
                exts[i] = ext
                return (f"{samples[i].key}.{ext}", new)

        raw = self._w.add([[(f"{s.key}.{e}", src) for e, src in s.members] for s in samples], native_check,
                          probe=probe, scan_check=scan_check)
        out = []
        lines = self._idx_lines
        for i, (s, (members, error, err)) in enumerate(zip(samples, raw)):
            if members is None:
                out.append(SampleResult(None, error, err))
                continue
            names = [e for e, _ in s.members]
            if i in exts:
                names[0] = exts[i]
            infos = [MemberInfo(e, off, size, h) for e, (off, size, h) in zip(names, members)]
            lines.append(" ".join(f"{m.ext} {m.offset} {m.size} {s.key}.{m.ext}" for m in infos))
            out.append(SampleResult(infos))
        self.num_samples = len(lines)
        return out

    def finish(self) -> ShardInfo:
        sha = self._w.finish(True)
        size = self._w.bytes_written
        idx = f"{_IDX_VERSION} {self.num_samples}\n" + "".join(line + "\n" for line in self._idx_lines)
        atomic_write(self.path[: -len(".tar")] + ".idx", idx.encode("utf-8"))
        os.replace(self._tmp, self.path)
        fsync_dir(os.path.dirname(os.path.abspath(self.path)))
        return ShardInfo(self.name, size, sha, self.num_samples)

    def abort(self) -> None:
        self._w.abort()
        if os.path.exists(self._tmp):
            os.unlink(self._tmp)


def write_shards(samples: Sequence[WdsSample], folder: str, shard_size: int = 1 << 30, first_index: int = 0,
                 num_threads: int = 0, chunk: int = 2048,
                 check: Check | None = None) -> tuple[list[ShardInfo], list[SampleResult]]:
    """Write `samples` in order into shards of about `shard_size` bytes, starting at `shard-{first_index}`;
    `check` as for `add_samples`, called with the index into `samples`.

    A sample opens a new shard when the current one holds samples and its bytes plus this sample's first member
    would pass `shard_size` (pack/run.py's rule). Sizes of file members are taken from os.stat up front, so when a
    file fails to read the boundary is where it would have been had it been readable (pack/run.py, which counts only
    stored samples, may then cut one sample later). Returns the shards and one result per sample.
    """
    shards: list[ShardInfo] = []
    results: list[SampleResult] = []
    pending: list[WdsSample] = []
    writer: NativeTarShardWriter | None = None
    planned = 0  # bytes the current shard will hold after `pending`
    index = first_index
    # finish() (fsync, .idx, rename) runs on a helper thread while the next shard is written, as in pack/run.py;
    # one helper, waited for before the next, keeps the shards' completion in order.
    finisher = ThreadPoolExecutor(max_workers=1, thread_name_prefix="fastfeed-native-finish")
    finishing: Future | None = None

    def close_shard() -> None:
        nonlocal finishing, writer, planned
        flush()
        if finishing is not None:
            shards.append(finishing.result())
        finishing, writer, planned = finisher.submit(writer.finish), None, 0

    def flush() -> None:
        if pending:
            base = len(results)
            results.extend(writer.add_samples(pending, None if check is None else lambda i, d: check(base + i, d)))
            pending.clear()

    try:
        for s in samples:
            first = _size(s.members[0][1])
            if writer is not None and (writer.num_samples or pending) and planned + first > shard_size:
                close_shard()
            if writer is None:
                writer = NativeTarShardWriter(folder, index, num_threads)
                index += 1
            pending.append(s)
            planned += sum(512 + -(-_size(src) // 512) * 512 for _, src in s.members)
            if len(pending) >= chunk:
                flush()
        if writer is not None:
            close_shard()
        if finishing is not None:
            shards.append(finishing.result())
    except BaseException:
        if writer is not None:
            writer.abort()
        raise
    finally:
        finisher.shutdown()
    return shards, results


def _size(src) -> int:
    if isinstance(src, (str, os.PathLike)):
        try:
            return os.stat(src).st_size
        except OSError:
            return 0
    return memoryview(src).nbytes
