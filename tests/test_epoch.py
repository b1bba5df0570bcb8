"""`EpochRun` on its own: built from explicit parts (plan, ring, decoders, settings, sample table, stats), no Loader."""
from __future__ import annotations

import dataclasses
import threading

import numpy as np
import pytest
import torch

import fastfeed
from fastfeed import sampling
from fastfeed.datasets import open_dataset
from fastfeed.decode import build_decoder
from fastfeed.formats import integrity
from fastfeed.loader import epoch as epoch_mod
from fastfeed.loader.assemble import LoaderError, SampleTable
from fastfeed.loader.epoch import EpochRun
from fastfeed.loader.ring import PrefetchRing
from fastfeed.loader.settings import resolve_settings
from fastfeed.loader.stats import StageStats
from fastfeed.world import World


def settings_for(**kw):
    args = dict(world=World(), batch_size=16, train=True, image_size=32, device="cpu", decoder="cpu",
                dtype=torch.float32, channels_last=False, mean=fastfeed.IMAGENET_MEAN, std=fastfeed.IMAGENET_STD,
                shuffle=True, seed=7, drop_last=False, order="global", num_threads=1, reader_threads=1,
                prefetch=None, hw_decoder_load=None, pipelines=None, on_error="skip", orientation="ignore",
                verify_checksums=True, log_every=None)
    args.update(kw)
    return resolve_settings(**args)


@pytest.fixture
def parts(wds_path):
    ds = open_dataset(wds_path)
    s = settings_for()
    table = SampleTable(labels=torch.from_numpy(ds.labels.astype(np.int64)), widths=np.asarray(ds.widths),
                        heights=np.asarray(ds.heights), keys=ds.keys, read=ds.read)
    ring = PrefetchRing(ds.extents(), s.batch_size, num_threads=1, num_slots=s.ring_slots)
    yield ds, s, table, ring
    ring.close()
    ds.close()


def run_all(plan, ring, decoders, s, table):
    run = EpochRun(plan, ring=ring, decoders=decoders, settings=s, table=table, stats=StageStats())
    run.begin()
    try:
        return [run.next() for _ in range(plan.num_batches)], run
    finally:
        run.stop()


def test_an_epoch_run_from_parts_equals_the_loaders_epoch(parts, wds_path):
    ds, s, table, ring = parts
    plan = sampling.plan_epoch(len(ds), seed=s.seed, epoch=3, world=World(), batch_size=16, shuffle=True)
    decoder = build_decoder(s)
    try:
        got, _ = run_all(plan, ring, [decoder], s, table)
    finally:
        decoder.close()
    with fastfeed.Loader(wds_path, batch_size=16, image_size=32, device="cpu", decoder="cpu", num_threads=1,
                         seed=7, drop_last=False) as L:
        L.set_epoch(3)
        want = list(L)
    assert len(got) == len(want) == plan.num_batches
    for (xa, ya), (xb, yb) in zip(got, want):
        assert torch.equal(ya, yb) and torch.equal(xa, xb)


def test_the_checksum_check_gets_the_rings_digests(parts):
    """A ring that hashes (the Loader's, when it verifies checksums) hands each batch's digests to the check."""
    ds, s, table, _ = parts
    seen = []

    def check(indices, samples, digests=None):
        seen.append((np.asarray(indices).copy(), digests))
        return integrity.bad_checksums(ds, indices, samples, digests=digests)

    table = dataclasses.replace(table, bad_checksums=check)
    plan = sampling.plan_epoch(len(ds), seed=s.seed, epoch=0, world=World(), batch_size=16, shuffle=True)
    decoder = build_decoder(s)
    try:
        with PrefetchRing(ds.extents(), s.batch_size, num_threads=2, num_slots=s.ring_slots, digests=True) as ring:
            run_all(plan, ring, [decoder], s, table)
    finally:
        decoder.close()
    assert len(seen) == plan.num_batches
    for indices, digests in seen:
        assert digests is not None and digests.tolist() == ds.checksums[indices].tolist()


def test_crop_windows_follow_the_plans_epoch_not_anything_else(parts):
    ds, s, table, ring = parts
    decoder = build_decoder(s)
    try:
        runs = {}
        for e in (0, 1):
            plan = sampling.plan_epoch(len(ds), seed=s.seed, epoch=e, world=World(), batch_size=16, shuffle=False)
            runs[e], _ = run_all(plan, ring, [decoder], s, table)
    finally:
        decoder.close()
    # Same samples at the same positions (no shuffle); the augmentation differs only through plan.epoch.
    assert torch.equal(runs[0][0][1], runs[1][0][1])
    assert not torch.equal(runs[0][0][0], runs[1][0][0])


class _Stuck:
    """A decoder that never returns until released: a worker that outlives stop()'s join."""

    def __init__(self):
        self.release = threading.Event()

    def __call__(self, samples, windows):
        self.release.wait(30)
        raise RuntimeError("released")

    def close(self):
        self.release.set()


def test_a_worker_that_does_not_stop_marks_its_decoders_unusable(parts, monkeypatch):
    ds, s, table, ring = parts
    monkeypatch.setattr(epoch_mod, "_JOIN_S", 0.2)
    plan = sampling.plan_epoch(len(ds), seed=s.seed, epoch=0, world=World(), batch_size=16)
    stuck = _Stuck()
    run = EpochRun(plan, ring=ring, decoders=[stuck], settings=s, table=table, stats=StageStats())
    run.begin()
    try:
        stopper = threading.Timer(0.5, run.stop)
        stopper.start()
        with pytest.raises(LoaderError, match="stopped"):
            run.next()
        stopper.join()
        assert run.joined is False
    finally:
        stuck.release.set()


def test_a_decoder_error_reaches_the_consumer_at_its_batch(parts):
    ds, s, table, ring = parts
    plan = sampling.plan_epoch(len(ds), seed=s.seed, epoch=0, world=World(), batch_size=16)

    class Broken:
        def __call__(self, samples, windows):
            raise OSError("disk on fire")

        def close(self):
            pass

    run = EpochRun(plan, ring=ring, decoders=[Broken()], settings=s, table=table, stats=StageStats())
    run.begin()
    try:
        with pytest.raises(LoaderError, match="disk on fire.*|OSError"):
            run.next()
    finally:
        assert run.stop() is True
