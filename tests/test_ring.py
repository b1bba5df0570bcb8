"""The native prefetch ring delivers exactly the source bytes, in order, for any layout and configuration."""
from __future__ import annotations

import errno
import io
import os
import tarfile
import tempfile

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fastfeed.loader.ring import PrefetchRing, RingBatch, RingReadError, auto_slot_bytes
from fastfeed.types import Extents

# Fewer examples under the sanitizer run (tools/sanitize.sh), which is ~10x slower per example.
EXAMPLES = 8 if os.environ.get("FASTFEED_RING_SANITIZE") else 30


def write_files(root: str, sizes: list[int], num_files: int, seed: int) -> tuple[Extents, list[bytes]]:
    """Samples spread round-robin over `num_files` files with random gaps, as shards would be."""
    rng = np.random.default_rng(seed)
    payloads = [rng.integers(0, 256, s, dtype=np.uint8).tobytes() for s in sizes]
    files = [bytearray() for _ in range(num_files)]
    file_index, offset = [], []
    for i, p in enumerate(payloads):
        f = i % num_files
        files[f] += rng.integers(0, 256, int(rng.integers(0, 700)), dtype=np.uint8).tobytes()  # a header, say
        file_index.append(f)
        offset.append(len(files[f]))
        files[f] += p
    paths = []
    for f, content in enumerate(files):
        path = os.path.join(root, f"file-{f}.bin")
        with open(path, "wb") as fh:
            fh.write(bytes(content))
        paths.append(path)
    ext = Extents(paths, np.array(file_index, np.int32), np.array(offset, np.int64), np.array(sizes, np.int64))
    return ext, payloads


def drain(ring: PrefetchRing, batch_size: int, expected_order: np.ndarray) -> list[bytes]:
    got = []
    position = 0
    while (b := ring.next_batch(timeout=30)) is not None:
        with b:
            assert isinstance(b, RingBatch)
            np.testing.assert_array_equal(b.indices, expected_order[position : position + batch_size])
            samples = b.samples()
            assert len(samples) == len(b.indices) == len(b)
            assert all(s.dtype == np.uint8 and s.base is not None for s in samples)  # views, not copies
            assert b.data.nbytes == int(b.sizes.sum())
            got.extend(bytes(s) for s in samples)
            position += len(samples)
    assert position == len(expected_order)
    return got


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    sizes=st.lists(st.integers(0, 20_000), min_size=1, max_size=50),
    num_files=st.integers(1, 4),
    batch_size=st.integers(1, 17),
    num_threads=st.integers(1, 6),
    num_slots=st.integers(1, 4),
    slot_bytes=st.sampled_from([None, 1, 8192, 65536]),
    seed=st.integers(0, 2**16),
    repeats=st.booleans(),
)
def test_bytes_equal_source_in_order(sizes, num_files, batch_size, num_threads, num_slots, slot_bytes, seed, repeats):
    """slot_bytes=1 (one page) makes most batches bigger than a slot: they must still arrive intact."""
    with tempfile.TemporaryDirectory() as root:
        ext, payloads = write_files(root, sizes, num_files, seed)
        rng = np.random.default_rng(seed)
        order = rng.integers(0, len(sizes), 2 * len(sizes)) if repeats else rng.permutation(len(sizes))
        with PrefetchRing(ext, batch_size, num_threads=num_threads, num_slots=num_slots, slot_bytes=slot_bytes,
                          pin_memory=False) as ring:
            for _epoch in range(2):  # a second epoch after a drained one
                ring.start(order)
                assert drain(ring, batch_size, order) == [payloads[i] for i in order]
                assert ring.next_batch() is None  # stays at the end
            stats = ring.stats()
    assert stats["batches"] == 2 * -(-len(order) // batch_size)
    assert stats["bytes_read"] == 2 * sum(sizes[i] for i in order)
    assert stats["slots"] == num_slots and stats["pinned"] is False


def test_tar_shard_members():
    """Real tar shards: members' data extents come from the tar headers, and the ring reads exactly them."""
    rng = np.random.default_rng(3)
    with tempfile.TemporaryDirectory() as root:
        paths, members = [], []
        for shard in range(2):
            path = os.path.join(root, f"shard-{shard:06d}.tar")
            with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
                for k in range(25):
                    data = rng.integers(0, 256, int(rng.integers(1, 150_000)), dtype=np.uint8).tobytes()
                    for ext, payload in ((".cls", str(k).encode()), (".jpg", data)):
                        info = tarfile.TarInfo(f"{shard:02d}{k:06d}{ext}")
                        info.size = len(payload)
                        tar.addfile(info, io.BytesIO(payload))
            paths.append(path)
            # Walk the ustar headers ourselves: 512-byte header, then data padded to 512.
            with open(path, "rb") as f:
                blob = f.read()
            pos = 0
            while blob[pos : pos + 512].strip(b"\0"):
                name = blob[pos : pos + 100].rstrip(b"\0").decode()
                size = int(blob[pos + 124 : pos + 136].strip(b"\0 ") or b"0", 8)
                if name.endswith(".jpg"):
                    members.append((shard, pos + 512, size, blob[pos + 512 : pos + 512 + size]))
                pos += 512 + -(-size // 512) * 512
        assert len(members) == 50
        ext = Extents(paths, np.array([m[0] for m in members], np.int32), np.array([m[1] for m in members]),
                      np.array([m[2] for m in members]))
        order = rng.permutation(len(members))
        with PrefetchRing(ext, 8, num_threads=3, num_slots=3, pin_memory=False) as ring:
            assert ring.stats()["slot_bytes"] == auto_slot_bytes(ext.size, 8)
            ring.start(order)
            assert drain(ring, 8, order) == [members[i][3] for i in order]


def _packed(tmp_path, kind: str):
    """A real packed dataset of small real JPEGs in two class folders, written by the packer."""
    from PIL import Image

    from fastfeed.datasets import open_dataset
    from fastfeed.pack.run import PackOptions, pack

    rng = np.random.default_rng(0)
    for i in range(20):
        folder = tmp_path / "src" / f"class{i % 2}"
        folder.mkdir(parents=True, exist_ok=True)
        size = (int(rng.integers(16, 80)), int(rng.integers(16, 80)))
        Image.fromarray(rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)).save(folder / f"{i}.jpg")
    out = tmp_path / kind
    pack(str(tmp_path / "src"), str(out), PackOptions(format=kind, workers=1, shard_size=20_000))
    return open_dataset(out)


@pytest.mark.parametrize("kind", ["wds", "lmdb"])
def test_packed_dataset_extents(tmp_path, kind):
    with _packed(tmp_path, kind) as ds:
        order = np.random.default_rng(0).permutation(len(ds))
        expected = [ds.read(int(i)) for i in order]
        with PrefetchRing(ds.extents(), 5, num_threads=2, num_slots=2, pin_memory=False) as ring:
            ring.start(order)
            assert drain(ring, 5, order) == expected


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    epochs=st.lists(st.integers(0, 23), min_size=1, max_size=4),
    batch_size=st.integers(1, 7),
    num_threads=st.integers(1, 4),
    num_slots=st.integers(1, 4),
    extend_after=st.integers(0, 30),
    seed=st.integers(0, 2**16),
)
def test_extend_reads_on_into_the_next_epochs(epochs, batch_size, num_threads, num_slots, extend_after, seed):
    """Epochs queued with extend() come out back to back, each batched from its own start (an epoch's last batch may
    be short), positions counting from 0 per epoch; extend() may come before or after the consumer took the queued
    epoch's batches, and never drops one."""
    with tempfile.TemporaryDirectory() as root:
        sizes = list(np.random.default_rng(seed).integers(0, 3000, 23))
        ext, payloads = write_files(root, sizes, 2, seed)
        rng = np.random.default_rng(seed + 1)
        orders = [rng.permutation(23)[:n] for n in epochs]
        expected = [(e, p, o[p * batch_size:(p + 1) * batch_size]) for e, o in enumerate(orders)
                    for p in range(-(-len(o) // batch_size))]
        got = []
        with PrefetchRing(ext, batch_size, num_threads=num_threads, num_slots=num_slots, pin_memory=False) as ring:
            ring.start(orders[0])
            queued, taken = 1, 0
            while True:
                if queued < len(orders) and taken >= min(extend_after, sum(e[0] < queued for e in expected)):
                    ring.extend(orders[queued])
                    queued += 1
                    continue
                b = ring.next_batch(timeout=30)
                if b is None:
                    break
                with b:
                    got.append((b.position, b.indices.copy(), [bytes(s) for s in b.samples()]))
                taken += 1
        assert len(got) == len(expected)
        for (position, indices, data), (_, want_position, want) in zip(got, expected):
            assert position == want_position
            np.testing.assert_array_equal(indices, want)
            assert data == [payloads[i] for i in want]


def test_extend_queues_behind_held_batches():
    """The next epoch is read into the slots its predecessor's batches free, while one of them is still held: no
    reset, nothing waited for (start() would drop the read-ahead and could not reuse a held batch's slot number)."""
    with tempfile.TemporaryDirectory() as root:
        ext, payloads = write_files(root, [2000] * 10, 2, 9)
        with PrefetchRing(ext, 4, num_threads=2, num_slots=3, pin_memory=False) as ring:
            ring.start(np.arange(10))  # batches of 4, 4, 2
            first = ring.next_batch(timeout=10)
            ring.extend(np.arange(10)[::-1].copy())
            rest = [ring.next_batch(timeout=10) for _ in range(2)]
            first.release()  # frees the slot batch 3 (the new epoch's first) goes to
            nxt = ring.next_batch(timeout=10)
            assert nxt.position == 0 and list(nxt.indices) == [9, 8, 7, 6]
            assert [bytes(s) for s in nxt.samples()] == [payloads[i] for i in (9, 8, 7, 6)]
            for b in rest + [nxt]:
                b.release()
            assert [list(b.indices) for b in iter(lambda: ring.next_batch(timeout=10), None)] == [[5, 4, 3, 2], [1, 0]]


def test_extend_needs_a_started_ring():
    with tempfile.TemporaryDirectory() as root:
        ext, _ = write_files(root, [10] * 4, 1, 5)
        with PrefetchRing(ext, 2, pin_memory=False) as ring:
            with pytest.raises(RuntimeError, match="start"):
                ring.extend(np.arange(4))
            ring.start(np.arange(4))
            with pytest.raises(IndexError, match="out of range"):
                ring.extend(np.array([0, 9]))


def test_restart_mid_epoch_abandons_the_rest():
    with tempfile.TemporaryDirectory() as root:
        ext, payloads = write_files(root, [3000] * 40, 2, 1)
        with PrefetchRing(ext, 4, num_threads=3, num_slots=3, pin_memory=False) as ring:
            ring.start(np.arange(40))
            held = ring.next_batch()  # still held when the next epoch starts: its slot waits for it
            ring.next_batch().release()
            order = np.arange(40)[::-1].copy()
            ring.start(order)
            assert bytes(held.samples()[0]) == payloads[0]
            held.release()
            assert drain(ring, 4, order) == [payloads[i] for i in order]


def test_unreleased_batches_are_reported_not_hung():
    with tempfile.TemporaryDirectory() as root:
        ext, _ = write_files(root, [100] * 10, 1, 2)
        with PrefetchRing(ext, 2, num_threads=2, num_slots=2, pin_memory=False) as ring:
            ring.start(np.arange(10))
            a, b = ring.next_batch(), ring.next_batch()
            with pytest.raises(RuntimeError, match="release"):
                ring.next_batch(timeout=5)
            a.release()
            c = ring.next_batch(timeout=5)
            np.testing.assert_array_equal(c.indices, [4, 5])
            b.release()
            c.release()


def test_dropped_batch_returns_its_slot_after_its_last_view():
    with tempfile.TemporaryDirectory() as root:
        ext, payloads = write_files(root, [100] * 6, 1, 3)
        with PrefetchRing(ext, 2, num_threads=1, num_slots=1, pin_memory=False) as ring:
            ring.start(np.arange(6))
            view = ring.next_batch().samples()[1]  # the batch object itself is dropped at once
            with pytest.raises(RuntimeError, match="release"):
                ring.next_batch(timeout=5)  # the live view still holds the one slot
            assert bytes(view) == payloads[1]
            del view
            np.testing.assert_array_equal(ring.next_batch(timeout=5).indices, [2, 3])


def test_released_batch_refuses_access():
    with tempfile.TemporaryDirectory() as root:
        ext, _ = write_files(root, [10] * 4, 1, 4)
        with PrefetchRing(ext, 2, num_threads=1, num_slots=2, pin_memory=False) as ring:
            ring.start(np.arange(4))
            b = ring.next_batch()
            b.release()
            b.release()  # idempotent
            with pytest.raises(ValueError, match="released"):
                b.samples()


def test_bad_arguments_raise():
    with tempfile.TemporaryDirectory() as root:
        ext, _ = write_files(root, [10] * 4, 1, 5)
        with pytest.raises(ValueError, match="batch_size"):
            PrefetchRing(ext, 0)
        with pytest.raises(ValueError, match="num_threads"):
            PrefetchRing(ext, 2, num_threads=0)
        bad = Extents(ext.paths, np.array([0, 0, 0, 7], np.int32), ext.offset, ext.size)
        with pytest.raises(ValueError, match="file_index"):
            PrefetchRing(bad, 2)
        with PrefetchRing(ext, 2, pin_memory=False) as ring:
            with pytest.raises(IndexError, match="out of range"):
                ring.start(np.array([0, 4]))
            with pytest.raises(ValueError, match="integer"):
                ring.start(np.array([0.5]))
            with pytest.raises(RuntimeError, match="start"):
                ring.next_batch()
            ring.start(np.array([], np.int64))
            assert ring.next_batch() is None


# ---- errors: raised at the batch that hit them, naming file and offset; the ring goes on -------------------------


def _expect_error_then_continue(ring, ext, payloads, order, bad_batch, err_no, match, path, offset, sample):
    for position in range(-(-len(order) // 2)):
        if position == bad_batch:
            with pytest.raises(RingReadError, match=match) as info:
                ring.next_batch(timeout=10)
            e = info.value
            assert isinstance(e, OSError) and e.errno == err_no
            assert e.filename == path and e.offset == offset and e.batch_index == bad_batch
            assert e.sample_index == sample and e.length == int(ext.size[sample])
            assert path in str(e) and str(offset) in str(e)
            continue
        with ring.next_batch(timeout=10) as b:
            assert [bytes(s) for s in b.samples()] == [payloads[i] for i in b.indices]
    assert ring.next_batch() is None


@pytest.mark.parametrize("num_threads", [1, 4])
def test_deleted_file(num_threads):
    with tempfile.TemporaryDirectory() as root:
        ext, payloads = write_files(root, [500] * 12, 3, 6)
        os.unlink(ext.paths[1])  # samples 1, 4, 7, 10
        with PrefetchRing(ext, 2, num_threads=num_threads, num_slots=2, pin_memory=False) as ring:
            order = np.array([0, 2, 3, 5, 7, 6, 8, 9, 11, 0])
            ring.start(order)
            _expect_error_then_continue(ring, ext, payloads, order, 2, errno.ENOENT, "cannot open",
                                        ext.paths[1], int(ext.offset[7]), 7)


def test_truncated_shard():
    with tempfile.TemporaryDirectory() as root:
        ext, payloads = write_files(root, [1000] * 8, 1, 7)
        os.truncate(ext.paths[0], int(ext.offset[5]) + 10)  # sample 5 is cut short, 6 and 7 are gone
        with PrefetchRing(ext, 2, num_threads=2, num_slots=3, pin_memory=False) as ring:
            order = np.array([0, 1, 2, 5, 3, 4])
            ring.start(order)
            _expect_error_then_continue(ring, ext, payloads, order, 1, errno.EIO, "short read.*got 10",
                                        ext.paths[0], int(ext.offset[5]), 5)


def test_extent_past_end_of_file_is_a_short_read():
    with tempfile.TemporaryDirectory() as root:
        ext, payloads = write_files(root, [100] * 4, 1, 8)
        far = Extents(ext.paths, ext.file_index, np.array([*ext.offset[:3], 10**9]), ext.size)
        with PrefetchRing(far, 2, num_threads=2, pin_memory=False) as ring:
            order = np.array([3, 0, 1, 2])
            ring.start(order)
            _expect_error_then_continue(ring, far, payloads, order, 0, errno.EIO, "short read.*got 0",
                                        ext.paths[0], 10**9, 3)


def test_read_error_from_the_kernel():
    """pread on a directory fails with EISDIR: a real I/O error path, not a short read."""
    with tempfile.TemporaryDirectory() as root:
        ext, payloads = write_files(root, [100] * 4, 1, 9)
        mixed = Extents([ext.paths[0], root], np.array([0, 0, 1, 0], np.int32), ext.offset, ext.size)
        with PrefetchRing(mixed, 2, num_threads=1, pin_memory=False) as ring:
            order = np.arange(4)
            ring.start(order)
            _expect_error_then_continue(ring, mixed, payloads, order, 1, errno.EISDIR, "read failed", root,
                                        int(ext.offset[2]), 2)
