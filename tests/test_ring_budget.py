"""The ring's read-ahead stays within each rank's share of host memory (fastfeed/loader/settings.py, RING_MEMORY_SHARE):
fewer slots when batches are large or ranks are many, never fewer than the pipelines need to make progress."""
from __future__ import annotations

import numpy as np
import torch

import fastfeed
from fastfeed.loader.settings import RING_MEMORY_SHARE, ring_budget_bytes
from fastfeed.world import World
from test_epoch import settings_for

GB = 1 << 30


def test_the_budget_is_a_share_of_memory_split_between_the_ranks_of_the_machine():
    one = ring_budget_bytes(World(), total_bytes=64 * GB)
    assert one == int(64 * GB * RING_MEMORY_SHARE)
    assert ring_budget_bytes(World(local_world_size=8), total_bytes=64 * GB) == one // 8
    assert 0 < ring_budget_bytes(World()) <= ring_budget_bytes(World(), total_bytes=1 << 62)


def test_slots_shrink_to_the_budget_but_keep_one_per_pipeline_plus_one():
    s = settings_for(decoder="cpu-dali", prefetch=2, pipelines=2)
    assert s.ring_slots == 6
    assert s.ring_slots_within(100 << 20, 10 * GB) == 6       # fits: the full read-ahead
    assert s.ring_slots_within(100 << 20, 450 << 20) == 4     # 4 slots of 100 MB fit in 450 MB
    assert s.ring_slots_within(2 * GB, 4 * GB) == 3           # 12-MP photos: pipelines + 1, over the budget
    assert s.ring_slots_within(2 * GB, 0) == 3


def test_a_loader_runs_whole_epochs_on_the_smallest_ring(wds_path, monkeypatch):
    """With a share too small for even one slot (a huge LOCAL_WORLD_SIZE), the Loader reads with pipelines + 1
    slots and still yields every sample of the epoch once, the same batches as with the full ring."""
    kw = dict(batch_size=8, train=False, image_size=32, device="cpu", decoder="cpu", dtype=torch.uint8)
    with fastfeed.Loader(wds_path, **kw) as full:
        want = [(x.clone(), y.clone()) for x, y in full]
        assert full.stats()["ring"]["slots"] == full.settings.ring_slots > 2
    monkeypatch.setenv("LOCAL_WORLD_SIZE", str(1 << 40))
    with fastfeed.Loader(wds_path, **kw) as small:
        assert small.world.local_world_size == 1 << 40
        got = list(small)
        assert small.stats()["ring"]["slots"] == small.settings.pipelines + 1 == 2
    assert len(got) == len(want)
    for (xa, ya), (xb, yb) in zip(want, got):
        assert torch.equal(xa, xb) and torch.equal(ya, yb)
    assert np.unique(np.concatenate([y.numpy() for _, y in got])).size > 1


def test_several_pipelines_train_epoch_after_epoch_on_the_smallest_ring(wds_path, monkeypatch):
    """pipelines + 1 slots for 3 pipelines: workers take batches in order and release them in any, so the ring could
    not hand out a batch whose slot a worker still held ("all 4 slots hold batches that were not released"); the
    run keeps its decoded window within the slots the workers leave free (EpochRun._window) and reads on."""
    kw = dict(batch_size=8, image_size=64, device="cpu", decoder="cpu-pil", num_threads=1, pipelines=3)
    with fastfeed.Loader(wds_path, **kw) as full:
        want = [[(x.clone(), y.clone()) for x, y in full] for _ in range(3)]
    monkeypatch.setenv("LOCAL_WORLD_SIZE", str(1 << 40))
    with fastfeed.Loader(wds_path, **kw) as small:
        assert small.stats()["ring"]["slots"] == 4
        got = [[(x.clone(), y.clone()) for x, y in small] for _ in range(3)]
    for a, b in zip(want, got):
        assert len(a) == len(b) == 20
        for (xa, ya), (xb, yb) in zip(a, b):
            assert torch.equal(xa, xb) and torch.equal(ya, yb)
