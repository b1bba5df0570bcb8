"""`fastfeed pack --engine ray` on a local 2-CPU Ray cluster: the parts run as Ray tasks and merge into exactly the
files of a single-process pack with the same options, and of `--num-parts K --part i` run one after another plus
`fastfeed merge`: every file compared byte for byte, WebDataset and LMDB (data.mdb included; only LMDB's lock.mdb,
runtime reader-table state that no manifest lists, is left out — tests/test_merge.py says why data.mdb is
reproducible).
"""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

ray = pytest.importorskip("ray")

from fastfeed.datasets import open_dataset  # noqa: E402
from fastfeed.pack import PackOptions, merge, pack  # noqa: E402
from fastfeed.pack.remote import pack_ray  # noqa: E402

SHARD = 1 << 20
pytestmark = pytest.mark.integration  # starts a Ray cluster (~10 s)


@pytest.fixture(scope="module")
def ray_cluster():
    ray.init(num_cpus=2, include_dashboard=False, object_store_memory=80 << 20, log_to_driver=False)
    yield ray.get_runtime_context().gcs_address
    ray.shutdown()


def _files(root) -> dict[str, bytes]:
    """Every file's bytes, except LMDB's lock.mdb: runtime reader-table state (pids) that LMDB's writer leaves
    behind, not data (no manifest lists it; readers open with lock=False)."""
    out = {}
    for d, _, names in os.walk(root):
        for n in names:
            if n == "lock.mdb":
                continue
            p = os.path.join(d, n)
            with open(p, "rb") as f:
                out[os.path.relpath(p, root)] = f.read()
    return out


def _samples(path) -> list[tuple]:
    with open_dataset(path) as ds:
        return [(str(ds.keys[i]), int(ds.labels[i]), ds.read(i), ds.metadata(i)) for i in range(len(ds))]


@pytest.mark.parametrize("fmt", ["wds", "lmdb"])
def test_ray_parts_are_byte_identical_to_one_pack_and_to_sequential_parts(ray_cluster, demo_tree, tmp_path, fmt):
    opts = PackOptions(format=fmt, shard_size=SHARD, num_parts=3)
    ray_out = tmp_path / "ray"
    result = pack_ray(str(demo_tree), str(ray_out), opts)
    seq_out = tmp_path / "seq"
    for k in range(3):
        pack(str(demo_tree), str(seq_out), PackOptions(format=fmt, shard_size=SHARD, num_parts=3, part=k))
    merge(str(seq_out))
    single = tmp_path / "single"
    one = pack(str(demo_tree), str(single), PackOptions(format=fmt, shard_size=SHARD))
    assert result.manifest == one.manifest
    assert fmt == "lmdb" or len(one.manifest.shards) >= 4  # boundaries inside and across the parts
    single_files = _files(single)
    assert "fastfeed.json" in single_files and not any(n.startswith("part-") for n in _files(ray_out))
    for other in (ray_out, seq_out):
        files = _files(other)
        assert sorted(files) == sorted(single_files)
        different = [n for n in files if files[n] != single_files[n]]
        assert different == [], (other.name, different)
    assert result.manifest.num_samples == len(_samples(ray_out)) > 0


def test_cli_engine_ray_on_an_existing_cluster(ray_cluster, demo_tree, tmp_path):
    out = tmp_path / "cli"
    proc = subprocess.run([sys.executable, "-m", "fastfeed.cli", "pack", str(demo_tree), str(out), "--quiet",
                           "--engine", "ray", "--ray-address", ray_cluster, "--num-parts", "2",
                           "--shard-size", "1MiB"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    single = tmp_path / "single"
    pack(str(demo_tree), str(single), PackOptions(shard_size=SHARD))
    assert _files(out) == _files(single)


def test_engine_ray_packs_to_a_url_merged_before_upload(ray_cluster, demo_tree, tmp_path, monkeypatch):
    """memory:// (fsspec's in-process store) stands in for object storage: the Ray tasks run in other
    processes, but only the driver uploads, after the merge."""
    import fsspec

    from fastfeed.pack.remote import pack_any

    monkeypatch.setenv("FASTFEED_CACHE", str(tmp_path / "cache"))
    url = "memory://ray-bucket/ds"
    pack_any(str(demo_tree), url, PackOptions(shard_size=SHARD, num_parts=2), engine="ray")
    names = sorted(p.split("/ds/", 1)[1] for p in fsspec.filesystem("memory").find("/ray-bucket/ds"))
    assert "fastfeed.json" in names and "shard-000000.tar" in names
    assert not [n for n in names if n.startswith("part-")]
    assert _samples(url) == _samples_of_single(demo_tree, tmp_path)


def _samples_of_single(src, tmp_path):
    single = tmp_path / "single"
    pack(str(src), str(single), PackOptions(shard_size=SHARD))
    return _samples(single)


def test_a_failing_part_is_a_pack_error_not_a_ray_traceback(ray_cluster, demo_tree, tmp_path):
    from fastfeed.pack import PackError

    out = tmp_path / "twice"
    pack_ray(str(demo_tree), str(out), PackOptions(shard_size=SHARD, num_parts=2))
    first = _files(out)
    with pytest.raises(PackError, match="a Ray pack task failed: .* already holds a packed dataset"):
        pack_ray(str(demo_tree), str(out), PackOptions(shard_size=SHARD, num_parts=2))
    assert _files(out) == first  # the dataset is untouched; --overwrite replaces it
    pack_ray(str(demo_tree), str(out), PackOptions(shard_size=SHARD, num_parts=3, overwrite=True))
    assert _files(out) == first


def test_an_unreachable_ray_address_is_a_clear_error_in_bounded_time(demo_tree, tmp_path):
    import time

    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "fastfeed.cli", "pack", str(demo_tree), str(tmp_path / "out"),
                           "--engine", "ray", "--ray-address", "127.0.0.1:1", "--quiet"], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 2 and "--ray-address 127.0.0.1:1: cannot connect" in proc.stderr
    assert time.monotonic() - t0 < 60
