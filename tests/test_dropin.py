"""The DataLoader contract users rely on: evaluation semantics, dtype, len/iter, sampler, DataLoader
keywords, per-batch transforms, constructor validation, fork. Real packed data, CPU decoders."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import warnings

import numpy as np
import pytest
import torch

import fastfeed
from fastfeed import sampling
from fastfeed.loader.compat import _remainder
from fastfeed.world import World

N = 160  # conftest.DEMO_IMAGES


def make(path, **kw):
    opts = dict(batch_size=16, image_size=32, device="cpu", decoder="cpu", num_threads=1, reader_threads=1)
    opts.update(kw)
    return fastfeed.Loader(path, **opts)


def test_eval_defaults_score_every_sample_once_in_order_on_one_process(wds_path):
    with make(wds_path, batch_size=48, train=False) as L:
        assert (L.settings.shuffle, L.settings.drop_last) == (False, False)
        batches = [(x, y) for x, y in L]
        labels = torch.cat([y for _, y in batches])
        assert [x.shape[0] for x, _ in batches] == [48, 48, 48, 16] and len(L) == 4
        assert torch.equal(labels, torch.from_numpy(L.dataset.labels.astype(np.int64)))
        assert batches[0][0].dtype == torch.float32  # the default dtype: ToTensor + Normalize's


@pytest.mark.parametrize("world_size", [2, 3, 7])
def test_eval_over_ranks_masks_padding_so_each_sample_counts_once(wds_path, world_size):
    B = 16
    seen, counts = [], []
    for r in range(world_size):
        with make(wds_path, batch_size=B, train=False, rank=r, world_size=world_size) as L:
            plan = L.epoch_plan()
            labels = torch.cat([y for _, y in L])
            counts.append(len(L))
            assert len(labels) == len(plan.indices)
            real = labels != fastfeed.IGNORE_INDEX
            assert torch.equal(real, torch.from_numpy(~plan.padded))
            assert torch.equal(labels[real], torch.from_numpy(L.dataset.labels[plan.indices[~plan.padded]]
                                                             .astype(np.int64)))
            seen.extend(plan.indices[~plan.padded].tolist())
            # Accelerate keeps the first `remainder` samples of the gathered last step: exactly the real ones.
            gathered_last = world_size * plan.last_batch_size
            assert L.remainder == 0 or 0 < L.remainder < gathered_last + 1
    assert len(set(counts)) == 1, "every rank must run the same number of batches (DDP)"
    assert sorted(seen) == list(range(N))


@pytest.mark.parametrize("n,w,b", [(160, 3, 16), (160, 7, 16), (10, 2, 4), (11, 2, 4), (16, 4, 4), (3, 4, 2)])
def test_accelerate_remainder_is_the_real_part_of_the_gathered_last_step(n, w, b):
    plans = [sampling.plan_epoch(n, seed=0, epoch=0, world=World(r, w), batch_size=b, shuffle=False)
             for r in range(w)]
    last = np.concatenate([p.indices[(p.num_batches - 1) * b:] for p in plans])  # gathered in rank order
    pad = np.concatenate([p.padded[(p.num_batches - 1) * b:] for p in plans])
    rem = _remainder(plans[0])
    keep = len(last) if rem == 0 else rem
    assert not pad[:keep].any() and pad[keep:].all()
    gathered = np.concatenate([np.concatenate([p.batch(k) for p in plans]) for k in range(plans[0].num_batches)])
    assert sorted(gathered[:len(gathered) - len(last) + keep].tolist()) == list(range(n))


def test_len_is_a_full_epoch_and_iter_alone_changes_nothing(wds_path):
    with make(wds_path, shuffle=False) as L:
        fresh = L.state_dict()
        for _ in range(3):
            iter(L)  # Lightning probes iterability like this
        assert L.state_dict() == fresh and L.epoch == 0 and L.batches_left == len(L) == N // 16
        it = iter(L)
        next(it), next(it)
        assert L.batches_left == len(L) - 2 and len(L) == N // 16
        state = L.state_dict()
        del it
    with make(wds_path, shuffle=False) as R:
        R.load_state_dict(state)
        iter(R)
        assert R.batches_left == len(R) - 2 and R.state_dict() == state  # the pending position survives iter()
        assert len(list(R)) == len(R) - 2


def test_sampler_is_what_scripts_call_set_epoch_on(wds_path):
    with make(wds_path, rank=1, world_size=2, drop_last=False) as L:
        s = L.sampler
        assert (s.num_replicas, s.rank, s.shuffle, s.seed, s.epoch) == (2, 1, True, 0, 0)
        assert len(s) == N // 2
        s.set_epoch(3)
        assert L.epoch == 3
        want = sampling.plan_epoch(N, seed=0, epoch=3, world=World(1, 2), batch_size=16, drop_last=False).indices
        assert list(s) == want.tolist()
        first = next(iter(L))[1]
        assert torch.equal(first, torch.from_numpy(L.dataset.labels[want[:16]].astype(np.int64)))


def test_dataloader_keywords_are_mapped_or_warned_about_once(wds_path, recwarn):
    with make(wds_path, num_threads="auto", num_workers=2, prefetch_factor=3, pin_memory=True,
              persistent_workers=True) as L:
        assert (L.settings.decode_threads, L.settings.prefetch) == (2, 3)
    fastfeed.loader.settings._warned.clear()
    with pytest.warns(UserWarning, match="collate_fn"):
        make(wds_path, collate_fn=list, worker_init_fn=print, timeout=0).close()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        make(wds_path, worker_init_fn=print).close()  # once per process, not per Loader
    with pytest.raises(TypeError, match="bogus_arg"):
        make(wds_path, bogus_arg=1)


@pytest.mark.parametrize("bad,match", [
    (dict(batch_size=2.7), "batch_size must be an integer"),
    (dict(batch_size=10**9), "batch_size must be in"),
    (dict(batch_size=True), "batch_size must be an integer"),
    (dict(image_size=100000), "image_size must be in"),
    (dict(seed=-1), "seed must be in"),
    (dict(prefetch=0), "prefetch must be in"),
    (dict(order="random"), "order must be one of"),
    (dict(dtype=torch.int32), "dtype must be one of"),
    (dict(on_error="ignore"), "on_error must be one of"),
    (dict(orientation="rotate"), "orientation must be one of"),
    (dict(mean=(0.5, 0.5)), "mean must be 3"),
    (dict(std=(1, 0, 1)), "std must be > 0"),
    (dict(hw_decoder_load=1.5), "hw_decoder_load"),
    (dict(num_threads=0), "num_threads must be in"),
    (dict(device="tpu"), "device must be"),
    (dict(batch_transform=3), "batch_transform must be callable"),
])
def test_bad_arguments_are_refused_up_front_with_the_argument_named(tmp_path, bad, match):
    # tmp_path is no dataset: validation must fail before the folder is even opened.
    with pytest.raises(ValueError, match=match):
        fastfeed.Loader(tmp_path, **{"device": "cpu", **bad})


def _mix(images, labels):
    """MixUp the way torchvision/timm do it: draws from the global generators."""
    lam = float(np.random.beta(1.0, 1.0))
    perm = torch.randperm(images.shape[0])
    return lam * images + (1 - lam) * images[perm], labels[perm]


def test_batch_transform_is_deterministic_resume_exact_and_leaves_global_rngs_alone(wds_path):
    kw = dict(batch_transform=_mix, seed=3)
    with make(wds_path, **kw) as L:
        torch.manual_seed(123)
        np.random.seed(123)
        before = (torch.rand(1), np.random.rand())
        torch.manual_seed(123)
        np.random.seed(123)
        full = [(x.clone(), y.clone()) for x, y in L]
        assert (torch.rand(1), np.random.rand()) == before  # the user's streams did not move
    with make(wds_path, **kw) as L:
        it = iter(L)
        [next(it) for _ in range(4)]
        state = json.loads(json.dumps(L.state_dict()))
    with make(wds_path, **kw) as R:
        R.load_state_dict(state)
        rest = [(x.clone(), y.clone()) for x, y in R]
    assert len(rest) == len(full) - 4
    for (xa, ya), (xb, yb) in zip(full[4:], rest):
        assert torch.equal(ya, yb) and torch.equal(xa, xb)
    with make(wds_path, seed=3) as plain:
        assert not torch.equal(next(iter(plain))[0], full[0][0])  # the transform really ran


def _pack_and_damage(tmp_path, pack_cli, *, num_images: int, seed: int, i: int, damage) -> tuple:
    """A fresh WebDataset of `num_images` demo JPEGs whose sample i's stored bytes went through damage(bytearray
    view of them) after packing; returns (dataset folder, key of sample i)."""
    from fastfeed.demo_data import make_dataset

    tree = make_dataset(tmp_path / "src", num_images=num_images, num_classes=1, seed=seed, workers=1)
    out = tmp_path / "wds"
    pack_cli(tree, out, "--format", "wds")
    shard = next(out.glob("*.tar"))
    with fastfeed.open_dataset(out) as ds:
        ext = ds.extents()
        off, size = int(ext.offset[i]), int(ext.size[i])
        key = str(ds.keys[i])
    data = bytearray(shard.read_bytes())
    damage(memoryview(data)[off:off + size])
    shard.unlink()  # a new file: the session's datasets may share this one's inode
    shard.write_bytes(bytes(data))
    return out, key


def _zero(record) -> None:
    record[:] = b"\0" * len(record)  # no image at all any more


def _flip_one_byte(record) -> None:
    record[len(record) // 2] ^= 0x55  # inside the entropy-coded data: still "a JPEG"


def test_a_batch_of_only_bad_samples_is_filled_from_the_epoch(tmp_path, pack_cli):
    i = 4
    out, key = _pack_and_damage(tmp_path, pack_cli, num_images=9, seed=4, i=i, damage=_zero)
    for train in (True, False):
        with make(out, batch_size=1, train=train, shuffle=False, drop_last=False, verify_checksums=False) as L:
            batches = list(L)
            skipped = L.stats()["skipped"]
        assert len(batches) == 9 and all(x.shape[0] == 1 for x, _ in batches)
        assert skipped["total"] == 1 and skipped["examples"][0]["key"] == key
        assert torch.equal(batches[i][0], batches[i + 1][0])  # the next sample of the epoch stands in
        assert batches[i][1].item() == (batches[i + 1][1].item() if train else fastfeed.IGNORE_INDEX)


def _run(script: str, timeout=240) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(script)], capture_output=True, text=True,
                          timeout=timeout)


@pytest.mark.integration  # a fresh interpreter
def test_works_after_a_script_replaced_builtins_print(wds_path):
    # torchvision's references/classification/utils.py setup_for_distributed, on a non-master rank.
    proc = _run(f"""
        import builtins as __builtin__
        builtin_print = __builtin__.print
        def print(*args, **kwargs):
            force = kwargs.pop("force", False)
            if force:
                builtin_print(*args, **kwargs)
        __builtin__.print = print
        import fastfeed
        L = fastfeed.Loader({str(wds_path)!r}, batch_size=16, image_size=32, device="cpu", decoder="cpu")
        n = sum(x.shape[0] for x, _ in L)
        print("samples", n, force=True)
    """)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "samples 160" in proc.stdout


@pytest.mark.integration  # a fresh interpreter that forks
@pytest.mark.parametrize("decoder", ["cpu-pil", "cpu-dali"])
def test_a_forked_child_can_exit_or_build_its_own_loader(wds_path, decoder):
    proc = _run(f"""
        import os, fastfeed
        kw = dict(batch_size=16, image_size=32, device="cpu", decoder={decoder!r}, num_threads=1)
        L = fastfeed.Loader({str(wds_path)!r}, **kw)
        it = iter(L); next(it)  # live workers and pipelines at fork time
        for mode in ("exit", "own"):
            pid = os.fork()
            if pid == 0:
                code = 0
                try:
                    if mode == "own":
                        try:
                            iter(L)
                            code = 3  # the parent's Loader must refuse
                        except RuntimeError:
                            pass
                        with fastfeed.Loader({str(wds_path)!r}, **kw) as mine:
                            code = code or (0 if sum(x.shape[0] for x, _ in mine) == 160 else 4)
                finally:
                    os._exit(code) if mode == "own" else None
                raise SystemExit(code)  # a normal interpreter exit: destructors and atexit run
            _, status = os.waitpid(pid, 0)
            print(mode, os.waitstatus_to_exitcode(status))
        print("parent", sum(1 for _ in it) + 1)
    """)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "exit 0" in proc.stdout and "own 0" in proc.stdout and "parent 10" in proc.stdout, proc.stdout


def test_a_sample_whose_bytes_changed_after_packing_is_caught_by_its_checksum(tmp_path, pack_cli):
    out, key = _pack_and_damage(tmp_path, pack_cli, num_images=12, seed=5, i=7, damage=_flip_one_byte)
    with make(out, batch_size=4, train=False, verify_checksums=True) as L:
        list(L)
        skipped, ring = L.stats()["skipped"], L.stats()["ring"]
    assert skipped["total"] == 1 and skipped["by_reason"] == {"checksum": 1}, skipped
    assert skipped["examples"][0]["key"] == key
    # the ring's reader threads hashed the samples (the check only compared their digests)
    assert ring["digests"] is True and ring["digest_seconds"] > 0
    with make(out, batch_size=4, train=False, verify_checksums=False) as L:
        list(L)
        assert L.stats()["skipped"]["total"] == 0  # unchecked, the flipped byte decodes to other pixels
        assert L.stats()["ring"]["digests"] is False
    with make(out, batch_size=4, train=False, on_error="raise") as L:
        with pytest.raises(fastfeed.LoaderError, match=key):
            list(L)
