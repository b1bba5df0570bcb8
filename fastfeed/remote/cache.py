"""A local, size-bounded cache of whole remote shards, shared safely by every process on the host.

NOTE [ Shard cache protocol ]
-----------------------------
Layout: `<cache_dir>/<sha256(url)[:16]>/<sha256(manifest)[:16]>/` mirrors the dataset folder (fastfeed.json,
samples.npz, shard files at their manifest paths, data.lmdb/data.mdb). A re-packed dataset at the same URL has
another manifest, so another folder: a cached file is never stale. Next to each data file F live two lock files,
`F.dl` and `F.pin` (empty, kept forever; a few bytes per shard).

Invariant: F exists only complete and verified. It is written as `F.<pid>.<random>.<size>.part` in the same
folder, checked against the manifest's size and sha256, fsynced and renamed onto F with os.replace (atomic on
POSIX).

Download: `fcntl.flock(F.dl, LOCK_EX)` around "F missing? -> download, verify, rename". A second process (or
thread: flock locks belong to an open file description, and each caller opens its own) blocks on the lock, then
finds F present and downloads nothing. A crashed downloader's lock is released by the kernel; its .part files
are removed by the next downloader of that shard.

Pins and eviction: a reader holds `flock(F.pin, LOCK_SH)` for as long as it may read F (its dataset's current
epoch, or until close()). Eviction takes `flock(F.pin, LOCK_EX | LOCK_NB)` and unlinks F only when that succeeds,
so a pinned shard is never removed. LRU by shard: F's mtime is set on every use; before a download the cache
removes unpinned shards, oldest first, until the new one fits `max_bytes` (summed over every dataset under
`cache_dir`), counting downloads in progress at their full size (the size in the .part name is the reservation).
Choosing victims and reserving room happen under one cache-wide `flock(.room.lock)`, so concurrent downloads
(threads or processes) cannot overrun the limit together. If pinned shards alone leave no room, the download
fails with DatasetError (raise the limit) — the cache never silently exceeds its bound. A reader that already has F
open keeps reading the old inode even if F is evicted (POSIX unlink semantics), so eviction never tears a read.
"""
from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import os
import secrets
import shutil
import tempfile
import threading
import time
from dataclasses import dataclass
from typing import Callable

from fastfeed.remote.store import LOCAL_DISK_ERRNOS
from fastfeed.types import DatasetError, parse_size

__all__ = ["ShardCache", "default_cache_dir", "default_cache_size", "CacheStats"]

_POLL_S = 0.05
_COPY_CHUNK = 8 << 20


def default_cache_dir() -> str:
    """$FASTFEED_CACHE, else $XDG_CACHE_HOME/fastfeed, else ~/.cache/fastfeed."""
    env = os.environ.get("FASTFEED_CACHE")
    if env:
        return env
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "fastfeed")


def default_cache_size(cache_dir: str) -> int:
    """$FASTFEED_CACHE_SIZE (e.g. 200GiB), else half of (free space + what the cache already holds) of the
    cache's filesystem: a limit that does not shrink as the cache itself fills the disk."""
    env = os.environ.get("FASTFEED_CACHE_SIZE")
    if env:
        return parse_size(env)
    _make_writable(cache_dir)
    held = sum(size for _, size, _ in _scan(cache_dir)[0])
    return (shutil.disk_usage(cache_dir).free + held) // 2


def _make_writable(cache_dir: str) -> None:
    """Create the cache folder; DatasetError naming it when it cannot be written, rather than a raw OSError from
    the first lock file or download."""
    try:
        os.makedirs(cache_dir, exist_ok=True)
        with tempfile.TemporaryFile(dir=cache_dir):
            pass
    except OSError as e:
        raise DatasetError(f"{cache_dir}: the shard cache folder cannot be written ({e.strerror or e}); point "
                           f"$FASTFEED_CACHE (or cache_dir=) at a writable folder") from None


@dataclass
class CacheStats:
    hits: int = 0  # shards found complete in the cache
    downloads: int = 0  # shards this process downloaded
    bytes_downloaded: int = 0
    download_seconds: float = 0.0
    evictions: int = 0


class ShardCache:
    """Args: cache_dir: the cache root (shared by all datasets and processes); max_bytes: size limit of all
    cached data files under cache_dir (None: `default_cache_size`)."""

    def __init__(self, cache_dir: str | None = None, max_bytes: int | None = None):
        self.cache_dir = os.path.abspath(cache_dir or default_cache_dir())
        _make_writable(self.cache_dir)
        self.max_bytes = int(max_bytes) if max_bytes is not None else default_cache_size(self.cache_dir)
        if self.max_bytes <= 0:
            raise ValueError(f"cache size must be positive, got {self.max_bytes}")
        self.stats = CacheStats()
        self._pins: dict[str, int] = {}  # data file path -> fd of F.pin holding LOCK_SH
        self._lock = threading.Lock()

    def mirror(self, url: str, manifest_text: str) -> str:
        d = os.path.join(self.cache_dir, _digest(url.rstrip("/")), _digest(manifest_text))
        os.makedirs(d, exist_ok=True)
        return d

    # ------------------------------------------------------------------ pins
    def pin(self, path: str) -> None:
        with self._lock:
            if path in self._pins:
                return
        os.makedirs(os.path.dirname(path), exist_ok=True)
        fd = os.open(path + ".pin", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            _flock_wait(fd, fcntl.LOCK_SH, None, path)  # an evictor holds LOCK_EX only for one unlink
        except BaseException:
            os.close(fd)
            raise
        with self._lock:
            if path in self._pins:  # another thread of this process pinned it meanwhile
                os.close(fd)
            else:
                self._pins[path] = fd

    def unpin(self, path: str) -> None:
        with self._lock:
            fd = self._pins.pop(path, None)
        if fd is not None:
            os.close(fd)  # closing the last descriptor of the description drops the flock

    def pinned(self) -> list[str]:
        with self._lock:
            return list(self._pins)

    def close(self) -> None:
        for p in self.pinned():
            self.unpin(p)

    # ------------------------------------------------------------------ fetch
    def ensure(self, path: str, size: int, sha256: str, download: Callable[[str], None], name: str,
               wait_timeout: float | None = None, refresh: bool = False) -> str:
        """Make `path` a complete, verified local copy and pin it; returns `path`.

        `download(tmp)` writes the remote bytes to the file `tmp` (retrying by itself, bounded); `name` is how
        errors name the shard. `wait_timeout` bounds the wait for another process's download of it. `refresh`:
        download and verify it even when a copy is cached (`fastfeed verify` checks the remote bytes); the copy is
        replaced by rename, so a reader holding it open keeps reading the old one."""
        self.pin(path)
        if not refresh and _complete(path, size):
            self._count(hits=1)
            _touch(path)
            return path
        fd = os.open(path + ".dl", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            _flock_wait(fd, fcntl.LOCK_EX, wait_timeout, name)
            if not refresh and _complete(path, size):  # someone else downloaded it while we waited
                self._count(hits=1)
                _touch(path)
                return path
            _remove_parts(path)
            # The size in the name is the reservation: every process counts it as used until the rename.
            tmp = f"{path}.{os.getpid()}.{secrets.token_hex(4)}.{size}.part"
            with self._room_lock():
                self._make_room(size, exclude=path, name=name)
                open(tmp, "wb").close()
            t0 = time.perf_counter()
            try:
                try:
                    download(tmp)
                except DatasetError as e:
                    if isinstance(e.__cause__, OSError) and e.__cause__.errno in LOCAL_DISK_ERRNOS:
                        raise DatasetError(
                            f"{name}: cannot be written into the shard cache at {self.cache_dir} "
                            f"({e.__cause__.strerror}; {shutil.disk_usage(self.cache_dir).free} bytes free there): "
                            f"free space, lower cache_size / $FASTFEED_CACHE_SIZE (now {self.max_bytes} bytes) "
                            f"or point $FASTFEED_CACHE at a larger disk") from e.__cause__
                    raise
                _verify(tmp, size, sha256, name)
                with open(tmp, "rb") as f:
                    os.fsync(f.fileno())
                os.replace(tmp, path)
            finally:
                if os.path.exists(tmp):
                    os.unlink(tmp)
            self._count(downloads=1, bytes_downloaded=size, download_seconds=time.perf_counter() - t0)
            return path
        finally:
            os.close(fd)

    def _count(self, **deltas) -> None:
        with self._lock:  # downloads run on several threads
            for k, v in deltas.items():
                setattr(self.stats, k, getattr(self.stats, k) + v)

    # ------------------------------------------------------------------ eviction
    def usage(self) -> int:
        """Bytes of cached shards plus the full size of the downloads in progress (their reservations)."""
        files, reserved = _scan(self.cache_dir)
        return sum(size for _, size, _ in files) + reserved

    @contextlib.contextmanager
    def _room_lock(self):
        """One process at a time decides what to evict and reserves room (a cache-wide flock), so two
        downloads can never both take the last free bytes."""
        fd = os.open(os.path.join(self.cache_dir, ".room.lock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            _flock_wait(fd, fcntl.LOCK_EX, None, self.cache_dir)
            yield
        finally:
            os.close(fd)

    def _make_room(self, incoming: int, exclude: str, name: str) -> None:
        files, reserved = _scan(self.cache_dir)
        files.sort(key=lambda f: f[2])  # oldest use first
        total = sum(size for _, size, _ in files) + reserved
        if total + incoming <= self.max_bytes:
            return
        for path, size, _ in files:
            if total + incoming <= self.max_bytes:
                return
            if path != exclude and _try_evict(path):
                total -= size
                self._count(evictions=1)
        if total + incoming > self.max_bytes:
            raise DatasetError(
                f"{name}: the shard cache at {self.cache_dir} is full: {incoming} more bytes do not fit its "
                f"limit of {self.max_bytes} bytes and the {total} bytes cached are in use (pinned by running "
                f"readers); raise cache_size / $FASTFEED_CACHE_SIZE")


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogateescape")).hexdigest()[:16]


def _complete(path: str, size: int) -> bool:
    try:
        return os.path.getsize(path) == size
    except OSError:
        return False


def _touch(path: str) -> None:
    try:
        os.utime(path)
    except OSError:
        pass


def _verify(tmp: str, size: int, sha256: str, name: str) -> None:
    got = os.path.getsize(tmp)
    if got != size:
        raise DatasetError(f"{name}: downloaded {got} bytes, the manifest says {size} (the remote object is "
                           f"truncated or was modified; re-pack, re-index (`fastfeed index --overwrite`) or "
                           f"re-upload the dataset)")
    h = hashlib.sha256()
    with open(tmp, "rb") as f:
        while chunk := f.read(_COPY_CHUNK):
            h.update(chunk)
    if h.hexdigest() != sha256:
        raise DatasetError(f"{name}: sha256 {h.hexdigest()[:16]}... of the downloaded bytes differs from the "
                           f"manifest's {sha256[:16]}... (the remote object is corrupted or was modified)")


def _remove_parts(path: str) -> None:
    """Leftovers of a downloader that died (we hold F.dl, so nobody is writing them)."""
    d, base = os.path.split(path)
    for n in os.listdir(d):
        if n.startswith(base + ".") and n.endswith(".part"):
            try:
                os.unlink(os.path.join(d, n))
            except FileNotFoundError:
                pass


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _scan(root: str) -> tuple[list[tuple[str, int, float]], int]:
    """(path, size, mtime) of every cached data file (the files with a `.pin` sibling), and the bytes reserved by
    downloads in progress (`F.<pid>.<token>.<size>.part`; the reservations of processes that no longer exist are
    removed: the cache is per host, so a pid is meaningful).

    One listing of each directory serves both: a download that completes during the scan (its `.part` renamed to F,
    outside the room lock) is counted once, as a reservation or as a file. Two separate walks could miss it in both
    (the part gone from the second, the file not yet in the first), and `_make_room` would then leave one shard too
    little room: a cache over its limit, seen in CI."""
    files, reserved = [], 0
    for d, _, names in os.walk(root):
        present = set(names)
        for n in names:
            if n.endswith(".pin") and n[:-4] in present:
                p = os.path.join(d, n[:-4])
                try:
                    st = os.stat(p)
                except FileNotFoundError:
                    continue
                files.append((p, st.st_size, st.st_mtime))
            elif n.endswith(".part"):
                fields = n[:-len(".part")].rsplit(".", 3)
                if len(fields) != 4 or not (fields[1].isdigit() and fields[3].isdigit()):
                    continue
                if not _alive(int(fields[1])):
                    try:
                        os.unlink(os.path.join(d, n))
                    except FileNotFoundError:
                        pass
                    continue
                reserved += int(fields[3])
    return files, reserved


def _try_evict(path: str) -> bool:
    try:
        fd = os.open(path + ".pin", os.O_RDWR | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                return False  # pinned by a reader
            raise
        try:
            os.unlink(path)
        except FileNotFoundError:
            return False
        return True
    finally:
        os.close(fd)


def _flock_wait(fd: int, op: int, timeout: float | None, name: str) -> None:
    """flock with polling, so a wait can be bounded; the holders themselves are bounded (downloads retry for a
    bounded time, evictors hold the lock for one unlink)."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        try:
            fcntl.flock(fd, op | fcntl.LOCK_NB)
            return
        except OSError as e:
            if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise
        if deadline is not None and time.monotonic() > deadline:
            raise DatasetError(f"{name}: waited {timeout:g} s for another process's download of this shard")
        time.sleep(_POLL_S)
