"""Epoch order, rank shares, exact and elastic resume: invariants checked over generated grids (hypothesis)."""
from __future__ import annotations

import json
import time
from collections import Counter

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fastfeed.sampling import ORDERS, epoch_order, plan_epoch
from fastfeed.world import World

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def plans(n, w, b, drop_last, seed=0, epoch=0, resume=None, **kw):
    return [plan_epoch(n, seed=seed, epoch=epoch, world=World(r, w, r % 8), batch_size=b, drop_last=drop_last,
                       resume=resume, **kw) for r in range(w)]


def batches(plan):
    return [plan.batch(i).tolist() for i in range(plan.num_batches)]


def check_shares(ps, n, w, b, drop_last, expected_real=None):
    """Equal batch counts and sizes on every rank; real samples disjoint and covering what they should."""
    expected_real = list(range(n)) if expected_real is None else expected_real
    assert len({p.num_batches for p in ps}) == 1
    assert len({len(p.indices) for p in ps}) == 1
    for p in ps:
        assert p.indices.dtype == np.int64
        sizes = [len(p.batch(i)) for i in range(p.num_batches)]
        assert all(s == b for s in sizes[:-1]) and (not sizes or 1 <= sizes[-1] <= b)
        assert sum(sizes) == len(p.indices)
    assert len({p.last_batch_size for p in ps}) == 1
    real = np.concatenate([p.indices[~p.padded] for p in ps])
    pad = np.concatenate([p.indices[p.padded] for p in ps])
    assert len(np.unique(real)) == len(real), "a real sample is read twice"
    if drop_last:
        assert len(pad) == 0
        assert all(s == b for p in ps for s in map(len, batches(p)))
        assert set(real.tolist()) <= set(expected_real)
        assert len(expected_real) - len(real) < w * b  # fewer than one global batch skipped
    else:
        assert sorted(real.tolist()) == sorted(expected_real)
        assert len(pad) < w and ((0 <= pad) & (pad < n)).all()  # padding repeats some sample of the epoch
        # Accelerate's gather_for_metrics keeps the first `remainder` samples of the last step gathered in rank
        # order and trims nothing before it: all padding must end that step (fastfeed/loader/compat.py).
        if ps[0].num_batches:
            last = (ps[0].num_batches - 1) * b
            assert not any(p.padded[:last].any() for p in ps), "padding before the last step"
            gathered = np.concatenate([p.padded[last:] for p in ps])
            assert gathered.tolist() == sorted(gathered.tolist()), "real samples after padding in the last step"
    return real


grid = dict(n=st.integers(1, 700), w=st.integers(1, 64), b=st.integers(1, 40), drop_last=st.booleans(),
            seed=st.integers(0, 2**32), epoch=st.integers(0, 1000))


@SETTINGS
@given(**grid)
def test_shares_cover_disjoint_equal(n, w, b, drop_last, seed, epoch):
    if drop_last and n < w * b:
        with pytest.raises(ValueError, match="not one full batch"):
            plans(n, w, b, drop_last, seed, epoch)
        return
    ps = plans(n, w, b, drop_last, seed, epoch)
    check_shares(ps, n, w, b, drop_last)
    again = plans(n, w, b, drop_last, seed, epoch)
    assert all(np.array_equal(x.indices, y.indices) for x, y in zip(ps, again))


@SETTINGS
@given(n=st.integers(20, 3000), seed=st.integers(0, 2**32), epoch=st.integers(0, 1000), order=st.sampled_from(
    sorted(ORDERS)), per_shard=st.integers(1, 50))
def test_orders_differ_across_epochs_and_seeds(n, seed, epoch, order, per_shard):
    shard_of = np.arange(n) // per_shard if per_shard * 8 <= n or order == "global" else np.arange(n) % 20
    kw = dict(order=order, shard_of=shard_of)
    base = epoch_order(n, seed=seed, epoch=epoch, **kw)
    assert sorted(base.tolist()) == list(range(n))
    assert np.array_equal(base, epoch_order(n, seed=seed, epoch=epoch, **kw))
    assert not np.array_equal(base, epoch_order(n, seed=seed, epoch=epoch + 1, **kw))
    assert not np.array_equal(base, epoch_order(n, seed=seed + 1, epoch=epoch, **kw))
    assert epoch_order(n, seed=seed, epoch=epoch, shuffle=False, **kw).tolist() == list(range(n))


def test_no_shuffle_is_identity_in_rank_order():
    ps = plans(10, 2, 4, drop_last=False, shuffle=False)
    assert [batches(p) for p in ps] == [[[0, 1, 2, 3], [4]], [[5, 6, 7, 8], [9]]]
    ps = plans(11, 2, 4, drop_last=False, shuffle=False)
    assert [batches(p) for p in ps] == [[[0, 1, 2, 3], [4, 5]], [[6, 7, 8, 9], [10, 0]]]
    assert ps[1].padded.tolist() == [False] * 5 + [True]
    ps = plans(11, 2, 4, drop_last=True, shuffle=False)
    assert [batches(p) for p in ps] == [[[0, 1, 2, 3]], [[4, 5, 6, 7]]]


def test_docstring_table():
    """The worked table in fastfeed.sampling's docstring, row by row."""
    for n, w, b, drop, m, nb, last, padded in [(10, 2, 4, False, 5, 2, 1, 0), (11, 2, 4, False, 6, 2, 2, 1),
                                               (11, 2, 4, True, 4, 1, 4, 0), (3, 4, 2, False, 1, 1, 1, 1),
                                               (16, 4, 4, True, 4, 1, 4, 0)]:
        ps = plans(n, w, b, drop)
        assert (len(ps[0].indices), ps[0].num_batches, ps[0].last_batch_size) == (m, nb, last)
        assert sum(int(p.padded.sum()) for p in ps) == padded
    with pytest.raises(ValueError, match="not one full batch"):
        plans(3, 4, 2, True)


@SETTINGS
@given(**grid)
def test_resume_at_every_k_is_the_uninterrupted_tail(n, w, b, drop_last, seed, epoch):
    if drop_last and n < w * b:
        return
    ps = plans(n, w, b, drop_last, seed, epoch)
    for k in range(ps[0].num_batches + 1):
        state = json.loads(json.dumps(ps[0].state(k)))  # what a checkpoint stores
        assert len(json.dumps(state)) < 400
        resumed = plans(n, w, b, drop_last, seed, epoch, resume=state)
        for p, r in zip(ps, resumed):
            assert r.num_batches == p.num_batches - k
            assert np.array_equal(r.indices, p.indices[k * b:])
            assert np.array_equal(r.padded, p.padded[k * b:])


def _consumed(ps, k):
    return [x for p in ps for x in p.indices[: k * p.batch_size][~p.padded[: k * p.batch_size]].tolist()]


@SETTINGS
@given(n=st.integers(1, 700), w=st.integers(1, 64), w2=st.integers(1, 64), w3=st.integers(1, 64),
       b=st.integers(1, 40), b2=st.integers(1, 40), drop_last=st.booleans(), seed=st.integers(0, 2**32),
       frac=st.floats(0, 1), frac2=st.floats(0, 1))
def test_elastic_resume_covers_the_remainder_once(n, w, w2, w3, b, b2, drop_last, seed, frac, frac2):
    if drop_last and n < w * b:
        return
    ps = plans(n, w, b, drop_last, seed)
    epoch_set = sorted(np.concatenate([p.indices[~p.padded] for p in ps]).tolist())
    k = int(frac * ps[0].num_batches)
    remaining = sorted((Counter(epoch_set) - Counter(_consumed(ps, k))).elements())

    ps2 = plans(n, w2, b2, drop_last, seed, resume=ps[0].state(k))
    real2 = check_shares(ps2, n, w2, b2, drop_last, expected_real=remaining)

    # Chained: W -> W' -> W''.
    k2 = int(frac2 * ps2[0].num_batches)
    remaining2 = sorted((Counter(real2.tolist()) - Counter(_consumed(ps2, k2))).elements())
    ps3 = plans(n, w3, b, drop_last, seed, resume=json.loads(json.dumps(ps2[0].state(k2))))
    check_shares(ps3, n, w3, b, drop_last, expected_real=remaining2)
    assert len(ps2[0].state(k2)["segments"]) == 2

    # The next epoch is an ordinary epoch at the new world size.
    nxt = plans(n, w3, b, drop_last=False, seed=seed, epoch=1)
    check_shares(nxt, n, w3, b, False)


@SETTINGS
@given(n=st.integers(1, 2000), per_shard=st.integers(1, 300), k=st.integers(1, 6), w=st.integers(1, 16),
       b=st.integers(1, 32), seed=st.integers(0, 2**32), shuffled_ids=st.booleans())
def test_shard_order_is_local(n, per_shard, k, w, b, seed, shuffled_ids):
    shard_of = np.arange(n) // per_shard
    if shuffled_ids:  # shard ids need be neither contiguous nor sorted by sample id
        shard_of = (np.random.default_rng(seed).permutation(n) // per_shard) * 7 + 3
    order = epoch_order(n, seed=seed, epoch=0, order="shard", shard_of=shard_of, shard_buffer=k)
    assert sorted(order.tolist()) == list(range(n))
    # Windows of k whole shards follow one another: number shards by first appearance; then the window of every
    # position (that number // k) never decreases, so at most k shards are open at any time.
    seq = shard_of[order]
    uniq, first = np.unique(seq, return_index=True)
    rank = np.empty(len(uniq), dtype=np.int64)
    rank[np.argsort(first)] = np.arange(len(uniq))
    window = rank[np.searchsorted(uniq, seq)] // k
    assert np.all(np.diff(window) >= 0)
    ps = plans(n, w, b, False, seed, order="shard", shard_of=shard_of, shard_buffer=k)
    check_shares(ps, n, w, b, False)


def test_shard_order_many_tiny_shards_uses_sort_path():
    n = 400_000
    shard_of = np.arange(n)  # one sample per shard: more windows than the per-window loop handles
    order = epoch_order(n, seed=1, epoch=2, order="shard", shard_of=shard_of, shard_buffer=2)
    assert np.array_equal(np.sort(order), np.arange(n))
    assert np.array_equal(order, epoch_order(n, seed=1, epoch=2, order="shard", shard_of=shard_of, shard_buffer=2))
    assert not np.array_equal(order, epoch_order(n, seed=1, epoch=3, order="shard", shard_of=shard_of,
                                                 shard_buffer=2))


def test_bad_input_raises_clearly():
    w = World(0, 2, 0)
    with pytest.raises(ValueError, match="dataset length"):
        plan_epoch(0, seed=0, epoch=0, world=w, batch_size=4)
    with pytest.raises(ValueError, match="batch_size"):
        plan_epoch(10, seed=0, epoch=0, world=w, batch_size=0)
    with pytest.raises(ValueError, match="unknown order"):
        plan_epoch(10, seed=0, epoch=0, world=w, batch_size=4, order="random")
    with pytest.raises(ValueError, match="needs shard_of"):
        plan_epoch(10, seed=0, epoch=0, world=w, batch_size=4, order="shard")
    with pytest.raises(ValueError, match="shape"):
        plan_epoch(10, seed=0, epoch=0, world=w, batch_size=4, order="shard", shard_of=np.zeros(3, int))
    state = plan_epoch(10, seed=0, epoch=0, world=w, batch_size=4).state(1)
    with pytest.raises(ValueError, match="epoch"):
        plan_epoch(10, seed=0, epoch=1, world=w, batch_size=4, resume=state)
    with pytest.raises(ValueError, match="n="):
        plan_epoch(11, seed=0, epoch=0, world=w, batch_size=4, resume=state)
    with pytest.raises(ValueError, match="not a fastfeed sampling state"):
        plan_epoch(10, seed=0, epoch=0, world=w, batch_size=4, resume={"segments": []})
    bad = {**state, "segments": [{"world_size": 2, "batch_size": 4, "batches_done": 9}]}
    with pytest.raises(ValueError, match="more batches"):
        plan_epoch(10, seed=0, epoch=0, world=w, batch_size=4, resume=bad)
    with pytest.raises(ValueError, match="batches_done"):
        plan_epoch(10, seed=0, epoch=0, world=w, batch_size=4).state(3)
    with pytest.raises(IndexError):
        plan_epoch(10, seed=0, epoch=0, world=w, batch_size=4).batch(2)


def test_ten_million_samples_plan_quickly():
    """Timing is printed, not asserted (benchmarks/bench_sampling.py measures it against a baseline)."""
    start = time.perf_counter()
    p = plan_epoch(10_000_000, seed=0, epoch=3, world=World(5, 8, 5), batch_size=256)
    print(f"plan_epoch(10M, W=8): {time.perf_counter() - start:.3f} s")
    assert len(p.indices) == 1_250_000 and p.num_batches == 4883
