"""The ring's reader threads compute each sample's xxh3_64 (`PrefetchRing(digests=True)`), equal to python-xxhash's
and to the checksum the packer stored, in arena slots and overflow buffers alike; the Loader checks with them."""
from __future__ import annotations

import os
import tempfile

import numpy as np
import pytest
import xxhash
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fastfeed.loader.ring import PrefetchRing
from fastfeed.types import Extents

EXAMPLES = 6 if os.environ.get("FASTFEED_RING_SANITIZE") else 25


def _pack(tmp_path, kind: str, n: int = 48):
    """A real packed dataset of real JPEGs (noise, 24-160 px: 1-60 KB each, so batch sizes vary a lot)."""
    from PIL import Image

    from fastfeed.datasets import open_dataset
    from fastfeed.pack.run import PackOptions, pack

    rng = np.random.default_rng(1)
    for i in range(n):
        folder = tmp_path / "src" / f"class{i % 3}"
        folder.mkdir(parents=True, exist_ok=True)
        w, h = (int(v) for v in rng.integers(24, 160, 2))
        Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(folder / f"{i}.jpg", quality=95)
    out = tmp_path / kind
    pack(str(tmp_path / "src"), str(out), PackOptions(format=kind, workers=1, shard_size=200_000))
    return open_dataset(out)


@pytest.mark.parametrize("kind", ["wds", "lmdb"])
def test_digests_are_the_xxh3_of_every_sample_and_the_packed_checksum(tmp_path, kind):
    batch = 5
    with _pack(tmp_path, kind) as ds:
        assert ds.checksums is not None
        ext = ds.extents()
        # A slot holds a batch of median size: the bigger half of the batches goes to the overflow buffers.
        slot_bytes = int(np.median([ext.size[i:i + batch].sum() for i in range(0, len(ds), batch)]))
        with PrefetchRing(ext, batch, num_threads=3, num_slots=2, slot_bytes=slot_bytes, pin_memory=False,
                          digests=True) as ring:
            for epoch in range(2):  # 10 batches per epoch through 2 slots: each slot is reused many times
                order = np.random.default_rng(epoch).permutation(len(ds))
                ring.start(order)
                done = 0
                while (b := ring.next_batch(timeout=30)) is not None:
                    with b:
                        np.testing.assert_array_equal(b.indices, order[done:done + batch])
                        assert b.digests.dtype == np.uint64 and len(b.digests) == len(b)
                        want = [xxhash.xxh3_64_intdigest(s) for s in b.samples()]
                        assert b.digests.tolist() == want
                        assert want == ds.checksums[b.indices].tolist()
                        done += len(b)
                assert done == len(ds)
            stats = ring.stats()
        assert 0 < stats["overflow_batches"] < stats["batches"] == 2 * -(-len(ds) // batch)
        assert stats["digests"] is True and stats["digest_seconds"] > 0


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(sizes=st.lists(st.integers(0, 30_000), min_size=1, max_size=40), batch_size=st.integers(1, 9),
       num_threads=st.integers(1, 4), num_slots=st.integers(1, 3), slot_bytes=st.sampled_from([None, 1, 16384]),
       windowed=st.booleans(), seed=st.integers(0, 2**16))
def test_digests_for_any_layout(sizes, batch_size, num_threads, num_slots, slot_bytes, windowed, seed):
    """Empty samples, one-page slots (every batch overflows), one slot, more threads than samples; each digest over
    the whole read or over its sample's window (anywhere inside, empty ones too)."""
    rng = np.random.default_rng(seed)
    n = np.asarray(sizes, np.int64)
    at = (rng.random(len(n)) * (n + 1)).astype(np.int64)
    length = (rng.random(len(n)) * (n - at + 1)).astype(np.int64)
    if not windowed:
        at, length = np.zeros_like(n), n
    with tempfile.TemporaryDirectory() as root:
        blob = rng.integers(0, 256, sum(sizes) + 100, dtype=np.uint8).tobytes()
        path = os.path.join(root, "data.bin")
        with open(path, "wb") as f:
            f.write(blob)
        offsets = np.concatenate(([0], np.cumsum(sizes)[:-1])).astype(np.int64) + 7
        ext = Extents([path], np.zeros(len(sizes), np.int32), offsets, n)
        order = rng.integers(0, len(sizes), 2 * len(sizes))
        got = []
        with PrefetchRing(ext, batch_size, num_threads=num_threads, num_slots=num_slots, slot_bytes=slot_bytes,
                          pin_memory=False, digests=True, digest_window=(at, length) if windowed else None) as ring:
            ring.start(order)
            while (b := ring.next_batch(timeout=30)) is not None:
                with b:
                    got.extend(b.digests.tolist())
    want = [xxhash.xxh3_64_intdigest(blob[o + a:o + a + s]) for o, a, s in zip(offsets[order], at[order],
                                                                               length[order])]
    assert got == want


@pytest.mark.parametrize("at, length, match", [
    ([0, 5], [10, 6], "sample 1 is not inside"),   # past the end of a 10-byte read
    ([-1, 0], [1, 1], "sample 0 is not inside"),
    ([0], [1], "one entry per sample"),
])
def test_a_digest_window_outside_its_read_is_refused(tmp_path, at, length, match):
    path = tmp_path / "data.bin"
    path.write_bytes(bytes(20))
    ext = Extents([str(path)], np.zeros(2, np.int32), np.array([0, 10]), np.array([10, 10]))
    with pytest.raises(ValueError, match=match):
        PrefetchRing(ext, 2, pin_memory=False, digests=True, digest_window=(np.array(at), np.array(length)))


def test_no_digests_unless_asked(tmp_path):
    with _pack(tmp_path, "wds", n=12) as ds:
        with PrefetchRing(ds.extents(), 4, num_threads=2, num_slots=2, pin_memory=False) as ring:
            ring.start(np.arange(len(ds)))
            while (b := ring.next_batch(timeout=30)) is not None:
                with b:
                    assert b.digests is None
            stats = ring.stats()
    assert stats["digests"] is False and stats["digest_seconds"] == 0
