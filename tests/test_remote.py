"""Remote datasets against a real S3-compatible server (moto's, started here on 127.0.0.1; no other network).

Packs go through the real CLI in subprocesses, reads through `open_dataset` / `fastfeed.Loader`; the server is
configured the way users configure s3fs (AWS_ENDPOINT_URL and key variables in the environment).
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from clients.common import free_port

moto_server = pytest.importorskip("moto.server")
pytest.importorskip("s3fs")

from fastfeed.datasets import open_dataset
from fastfeed.formats import DatasetError  # noqa: E402

pytestmark = pytest.mark.integration  # an S3 server, and the CLI as a process
BUCKET = "fastfeed-test"
FAST_FAIL = {"config_kwargs": {"retries": {"max_attempts": 1}, "connect_timeout": 1, "read_timeout": 3}}


class S3Server:
    """moto's S3 server on a free loopback port; `env` is what a client process needs to reach it."""

    def __init__(self):
        self.port = free_port()
        self.server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=self.port, verbose=False)
        self.server.start()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.env = {"AWS_ENDPOINT_URL": self.endpoint, "AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test",
                    "AWS_DEFAULT_REGION": "us-east-1"}
        if not self.fs().exists(BUCKET):  # moto's backend is per process: a second server sees the first's
            self.fs().mkdir(BUCKET)

    def fs(self):
        import s3fs

        return s3fs.S3FileSystem(endpoint_url=self.endpoint, key="test", secret="test", skip_instance_cache=True)

    def stop(self) -> None:
        self.server.stop()


@pytest.fixture(scope="module")
def s3():
    old = {k: os.environ.get(k) for k in ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY",
                                          "AWS_DEFAULT_REGION")}
    server = S3Server()
    os.environ.update(server.env)
    yield server
    server.stop()
    for k, v in old.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


@pytest.fixture()
def cache_dir(tmp_path, monkeypatch):
    d = tmp_path / "cache"
    monkeypatch.setenv("FASTFEED_CACHE", str(d))
    return d


def _cli(*args: str, cwd=None, env=None) -> subprocess.CompletedProcess:
    full_env = dict(os.environ, **(env or {}))
    return subprocess.run([sys.executable, "-m", "fastfeed.cli", *args], capture_output=True, text=True,
                          timeout=300, cwd=cwd, env=full_env)


@pytest.fixture(scope="module")
def remote_wds(s3, demo_tree, tmp_path_factory):
    """demo_tree packed by the CLI straight to s3://BUCKET/wds, run from an empty folder (which must stay empty:
    no local `s3:` folder)."""
    cwd = tmp_path_factory.mktemp("cwd")
    url = f"s3://{BUCKET}/wds"
    proc = _cli("pack", str(demo_tree), url, "--quiet", "--format", "wds", "--shard-size", "4MB", cwd=cwd)
    assert proc.returncode == 0, proc.stderr
    assert os.listdir(cwd) == []
    return url


def _loader_epoch(path, **kw):
    import torch

    import fastfeed

    with fastfeed.Loader(path, batch_size=32, train=False, image_size=64, device="cpu", decoder="cpu-pil",
                         dtype=torch.uint8, shuffle=False, drop_last=False, num_threads=1, **kw) as loader:
        batches = list(loader)
    return torch.cat([b[0] for b in batches]), torch.cat([b[1] for b in batches])


def test_pack_to_s3_then_loader_reads_every_sample_like_the_local_pack(s3, remote_wds, wds_path, cache_dir):
    names = {p.rsplit("/", 1)[-1] for p in s3.fs().find(f"{BUCKET}/wds")}
    assert {"fastfeed.json", "samples.npz", "shard-000000.tar"} <= names
    with open_dataset(remote_wds) as ds, open_dataset(wds_path) as local:
        assert len(ds) == len(local) > 0 and len(ds.manifest.shards) > 1
        assert [s.sha256 for s in ds.manifest.shards] == [s.sha256 for s in local.manifest.shards]
        assert all(ds.read(i) == local.read(i) for i in range(len(local)))
        np.testing.assert_array_equal(ds.labels, local.labels)
    images, labels = _loader_epoch(remote_wds)
    ref_images, ref_labels = _loader_epoch(str(wds_path))
    assert len(labels) == len(ref_labels) == len(local)
    assert torch_equal(labels, ref_labels) and torch_equal(images, ref_images)


def torch_equal(a, b) -> bool:
    import torch

    return bool(torch.equal(a, b))


def test_lmdb_pack_to_s3_is_read_whole_and_equal(s3, demo_tree, lmdb_path, cache_dir, tmp_path):
    url = f"s3://{BUCKET}/lmdb"
    proc = _cli("pack", str(demo_tree), url, "--quiet", "--format", "lmdb")
    assert proc.returncode == 0, proc.stderr
    with open_dataset(url) as ds, open_dataset(lmdb_path) as local:
        assert ds.cache_stats()["downloads"] == 1  # the environment, whole
        assert [ds.read(i) for i in range(len(ds))] == [local.read(i) for i in range(len(local))]


def test_remote_src_is_downloaded_then_packed_like_the_local_tree(s3, demo_tree, wds_path, cache_dir, tmp_path):
    s3.fs().put(str(demo_tree), f"{BUCKET}/src-tree", recursive=True)
    out = tmp_path / "from-s3"
    proc = _cli("pack", f"s3://{BUCKET}/src-tree", str(out), "--quiet", "--format", "wds", "--shard-size", "4MB")
    assert proc.returncode == 0, proc.stderr
    with open_dataset(out) as a, open_dataset(wds_path) as b:
        assert a.manifest.source == f"s3://{BUCKET}/src-tree"
        assert [s.sha256 for s in a.manifest.shards] == [s.sha256 for s in b.manifest.shards]


def test_pack_refuses_an_existing_remote_dataset_and_overwrite_replaces_it(s3, demo_tree, wds_path, cache_dir):
    url = f"s3://{BUCKET}/overwrite"
    assert _cli("pack", str(demo_tree), url, "--quiet", "--shard-size", "2MB").returncode == 0
    proc = _cli("pack", str(demo_tree), url, "--quiet", "--shard-size", "4MB")
    assert proc.returncode == 2 and "already holds a packed dataset" in proc.stderr
    proc = _cli("pack", str(demo_tree), url, "--quiet", "--shard-size", "4MB", "--overwrite")
    assert proc.returncode == 0, proc.stderr
    with open_dataset(url) as ds, open_dataset(wds_path) as local:  # wds_path: the same tree at 4MB shards
        assert [s.sha256 for s in ds.manifest.shards] == [s.sha256 for s in local.manifest.shards]
        listed = {s.path for s in ds.manifest.shards}
    tars = {p.rsplit("/", 1)[-1] for p in s3.fs().find(f"{BUCKET}/overwrite") if p.endswith(".tar")}
    assert tars == listed  # the 2MB pack's extra shards are gone
    fs = s3.fs()
    fs.pipe(f"{BUCKET}/strangers/notes.txt", b"mine")
    proc = _cli("pack", str(demo_tree), f"s3://{BUCKET}/strangers", "--quiet", "--overwrite")
    assert proc.returncode == 2 and "did not write" in proc.stderr
    assert fs.cat(f"{BUCKET}/strangers/notes.txt") == b"mine"


def _local_files(root) -> dict[str, bytes]:
    root = Path(root)
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def test_parts_packed_to_s3_are_merged_there_into_the_one_process_pack(s3, demo_tree, wds_path, cache_dir,
                                                                       tmp_path):
    """A Slurm array writing to object storage: each part uploads to URL/part-NNNNN, then `fastfeed merge URL`
    leaves exactly the files of a one-process pack there (every object compared byte for byte), the parts gone."""
    from fastfeed.pack import PackOptions
    from fastfeed.pack.remote import pack_any

    url = f"s3://{BUCKET}/merged"
    opts = PackOptions(shard_size=4_000_000, num_parts=3)  # wds_path: the same tree, options and shard size
    for i in (0, 2):
        pack_any(str(demo_tree), url, replace(opts, part=i))
    proc = _cli("merge", url)
    assert proc.returncode == 2 and "parts [1] of 3 are missing" in proc.stderr
    pack_any(str(demo_tree), url, replace(opts, part=1))
    fs = s3.fs()
    assert {p.split("/merged/", 1)[1].split("/")[0] for p in fs.find(f"{BUCKET}/merged")} == {
        "part-00000", "part-00001", "part-00002"}
    proc = _cli("merge", url)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("merged 3 parts: ")
    fs.get(f"{BUCKET}/merged/", str(tmp_path / "down") + "/", recursive=True)
    assert _local_files(tmp_path / "down") == _local_files(wds_path)
    assert _cli("merge", url).stderr.endswith("already holds a merged dataset; delete fastfeed.json there to "
                                              "merge again\n")


def test_pack_to_a_missing_bucket_fails_before_packing(s3, demo_tree, tmp_path):
    proc = _cli("pack", str(demo_tree), "s3://no-such-bucket/ds", "--staging", str(tmp_path / "stage"))
    assert proc.returncode == 2 and "bucket 'no-such-bucket' does not exist" in proc.stderr
    assert not (tmp_path / "stage").exists()


def test_a_missing_bucket_is_named_by_the_loader_and_by_index_before_any_shard_is_read(s3, cache_dir, tmp_path):
    """Reading, adopting from or indexing into a bucket that does not exist says so, not "no fastfeed.json" (an
    unfinished upload) or "no such shard", and `index` into it refuses before reading a shard, not at the upload."""
    with pytest.raises(DatasetError, match="bucket 'no-such-bucket' does not exist"):
        open_dataset("s3://no-such-bucket/ds")
    from fastfeed.pack.index import index_shards

    with pytest.raises(DatasetError, match="bucket 'no-such-bucket' does not exist"):
        index_shards("s3://no-such-bucket/shards/", str(tmp_path / "ds"))
    s3.fs().pipe(f"{BUCKET}/nb-shards/part-0000.tar", b"not a tar, never read")
    with pytest.raises(DatasetError, match="bucket 'no-such-bucket' does not exist"):
        index_shards(f"s3://{BUCKET}/nb-shards/", "s3://no-such-bucket/ds")


def test_an_unwritable_cache_folder_is_a_dataset_error_naming_it(s3, remote_wds, tmp_path):
    (tmp_path / "file").write_text("not a folder")
    cache = tmp_path / "file" / "cache"
    with pytest.raises(DatasetError, match=f"{cache}: the shard cache folder cannot be written"):
        open_dataset(remote_wds, cache_dir=str(cache))
    proc = _cli("doctor", remote_wds, env={"FASTFEED_CACHE": str(cache)})  # a failed check, not a traceback
    assert "Traceback" not in proc.stderr and "cannot be written" in proc.stdout, proc.stdout + proc.stderr


_FULL_CHILD = """
import resource, signal, sys, time
from fastfeed.datasets import open_dataset
from fastfeed.formats import DatasetError
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit then fails with EFBIG, as a full disk does
ds = open_dataset(sys.argv[1], cache_dir=sys.argv[2], cache_size=1 << 40, retry_timeout=30)
resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))  # no shard fits
t0 = time.monotonic()
try:
    ds.extents()
except DatasetError as e:
    print(f"{time.monotonic() - t0:.1f}", e)
"""


def test_a_full_disk_under_the_cache_is_an_error_naming_the_shard_and_the_cache_at_once(s3, remote_wds, tmp_path):
    """A shard that cannot be written into the cache (no space, a quota, a file-size limit) is not retried for the
    retry timeout as if the store had failed: the error names the shard and the cache's folder at once."""
    cache = tmp_path / "c"
    proc = subprocess.run([sys.executable, "-c", _FULL_CHILD, remote_wds, str(cache)], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    seconds, message = proc.stdout.split(" ", 1)
    assert float(seconds) < 10, proc.stdout
    assert "shard-" in message and f"cannot be written into the shard cache at {cache}" in message, message
    assert not [p for p in cache.rglob("*.part")]


def test_missing_manifest_is_a_clear_dataset_error(s3, cache_dir):
    s3.fs().pipe(f"{BUCKET}/half/shard-000000.tar", b"x" * 10)
    with pytest.raises(DatasetError, match="no fastfeed.json"):
        open_dataset(f"s3://{BUCKET}/half")


def test_truncated_object_is_a_checksum_error_naming_the_shard(s3, demo_tree, cache_dir):
    url = f"s3://{BUCKET}/truncated"
    assert _cli("pack", str(demo_tree), url, "--quiet", "--shard-size", "4MB").returncode == 0
    fs = s3.fs()
    name = "shard-000001.tar"
    fs.pipe(f"{BUCKET}/truncated/{name}", fs.cat(f"{BUCKET}/truncated/{name}")[:-4096])
    with open_dataset(url, retry_timeout=5) as ds:
        victim = int(np.flatnonzero(ds.shard_index == 1)[0])
        with pytest.raises(DatasetError, match=name):
            ds.read(victim)
        assert not os.path.exists(os.path.join(ds.root, name))  # nothing torn or unverified left in the cache
        assert [n for n in os.listdir(ds.root) if n.endswith(".part")] == []
        with pytest.raises(DatasetError, match=name):
            ds.extents()  # fetch="all" cannot hand the ring a path that is not verified


def test_verify_names_every_damaged_remote_shard_and_checks_the_rest(s3, demo_tree, cache_dir):
    """Two shards changed on the server after a first verify cached every shard: `fastfeed verify` checks the server's
    bytes, not the cached copies, reports both (not the first and stop), says their samples went unchecked, and
    checks the other shards."""
    url = f"s3://{BUCKET}/damaged"
    assert _cli("pack", str(demo_tree), url, "--quiet", "--shard-size", "2MB").returncode == 0
    assert _cli("verify", url, "--quick").returncode == 0  # every shard now cached, and good
    fs = s3.fs()
    with open_dataset(url) as ds:
        shards = [s.path for s in ds.manifest.shards]
        counts = np.bincount(ds.shard_index, minlength=len(shards))
    assert len(shards) >= 4
    fs.pipe(f"{BUCKET}/damaged/{shards[1]}", fs.cat(f"{BUCKET}/damaged/{shards[1]}")[:-4096])
    fs.pipe(f"{BUCKET}/damaged/{shards[3]}", b"\0" * 512)
    proc = _cli("verify", url, "--quick")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    out = proc.stdout + proc.stderr
    for k in (1, 3):
        assert re.search(rf"{shards[k]}.*its {counts[k]} samples were not checked", out), out
    assert shards[0] not in out and shards[2] not in out


def test_verify_names_a_missing_remote_index_by_its_name_not_its_cache_copy(s3, demo_tree, cache_dir):
    url = f"s3://{BUCKET}/no-idx"
    assert _cli("pack", str(demo_tree), url, "--quiet", "--shard-size", "2MB").returncode == 0
    with open_dataset(url) as ds:
        shard = ds.manifest.shards[1].path
    idx = shard[: -len(".tar")] + ".idx"
    s3.fs().rm(f"{BUCKET}/no-idx/{idx}")
    proc = _cli("verify", url, "--quick")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    assert f"{idx}: unreadable DALI index (No such file or directory)" in out
    assert str(cache_dir) not in out


_SHARE_CHILD = """
import json, sys
from fastfeed.datasets import open_dataset
ds = open_dataset(sys.argv[1], cache_dir=sys.argv[2])
ds.extents()  # fetch="all": every shard local before the ring would read
print(json.dumps(ds.cache_stats()))
ds.close()
"""


def test_two_processes_share_one_cache_and_download_each_shard_once(s3, remote_wds, tmp_path):
    cache = tmp_path / "shared-cache"
    procs = [subprocess.Popen([sys.executable, "-c", _SHARE_CHILD, remote_wds, str(cache)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outs = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), [o[1] for o in outs]
    stats = [json.loads(o[0]) for o in outs]
    with open_dataset(remote_wds, cache_dir=str(cache)) as ds:
        shards = ds.manifest.shards
        assert sum(s["downloads"] for s in stats) == len(shards)  # not one shard twice
        assert sum(s["hits"] for s in stats) == len(shards)  # the other process found each complete
        for s in shards:
            with open(os.path.join(ds.root, s.path), "rb") as f:
                assert hashlib.sha256(f.read()).hexdigest() == s.sha256
        ds.extents()
        assert ds.cache_stats()["downloads"] == 0


def test_cache_stays_under_its_limit_lru_by_shard(s3, remote_wds, tmp_path):
    with open_dataset(remote_wds, cache_dir=str(tmp_path / "c"), cache_size=1) as probe:
        sizes = [s.bytes for s in probe.manifest.shards]
        shard_col = probe.shard_index
    assert len(sizes) >= 3
    limit = sizes[0] + sizes[1] + sizes[2] // 2  # room for two shards, not three
    with open_dataset(remote_wds, cache_dir=str(tmp_path / "c"), cache_size=limit, fetch="on_demand") as ds:
        for s in range(len(sizes)):
            ds.prepare_epoch(np.flatnonzero(shard_col == s))  # one shard per "epoch": the previous is unpinned
            assert ds.cache.usage() <= limit
            assert os.path.exists(os.path.join(ds.root, ds.manifest.shards[s].path))
        assert ds.cache_stats()["evictions"] == len(sizes) - 2
        with pytest.raises(DatasetError, match="more than the shard cache limit"):
            ds.prepare_epoch(np.arange(len(ds)))


def test_a_download_completing_during_a_scan_is_counted_once(tmp_path, monkeypatch):
    """A download renames its `.part` to the shard outside the room lock. The cache's scan must count those bytes
    once, as the reservation or as the file: counted nowhere, `_make_room` leaves a shard too little room and the
    cache goes over its limit (it did, once, in CI)."""
    from fastfeed.remote import cache as cache_mod

    d = tmp_path / "c"
    d.mkdir()
    (d / "a.tar").write_bytes(b"x" * 1000)
    (d / "a.tar.pin").touch()
    (d / "b.tar.pin").touch()
    part = d / f"b.tar.{os.getpid()}.abcd1234.500.part"
    part.write_bytes(b"y" * 500)
    real_walk = os.walk

    def walk_then_complete(root, *args, **kwargs):
        for entry in real_walk(root, *args, **kwargs):
            if part.exists():  # the download of b.tar completes right after the directory was listed
                part.rename(d / "b.tar")
            yield entry

    monkeypatch.setattr(cache_mod.os, "walk", walk_then_complete)
    assert cache_mod.ShardCache(str(d), max_bytes=10_000).usage() == 1500


def test_ensure_local_fetches_in_order_for_streaming(s3, remote_wds, tmp_path):
    with open_dataset(remote_wds, cache_dir=str(tmp_path / "c"), fetch="on_demand") as ds:
        order = np.argsort(ds.shard_index, kind="stable")[::-1]  # last shard first
        ds.prepare_epoch(order, wait=False)
        first = order[:8]
        ds.ensure_local(first, timeout=60)
        shard = int(ds.shard_index[first[0]])
        assert os.path.exists(os.path.join(ds.root, ds.manifest.shards[shard].path))
        ds.ensure_local(order, timeout=60)
        assert ds.cache_stats()["downloads"] == len(ds.manifest.shards)


def test_server_stopped_mid_epoch_raises_dataset_error_within_a_bounded_time(demo_tree, tmp_path, monkeypatch):
    server = S3Server()
    try:
        for k, v in server.env.items():
            monkeypatch.setenv(k, v)
        url = f"s3://{BUCKET}/stopped"
        assert _cli("pack", str(demo_tree), url, "--quiet", "--shard-size", "4MB").returncode == 0
        retry_timeout = 1.0
        ds = open_dataset(url, FAST_FAIL, cache_dir=str(tmp_path / "c"), retry_timeout=retry_timeout, parallel=1)
        shard_col = ds.shard_index
        ds.ensure_local([0], timeout=60)  # the epoch has begun: its first shard is local, the others are not
        server.stop()
        t0 = time.monotonic()
        seen = 0
        with pytest.raises(DatasetError) as info:
            for _ in ds:
                seen += 1
        elapsed = time.monotonic() - t0
    finally:
        server.stop()
    assert seen == int((shard_col == 0).sum())  # every sample of the local shard, then the error: no silent skip
    assert "shard-" in str(info.value) and "after" in str(info.value)
    # retry_timeout of retrying plus one attempt of the client (1 s connect, 1 attempt) per shard in flight
    assert elapsed < 30, elapsed
    ds.close()


def test_epoch_fetch_streams_shards_through_the_native_ring(s3, remote_wds, wds_path, tmp_path):
    """The hook the epoch runner calls (fastfeed/remote/epoch.py) with the real ring: nothing is local when the
    ring starts except the first window, and every batch read equals the local dataset's bytes."""
    from fastfeed.loader.ring import PrefetchRing
    from fastfeed.remote import epoch_fetch

    batch_size, slots = 8, 3
    with open_dataset(remote_wds, cache_dir=str(tmp_path / "c"), fetch="on_demand") as ds, \
            open_dataset(wds_path) as local:
        order = np.argsort(ds.shard_index, kind="stable")  # order="shard": shard by shard
        with PrefetchRing(ds.extents(), batch_size, num_threads=2, num_slots=slots, pin_memory=False) as ring:
            assert ds.cache_stats()["downloads"] == 0  # extents() of an on_demand dataset fetches nothing
            fetch = epoch_fetch(ds, order, batch_size, slots)  # the first window is local after this
            ring.start(order)
            for k in range(fetch.num_batches):
                fetch.before_batch(k)
                with ring.next_batch(timeout=60) as b:
                    assert [bytes(x) for x in b.samples()] == [local.read(int(i)) for i in b.indices]
            assert ring.next_batch(timeout=60) is None
        assert ds.cache_stats()["downloads"] == len(ds.manifest.shards)
    with open_dataset(wds_path) as local:
        assert epoch_fetch(local, order, batch_size, slots) is None  # local datasets: no hook


def _small_shards(demo_tree, name: str, tmp_path) -> tuple[str, list[int], int]:
    """demo_tree packed to s3://BUCKET/name in 1-MB shards: (url, the shards' sizes, a cache limit of 10 shards,
    under 70% of the dataset)."""
    url = f"s3://{BUCKET}/{name}"
    assert _cli("pack", str(demo_tree), url, "--quiet", "--shard-size", "1MB").returncode == 0
    with open_dataset(url, cache_dir=str(tmp_path / "probe"), cache_size=1, fetch="on_demand") as probe:
        sizes = [s.bytes for s in probe.manifest.shards]
    limit = 10 * max(sizes)
    assert limit < sum(sizes) * 0.7
    return url, sizes, limit


def test_streaming_with_a_cache_smaller_than_the_dataset_stays_under_its_limit(s3, demo_tree, wds_path, tmp_path):
    """order="shard" through the ring with a cache that holds about half the dataset: shards whose batches the
    ring is done with are released and evicted (LRU), every byte read is right, the limit always holds."""
    from fastfeed.loader.ring import PrefetchRing
    from fastfeed.remote.epoch import EpochFetch

    url, sizes, limit = _small_shards(demo_tree, "small-shards", tmp_path)
    batch_size, slots = 8, 3
    with open_dataset(url, cache_dir=str(tmp_path / "c"), cache_size=limit, fetch="on_demand") as ds, \
            open_dataset(wds_path) as local:
        order = np.argsort(ds.shard_index, kind="stable")
        with PrefetchRing(ds.extents(), batch_size, num_threads=2, num_slots=slots, pin_memory=False) as ring:
            fetch = EpochFetch(ds, order, batch_size, slots, lookahead=1)
            ring.start(order)
            for k in range(fetch.num_batches):
                assert fetch.before_batch(k)
                with ring.next_batch(timeout=60) as b:
                    assert [bytes(x) for x in b.samples()] == [local.read(int(i)) for i in b.indices]
                assert ds.cache.usage() <= limit
        stats = ds.cache_stats()
        assert stats["downloads"] == len(sizes) and stats["evictions"] > 0


def test_the_lookahead_never_fills_the_cache_with_pinned_shards(s3, demo_tree, tmp_path, monkeypatch):
    """EpochFetch fetches shards past the ring's window only as far as the cache holds them beside the window, and
    lets the previous epoch's pins go when it starts: a download that finds the cache full of pinned shards fails,
    and for a shard of the window that failed the epoch (seen under load: the Loader test in test_remote_loader.py).
    Every download here finishes before the next batch, and none may find the cache full, in two epochs."""
    from fastfeed.remote.epoch import EpochFetch

    url, sizes, limit = _small_shards(demo_tree, "lookahead", tmp_path)
    batch_size, slots = 8, 3
    with open_dataset(url, cache_dir=str(tmp_path / "c"), cache_size=limit, fetch="on_demand") as ds:
        full = []
        make_room = ds.cache._make_room

        def watched(*args, **kwargs):
            try:
                return make_room(*args, **kwargs)
            except DatasetError as e:
                full.append(str(e))
                raise

        monkeypatch.setattr(ds.cache, "_make_room", watched)
        order = np.argsort(ds.shard_index, kind="stable")
        for epoch in range(2):  # the same order again: the shards the first epoch ended on come last in the second
            fetch = EpochFetch(ds, order, batch_size, slots, lookahead=len(sizes))
            for k in range(fetch.num_batches):
                assert fetch.before_batch(k)
                for f in ds.prefetch(ds.shards_of(order[k * batch_size:(k + slots + 1) * batch_size])):
                    f.result()  # the window's downloads done before the next batch's release
                time.sleep(0.05)  # and the lookahead's
            assert full == [], epoch
        assert ds.cache_stats()["downloads"] <= 2 * len(sizes)  # each shard at most once an epoch


def test_cli_inspect_verify_doctor_accept_a_url(s3, remote_wds, cache_dir):
    proc = _cli("inspect", remote_wds)
    assert proc.returncode == 0 and "samples:" in proc.stdout, proc.stderr
    proc = _cli("verify", remote_wds)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    proc = _cli("doctor", remote_wds)
    assert "does not exist" not in proc.stdout and "samples" in proc.stdout, proc.stdout
    proc = _cli("bench", remote_wds, "--steps", "2", "--warmup", "0", "--max-warmup", "0", "--batch-size", "8",
                "--image-size", "32", "--device", "cpu", "--no-progress")
    assert proc.returncode == 0 and "samples/s" in proc.stdout, proc.stdout + proc.stderr


def test_a_reader_never_sees_the_manifest_before_the_files_it_lists(s3, wds_path, tmp_path):
    """Readers poll the URL while a dataset uploads: each sees either no dataset or a complete, verified one."""
    import threading

    from fastfeed.pack.remote import upload_dataset

    url = f"s3://{BUCKET}/racing"
    done = threading.Event()
    errors = []

    def upload():
        try:
            upload_dataset(str(wds_path), url)
        except BaseException as e:  # noqa: BLE001 - reported by the assertion below
            errors.append(e)
        finally:
            done.set()

    t = threading.Thread(target=upload)
    t.start()
    missing = complete = 0
    while not done.is_set() or complete == 0:
        try:
            with open_dataset(url, cache_dir=str(tmp_path / f"c{complete}-{missing}"), retry_timeout=2) as ds:
                ds.extents()  # every shard fetched and sha256-checked
                complete += 1
        except DatasetError as e:
            assert "no fastfeed.json" in str(e), e  # never a half-uploaded dataset
            missing += 1
        if complete:
            break
    t.join()
    assert errors == [] and missing > 0 and complete == 1


def test_killed_pack_to_a_url_uploads_nothing_and_resumes_from_staging(s3, src_small, tmp_path, cache_dir):
    import signal

    url = f"s3://{BUCKET}/killed"
    staging = tmp_path / "stage"
    cmd = [sys.executable, "-m", "fastfeed.cli", "pack", str(src_small), url, "--staging", str(staging),
           "--shard-size", "40KB", "--max-side", "200", "--workers", "1", "--quiet"]
    journal = staging / ".fastfeed-pack" / "journal.jsonl"
    proc = subprocess.Popen(cmd)
    deadline = time.monotonic() + 60
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            if journal.exists() and journal.read_bytes().count(b"\n") >= 3:
                break
            time.sleep(0.005)
        assert proc.poll() is None, "the pack finished before it could be killed"
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.wait()
    assert not s3.fs().exists(f"{BUCKET}/killed/fastfeed.json")
    with pytest.raises(DatasetError, match="no fastfeed.json"):
        open_dataset(url)
    assert subprocess.run(cmd + ["--resume"], capture_output=True).returncode == 0
    ref = tmp_path / "ref"
    assert subprocess.run(cmd[:5] + [str(ref)] + cmd[8:], capture_output=True).returncode == 0
    with open_dataset(url) as a, open_dataset(ref) as b:
        assert len(a) == len(b) > 0
        assert [a.read(i) for i in range(len(a))] == [b.read(i) for i in range(len(b))]


@pytest.fixture(scope="module")
def src_small(tmp_path_factory):
    from fastfeed.demo_data import make_dataset

    return make_dataset(tmp_path_factory.mktemp("small") / "src", num_images=48, num_classes=3, seed=1, workers=1)


def test_a_dataset_served_over_http_reads_like_the_local_one(wds_path, tmp_path):
    """https:// works the same way (fsspec's HTTP filesystem); a plain local http.server stands in for a CDN."""
    import functools
    import http.server
    import threading

    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(wds_path))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        with open_dataset(url, cache_dir=str(tmp_path / "c")) as ds, open_dataset(wds_path) as local:
            ds.extents()
            assert ds.cache_stats()["downloads"] == len(local.manifest.shards)
            assert [ds.read(i) for i in range(len(ds))] == [local.read(i) for i in range(len(local))]
    finally:
        server.shutdown()
        server.server_close()


def test_shards_on_s3_indexed_where_they_lie_by_the_cli(s3, tmp_path, cache_dir):
    """Shards written by the webdataset library, uploaded to S3, adopted by `fastfeed index` into a local folder
    and into another prefix, never written to; the Loader reads every sample with its own fields through the shard
    cache, and `fastfeed verify` passes on both."""
    from test_index import N, check_batch, loader, sample, write_shards

    local = write_shards(tmp_path / "shards", (sample(i) for i in range(N)))
    fs = s3.fs()
    for p in sorted(local.glob("*.tar")):
        fs.put_file(str(p), f"{BUCKET}/adopt/shards/{p.name}")
    etags = {p: fs.info(p)["ETag"] for p in fs.find(f"{BUCKET}/adopt/shards")}
    url = f"s3://{BUCKET}/adopt/shards"
    for src, out in ((url + "/", str(tmp_path / "ds")), (url + "/part-{0000..0002}.tar", f"s3://{BUCKET}/adopt/ds")):
        proc = _cli("index", src, out)
        assert proc.returncode == 0 and f"indexed {N} samples in 3 shard(s)" in proc.stdout, proc.stderr
    fs.invalidate_cache()
    assert {p: fs.info(p)["ETag"] for p in fs.find(f"{BUCKET}/adopt/shards")} == etags
    for where in (str(tmp_path / "ds"), f"s3://{BUCKET}/adopt/ds"):
        with loader(where, train=False, shuffle=False, drop_last=False) as ld:
            assert sorted(i for b in ld for i in check_batch(b)) == list(range(N))
        proc = _cli("verify", where)
        assert proc.returncode == 0, proc.stdout + proc.stderr
    assert any(p.name.endswith(".tar") for p in Path(cache_dir).rglob("*"))
