"""`fastfeed pack --format wds` through the native tar writer (pack/native.py): same output, byte for byte.

Used by run.py when the native core has the tar writer (`HAVE_NATIVE_WRITER`); pack/wds.py's Python writer stays the
fallback. The plan, the journal commits, the shard boundaries, the samples.npz rows and the rejection reasons are
those of the Python path (tests/test_pack_native_wired.py packs the same trees both ways and compares every file):
- validation is pack/validate.check_image, run through the writer's `check` hook on the bytes the native threads
  read (no copy), with the facts those threads found in them (the JPEG header probe, the scan check: the per-file
  byte work runs in parallel, the hook only decides); a trimmed or converted image is handed back and stored
  instead;
- a shard ends where the Python writer ends it (`bytes_written + stored size > shard_size` with samples in the
  shard), decided inside the hook, where the stored size is known: that sample and the rest of the call are left
  out ("deferred") and submitted again to the next shard. Calls are cut near the expected boundary from the stat
  sizes, so a deferral re-reads only a few files;
- files are stat'ed first with the Python path's `stat_size` (a FIFO is never opened, same reasons); a file the
  native threads fail to read gets the Python reader's reason for it;
- a sample's further members (a mask: pack/members.py) are read and decoded on a Python pool before the call and
  handed to the writer as bytes; the hook rejects the sample when they do not fit the checked image.
"""
from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, replace

from fastfeed.image.transcode import HAVE_SCAN_CHECK
from fastfeed.pack.members import member_pairs, member_sizes, members_problem, read_members
from fastfeed.pack.native import HAVE_NATIVE_WRITER, NativeTarShardWriter, wds_sample
from fastfeed.pack.reader import _read_into
from fastfeed.pack.validate import LoadOptions, Rejected, check_image, stat_size
from fastfeed.pack.wds import WdsWriter, field_cells
from fastfeed.pack.writers import meta_bytes, record_size
from fastfeed.world import usable_cpus

__all__ = ["NativeWdsWriter", "use_native", "pack_native"]

# Private switch for the byte-identity test and the benchmark: FASTFEED_PACK_NATIVE=0 forces the Python writer.
ENABLED = os.environ.get("FASTFEED_PACK_NATIVE", "1") != "0"
_CHUNK_FILES = 1024  # samples per native call: Python costs one tuple per sample, the call amortises the rest
_DEFER = "\0deferred to the next shard"  # never a rejection reason: every deferred sample is submitted again


def use_native(fmt: str) -> bool:
    return fmt == "wds" and HAVE_NATIVE_WRITER and ENABLED


class NativeWdsWriter(WdsWriter):
    """WdsWriter's files and table columns, written by NativeTarShardWriter; driven by `pack_native`, not by the
    per-sample put path (its load/add are not used)."""

    def __init__(self, folder: str, shard_size: int, next_shard: int, cut, num_threads: int = 0):
        self.folder, self.shard_size, self.next_shard, self._cut = folder, shard_size, next_shard, cut
        self.num_threads = num_threads
        self.tar: NativeTarShardWriter | None = None
        self.count = 0    # samples stored in the current shard
        self.planned = 0  # its bytes, as TarShardWriter.bytes_written counts them

    def load(self, items, opts):
        raise NotImplementedError("NativeWdsWriter is driven by pack_native")

    add = start_sample = end_batch = load

    def end_sample(self, pos: int) -> None:
        pass

    def open(self) -> NativeTarShardWriter:
        if self.tar is None:
            self.tar = NativeTarShardWriter(self.folder, self.next_shard, self.num_threads)
        return self.tar

    def finish_shard(self, pos: int) -> None:
        tar, self.tar = self.tar, None
        self.next_shard += 1
        self.count = self.planned = 0
        self._cut(pos, lambda: asdict(tar.finish()), background=True)

    def close(self, end: int) -> None:
        if self.tar is not None and self.count:
            self.finish_shard(end)
        elif self.tar is not None:  # opened, but every sample since was rejected: no shard (as the Python path)
            tar, self.tar = self.tar, None
            tar.abort()

    def shutdown(self) -> None:
        pass

    def abort(self) -> None:
        if self.tar is not None:
            tar, self.tar = self.tar, None
            tar.abort()


def pack_native(w, src, plan, start: int, key_width: int, opts: LoadOptions, bar=None) -> None:
    """Write plan[start:] through `w` (run.py's _Writer holding a NativeWdsWriter), in plan order."""
    # Members (a mask each) are read and decoded on a pool ahead of each call: the check hook only compares sizes.
    pool = ThreadPoolExecutor(max_workers=w.o.workers or usable_cpus(),
                              thread_name_prefix="fastfeed-pack-members") if src.fields else None
    try:
        _pack_native(w, src, plan, start, key_width, opts, bar, pool)
    finally:
        if pool is not None:
            pool.shutdown()


def _pack_native(w, src, plan, start: int, key_width: int, opts: LoadOptions, bar, pool) -> None:
    """pack_native's loop; `pool` reads the members (None: the source has none)."""
    fmt: NativeWdsWriter = w.fmt
    pos = start
    while pos < len(plan):
        # The chunk: up to _CHUNK_FILES files, ending just past the stat-estimated end of the current shard.
        chunk = []  # (plan position, entry, key, meta, stat size | Rejected)
        room = fmt.shard_size - fmt.planned
        est = 0
        while pos + len(chunk) < len(plan) and len(chunk) < _CHUNK_FILES and (not chunk or est <= room):
            i = int(plan[pos + len(chunk)])
            e = src.entries[i]
            size = stat_size(e.path)
            meta = meta_bytes(e.metadata)
            chunk.append((pos + len(chunk), e, f"{i:0{key_width}d}", meta, size))
            if not isinstance(size, Rejected):
                est += record_size(size, e.label, meta)
        todo = [c for c in chunk if not isinstance(c[4], Rejected)]
        extras = list(pool.map(lambda c: read_members(c[1].members), todo)) if pool else [[]] * len(todo)
        loaded: list = [None] * len(todo)
        deferred = len(todo)
        if todo:
            tar = fmt.open()

            def check(j, data, facts):
                nonlocal deferred
                if j >= deferred:
                    return _DEFER
                res = check_image(data, opts, facts, name=todo[j][1].path)
                why = None if isinstance(res, Rejected) else members_problem(
                    extras[j], res.width, res.height, res.orientation, opts.orientation)
                if why is not None:
                    res = Rejected(why)
                if isinstance(res, Rejected):
                    loaded[j] = res
                    return res.reason
                n = len(res.data)
                if fmt.count and fmt.planned + n > fmt.shard_size:  # pack/wds.py WdsWriter.start_sample's rule
                    deferred = j
                    return _DEFER
                _, e, _, meta, _ = todo[j]
                fmt.count += 1
                fmt.planned += record_size(n, e.label, meta, member_sizes(extras[j]))
                loaded[j] = replace(res, data=None)  # the view pins the native buffer
                if res.data is data and res.ext == "jpg":
                    return None
                return res.ext, bytes(res.data)

            # The reader threads probe each JPEG's header (and run the scan check): check_image decides from that.
            # A sample whose members failed is still submitted (its hook rejects it): its image's reason comes first.
            samples = [wds_sample(k, e.path, "jpg", e.label, m, member_pairs(extra))
                       for (_, e, k, m, _), extra in zip(todo, extras)]
            results = tar.add_samples(samples, check, probe=True, scan_check=opts.scan_check and HAVE_SCAN_CHECK)
        j = 0
        stop = None
        for p, e, key, meta, size in chunk:
            if isinstance(size, Rejected):
                w.reject(e, size.reason)
                continue
            if j >= deferred:
                stop = p
                break
            r, res = results[j], loaded[j]
            j += 1
            if r.ok:
                js = r.meta
                row = {"shard": fmt.next_shard, "offset": r.image.offset,
                       "meta_offset": js.offset if js else -1, "meta_size": js.size if js else 0}
                for m in r.members[2:]:  # after the image and .cls: the fields (a mask's seg.png)
                    if m.ext != "json":
                        row.update(field_cells(m.ext, m.offset, m.size, m.xxh3))
                w.row(e, key, res, r.image.size, r.image.xxh3, row)
            elif isinstance(res, Rejected):
                w.reject(e, res.reason)
            else:
                w.reject(e, _read_reason(e.path, size) or r.error)
        if stop is not None:
            fmt.finish_shard(stop)  # the deferred sample opens the next shard
        done = (stop if stop is not None else pos + len(chunk)) - pos
        pos += done
        if bar is not None and done:
            bar.update(done)
            bar.set_postfix_str(f"{w.bytes_in / 1e6 / max(bar.format_dict['elapsed'], 1e-9):.0f} MB/s", refresh=False)


def _read_reason(path: str, size: int) -> str | None:
    """The Python reader's reason for a file the native threads failed to read (None if it reads now)."""
    err = _read_into(path, memoryview(bytearray(size)))
    return err.reason if err is not None else None
