"""fastfeed.Loader on a dataset at a URL, streaming (shards fetched per epoch through remote.epoch_fetch): needs
the Loader/epoch hooks (storage_options=, EpochRun.fetch). The server is moto's, on 127.0.0.1."""
from __future__ import annotations

import time

import pytest
import torch

pytest.importorskip("moto.server")
pytest.importorskip("s3fs")

import fastfeed  # noqa: E402
from fastfeed.datasets import open_dataset
from fastfeed.formats import DatasetError  # noqa: E402
from fastfeed.loader.assemble import LoaderError  # noqa: E402
from tests.test_remote import BUCKET, FAST_FAIL, S3Server, _cli  # noqa: E402

pytestmark = pytest.mark.integration  # an S3 server, and the CLI as a process


def _loader(path, **kw):
    args = dict(batch_size=16, train=False, image_size=64, device="cpu", decoder="cpu-pil", dtype=torch.uint8,
                shuffle=False, drop_last=False, num_threads=1)
    args.update(kw)
    return fastfeed.Loader(path, **args)


@pytest.fixture
def server(tmp_path, monkeypatch):
    """moto's S3 server for one test, with the client environment and a shard cache of the test's own."""
    server = S3Server()
    for k, v in server.env.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("FASTFEED_CACHE", str(tmp_path / "cache"))
    yield server
    server.stop()


@pytest.mark.parametrize("order", ["shard", "global"])
def test_streaming_epochs_equal_the_local_pack_and_later_epochs_read_the_cache(server, demo_tree, wds_path, order):
    url = f"s3://{BUCKET}/stream-{order}"
    assert _cli("pack", str(demo_tree), url, "--quiet", "--shard-size", "4MB").returncode == 0
    with _loader(url, order=order, shuffle=True) as remote, _loader(str(wds_path), order=order,
                                                                    shuffle=True) as local:
        assert remote.dataset.cache_stats()["downloads"] == 0  # nothing fetched before the first epoch
        for epoch in range(2):
            got = [(x.clone(), y.clone()) for x, y in remote]
            want = list(local)
            assert len(got) == len(want) > 0
            for (a, la), (b, lb) in zip(got, want):
                assert torch.equal(la, lb) and torch.equal(a, b)
            stats = remote.dataset.cache_stats()
            assert stats["downloads"] == len(remote.dataset.manifest.shards)  # epoch 2 downloaded nothing


def test_server_stopped_mid_epoch_is_a_loader_error_naming_the_shard_within_a_bounded_time(
        server, demo_tree, monkeypatch):
    monkeypatch.setenv("FASTFEED_RETRY_TIMEOUT", "1")
    url = f"s3://{BUCKET}/stream-stopped"
    # ~40 small shards: streaming fetches only the window plus a few ahead, so most are remote when it stops
    assert _cli("pack", str(demo_tree), url, "--quiet", "--shard-size", "512KB").returncode == 0
    loader = _loader(url, order="shard", shuffle=False, storage_options=FAST_FAIL, batch_size=4)
    n_batches = len(loader)
    it = iter(loader)
    next(it)
    server.stop()
    t0 = time.monotonic()
    got = 1
    with pytest.raises(LoaderError) as info:
        for _ in it:
            got += 1
    elapsed = time.monotonic() - t0
    loader.close()
    assert got < n_batches
    assert isinstance(info.value.__cause__, DatasetError) and "shard-" in str(info.value)
    assert elapsed < 30, elapsed


@pytest.mark.parametrize("order", ["shard", "global"])
def test_a_cache_too_small_for_the_read_ahead_is_said_before_any_download(server, demo_tree, order):
    """Found by an adversarial run: a cache that holds the dataset's first shards but not the ring's read-ahead
    window failed some batches in, saying the cache was pinned by running readers. Now the epoch refuses before it
    downloads anything, saying how many bytes the read-ahead holds at once, and the cache stays empty."""
    url = f"s3://{BUCKET}/window-{order}"
    assert _cli("pack", str(demo_tree), url, "--quiet", "--shard-size", "1MB").returncode == 0
    with open_dataset(url, cache_size=1) as probe:
        sizes = [s.bytes for s in probe.manifest.shards]
    limit = max(sizes) * 2  # two shards: less than any read-ahead of 16-sample batches over 1-MB shards
    assert len(sizes) > 4
    with _loader(url, cache_size=limit, train=True, shuffle=True, order=order, batch_size=8) as loader:
        with pytest.raises(DatasetError, match=r"holds up to \d+ bytes of shards at once .* more than the shard "
                                              rf"cache limit of {limit} bytes; raise cache_size"):
            next(iter(loader))
        assert loader.dataset.cache.usage() == 0


def test_a_detection_dataset_streams_through_a_cache_smaller_than_it(server, tmp_path):
    """Loader(task="detect") reads every sample's annotation when it is built: at a URL that fetches every shard,
    and the cache must not have to hold them all at once (pinned until the epoch) for order="shard" to stream.
    Built with a cache of 3/4 of the dataset, nothing is left pinned, the limit holds throughout, and the epoch's
    batches are the local pack's, bit for bit."""
    from tests.test_detect_loader import make_yolo

    make_yolo(tmp_path / "src", n=48)
    url = f"s3://{BUCKET}/detect-stream"
    for out in (url, str(tmp_path / "local")):
        proc = _cli("pack", str(tmp_path / "src"), out, "--quiet", "--format", "wds", "--shard-size", "200KB")
        assert proc.returncode == 0, proc.stderr
    with open_dataset(url, cache_size=1) as probe:
        sizes = [s.bytes for s in probe.manifest.shards]
    limit = sum(sizes) * 3 // 4
    assert len(sizes) > 20 and max(sizes) * 8 < limit

    def batches(path, **kw):
        with fastfeed.Loader(path, batch_size=2, image_size=64, dtype=torch.uint8, device="cpu", seed=5,
                             train=True, order="shard", **kw) as loader:
            cache = getattr(loader.dataset, "cache", None)
            if cache is not None:
                assert cache.pinned() == [] and cache.usage() <= limit
            got = []
            for b in loader:
                got.append([b[k].clone() for k in ("images", "boxes", "labels", "batch_idx")])
                assert cache is None or cache.usage() <= limit
        return got

    remote, local = batches(url, cache_size=limit), batches(str(tmp_path / "local"))
    assert len(remote) == len(local) == 24
    assert all(torch.equal(a, b) for r, w in zip(remote, local) for a, b in zip(r, w))
