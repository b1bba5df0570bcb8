"""Datasets at fsspec URLs (s3://, gs://, https://, memory://, ...) read through the local shard cache.

`open_remote(url, ...)` fetches fastfeed.json, samples.npz and rejected.jsonl into the cache's mirror folder
(see NOTE [ Shard cache protocol ] in fastfeed/remote/cache.py) and returns a reader with the same interface as
the local ones; its `root` is the mirror folder and `url` the dataset URL.

WebDataset: shards are fetched whole, when first needed:
  - `read(i)`, `metadata(i)` and iteration fetch the shard they touch (iteration also fetches ahead, in order);
  - `extents()` (what the Loader's native ring reads with pread) first makes every shard local, unless the
    dataset was opened with `fetch="on_demand"`: then the caller promises to call `prepare_epoch(indices)` (all
    shards of the epoch, downloaded in the epoch's shard order, `parallel` at a time) or `ensure_local(ids)`
    (the shards of these samples) before the ring reads those samples.
LMDB: the environment is one file, fetched whole at open.

Shards adopted by `fastfeed index` at a URL: the manifest's `data_root` is the shards' URL, and the dataset (its
manifest, table and DALI index files) is a local folder or another URL. Shards are then fetched from `data_root`
into the mirror of (`data_root`, manifest), and the table is copied (or fetched) there, as for any dataset here.

Pinned shards (see the NOTE) stay pinned until `prepare_epoch` of another set, or `close()`.
"""
from __future__ import annotations

import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np

from fastfeed.formats.base import TableDataset, _check_columns, load_table, read_regular, remote_shards
from fastfeed.formats.lmdb import LmdbDataset
from fastfeed.formats.wds import WdsDataset
from fastfeed.remote.cache import ShardCache
from fastfeed.remote.store import is_url, join, missing_bucket, resolve_retry_timeout, retrying, url_to_fs
from fastfeed.types import MANIFEST_NAME, REJECTED_NAME, SAMPLES_NAME, DatasetError, Extents, Manifest

__all__ = ["open_remote", "read_manifest", "RemoteWdsDataset", "RemoteLmdbDataset", "FETCH_MODES"]

FETCH_MODES = ("all", "on_demand")
DEFAULT_PARALLEL = 4  # shard downloads in flight per dataset


class _Remote:
    """Where a dataset's files are and how to fetch one of them into the cache."""

    def __init__(self, url: str, storage_options: dict | None, cache: ShardCache, retry_timeout: float | None):
        self.url = url.rstrip("/")
        self.fs, self.base = url_to_fs(self.url, storage_options)
        self.cache = cache
        self.retry_timeout = resolve_retry_timeout(retry_timeout)

    def cat(self, name: str) -> bytes:
        path = join(self.base, name)
        return retrying(lambda: self.fs.cat_file(path), f"{self.url}/{name}", self.retry_timeout)

    def download_to(self, name: str, dest: str) -> None:
        """The object into the file `dest`, rewritten whole on every attempt (one streamed GET for s3fs/gcsfs,
        not ranged reads)."""
        path = join(self.base, name)
        retrying(lambda: self.fs.get_file(path, dest), f"{self.url}/{name}", self.retry_timeout)

    def fetch_small(self, mirror: str, name: str, required: bool = True) -> None:
        """samples.npz / rejected.jsonl into the mirror, by atomic rename (the mirror is per manifest, so a
        present file is the right one)."""
        dest = os.path.join(mirror, name)
        if os.path.exists(dest):
            return
        try:
            data = self.cat(name)
        except DatasetError:
            if required:
                raise
            return
        os.makedirs(os.path.dirname(dest), exist_ok=True)  # merged datasets keep parts in subfolders
        tmp = f"{dest}.{os.getpid()}.{threading.get_ident()}.part"
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, dest)

    def ensure(self, shard, mirror: str, wait_timeout: float | None = None, refresh: bool = False) -> str:
        dest = os.path.join(mirror, shard.path)
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        return self.cache.ensure(dest, shard.bytes, shard.sha256, lambda tmp: self.download_to(shard.path, tmp),
                                 f"{self.url}/{shard.path}", wait_timeout, refresh)


def read_manifest(path: str, storage_options: dict | None = None,
                  retry_timeout: float | None = None) -> Manifest:
    """The manifest of a dataset folder or URL, without fetching data (for inspect/doctor). A local folder goes
    through `load_manifest` (which also checks its data files); a URL only reads fastfeed.json."""
    from fastfeed.formats.base import load_manifest
    from fastfeed.remote.store import is_url, local_path

    if not is_url(path):
        return load_manifest(local_path(path))
    fs, base = url_to_fs(path.rstrip("/"), storage_options)
    return Manifest.from_json(_manifest_text(path.rstrip("/"), fs, base, retry_timeout),
                              where=f"{path.rstrip('/')}/{MANIFEST_NAME}")


def _manifest_text(url: str, fs, base: str, retry_timeout: float | None) -> str:
    name = f"{url}/{MANIFEST_NAME}"
    try:
        return retrying(lambda: fs.cat_file(join(base, MANIFEST_NAME)), name, retry_timeout).decode("utf-8")
    except UnicodeDecodeError as e:
        raise DatasetError(f"{name}: unreadable ({e})") from None
    except DatasetError as e:
        if isinstance(e.__cause__, FileNotFoundError):
            problem = missing_bucket(fs, url, base)
            if problem:
                raise DatasetError(problem) from None
            raise DatasetError(f"{url}: no {MANIFEST_NAME}, so this is not a complete fastfeed dataset "
                               f"(an unfinished upload, or parts not merged yet)") from None
        raise


def open_remote(url: str, storage_options: dict | None = None, *, cache_dir: str | None = None,
                cache_size: int | None = None, fetch: str = "all", parallel: int = DEFAULT_PARALLEL,
                retry_timeout: float | None = None):
    """Open the dataset at `url`, or in the local folder `url` whose shards are at a URL (see the module docstring).
    Raises DatasetError when it is not a complete dataset or cannot be reached within `retry_timeout` seconds of
    retries."""
    if fetch not in FETCH_MODES:
        raise ValueError(f"fetch must be one of {FETCH_MODES}, got {fetch!r}")
    if int(parallel) < 1:
        raise ValueError(f"parallel must be >= 1, got {parallel}")
    cache = ShardCache(cache_dir, cache_size)
    if is_url(url):
        remote = _Remote(url, storage_options, cache, retry_timeout)
        text = _manifest_text(remote.url, remote.fs, remote.base, remote.retry_timeout)
        manifest = Manifest.from_json(text, where=f"{remote.url}/{MANIFEST_NAME}")
        shards = _Remote(manifest.data_root, storage_options, cache, retry_timeout) if remote_shards(manifest) \
            else remote
        mirror = cache.mirror(remote.url, text)
        remote.fetch_small(mirror, SAMPLES_NAME)

        def small(name: str) -> None:
            remote.fetch_small(mirror, name, required=False)
    else:
        folder = os.path.abspath(url)
        text = read_regular(os.path.join(folder, MANIFEST_NAME)).decode("utf-8")
        manifest = Manifest.from_json(text, where=os.path.join(folder, MANIFEST_NAME))
        if not remote_shards(manifest):
            raise DatasetError(f"{folder}: its shards are local; open it with fastfeed.open_dataset", path=folder)
        shards = _Remote(manifest.data_root, storage_options, cache, retry_timeout)
        mirror = cache.mirror(shards.url, text)

        def small(name: str) -> None:
            if os.path.exists(os.path.join(folder, name)):
                _write_if_missing(os.path.join(mirror, name), read_regular(os.path.join(folder, name)))

        small(SAMPLES_NAME)
    small(REJECTED_NAME)
    _write_if_missing(os.path.join(mirror, MANIFEST_NAME), text.encode("utf-8"))
    if manifest.kind == "lmdb":
        return RemoteLmdbDataset(shards, mirror, manifest)
    return RemoteWdsDataset(shards, mirror, manifest, fetch, int(parallel), small)


def _write_if_missing(path: str, data: bytes) -> None:
    if not os.path.exists(path):
        tmp = f"{path}.{os.getpid()}.{threading.get_ident()}.part"
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, path)


class RemoteLmdbDataset(LmdbDataset):
    """An LMDB dataset whose environment was fetched whole into the cache (and stays pinned until close)."""

    def __init__(self, remote: _Remote, mirror: str, manifest: Manifest):
        self.url = remote.url
        self.cache = remote.cache
        self._pinned = [remote.ensure(s, mirror) for s in manifest.shards]
        super().__init__(mirror)

    def cache_stats(self) -> dict:
        return vars(self.cache.stats).copy()

    def close(self) -> None:
        super().close()
        self.cache.close()


class _ShardPaths(list):
    """The shard paths of a RemoteWdsDataset; indexing one fetches that shard first. WdsDataset reads shards
    only through `self._paths[i]` (pread handles and iteration), so this one hook makes every read path of the
    local reader safe; `list(paths)` (extents) copies without fetching."""

    def __init__(self, paths, ensure):
        super().__init__(paths)
        self._ensure = ensure

    def __getitem__(self, i):
        if isinstance(i, slice):
            return list.__getitem__(self, i)
        self._ensure(int(i))
        return list.__getitem__(self, i)


class RemoteWdsDataset(WdsDataset):
    """A WebDataset dataset whose shards are fetched into the cache as they are needed (module docstring).
    `remote`: where the shards are; `fetch_small(name)` brings a small file of the dataset's own (a DALI `.idx`)
    into the mirror from where its manifest is."""

    def __init__(self, remote: _Remote, mirror: str, manifest: Manifest, fetch: str, parallel: int, fetch_small):
        # Not WdsDataset.__init__: that checks every shard file exists, and here they come later.
        self._fetch_small = fetch_small
        self.url = remote.url
        self.cache = remote.cache
        self.root = mirror
        self.manifest = manifest
        self.fetch = fetch
        self.parallel = parallel
        self._remote = remote
        self._table = load_table(mirror, manifest, TableDataset.REQUIRED + ("shard", "offset", "meta_offset",
                                                                           "meta_size"))
        t = self._table
        if len(self) and (t["shard"].min() < 0 or t["shard"].max() >= len(manifest.shards)):
            raise DatasetError(f"{self.url}: samples.npz refers to shards the manifest does not list")
        # What TableDataset.__init__ sets up, but for shards that are not local yet (its checks read the files).
        self.table_path = os.path.join(mirror, SAMPLES_NAME)
        _check_columns(self.table_path, t, len(manifest.classes))
        self._sums = t.get("checksum")
        self._file_index = t["shard"].astype(np.int32)
        self._offset = t["offset"].astype(np.int64)
        self._paths = _ShardPaths([os.path.join(mirror, s.path) for s in manifest.shards], self._ensure_one)
        self._fds: dict[int, int] = {}
        self._pool = ThreadPoolExecutor(max_workers=parallel, thread_name_prefix="fastfeed-fetch")
        self._futures: dict[int, Future] = {}
        self._flock = threading.Lock()

    # ------------------------------------------------------------------ fetching
    def _submit(self, shard: int) -> Future:
        with self._flock:
            fut = self._futures.get(shard)
            if fut is None or fut.cancelled() or (fut.done() and fut.exception() is not None):  # tried again
                fut = self._futures[shard] = self._pool.submit(self._remote.ensure, self.manifest.shards[shard],
                                                               self.root)
            return fut

    def _ensure_one(self, shard: int) -> None:
        self._submit(shard).result()

    def shards_of(self, sample_ids) -> list[int]:
        """The shards holding these samples, in order of first use."""
        s = self._table["shard"][np.asarray(sample_ids, dtype=np.int64)]
        _, first = np.unique(s, return_index=True)
        return [int(x) for x in s[np.sort(first)]]

    def prefetch(self, shards: list[int]) -> list[Future]:
        """Start fetching these shards (in this order, `parallel` at a time); returns their futures."""
        return [self._submit(int(s)) for s in shards]

    @property
    def shard_index(self) -> np.ndarray:
        """The shard of every sample (int32[N])."""
        return self._table["shard"]

    def retain(self, shards) -> None:
        """Keep these shards pinned (once fetched); unpin every other shard this dataset holds (evictable)."""
        wanted = {int(s) for s in shards}
        keep = {list.__getitem__(self._paths, s) for s in wanted}
        for p in self.cache.pinned():
            if p not in keep:
                self.cache.unpin(p)
        with self._flock:  # an unpinned shard may be evicted: fetch it again if it is needed later
            self._futures = {s: f for s, f in self._futures.items() if s in wanted}

    def release(self, shards) -> None:
        """Unpin these shards: nothing will read them through this dataset's ring any more."""
        for s in shards:
            with self._flock:
                self._futures.pop(int(s), None)
            self.cache.unpin(list.__getitem__(self._paths, int(s)))

    def prepare_epoch(self, indices, wait: bool = True) -> None:
        """Fetch the shards of an epoch's sample `indices`, in the order the epoch first reads them; shards
        pinned for an earlier epoch and not needed now are unpinned (evictable). With `wait`, returns once all
        are local (raises DatasetError naming a shard that cannot be fetched); without, use `ensure_local`
        before each batch is read. The epoch's shards must fit the cache (streaming with a smaller cache:
        fastfeed/remote/epoch.py)."""
        futures = self.prefetch(self._retain_all(indices))
        if wait:
            for f in futures:
                f.result()

    def _retain_all(self, indices) -> list[int]:
        """The shards of sample `indices`, pinned once fetched, each other shard unpinned; DatasetError when they do
        not fit the cache together."""
        shards = self.shards_of(indices)
        need = sum(self.manifest.shards[s].bytes for s in shards)
        if need > self.cache.max_bytes:
            raise DatasetError(f"{self.url}: this epoch reads {len(shards)} shards, {need} bytes, more than the "
                               f"shard cache limit of {self.cache.max_bytes} bytes; raise cache_size")
        self.retain(shards)
        return shards

    def ensure_local(self, sample_ids, timeout: float | None = None) -> None:
        """Block until the shards of `sample_ids` are in the cache (fetching them if nobody is). Raises
        DatasetError naming the shard on a failed fetch, or when `timeout` seconds pass first."""
        import concurrent.futures as cf

        for s, fut in self.fetch_futures(sample_ids):
            try:
                fut.result(timeout=timeout)
            except cf.TimeoutError:
                raise DatasetError(f"{self.url}/{self.manifest.shards[s].path}: not fetched within {timeout:g} s"
                                   ) from None

    def fetch_futures(self, sample_ids) -> list[tuple[int, Future]]:
        """(shard, future) for the shards of `sample_ids`, fetches started if needed; a future's result()
        raises DatasetError naming the shard when it cannot be fetched."""
        return [(s, self._submit(s)) for s in self.shards_of(sample_ids)]

    def fetch_all(self) -> None:
        self.prepare_epoch(np.arange(len(self)), wait=True)

    def fetch_each(self) -> dict[int, str]:
        """Download and sha256-check every shard again, a cached copy too (the remote bytes are what `fastfeed
        verify` checks), and go on past one that cannot be had: {shard: why} of those."""
        refreshed = [(s, self._pool.submit(self._remote.ensure, self.manifest.shards[s], self.root, None, True))
                     for s in self._retain_all(np.arange(len(self)))]
        failed = {}
        for s, fut in refreshed:
            try:
                fut.result()
            except DatasetError as e:
                failed[s] = str(e)
        return failed

    def check_layout(self, damaged: set[str], unavailable: frozenset[str] = frozenset()):
        """`fastfeed verify` also cross-checks each shard's DALI `.idx`: bring those (small) files too, from where
        the manifest is (not where the shards are, when they are apart)."""
        for shard in self.manifest.shards:
            if shard.path not in unavailable and shard.path not in self.no_dali_index:
                self._fetch_small(shard.path[: -len(".tar")] + ".idx")
        return super().check_layout(damaged, unavailable)

    def extents(self) -> Extents:
        if self.fetch == "all":
            self.fetch_all()
        return super().extents()

    def __iter__(self):
        self.prefetch(self.shards_of(np.arange(len(self))))
        return super().__iter__()

    def cache_stats(self) -> dict:
        return vars(self.cache.stats).copy()

    def close(self) -> None:
        super().close()
        self._pool.shutdown(wait=True, cancel_futures=True)
        self.cache.close()
