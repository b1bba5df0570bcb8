"""Exact mid-epoch resume of fastfeed.Loader over format x order x decoder, with tests/resume_harness.py (the
torchdata-style save/load-state check): initial state, mid-epoch 0, end of epoch 0 and mid-epoch 2.

Data: 44 small JPEGs (40-80 px) packed by the CLI as wds (8 shards, so order="shard" has shards to shuffle) and
lmdb. Batch 8 with drop_last in training gives 5 batches per epoch and drops 4 samples (a different 4 each epoch).
"""
from __future__ import annotations

import pytest

import fastfeed
from clients.common import make_tiny_tree, pack
from resume_harness import run_test_save_load_state

N = 44


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("tiny-resume")
    src = make_tiny_tree(root / "src", N)
    return {fmt: pack(src, root / fmt, fmt) for fmt in ("wds", "lmdb")}


def factory(path, **kw):
    opts = dict(batch_size=8, image_size=32, device="cpu", num_threads=1, reader_threads=1, seed=3)
    opts.update(kw)
    return lambda: fastfeed.Loader(path, **opts)


@pytest.mark.parametrize("decoder", ["cpu-pil", "cpu-dali"])
@pytest.mark.parametrize("order", ["global", "shard"])
@pytest.mark.parametrize("fmt", ["wds", "lmdb"])
def test_resume_is_exact(tiny, fmt, order, decoder):
    epochs = run_test_save_load_state(factory(tiny[fmt], decoder=decoder, order=order), midpoint=2)
    # The check can only catch a wrong epoch if epochs differ: shuffled, augmented, 4 samples dropped each epoch.
    assert len({tuple(b["images"] for b in e) for e in epochs}) == len(epochs)
    assert all(len(b["labels"]) == 8 for e in epochs for b in e)


def test_resume_is_exact_on_one_rank_of_two(tiny):
    """Rank 1 of 2 (in one process; the split is a pure function of rank and world size)."""
    run_test_save_load_state(factory(tiny["wds"], decoder="cpu-pil", rank=1, world_size=2, batch_size=4),
                             midpoint=3)


def test_resume_is_exact_in_eval_with_a_short_last_batch(tiny):
    """train=False: every sample once, in order, the last batch short (44 = 5 * 8 + 4)."""
    epochs = run_test_save_load_state(factory(tiny["lmdb"], decoder="cpu-pil", train=False), midpoint=3)
    assert [len(b["labels"]) for b in epochs[0]] == [8, 8, 8, 8, 8, 4]
    assert sum(len(b["labels"]) for b in epochs[0]) == len(fastfeed.open_dataset(tiny["lmdb"]))
