"""gs:// datasets against a real GCS-compatible server: gcp-storage-emulator (pure Python), started here on
127.0.0.1 in this process; gcsfs reaches it through STORAGE_EMULATOR_HOST, as gcsfs users configure emulators.

Two settings keep every request on the loopback and the test fast: `token="anon"` (no credential lookup, which
would otherwise probe the GCE metadata server) and GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT=false (gcsfs >= 2026.10
otherwise asks the bucket's storage layout over a gRPC control API the emulator lacks, 60 s per bucket).
"""
from __future__ import annotations

import importlib.util
import os
import socket

import numpy as np
import pytest

if importlib.util.find_spec("gcsfs") is None:  # not imported here: the fixture sets its environment first
    pytest.skip("gcsfs is not installed", allow_module_level=True)
emulator = pytest.importorskip("gcp_storage_emulator.server")

from fastfeed.datasets import open_dataset  # noqa: E402

# gcsfs hands aiohttp each upload as one bytes body, which aiohttp warns about (a client-side performance note;
# the suite turns warnings into errors).
pytestmark = [pytest.mark.integration,  # a GCS server
              pytest.mark.filterwarnings("ignore:Sending a large body directly with raw bytes:ResourceWarning")]
BUCKET = "fastfeed-gcs-test"
ANON = {"token": "anon"}


@pytest.fixture(scope="module")
def gcs():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = emulator.create_server("127.0.0.1", port, in_memory=True, default_bucket=BUCKET)
    server.start()
    try:
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("STORAGE_EMULATOR_HOST", f"http://127.0.0.1:{port}")
            mp.setenv("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")
            mp.setenv("NO_GCE_CHECK", "True")  # google-auth: never probe the metadata server
            import gcsfs

            # read at gcsfs's import: had something imported it earlier, the layout probe would slow this down
            assert gcsfs.GCSFileSystem is gcsfs.core.GCSFileSystem, "gcsfs was imported before its env was set"
            yield gcsfs.GCSFileSystem(skip_instance_cache=True, **ANON)
    finally:
        server.stop()  # its thread would keep the test process alive


def _loader_epoch(path, **kw):
    import torch

    import fastfeed

    with fastfeed.Loader(path, batch_size=32, train=False, image_size=64, device="cpu", decoder="cpu-pil",
                         dtype=torch.uint8, shuffle=False, drop_last=False, num_threads=1, **kw) as loader:
        batches = list(loader)
    return torch.cat([b[0] for b in batches]), torch.cat([b[1] for b in batches])


def test_pack_to_gcs_then_loader_reads_every_sample_like_the_local_pack(gcs, demo_tree, wds_path, tmp_path,
                                                                        monkeypatch):
    import torch

    from fastfeed.pack import PackOptions
    from fastfeed.pack.remote import pack_any

    monkeypatch.setenv("FASTFEED_CACHE", str(tmp_path / "cache"))
    url = f"gs://{BUCKET}/wds"
    pack_any(str(demo_tree), url, PackOptions(shard_size=4_000_000), storage_options=ANON)  # wds_path's options
    names = {p.rsplit("/", 1)[-1] for p in gcs.find(f"{BUCKET}/wds")}
    assert {"fastfeed.json", "samples.npz", "shard-000000.tar"} <= names
    with open_dataset(url, storage_options=ANON) as ds, open_dataset(wds_path) as local:
        assert len(ds) == len(local) > 0 and len(ds.manifest.shards) > 1
        assert [s.sha256 for s in ds.manifest.shards] == [s.sha256 for s in local.manifest.shards]
        assert all(ds.read(i) == local.read(i) for i in range(len(local)))
        np.testing.assert_array_equal(ds.labels, local.labels)
    images, labels = _loader_epoch(url, storage_options=ANON)
    ref_images, ref_labels = _loader_epoch(str(wds_path))
    assert len(labels) == len(ref_labels) == len(local)
    assert torch.equal(labels, ref_labels) and torch.equal(images, ref_images)
    assert os.listdir(tmp_path / "cache")  # read through the shard cache
