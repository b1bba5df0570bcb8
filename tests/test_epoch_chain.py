"""A Loader reads on into the next epoch (NOTE [Reading on into the next epoch] in fastfeed/loader/loader.py):
what it read ahead is exactly what a fresh Loader gives for that epoch, and whatever asks for another epoch or
state gets that instead. So does its first read, started at construction (NOTE [Reading before the first
iteration]). Real packed data from conftest.py (160 demo JPEGs), the CPU path."""
from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
import time

import pytest
import torch

from test_loader import assert_same_batches, collect, corrupt_packed, make_loader  # noqa: F401 - a fixture


def fresh_epoch(path, epoch, **kw):
    with make_loader(path, **kw) as loader:
        loader.set_epoch(epoch)
        return collect(loader)


def wait_for_read_on(loader, consumed: int, timeout: float = 30.0, at_least: int = 1) -> int:
    """Batches decoded beyond the `consumed` ones, once there are `at_least` (the run read on); 0 at the timeout."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ahead = loader.stats()["counters"].get("batches", 0) - consumed
        if ahead >= at_least:
            return ahead
        time.sleep(0.02)
    return 0


@pytest.mark.parametrize("rank", [None, 1])
def test_the_next_epochs_batches_are_decoded_ahead_and_are_exactly_that_epochs(wds_path, rank):
    dist = {} if rank is None else dict(rank=rank, world_size=2)
    with make_loader(wds_path, **dist) as loader:
        epochs = [collect(loader)]
        assert wait_for_read_on(loader, consumed=len(epochs[0])) > 0  # before the loop asked for epoch 1
        epochs += [collect(loader), collect(loader)]  # a plain `for` again: epochs 1 and 2
    for e, got in enumerate(epochs):
        assert_same_batches(got, fresh_epoch(wds_path, e, **dist))


@pytest.mark.parametrize("train", [True, False])
def test_a_run_read_on_from_for_many_epochs_holds_the_plans_of_the_last_ones_only(wds_path, train):
    """Each chained epoch's plan (its sample order: 11.5 MB for ImageNet) was kept for the run's life, so one run
    read on from epoch after epoch (an evaluation Loader, validated every few hundred steps) grew without bound; it
    holds those of the epochs from the loop's on, as far as the read-ahead reaches."""
    with make_loader(wds_path, train=train, batch_size=80, image_size=16, dtype=torch.uint8) as loader:
        first = collect(loader)
        run = loader._parked
        ahead = -(-loader.stats()["ring"]["slots"] // len(first))  # epochs the ring's read-ahead may span
        for _ in range(12):
            got = collect(loader)
            assert loader._parked is run and len(run._segments) <= 1 + ahead < 12, len(run._segments)
        assert len(got) == len(first) == 2
        if not train:
            assert_same_batches(got, first)


def test_set_epoch_to_the_next_epoch_continues_and_to_another_gets_that_one(wds_path):
    with make_loader(wds_path) as loader:
        collect(loader)
        loader.set_epoch(1)  # what a training loop calls before each epoch: the epoch read on
        assert_same_batches(collect(loader), fresh_epoch(wds_path, 1))
        wait_for_read_on(loader, consumed=2 * len(loader))
        loader.set_epoch(5)  # not the epoch read on (2): it is dropped
        assert_same_batches(collect(loader), fresh_epoch(wds_path, 5))


def state_and_rest(path, epoch: int, taken: int = 3):
    """A Loader's state after `taken` batches of `epoch`, and the batches that follow them."""
    with make_loader(path) as ref:
        ref.set_epoch(epoch)
        it = iter(ref)
        for _ in range(taken):
            next(it)
        return ref.state_dict(), [(x.clone(), y.clone()) for x, y in it]


def test_a_state_loaded_after_an_epoch_replaces_what_was_read_on(wds_path):
    state, rest = state_and_rest(wds_path, epoch=1)
    with make_loader(wds_path) as loader:
        collect(loader)
        wait_for_read_on(loader, consumed=len(loader))
        loader.load_state_dict(state)
        assert_same_batches(collect(loader), rest)


def wait_for_a_read(loader, timeout: float = 30.0) -> int:
    """The ring's bytes read, once there are some (or 0 after `timeout`)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done = loader.stats()["ring"]["bytes_read"]
        if done > 0:
            return done
        time.sleep(0.02)
    return 0


def count_ring_starts(loader) -> list:
    """Replaces the Loader's ring.start with one that records its calls (the orders' lengths)."""
    calls, start = [], loader._ring.start

    def counted(order):
        calls.append(len(order))
        return start(order)

    loader._ring.start = counted
    return calls


def epoch_0_restarted(loader) -> list:
    """Epoch 0 from a Loader not yet iterated, after what it read (or decoded) early for epoch 0 was dropped: epoch
    1 first, one batch, then epoch 0 from a ring and run started again."""
    loader.set_epoch(1)
    collect(loader, limit=1)
    loader.set_epoch(0)
    return collect(loader)


@pytest.mark.parametrize("train", [True, False])
def test_a_loader_reads_epoch_0_before_its_first_iteration(wds_path, train):
    with make_loader(wds_path, train=train) as loader:
        assert wait_for_a_read(loader) > 0  # constructed, never iterated
        starts = count_ring_starts(loader)
        primed = collect(loader)
        assert starts == [], "the first iteration started the ring again instead of running on from its read"
    with make_loader(wds_path, train=train) as ref:
        starts = count_ring_starts(ref)
        assert_same_batches(primed, epoch_0_restarted(ref))
        assert len(starts) == 2


def test_a_state_loaded_before_the_first_iteration_replaces_the_early_read(wds_path):
    state, rest = state_and_rest(wds_path, epoch=0)
    with make_loader(wds_path) as loader:
        assert wait_for_a_read(loader) > 0
        loader.load_state_dict(state)
        assert_same_batches(collect(loader), rest)


def test_a_cpu_decoder_decodes_nothing_before_the_first_iteration(wds_path):
    with make_loader(wds_path) as loader:
        assert wait_for_a_read(loader) > 0
        time.sleep(0.3)  # what the workers of a started run decode in that time: at least one batch of 16
        assert loader.stats()["counters"].get("batches", 0) == 0


@pytest.fixture
def decodes_early(monkeypatch):
    """Loaders built while this is active start epoch 0's decode in the constructor, as a GPU decoder's do (NOTE
    [Reading before the first iteration]): the mechanism, run on the CPU path here (tests/test_gpu.py runs it as is)."""
    from fastfeed.loader.loader import Loader

    monkeypatch.setattr(Loader, "_decodes_early", property(lambda self: self._primed is not None))


def test_decoding_before_the_first_iteration_gives_epoch_0_and_is_continued(wds_path, decodes_early):
    with make_loader(wds_path) as loader:
        assert wait_for_read_on(loader, consumed=0) > 0  # decoded, never iterated
        state = loader.state_dict()
        assert (state["epoch"], state["sampling"]) == (0, None)  # nothing handed out yet
        run, starts = loader._parked, count_ring_starts(loader)
        it = iter(loader)
        got = [tuple(t.clone() for t in next(it))]
        assert loader._active is run and starts == [], "the first iteration did not continue the early run"
        got += [(x.clone(), y.clone()) for x, y in it]
    with make_loader(wds_path) as ref:
        assert_same_batches(got, epoch_0_restarted(ref))


@pytest.mark.parametrize("then", ["set_epoch", "load_state_dict"])
def test_another_epoch_or_a_loaded_state_replaces_the_early_decode(wds_path, decodes_early, then):
    state, rest = state_and_rest(wds_path, epoch=0)
    with make_loader(wds_path) as loader:
        assert wait_for_read_on(loader, consumed=0) > 0
        if then == "set_epoch":
            loader.set_epoch(2)
            assert_same_batches(collect(loader), fresh_epoch(wds_path, 2))
        else:
            loader.load_state_dict(state)
            assert_same_batches(collect(loader), rest)


def test_a_failed_decoder_build_closes_the_ring_it_started(wds_path, monkeypatch):
    import fastfeed.loader.loader
    import fastfeed.loader.parts
    from fastfeed.loader.ring import PrefetchRing, RingClosedError

    rings = []  # held here, so only the Loader's own close() can have closed it

    def recorded(*args, **kwargs):
        rings.append(PrefetchRing(*args, **kwargs))
        return rings[-1]

    def broken(*args, **kwargs):
        raise RuntimeError("no decoder today")

    monkeypatch.setattr(fastfeed.loader.loader, "PrefetchRing", recorded)
    monkeypatch.setattr(fastfeed.loader.parts, "build_decoder", broken)
    with pytest.raises(RuntimeError, match="no decoder today"):
        make_loader(wds_path)
    assert len(rings) == 1
    with pytest.raises(RingClosedError):
        rings[0].next_batch(timeout=0)


def test_a_bad_sample_decoded_ahead_is_counted_when_its_batch_is_handed_out(corrupt_packed):
    """stats()["skipped"] counts the bad samples of the batches the loop got. The next epoch's first batches are
    decoded while the loop finishes this one; counted at decode time, a bad sample among them showed in this epoch's
    stats whenever the read-on beat the loop's stats() call (a fresh-clone CI run failed that way)."""
    folders, bad_key = corrupt_packed  # 25 samples, one that no decoder can decode
    with make_loader(folders["wds"], batch_size=8, image_size=32, shuffle=False, drop_last=False) as loader:
        k = [str(key) for key in loader.dataset.keys].index(bad_key) // 8  # its batch, in every epoch
        assert wait_for_read_on(loader, consumed=len(collect(loader)), at_least=k + 1) > k  # decoded, not taken
        first = loader.stats()["skipped"]
        collect(loader)
        second = loader.stats()["skipped"]
    assert first["by_reason"] == {"decode_error": 1} and [e["key"] for e in first["examples"]] == [bad_key]
    assert second["by_reason"] == {"decode_error": 2}


def test_an_epoch_left_early_is_not_read_on_from(wds_path):
    with make_loader(wds_path) as loader:
        collect(loader, limit=2)
        assert loader._parked is None  # the run stopped with the loop: nothing reads on
        assert_same_batches(collect(loader), fresh_epoch(wds_path, 1))


@pytest.mark.parametrize("world_size", [1, 3])
def test_an_evaluation_loader_reads_on_into_its_next_pass(wds_path, world_size):
    """Its next pass starts with decoded batches, and every pass is the same batches, a short last one included
    (160 images, 13 a batch: each of 3 ranks gets 54, padded, in 5 batches, the last of 2)."""
    kw = dict(train=False, batch_size=13, rank=world_size - 1, world_size=world_size)
    with make_loader(wds_path, **kw) as loader:
        first = collect(loader)
        assert wait_for_read_on(loader, consumed=len(first)) > 0  # decoded before the loop asked for pass 2
        starts = count_ring_starts(loader)
        assert_same_batches(collect(loader), first)  # eval output does not depend on the epoch
        assert_same_batches(collect(loader), first)
        assert starts == [], "a later pass started the ring again instead of continuing the run that read on"
    assert len(first) == len(loader) and sum(len(y) for _, y in first) == -(-160 // world_size)


@pytest.mark.integration  # a fresh interpreter
def test_a_loader_still_reading_at_interpreter_exit_is_closed_before_dali_shuts_down(wds_path):
    """A script that ends while its Loader's workers still decode (here reading on into the next epoch) exits
    cleanly: the Loader's exit hook closes it before DALI's own hook, which shuts every pipeline down and asserts
    that none is left (a worker caught decoding built a new pipeline, and the process aborted: 1 exit in 4). A hook
    registered first runs last: by then the Loader is closed."""
    script = textwrap.dedent(f"""
        import atexit

        def last():  # registered first, so it runs after every other exit hook
            try:
                iter(L)
                print("the Loader was still open")
            except RuntimeError as e:
                print("at the end:", e)

        atexit.register(last)
        import fastfeed
        L = fastfeed.Loader({str(wds_path)!r}, batch_size=4, device="cpu", decoder="cpu-dali", num_threads=1)
        for batch in L:
            pass
        it = iter(L)
        next(it)  # the next epoch, continued from the read-ahead; its worker goes on decoding
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert "at the end: this Loader is closed" in proc.stdout, proc.stdout


def test_several_workers_read_on_epoch_after_epoch_whatever_the_epoch_length(wds_path):
    """The ring puts batch b in slot b % slots, and reading on, the next epoch starts while workers may still hold
    the last batches of this one. When the ring numbered each epoch's batches from 0, an epoch length that is not a
    multiple of the slots put the next epoch's first batches into slots still held, and the ring refused them ("all
    8 slots hold batches that were not released", at epoch 1, batch 0); the ring now numbers on across epochs
    (`PrefetchRing.extend`)."""
    kw = dict(batch_size=6, image_size=32, decoder="cpu-pil", pipelines=3)  # 26 batches an epoch, 8 slots
    epochs = 4  # epochs start at batches 0, 26, 52, 78: slots 0, 2, 4, 6, every offset 26 batches can fall on
    with make_loader(wds_path, **kw) as loader:
        assert loader.stats()["ring"]["slots"] == 8 and len(loader) % 8 != 0
        got = [collect(loader) for _ in range(epochs)]
    with make_loader(wds_path, **{**kw, "pipelines": 1}) as one:  # one worker never holds a batch while it takes
        want = [collect(one) for _ in range(epochs)]
    for a, b in zip(got, want):
        assert_same_batches(a, b)


def test_the_next_epoch_is_decoded_while_a_worker_still_holds_this_ones_last_batch(wds_path, monkeypatch):
    """No pipeline waits at an epoch boundary: while one worker still decodes the last batch of epoch 0, another
    decodes epoch 1's first. (The run used to start the next epoch in the ring only once every batch of this one was
    released, so each boundary drained the pipelines: the loader alone lost ~1.5 batches of decode per epoch.)"""
    from fastfeed.loader.epoch import EpochRun

    produce, slow = EpochRun._produce, threading.Event()

    def held_at_the_end(self, k, slot, decoder, stream):
        if k == self._segments[0][1].num_batches - 1:  # epoch 0's last batch: decoded only once `slow` is set
            slow.wait(30)
        return produce(self, k, slot, decoder, stream)

    monkeypatch.setattr(EpochRun, "_produce", held_at_the_end)
    with make_loader(wds_path, batch_size=16, decoder="cpu-pil", pipelines=2) as loader:
        n = len(loader)
        it = iter(loader)
        for _ in range(n - 1):
            next(it)
        run = loader._active
        deadline = time.monotonic() + 20
        while n not in run.results and time.monotonic() < deadline:
            time.sleep(0.01)
        decoded_ahead = n in run.results
        slow.set()
        assert len(list(it)) == 1
    assert decoded_ahead, "epoch 1's first batch waited for epoch 0's last one"


@pytest.mark.parametrize("batch_size,pipelines,prefetch,train,world_size,small_ring", [
    (1, 4, 1, True, 1, False),    # 160 batches, 9 slots: the ring wraps around many times an epoch
    (7, 3, 2, True, 2, False),    # 11 batches per rank, 8 slots
    (25, 4, 4, True, 1, False),   # 6 batches, fewer than the 12 slots
    (13, 2, 3, False, 3, False),  # evaluation: padded, a short last batch
    (5, 3, 1, True, 1, True),     # the smallest ring: pipelines + 1 slots
    (8, 4, 2, False, 1, True),
])
def test_batches_are_one_workers_for_any_shape_of_run(wds_path, monkeypatch, batch_size, pipelines, prefetch, train,
                                                      world_size, small_ring):
    """Which of several workers decodes a batch, how the epoch's length falls on the ring's slots, reading on or
    not: three iterations give exactly the batches one worker gives."""
    kw = dict(batch_size=batch_size, image_size=16, decoder="cpu-pil", train=train, rank=world_size - 1,
              world_size=world_size, dtype=torch.uint8)
    if small_ring:
        monkeypatch.setenv("LOCAL_WORLD_SIZE", str(1 << 40))
    with make_loader(wds_path, pipelines=pipelines, prefetch=prefetch, **kw) as loader:
        assert (loader.stats()["ring"]["slots"] == pipelines + 1) == small_ring
        got = [collect(loader) for _ in range(3)]
    with make_loader(wds_path, pipelines=1, **kw) as one:
        want = [collect(one) for _ in range(3)]
    for a, b in zip(got, want):
        assert_same_batches(a, b)
