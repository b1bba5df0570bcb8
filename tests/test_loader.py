"""fastfeed.Loader end to end on real packed data (the CPU path): layout, torchvision parity, determinism, exact and
elastic resume, shutdown, errors and stats.

The datasets come from conftest.py (160 demo JPEGs in 4 classes, packed as wds and lmdb by the CLI). Samples are
identified from the Loader's own output by "fingerprints": eval-mode output depends only on a sample's bytes, so
an eval batch image equals exactly one row of a table decoded once with shuffle=False.
"""
from __future__ import annotations

import gc
import json
import logging
import os
import struct
import threading
import time

import numpy as np
import pytest
import torch

import fastfeed

from fastfeed import IMAGENET_MEAN, IMAGENET_STD, open_dataset, sampling
from fastfeed.decode import CPU_DEFAULT
from decode_samples import torchvision_eval_reference
from fastfeed.demo_data import make_dataset
from fastfeed.loader.loader import Loader, LoaderError
from fastfeed.types import DatasetError
from fastfeed.world import World

DECODERS = ("cpu", "cpu-dali")
FORMATS = ("wds", "lmdb")


def make_loader(path, **kw) -> Loader:
    opts = dict(batch_size=16, image_size=64, device="cpu", decoder="cpu", dtype=torch.float32, num_threads=1,
                reader_threads=1, seed=0)
    opts.update(kw)
    return Loader(path, **opts)


def collect(loader, limit: int | None = None) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """One iteration's batches (cloned, so nothing can alias a reused buffer), at most `limit` of them."""
    out = []
    if limit == 0:
        iter(loader).close()  # an iteration that began and took nothing
        return out
    for images, labels in loader:
        out.append((images.clone(), labels.clone()))
        if limit is not None and len(out) == limit:
            break
    return out


def assert_same_batches(a, b):
    assert len(a) == len(b)
    for k, ((xa, ya), (xb, yb)) in enumerate(zip(a, b)):
        assert torch.equal(ya, yb), f"labels differ at batch {k}"
        assert torch.equal(xa, xb), f"images differ at batch {k}"


def plan(n, loader_kw: dict, epoch=0, rank=0, world_size=1, resume=None):
    return sampling.plan_epoch(n, seed=loader_kw.get("seed", 0), epoch=epoch, world=World(rank, world_size),
                               batch_size=loader_kw["batch_size"], drop_last=loader_kw.get("drop_last", True),
                               shuffle=loader_kw.get("shuffle", True), resume=resume)


@pytest.fixture(scope="module")
def fingerprints(wds_path):
    """[N, 3*32*32] eval-mode images of every sample at S=32 in id order (row i = sample i)."""
    with make_loader(wds_path, batch_size=32, image_size=32, train=False, shuffle=False, drop_last=False) as L:
        rows = torch.cat([x for x, _ in collect(L)])
    assert rows.shape[0] == len(L.dataset)
    return rows.flatten(1)


def identify(fingerprints, images) -> np.ndarray:
    """Sample ids of eval-mode S=32 images, by exact match against the fingerprint table."""
    same = (images.flatten(1)[:, None, :] == fingerprints[None, :, :]).all(dim=2)
    assert torch.all(same.sum(dim=1) == 1), "an output image matches no sample (or several) exactly"
    return same.int().argmax(dim=1).numpy()


# ---------------------------------------------------------------- layout
def test_both_formats_yield_the_same_batches(packed):
    with open_dataset(packed["wds"]) as a, open_dataset(packed["lmdb"]) as b:
        assert list(a.keys) == list(b.keys)
    batches = {}
    for fmt in FORMATS:
        with make_loader(packed[fmt], seed=7) as L:
            batches[fmt] = collect(L)
    assert len(batches["wds"]) == 10
    assert_same_batches(batches["wds"], batches["lmdb"])


@pytest.mark.parametrize("decoder", DECODERS)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.uint8])
@pytest.mark.parametrize("channels_last", [False, True])
def test_shapes_dtypes_and_memory_format(wds_path, decoder, dtype, channels_last):
    with make_loader(wds_path, decoder=decoder, dtype=dtype, channels_last=channels_last, train=False,
                     shuffle=False) as L:
        (images, labels), = collect(L, limit=1)
        ds_labels = torch.from_numpy(L.dataset.labels[:16])
    assert images.shape == (16, 3, 64, 64) and images.dtype == dtype and images.device.type == "cpu"
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    assert images.is_contiguous(memory_format=fmt)
    assert labels.dtype == torch.int64 and labels.shape == (16,)
    assert torch.equal(labels, ds_labels)
    # Every dtype carries the same picture: compare to the float32 NCHW output in 0-1 units.
    with make_loader(wds_path, decoder=decoder, train=False, shuffle=False) as L:
        (ref, _), = collect(L, limit=1)
    mean = torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1)
    std = torch.tensor(IMAGENET_STD).view(1, 3, 1, 1)
    ref01 = ref * std + mean
    got01 = images.float() / 255 if dtype == torch.uint8 else images.float() * std + mean
    tol = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 2e-2, torch.uint8: 0.5 / 255 + 1e-4}[dtype]
    assert (got01 - ref01).abs().max().item() <= tol
    assert ref01.std() > 0.05  # a real picture, not a constant


@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("world_size", [1, 3])
def test_len_matches_batches_and_drop_last(wds_path, drop_last, world_size):
    kw = dict(batch_size=24, drop_last=drop_last, image_size=32)
    expected = plan(160, kw, rank=world_size - 1, world_size=world_size)
    # 160 samples: W=1 -> 7 batches (last 16) or 6; W=3 -> 54 per rank: 3 batches (last 6) or 48: 2 batches.
    want = {(1, False): (7, 16), (1, True): (6, 24), (3, False): (3, 6), (3, True): (2, 24)}[world_size, drop_last]
    with make_loader(wds_path, rank=world_size - 1, world_size=world_size, **kw) as L:
        assert len(L) == want[0] == expected.num_batches
        got = collect(L)
        labels = L.dataset.labels
    assert len(got) == len(L) == want[0]
    assert [len(y) for _, y in got] == [24] * (want[0] - 1) + [want[1]]
    assert all(x.shape[0] == len(y) for x, y in got)
    assert np.array_equal(torch.cat([y for _, y in got]).numpy(), labels[expected.indices])


# ---------------------------------------------------------------- correctness against torchvision
@pytest.mark.parametrize("decoder", DECODERS)
def test_eval_output_matches_torchvision(wds_path, decoder):
    S, B = 96, 16
    with make_loader(wds_path, decoder=decoder, train=False, shuffle=False, drop_last=False, batch_size=B,
                     image_size=S) as L:
        batches = collect(L, limit=2)
        ds = L.dataset
        std = torch.tensor(IMAGENET_STD).view(3, 1, 1)
        for k, (images, labels) in enumerate(batches):
            for j in range(B):
                i = k * B + j  # shuffle=False, world 1: position -> sample id
                assert labels[j] == ds.labels[i]
                ref = torchvision_eval_reference(ds.read(i), S, IMAGENET_MEAN, IMAGENET_STD)
                mad = ((images[j] - ref) * std).abs().mean().item()  # in 0-1 pixel units
                assert mad < 2 / 255, f"sample {ds.keys[i]}: mean abs diff {mad * 255:.2f}/255"


# ---------------------------------------------------------------- determinism
def test_same_seed_same_batches_other_seed_or_epoch_differs(wds_path):
    with make_loader(wds_path, seed=3) as a, make_loader(wds_path, seed=3) as b, make_loader(wds_path, seed=4) as c:
        a0, b0, c0 = collect(a), collect(b), collect(c)
        assert_same_batches(a0, b0)  # train mode: crops and flips are reproduced too
        assert not torch.equal(a0[0][1], c0[0][1])
        a1 = collect(a)  # iterating again without set_epoch runs the next epoch
        assert a.epoch == 1
        assert not torch.equal(torch.cat([y for _, y in a0]), torch.cat([y for _, y in a1]))
        b.set_epoch(1)
        assert_same_batches(a1, collect(b))
        b.set_epoch(0)
        assert_same_batches(a0, collect(b))  # set_epoch goes back, as DistributedSampler does
        assert b.epoch == 0


def test_augmentation_differs_across_epochs_for_the_same_sample(wds_path):
    # shuffle=False: the same sample sits at the same position, so only the augmentation can differ.
    with make_loader(wds_path, shuffle=False) as L:
        e0, e1 = collect(L, limit=1), collect(L, limit=1)
    assert torch.equal(e0[0][1], e1[0][1])
    assert not torch.equal(e0[0][0], e1[0][0])


# ---------------------------------------------------------------- resume
RESUME_KW = dict(batch_size=16, image_size=48, seed=5, drop_last=False)


@pytest.fixture(scope="module")
def reference_run(wds_path):
    with make_loader(wds_path, **RESUME_KW) as L:
        return collect(L), collect(L)


@pytest.mark.parametrize("k", [0, 1, 6, 9, 10])
def test_resume_after_k_batches_gives_exactly_the_rest(wds_path, reference_run, k):
    epoch0, epoch1 = reference_run
    assert len(epoch0) == 10
    with make_loader(wds_path, **RESUME_KW) as first:
        assert len(collect(first, limit=k)) == k
        state = json.loads(json.dumps(first.state_dict()))
    with make_loader(wds_path, **RESUME_KW) as resumed:
        resumed.load_state_dict(state)
        assert resumed.batches_left == (10 - k if k < 10 else 10)
        assert len(resumed) == 10  # len() is always a full epoch (Lightning and schedulers read it as one)
        rest = collect(resumed)
        assert_same_batches(rest, epoch0[k:] if k < 10 else epoch1)
        if k < 10:
            assert_same_batches(collect(resumed), epoch1)  # the next epoch is an ordinary one


def test_resume_before_any_iteration_and_state_of_a_fresh_loader(wds_path, reference_run):
    with make_loader(wds_path, **RESUME_KW) as fresh:
        state = json.loads(json.dumps(fresh.state_dict()))
    with make_loader(wds_path, **RESUME_KW) as resumed:
        resumed.load_state_dict(state)
        assert_same_batches(collect(resumed), reference_run[0])


def test_set_epoch_keeps_a_loaded_state_of_that_epoch_and_drops_it_for_another(wds_path, reference_run):
    epoch0, epoch1 = reference_run
    with make_loader(wds_path, **RESUME_KW) as first:
        collect(first, limit=4)
        state = first.state_dict()
    with make_loader(wds_path, **RESUME_KW) as L:
        L.load_state_dict(state)
        L.set_epoch(0)
        assert_same_batches(collect(L), epoch0[4:])
        L.load_state_dict(state)
        L.set_epoch(1)
        assert len(L) == 10
        assert_same_batches(collect(L), epoch1)



def test_a_state_taken_mid_epoch_after_set_epoch_in_the_loop_is_where_the_loop_is(wds_path, reference_run):
    """set_epoch names the next iteration's epoch; called inside the loop (a callback announcing the epoch it is in)
    it must not move where `state_dict()` says the loop is. Found by calling it mid-epoch: the state then pointed at
    the start of the epoch, and a resumed run read its first batches again, while batches_left said 6 remained."""
    epoch0, _ = reference_run
    with make_loader(wds_path, **RESUME_KW) as first:
        for k, _batch in enumerate(first):
            if k == 3:
                first.set_epoch(0)
                state = json.loads(json.dumps(first.state_dict()))
                assert first.batches_left == 6
                break
    with make_loader(wds_path, **RESUME_KW) as resumed:
        resumed.load_state_dict(state)
        assert_same_batches(collect(resumed), epoch0[4:])


def test_load_state_rejects_other_seed_and_garbage(wds_path):
    with make_loader(wds_path, **RESUME_KW) as L:
        collect(L, limit=2)
        state = L.state_dict()
    with make_loader(wds_path, **{**RESUME_KW, "seed": 6}) as other:
        with pytest.raises(ValueError, match="seed"):
            other.load_state_dict(state)
        with pytest.raises(ValueError):
            other.load_state_dict({"version": 999})


@pytest.mark.parametrize("new_world", [2, 3, 5])
def test_elastic_resume_covers_the_rest_exactly_once(wds_path, fingerprints, new_world):
    kw = dict(batch_size=8, image_size=32, train=False, shuffle=True, seed=11, drop_last=False)
    W, k = 4, 2
    consumed, states = [], []
    for r in range(W):
        with make_loader(wds_path, rank=r, world_size=W, **kw) as L:
            for images, _ in collect(L, limit=k):
                consumed.extend(identify(fingerprints, images))
            states.append(json.loads(json.dumps(L.state_dict())))
    assert len(consumed) == len(set(consumed)) == W * k * 8
    remaining = set(range(160)) - set(consumed)
    real, everything = [], []
    for r in range(new_world):
        with make_loader(wds_path, rank=r, world_size=new_world, **kw) as L:
            L.load_state_dict(states[r % W])  # any rank's state: they are rank-local but equal
            expected = plan(160, kw, rank=r, world_size=new_world, resume=states[r % W]["sampling"])
            assert L.batches_left == expected.num_batches  # the rest of the epoch, not a full one
            ids = np.concatenate([identify(fingerprints, x) for x, _ in collect(L)])
            assert np.array_equal(ids, expected.indices)  # the Loader reads what the sampling plan says
            real.extend(ids[~expected.padded])
            everything.extend(ids)
            assert L.epoch == 0
    assert sorted(real) == sorted(remaining)  # each remaining sample exactly once
    assert set(everything) == remaining  # padding only repeats remaining samples


# ---------------------------------------------------------------- shutdown
def _threads() -> tuple[int, int]:
    return len(os.listdir("/proc/self/task")), len(threading.enumerate())


def _settled_threads(limit: tuple[int, int], wait_s: float = 5.0) -> tuple[int, int]:
    deadline = time.monotonic() + wait_s
    while True:
        gc.collect()
        now = _threads()
        if (now[0] <= limit[0] and now[1] <= limit[1]) or time.monotonic() > deadline:
            return now
        time.sleep(0.05)


def _loader_threads() -> list[str]:
    """Live decode workers of an iteration (not the decoders' own pools, which live as long as the Loader)."""
    return [t.name for t in threading.enumerate() if t.name.startswith("fastfeed-decode-") and t.is_alive()]


def _within(seconds: float, fn):
    """fn() in a helper thread; fails the test (instead of hanging it) when fn has not returned in time."""
    box = {}

    def run():
        try:
            box["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - handed to the test thread
            box["error"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(seconds)
    assert not t.is_alive(), f"did not return within {seconds} s (hang)"
    if "error" in box:
        raise box["error"]
    return box.get("value")


def test_break_early_then_iterate_again(wds_path):
    with make_loader(wds_path) as L:
        for k, _ in enumerate(L):
            if k == 1:
                break
        assert not _loader_threads()
        assert len(collect(L)) == len(L) == 10
        assert L.epoch == 1


@pytest.mark.parametrize("decoder", DECODERS)
def test_no_thread_leak_over_many_cycles(wds_path, decoder):
    def cycle():
        L = make_loader(wds_path, decoder=decoder, image_size=32)
        for k, _ in enumerate(L):
            if k == 2:
                break
        L.close()

    cycle()  # first use starts lazily created process-wide pools (torch, numba, DALI)
    base = _settled_threads((0, 0), wait_s=0)
    for _ in range(4):  # a thread left behind by each cycle would show as 4 more; none may stay
        cycle()
    after = _settled_threads(base)
    assert after[0] <= base[0] and after[1] <= base[1], f"threads (os, python): {base} -> {after}"


def test_exception_in_the_loop_body_does_not_hang(wds_path):
    with make_loader(wds_path) as L:
        def body():
            for _ in L:
                1 / 0

        with pytest.raises(ZeroDivisionError):
            _within(20, body)
        assert not _loader_threads()
        assert len(collect(L)) == 10


def test_close_is_idempotent_and_final(wds_path):
    L = make_loader(wds_path)
    collect(L, limit=1)
    L.close()
    L.close()
    with pytest.raises(RuntimeError, match="closed"):
        iter(L)


def test_an_iterator_stopped_by_close_or_reiteration_raises_instead_of_hanging(wds_path):
    L = make_loader(wds_path)
    stale = iter(L)
    next(stale)
    fresh = iter(L)  # starting a new iteration stops the old one
    assert next(fresh)[0].shape == (16, 3, 64, 64)
    with pytest.raises(LoaderError):
        _within(10, lambda: [next(stale) for _ in range(20)])
    assert next(fresh)[0].shape == (16, 3, 64, 64)  # the new iteration is unaffected
    L.close()
    with pytest.raises(LoaderError):
        _within(10, lambda: [next(fresh) for _ in range(20)])
    assert not _loader_threads()


# ---------------------------------------------------------------- errors
def test_folder_without_manifest_is_a_clear_error(demo_tree):
    with pytest.raises(DatasetError, match="fastfeed.json"):
        Loader(demo_tree, device="cpu")


def test_other_format_version_is_a_clear_error(lmdb_path, copy_dataset):
    root = copy_dataset(lmdb_path)
    manifest = json.loads((root / "fastfeed.json").read_text())
    manifest["version"] = 999
    (root / "fastfeed.json").unlink()  # a hard link: replace, never edit in place
    (root / "fastfeed.json").write_text(json.dumps(manifest))
    with pytest.raises(DatasetError, match="version 999"):
        Loader(root, device="cpu")


def test_missing_shard_is_a_clear_error(wds_path, copy_dataset):
    root = copy_dataset(wds_path)
    (root / "shard-000002.tar").unlink()
    with pytest.raises(DatasetError, match="shard-000002.tar.*missing"):
        Loader(root, device="cpu")


def _break_huffman_selectors(data: bytes) -> bytes:
    """Point the scan's components at Huffman tables that do not exist: header, size and end marker stay valid
    (pack accepts the file when its scan check is off), but every decoder must fail."""
    i = 2
    while True:
        if data[i] != 0xFF:
            raise ValueError("unexpected JPEG layout")
        marker, length = data[i + 1], struct.unpack(">H", data[i + 2:i + 4])[0]
        if marker == 0xDA:
            out = bytearray(data)
            for c in range(out[i + 4]):
                out[i + 5 + 2 * c + 1] = 0x33
            return bytes(out)
        i += 2 + length


@pytest.fixture(scope="module")
def corrupt_packed(tmp_path_factory, pack_cli):
    """25 images (one with a broken scan header) packed as wds and lmdb; returns (folders, bad key). Packed with
    --no-scan-check: with it, pack rejects the broken file (tests/test_scan_check.py), and this is about a bad
    sample inside a dataset (packed without the check, or by an older fastfeed)."""
    root = tmp_path_factory.mktemp("corrupt")
    tree = make_dataset(root / "src", num_images=25, num_classes=2, seed=2, workers=1)
    victim = tree / "class_001" / "img_0000007.jpg"
    bad = _break_huffman_selectors(victim.read_bytes())
    victim.write_bytes(bad)
    out = {}
    for fmt in FORMATS:
        out[fmt] = root / fmt
        pack_cli(tree, out[fmt], "--format", fmt, "--no-scan-check")
    with open_dataset(out["wds"]) as ds:
        assert len(ds) == 25, "pack rejected the damaged image; the test needs it inside the dataset"
        hits = [str(ds.keys[i]) for i in range(len(ds)) if ds.read(i) == bad]
    assert len(hits) == 1
    return out, hits[0]


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("decoder", DECODERS)
@pytest.mark.parametrize("train", [False, True])
def test_corrupt_record_skip_keeps_shape_and_counts(corrupt_packed, fmt, decoder, train):
    folders, bad_key = corrupt_packed
    with make_loader(folders[fmt], decoder=decoder, batch_size=8, image_size=32, train=train, shuffle=False,
                     drop_last=False, on_error="skip") as L:
        batches = collect(L)
        keys, labels = [str(k) for k in L.dataset.keys], L.dataset.labels
        stats = L.stats()
    assert len(batches) == len(L) == 4
    assert [x.shape[0] for x, _ in batches] == [8, 8, 8, 1]
    assert stats["skipped"]["total"] == 1
    assert [e["key"] for e in stats["skipped"]["examples"]] == [bad_key]
    i = keys.index(bad_key)
    k, j = divmod(i, 8)
    images, got_labels = batches[k]
    # The bad position holds a copy of the next good sample of the batch (cyclically), with its label in training;
    # in evaluation it is labelled IGNORE_INDEX, so no sample is scored twice.
    src = (j + 1) % len(got_labels)
    assert torch.equal(images[j], images[src])
    assert got_labels[j] == (labels[k * 8 + src] if train else fastfeed.IGNORE_INDEX)
    others = [p for p in range(len(got_labels)) if p != j]
    assert np.array_equal(got_labels[others].numpy(), labels[[k * 8 + p for p in others]])


@pytest.mark.parametrize("decoder", DECODERS)
def test_corrupt_record_raise_names_the_sample(corrupt_packed, decoder):
    folders, bad_key = corrupt_packed
    with make_loader(folders["wds"], decoder=decoder, batch_size=8, image_size=32, on_error="raise",
                     drop_last=False) as L:
        with pytest.raises(LoaderError, match=bad_key):
            collect(L)



def test_a_bad_record_is_named_once_whatever_epochs_the_loop_runs(corrupt_packed, caplog):
    """A bad sample is logged once per Loader and counted in every batch that holds it. Found by iterating epochs
    out of order (set_epoch jumps, as a loop resumed or driven by a scheduler does): each such epoch starts a new
    run, and every run named the sample again, while a plain run of epochs read on into named it once."""
    folders, bad_key = corrupt_packed
    with make_loader(folders["wds"], decoder="cpu", batch_size=8, image_size=32, drop_last=False) as L:
        with caplog.at_level(logging.WARNING, logger="fastfeed"):
            for epoch in (0, 2, 1):
                L.set_epoch(epoch)
                collect(L)
            total = L.stats()["skipped"]["total"]
    named = [r for r in caplog.records if bad_key in r.getMessage() and "replaced" in r.getMessage()]
    assert total == 3 and len(named) == 1


# ---------------------------------------------------------------- stats
def test_stats_count_samples_exactly(wds_path):
    # The decode counters also count the next pass's batches decoded ahead (Loader.stats), as many as the read-on
    # reached when stats() is called: full ones here (7 a pass: 6 of 24, then 16).
    with make_loader(wds_path, batch_size=24, train=False, image_size=32) as L:
        collect(L)
        s = L.stats()
        ahead = s["counters"]["batches"] - 7
        assert 0 <= ahead < 7 and s["counters"]["samples"] == 160 + 24 * ahead
        assert s["stages"]["decode"]["count"] == s["counters"]["samples"] and s["stages"]["decode"]["seconds"] > 0
        assert s["stages"]["wait"]["count"] == 7
        assert s["skipped"]["total"] == 0
        assert s["info"]["decoder"] == CPU_DEFAULT and s["info"]["num_threads"] == 1
        json.dumps(s)
        collect(L)
        assert L.stats()["stages"]["wait"]["count"] == 14 and L.stats()["counters"]["samples"] >= 320


def test_shard_order_reads_whole_shards_and_each_sample_once(wds_path):
    """order="shard" (cold-storage locality): the Loader yields exactly the plan's samples, and that plan visits
    every sample once per epoch while staying within a bounded window of shards at any time."""
    with open_dataset(wds_path) as ds:
        shard_of = np.asarray(ds.extents().file_index, dtype=np.int64)
        labels_of = np.asarray(ds.labels)
    with make_loader(wds_path, order="shard", shuffle=True, drop_last=False, train=False) as L:
        got = torch.cat([y for _, y in collect(L)]).numpy()
        plan = sampling.plan_epoch(len(shard_of), seed=0, epoch=0, world=L.world, batch_size=16, drop_last=False,
                                   shuffle=True, order="shard", shard_of=shard_of)
    assert np.array_equal(got, labels_of[plan.indices])
    assert sorted(plan.indices.tolist()) == list(range(len(shard_of)))
    # Locality: consecutive reads come from few distinct shards (a global shuffle would hop across all of them).
    window = shard_of[plan.indices[:32]]
    assert len(set(window.tolist())) <= 4 < len(set(shard_of.tolist()))


def test_a_fatal_ring_error_reaches_the_training_loop_at_its_batch(wds_path):
    """If the ring itself fails mid-epoch (here: closed under the iteration), the consumer gets an error naming
    the cause at the next batch instead of waiting forever."""
    with make_loader(wds_path, drop_last=False) as L:
        it = iter(L)
        next(it)
        L._ring.close()  # white-box: the ring dies while workers still want batches
        with pytest.raises(LoaderError, match="RingClosedError"):
            for _ in range(len(L)):
                next(it)
