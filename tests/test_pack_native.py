"""The native tar writer (fastfeed/pack/native.py over csrc/tar_writer.cpp) writes exactly what the Python writer
(fastfeed/pack/writers.py) writes: same tar bytes, same DALI index, same sha256, plus a correct xxh3_64 per member."""
from __future__ import annotations

import glob
import hashlib
import os
import tarfile

import numpy as np
import pytest
import xxhash

from fastfeed.demo_data import make_dataset
from fastfeed.pack.native import HAVE_NATIVE_WRITER, NativeTarShardWriter, wds_sample, write_shards
from fastfeed.pack.writers import TarShardWriter, meta_bytes

pytestmark = pytest.mark.skipif(not HAVE_NATIVE_WRITER, reason="native tar writer not built (no OpenSSL headers)")


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    root = tmp_path_factory.mktemp("src") / "images"
    make_dataset(root, num_images=40, num_classes=4, seed=5, workers=1)
    paths = sorted(glob.glob(os.path.join(root, "*", "*")))
    # Sizes at the edges of tar padding: exactly one block, one byte over, one under.
    edge = tmp_path_factory.mktemp("edge")
    for n in (512, 513, 511, 1, 1024):
        p = edge / f"edge-{n}.bin"
        p.write_bytes(np.random.default_rng(n).integers(0, 256, n, dtype=np.uint8).tobytes())
        paths.append(str(p))
    return paths


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def _samples(paths):
    """(key, path, ext, label, meta) with varied labels and metadata on every third sample."""
    out = []
    for i, p in enumerate(paths):
        meta = meta_bytes({"source": os.path.basename(p), "i": i, "ü": "ß"}) if i % 3 == 0 else None
        out.append((f"{i:08d}", p, "jpg" if p.endswith(".jpg") else "bin", (i * 37) % 1001, meta))
    return out


def _python_shard(folder: str, samples, index: int = 0):
    w = TarShardWriter(folder, index)
    for key, p, ext, label, meta in samples:
        w.add(key, ext, _read(p), label, meta)
    return w.finish()


def _native_shard(folder: str, samples, index: int = 0, num_threads: int = 0, as_bytes: bool = False):
    w = NativeTarShardWriter(folder, index, num_threads)
    res = w.add_samples([wds_sample(k, _read(p) if as_bytes else p, e, lab, m) for k, p, e, lab, m in samples])
    return w.finish(), res


@pytest.mark.parametrize("num_threads", [1, 3])
@pytest.mark.parametrize("as_bytes", [False, True])
def test_byte_identical_to_the_python_writer(images, tmp_path, num_threads, as_bytes):
    samples = _samples(images)
    (tmp_path / "py").mkdir()
    (tmp_path / "nat").mkdir()
    theirs = _python_shard(str(tmp_path / "py"), samples)
    ours, res = _native_shard(str(tmp_path / "nat"), samples, num_threads=num_threads, as_bytes=as_bytes)
    assert ours == theirs  # name, size, sha256, num_samples
    for suffix in (".tar", ".idx"):
        a = _read(str(tmp_path / "py" / ("shard-000000" + suffix)))
        b = _read(str(tmp_path / "nat" / ("shard-000000" + suffix)))
        assert a == b, suffix
    tar = _read(str(tmp_path / "nat" / "shard-000000.tar"))
    assert hashlib.sha256(tar).hexdigest() == ours.sha256 and len(tar) == ours.bytes
    assert not os.path.exists(str(tmp_path / "nat" / "shard-000000.tar.tmp"))
    # Every member's offset, size and xxh3 describe the stored bytes; the image bytes are the source's.
    for (key, p, ext, label, meta), r in zip(samples, res):
        assert r.ok and [m.ext for m in r.members] == [ext, "cls"] + (["json"] if meta else [])
        for m in r.members:
            stored = tar[m.offset : m.offset + m.size]
            assert m.xxh3 == xxhash.xxh3_64_intdigest(stored)
        assert tar[r.image.offset : r.image.offset + r.image.size] == _read(p)
        assert (r.meta is None) == (meta is None)


def test_index_is_what_dali_wds2idx_writes(images, tmp_path):
    wds2idx = pytest.importorskip("wds2idx")
    info, _ = _native_shard(str(tmp_path), _samples(images))
    theirs = str(tmp_path / "theirs.idx")
    with wds2idx.IndexCreator(str(tmp_path / info.path), theirs, verbose=False) as ic:
        ic.create_index()
    assert _read(str(tmp_path / "shard-000000.idx")) == _read(theirs)


def test_tarfile_reads_it_back(images, tmp_path):
    samples = _samples(images[:10])
    _native_shard(str(tmp_path), samples)
    with tarfile.open(str(tmp_path / "shard-000000.tar")) as tf:
        names = tf.getnames()
        assert names[:3] == [f"{samples[0][0]}.jpg", f"{samples[0][0]}.cls", f"{samples[0][0]}.json"]
        assert tf.extractfile(f"{samples[1][0]}.jpg").read() == _read(samples[1][1])
        assert tf.extractfile(f"{samples[1][0]}.cls").read() == b"%d" % samples[1][3]


def test_unreadable_files_drop_their_sample_only(images, tmp_path):
    """Missing file, a directory, a FIFO (must not block) and a file that cannot be opened: each sample is left out
    whole with an error naming the file; the shard equals the Python writer's shard of the remaining samples."""
    src = tmp_path / "src"
    src.mkdir()
    fifo = src / "pipe.jpg"
    os.mkfifo(fifo)
    locked = src / "locked.jpg"
    locked.write_bytes(b"\xff\xd8secret")
    os.chmod(locked, 0)
    good = _samples(images[:12])
    bad_paths = [str(src / "missing.jpg"), str(src), str(fifo)]
    if os.geteuid() != 0:  # root opens anything
        bad_paths.append(str(locked))
    mixed = list(good)
    for j, p in enumerate(bad_paths):
        mixed.insert(2 + 3 * j, (f"bad{j}", p, "jpg", 1, None))
    (tmp_path / "nat").mkdir()
    (tmp_path / "py").mkdir()
    info, res = _native_shard(str(tmp_path / "nat"), mixed, num_threads=2)
    bad = {s[0]: r for s, r in zip(mixed, res) if s[0].startswith("bad")}
    assert len(bad) == len(bad_paths)
    for (key, r), p in zip(sorted(bad.items()), bad_paths):
        assert not r.ok and p in r.error and r.errno != 0, (key, r)
    assert "not a regular file" in bad["bad1"].error and "not a regular file" in bad["bad2"].error
    theirs = _python_shard(str(tmp_path / "py"), good)
    assert info == theirs
    assert _read(str(tmp_path / "nat" / info.path)) == _read(str(tmp_path / "py" / info.path))
    assert _read(str(tmp_path / "nat" / "shard-000000.idx")) == _read(str(tmp_path / "py" / "shard-000000.idx"))


def test_write_shards_cuts_where_pack_cuts(images, tmp_path):
    samples = _samples(images)
    shard_size = 60_000
    (tmp_path / "nat").mkdir()
    (tmp_path / "py").mkdir()
    shards, res = write_shards([wds_sample(k, p, e, lab, m) for k, p, e, lab, m in samples], str(tmp_path / "nat"),
                               shard_size=shard_size, num_threads=2, chunk=7)
    assert all(r.ok for r in res) and len(shards) > 2
    # pack/run.py's rule with the Python writer: a sample opens a new shard when the current one holds samples
    # and its bytes plus this image would pass shard_size.
    expected, w, index = [], None, 0
    for key, p, ext, label, meta in samples:
        data = _read(p)
        if w is not None and w.num_samples and w.bytes_written + len(data) > shard_size:
            expected.append(w.finish())
            w = None
        if w is None:
            w, index = TarShardWriter(str(tmp_path / "py"), index), index + 1
        w.add(key, ext, data, label, meta)
    expected.append(w.finish())
    assert shards == expected
    for s in shards:
        assert _read(str(tmp_path / "nat" / s.path)) == _read(str(tmp_path / "py" / s.path))


def test_bad_member_names_are_refused_before_writing(tmp_path):
    w = NativeTarShardWriter(str(tmp_path), 0)
    with pytest.raises(ValueError, match="100"):
        w.add_samples([wds_sample("k" * 100, b"x", "jpg", 0)])
    with pytest.raises(ValueError, match="NUL"):
        w.add_samples([wds_sample("a\x00b", b"x", "jpg", 0)])
    assert w.bytes_written == 0
    w.abort()
    assert os.listdir(tmp_path) == []


def test_abort_removes_the_partial_shard(images, tmp_path):
    w = NativeTarShardWriter(str(tmp_path), 3)
    assert all(r.ok for r in w.add_samples([wds_sample("a", images[0], "jpg", 0)]))
    assert w.bytes_written > 0 and os.path.exists(str(tmp_path / "shard-000003.tar.tmp"))
    w.abort()
    assert os.listdir(tmp_path) == []


def test_native_xxh3_matches_the_xxhash_package():
    from fastfeed import _native

    rng = np.random.default_rng(0)
    for n in (0, 1, 3, 16, 17, 128, 129, 240, 241, 1000, 1 << 20):
        data = rng.integers(0, 256, n, dtype=np.uint8).tobytes()
        assert _native.xxh3_64(data) == xxhash.xxh3_64_intdigest(data)


def test_check_keeps_drops_and_replaces_like_the_python_writer(images, tmp_path):
    """The check sees each image's bytes before it is written; its decisions give the same shard as the Python
    writer fed the kept/replaced samples."""
    samples = _samples(images[:15])
    seen = {}

    def check(i, data):
        seen[i] = bytes(data)
        assert data.readonly
        if i % 5 == 1:
            return "bad image header: test"
        if i % 5 == 3:
            return ("png", b"converted-%d" % i * (i + 1))
        return None

    (tmp_path / "nat").mkdir()
    (tmp_path / "py").mkdir()
    w = NativeTarShardWriter(str(tmp_path / "nat"), 0, num_threads=2)
    res = w.add_samples([wds_sample(k, p, e, lab, m) for k, p, e, lab, m in samples], check=check)
    ours = w.finish()
    assert seen == {i: _read(s[1]) for i, s in enumerate(samples)}
    py = TarShardWriter(str(tmp_path / "py"), 0)
    for i, ((key, p, ext, label, meta), r) in enumerate(zip(samples, res)):
        if i % 5 == 1:
            assert not r.ok and r.error == "bad image header: test" and r.errno == 0
            continue
        data, e = (b"converted-%d" % i * (i + 1), "png") if i % 5 == 3 else (_read(p), ext)
        py.add(key, e, data, label, meta)
        assert r.ok and r.image.ext == e and r.image.xxh3 == xxhash.xxh3_64_intdigest(data)
    assert ours == py.finish()
    for suffix in (".tar", ".idx"):
        name = f"shard-000000{suffix}"
        assert _read(str(tmp_path / "nat" / name)) == _read(str(tmp_path / "py" / name))


def test_a_view_kept_by_the_check_stays_valid(images, tmp_path):
    """Views the check keeps pin their buffer: later samples never overwrite them, even after finish()."""
    kept = []
    w = NativeTarShardWriter(str(tmp_path), 0, num_threads=2)
    samples = [wds_sample(f"{i:04d}", images[i % len(images)], "jpg", 0) for i in range(200)]
    w.add_samples(samples, check=lambda i, d: kept.append((i, d)) if i % 7 == 0 else None)
    w.finish()
    del w
    for i, view in kept:
        assert bytes(view) == _read(images[i % len(images)])
        with pytest.raises(TypeError):
            view[0] = 0


def test_a_check_that_raises_propagates_and_the_writer_refuses_more(images, tmp_path):
    def check(i, data):
        if i == 3:
            raise KeyError("boom")

    w = NativeTarShardWriter(str(tmp_path), 0, num_threads=2)
    with pytest.raises(KeyError, match="boom"):
        w.add_samples([wds_sample(f"{i:04d}", images[i], "jpg", 0) for i in range(10)], check=check)
    with pytest.raises(RuntimeError, match="unusable"):
        w.add_samples([wds_sample("x", images[0], "jpg", 0)])
    w.abort()
    assert os.listdir(tmp_path) == []


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_a_failed_write_raises_and_the_writer_refuses_more(images):
    """Writes to /dev/full fail with ENOSPC: add() raises it (workers mid-flight drop their samples), then refuses."""
    import errno

    from fastfeed import _native

    w = _native.TarWriter("/dev/full", 3)
    with pytest.raises(OSError) as info:
        w.add([[(f"{i:04d}.jpg", images[i % len(images)])] for i in range(100)])
    assert info.value.errno == errno.ENOSPC
    with pytest.raises(RuntimeError, match="unusable"):
        w.add([[("x.jpg", images[0])]])
    w.abort()
