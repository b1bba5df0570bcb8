"""The binding boundary of the ring (csrc/ring_bindings.cpp): typed status values, a read failure with named
fields, and construction that reserves the arena without touching it (the readers fault each slot in as they fill
it)."""
from __future__ import annotations

import os
import tempfile
import time

import numpy as np

from fastfeed import _native


def _one_file(root: str, n: int) -> str:
    path = os.path.join(root, "data.bin")
    with open(path, "wb") as f:
        f.write(bytes(range(256)) * (n // 256 + 1))
    return path


def test_next_returns_typed_status_values():
    with tempfile.TemporaryDirectory() as root:
        path = _one_file(root, 1024)
        ring = _native.Ring([path], np.zeros(2, np.int32), np.array([0, 100]), np.array([100, 50]), 1, 1, 2, 4096)
        st, handle = ring.next(0.0)
        assert st == _native.RingStatus.not_started and handle is None
        ring.start(np.array([1, 0]))
        st, handle = ring.next(5.0)
        assert st == _native.RingStatus.ok and handle.error is None
        assert bytes(memoryview(handle)) == bytes(range(256))[100:150]
        handle.release()
        st, handle = ring.next(5.0)
        assert st == _native.RingStatus.ok
        handle.release()
        st, handle = ring.next(5.0)
        assert st == _native.RingStatus.end_of_epoch and handle is None
        ring.stop()
        st, _ = ring.next(0.0)
        assert st == _native.RingStatus.closed
        assert isinstance(st, _native.RingStatus) and st != _native.RingStatus.ok


def test_read_failure_has_named_fields():
    with tempfile.TemporaryDirectory() as root:
        path = _one_file(root, 1000)
        size = os.path.getsize(path)
        ring = _native.Ring([path], np.zeros(2, np.int32), np.array([0, size - 10]), np.array([10, 40]), 2, 1, 2,
                            4096)
        ring.start(np.array([0, 1]))
        st, handle = ring.next(5.0)
        assert st == _native.RingStatus.ok
        f = handle.error
        assert isinstance(f, _native.RingReadFailure)
        assert (f.sample_index, f.path, f.offset, f.length, f.errno) == (1, path, size - 10, 40, 5)
        assert "short read" in f.message and path in f.message and "got 10" in f.message
        assert "sample_index=1" in repr(f)
        handle.release()
        ring.stop()


def _resident_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_construction_leaves_the_arena_untouched_and_the_readers_fault_in_what_they_fill():
    """A 2 GiB arena costs no resident memory (and no time) until batches are read into it: 12-MP photos make the
    arena ~12 GB, and touching it all in the constructor delayed the first batch by seconds. Reading one 16 MiB
    batch makes about that much resident, not the arena. (Bounds are loose: sanitizer builds map shadow memory.)"""
    with tempfile.TemporaryDirectory() as root:
        n = 16 << 20
        path = _one_file(root, n)
        slot = 512 << 20
        before = _resident_bytes()
        t0 = time.perf_counter()
        ring = _native.Ring([path], np.zeros(1, np.int32), np.zeros(1, np.int64), np.array([n]), 1, 2, 4, slot)
        try:
            built = time.perf_counter() - t0
            grown = _resident_bytes() - before
            assert ring.arena_bytes == 4 * slot
            assert grown < (256 << 20), f"constructing a 2 GiB ring made {grown >> 20} MiB resident"
            assert built < 1.0, f"constructing a 2 GiB ring took {built:.2f} s"
            ring.start(np.array([0]))
            st, handle = ring.next(10.0)
            assert st == _native.RingStatus.ok and handle.error is None
            assert bytes(memoryview(handle)[:256]) == bytes(range(256))
            read = _resident_bytes() - before
            assert n - (4 << 20) <= read < (512 << 20), f"one 16 MiB batch made {read >> 20} MiB resident"
            handle.release()
        finally:
            ring.stop()
