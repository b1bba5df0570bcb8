"""Ring shutdown, back-pressure, fork and leak behaviour (NOTE [ Prefetch ring protocol ] in csrc/ring.h)."""
from __future__ import annotations

import gc
import os
import signal
import tempfile
import threading
import time

import numpy as np
import pytest

from fastfeed.loader.ring import PrefetchRing, RingClosedError, RingPinWarning
from fastfeed.types import Extents


def thread_count() -> int:
    return len(os.listdir("/proc/self/task"))


def settled_thread_count(quiet: float = 0.25, within: float = 5.0) -> int:
    """The process's thread count once it has not changed for `quiet` seconds: threads of earlier tests in this
    worker (a pool shutting down) may still be exiting, and a count taken meanwhile is not the baseline."""
    deadline = time.monotonic() + within
    count, since = thread_count(), time.monotonic()
    while time.monotonic() < deadline and time.monotonic() - since < quiet:
        time.sleep(0.02)
        now = thread_count()
        if now != count:
            count, since = now, time.monotonic()
    return count


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def wait_for_threads(expected: int, within: float = 1.0) -> int:
    deadline = time.monotonic() + within
    while thread_count() != expected and time.monotonic() < deadline:
        time.sleep(0.01)
    return thread_count()


@pytest.fixture
def shard():
    """One real file of 200 samples of 2-6 KB."""
    rng = np.random.default_rng(0)
    sizes = rng.integers(2000, 6000, 200)
    payloads = [rng.integers(0, 256, s, dtype=np.uint8).tobytes() for s in sizes]
    with tempfile.TemporaryDirectory() as root:
        path = os.path.join(root, "shard.bin")
        with open(path, "wb") as f:
            f.write(b"".join(payloads))
        offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]])
        extents = Extents([path], np.zeros(len(sizes), np.int32), offsets.astype(np.int64), sizes.astype(np.int64))
        yield extents, payloads


@pytest.fixture
def fifo():
    """A named pipe: a producer that opens it blocks in open() until a writer appears (a hung storage read)."""
    with tempfile.TemporaryDirectory() as root:
        path = os.path.join(root, "stuck")
        os.mkfifo(path)
        ext = Extents([path], np.zeros(4, np.int32), np.zeros(4, np.int64), np.full(4, 10, np.int64))
        yield ext, path


def unstick(path: str) -> None:
    # A writer lets the blocked open() return; the pread that follows fails at once (ESPIPE) and the thread exits.
    fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
    os.close(fd)


def test_close_with_producers_blocked_on_full_slots(shard):
    ext, _ = shard
    before = settled_thread_count()
    ring = PrefetchRing(ext, 8, num_threads=4, num_slots=2, pin_memory=False)
    ring.start(np.arange(200))
    held = ring.next_batch()
    time.sleep(0.1)  # every slot full: producers wait for the consumer
    assert thread_count() == before + 4
    t0 = time.monotonic()
    ring.close()
    ring.close()  # idempotent
    assert time.monotonic() - t0 < 1.0
    assert wait_for_threads(before) == before
    assert len(held.samples()) == 8  # memory outlives close while a batch is alive
    held.release()
    with pytest.raises(RingClosedError):
        ring.next_batch()
    assert ring.stats()["batches"] == 1


def test_bounded_read_ahead_under_slow_consumer(shard):
    ext, _ = shard
    sizes = ext.size
    with PrefetchRing(ext, 10, num_threads=4, num_slots=3, pin_memory=False) as ring:
        rss0 = rss_bytes()
        ring.start(np.arange(200))
        for i in range(20):
            with ring.next_batch(timeout=10):
                time.sleep(0.02)
            # Producers may be at most num_slots batches ahead of the consumer, never more.
            assert ring.stats()["bytes_read"] <= int(sizes[: (i + 1 + 3) * 10].sum())
        assert ring.next_batch() is None
        assert rss_bytes() - rss0 < 8 << 20


def test_close_from_another_thread_wakes_the_waiting_consumer(fifo):
    ext, path = fifo
    before = settled_thread_count()
    ring = PrefetchRing(ext, 2, num_threads=1, num_slots=2, pin_memory=False)
    ring.start(np.arange(4))
    outcome = []

    def consume():
        try:
            ring.next_batch()
            outcome.append("batch")
        except RingClosedError:
            outcome.append(("closed", time.monotonic()))

    consumer = threading.Thread(target=consume)
    consumer.start()
    time.sleep(0.2)
    assert outcome == []  # really waiting
    t0 = time.monotonic()
    closer = threading.Thread(target=ring.close)
    closer.start()
    consumer.join(timeout=2)
    assert not consumer.is_alive() and outcome[0][0] == "closed" and outcome[0][1] - t0 < 1.0
    unstick(path)  # only now can the producer, stuck in open(), see the stop flag
    closer.join(timeout=2)
    assert not closer.is_alive()
    assert wait_for_threads(before) == before


def test_ctrl_c_interrupts_a_waiting_consumer(fifo):
    # Ctrl-C is sent until it lands, at most 8 times, and the wait is bounded: a SIGINT that Python handles inside a
    # finalizer (a ring collected while the wait starts) is lost, and a single one once hung the suite for good (a
    # fresh-clone CI run on the 2-core box, 2026-12-01). One that lands must end the wait at once.
    ext, path = fifo
    gc.collect()  # no finalizer of an earlier test's objects runs during the wait
    ring = PrefetchRing(ext, 2, num_threads=1, pin_memory=False)
    ring.start(np.arange(4))
    done = threading.Event()
    sent = []

    def on_ctrl_c(signum, frame):  # Python's default handler, except that a late extra signal is dropped
        if not done.is_set():
            raise KeyboardInterrupt

    def ctrl_c():
        for _ in range(8):
            if done.wait(0.2):
                return
            sent.append(time.monotonic())
            os.kill(os.getpid(), signal.SIGINT)

    previous = signal.signal(signal.SIGINT, on_ctrl_c)
    sender = threading.Thread(target=ctrl_c)
    sender.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            ring.next_batch(timeout=5)
        interrupted = time.monotonic()
    finally:
        done.set()
        sender.join()
        signal.signal(signal.SIGINT, previous)
    assert sent and interrupted - sent[-1] < 0.5, (sent, interrupted)
    unstick(path)
    ring.close()


def test_exception_in_training_loop_joins_threads(shard):
    ext, _ = shard
    before = settled_thread_count()

    def train():
        with PrefetchRing(ext, 8, num_threads=3, num_slots=3, pin_memory=False) as ring:
            ring.start(np.arange(200))
            for step in range(100):
                batch = ring.next_batch()
                if step == 2:
                    raise KeyboardInterrupt  # as if Ctrl-C hit the training step; batch is still held
                batch.release()

    with pytest.raises(KeyboardInterrupt):
        train()
    assert wait_for_threads(before) == before


def test_garbage_collection_closes(shard):
    ext, _ = shard
    before = settled_thread_count()
    ring = PrefetchRing(ext, 8, num_threads=2, pin_memory=False)
    ring.start(np.arange(200))
    ring.next_batch()  # dropped unreleased
    del ring
    gc.collect()
    assert wait_for_threads(before) == before


def test_many_rings_leak_no_threads_or_memory(shard):
    ext, _ = shard
    before = settled_thread_count()

    def cycle():
        with PrefetchRing(ext, 16, num_threads=4, num_slots=4, slot_bytes=1 << 20, pin_memory=False) as ring:
            ring.start(np.arange(200))
            for _ in range(3):
                ring.next_batch().release()  # abandon the epoch with producers mid-flight

    for _ in range(10):
        cycle()
    gc.collect()
    rss0 = rss_bytes()
    for _ in range(60):  # 60 x 4 MiB arenas: a leak would show
        cycle()
    gc.collect()
    assert wait_for_threads(before) == before
    assert rss_bytes() - rss0 < 32 << 20


@pytest.mark.integration  # forks
def test_forked_child_sees_the_ring_closed(shard):
    ext, payloads = shard
    with PrefetchRing(ext, 4, num_threads=2, num_slots=2, pin_memory=False) as ring:
        ring.start(np.arange(200))
        first = ring.next_batch()
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # child: must neither hang nor touch the parent's threads
            code = 1
            try:
                try:
                    ring.next_batch()
                except RingClosedError as e:
                    code = 0 if "forked child" in str(e) else 2
                ring.close()
                first.release()
                del ring
                gc.collect()
                os.write(w, b"done")
            finally:
                os._exit(code)
        os.close(w)
        _, status = os.waitpid(pid, 0)
        assert os.read(r, 16) == b"done"
        os.close(r)
        assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
        # The parent's ring is unaffected.
        assert [bytes(s) for s in first.samples()] == payloads[:4]
        first.release()
        with ring.next_batch(timeout=10) as b:
            assert [bytes(s) for s in b.samples()] == payloads[4:8]


def test_pin_memory_without_cuda_warns_and_reports_unpinned(shard):
    torch = pytest.importorskip("torch")
    ext, _ = shard
    if torch.cuda.is_available():
        with PrefetchRing(ext, 4, pin_memory=True) as ring:
            assert ring.stats()["pinned"] is True
        return
    with pytest.warns(RingPinWarning, match="not pinned"):
        ring = PrefetchRing(ext, 4, pin_memory=True)
    with ring:
        assert ring.stats()["pinned"] is False
    with PrefetchRing(ext, 4) as ring:  # auto: no CUDA is not a failure, so no warning
        assert ring.stats()["pinned"] is False
