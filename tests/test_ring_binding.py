"""The binding boundary of the ring (csrc/ring_bindings.cpp): typed status values, a read failure with named fields,
and construction (arena allocation + prefault) that lets other Python threads run."""
from __future__ import annotations

import os
import tempfile
import threading
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


def test_construction_does_not_hold_the_gil():
    """A Python thread keeps running while a large arena is allocated and prefaulted.

    With the GIL held for the whole constructor, the ticking thread's longest pause is the construction time;
    released, it is about the interpreter's switch interval. The arena is made large enough that construction takes
    well over 100 ms, and the bound is half of it, so scheduling noise on a busy machine does not decide the test.
    """
    with tempfile.TemporaryDirectory() as root:
        path = _one_file(root, 4096)
        stamps: list[float] = []
        done = threading.Event()

        def tick():
            while not done.is_set():
                stamps.append(time.perf_counter())
                time.sleep(0.001)

        arena = 512 << 20
        t = threading.Thread(target=tick)
        t.start()
        try:
            time.sleep(0.05)
            t0 = time.perf_counter()
            ring = _native.Ring([path], np.zeros(1, np.int32), np.zeros(1, np.int64), np.ones(1, np.int64), 1, 1,
                                4, arena // 4)
            t1 = time.perf_counter()
        finally:
            done.set()
            t.join()
        ring.stop()
        del ring
        during = [s for s in stamps if t0 <= s <= t1]
        construct = t1 - t0
        gaps = np.diff([t0, *during, t1])
        assert construct > 0.05, f"construction took only {construct * 1e3:.0f} ms: the test cannot tell"
        assert gaps.max() < construct / 2, (
            f"a Python thread stalled {gaps.max() * 1e3:.0f} ms of a {construct * 1e3:.0f} ms construction")
