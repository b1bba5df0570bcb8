"""The GPU path, on a machine with CUDA and DALI (`pytest -m gpu`; skipped elsewhere, see conftest.py).

Same data and the same assertions as the CPU tests: what the user sees on the GPU must match the CPU path."""
from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

import fastfeed

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def gpu_wds(demo_tree, tmp_path_factory, pack_cli):
    out = tmp_path_factory.mktemp("gpu") / "wds"
    pack_cli(demo_tree, out, "--format", "wds", "--shard-size", "4MB")
    return out


def _unnormalise(x):
    mean = torch.tensor(fastfeed.IMAGENET_MEAN, device=x.device).view(1, 3, 1, 1)
    std = torch.tensor(fastfeed.IMAGENET_STD, device=x.device).view(1, 3, 1, 1)
    return (x.float() * std + mean) * 255


def test_gpu_eval_matches_the_cpu_path_sample_for_sample(gpu_wds):
    kw = dict(batch_size=32, train=False, image_size=64)
    with fastfeed.Loader(gpu_wds, device="cuda", decoder="dali", **kw) as g, \
            fastfeed.Loader(gpu_wds, device="cpu", decoder="cpu", **kw) as c:
        assert g.settings.decoder == "dali"
        for (xg, yg), (xc, yc) in zip(g, c):
            assert xg.is_cuda and yg.is_cuda and xg.dtype == torch.float32
            assert torch.equal(yg.cpu(), yc)
            diff = (_unnormalise(xg).cpu() - _unnormalise(xc)).abs().mean().item()
            assert diff < 2.0, f"GPU and CPU eval outputs differ by {diff:.2f}/255 on average"


def test_gpu_train_batches_are_deterministic_and_channels_last(gpu_wds):
    kw = dict(batch_size=32, train=True, image_size=64, device="cuda", channels_last=True, decoder="dali",
              dtype=torch.bfloat16, hw_decoder_load=0.0)  # CUDA decoder only: bit-exact run to run
    with fastfeed.Loader(gpu_wds, **kw) as a, fastfeed.Loader(gpu_wds, **kw) as b:
        for (xa, ya), (xb, yb) in zip(a, b):
            assert xa.is_contiguous(memory_format=torch.channels_last) and xa.dtype == torch.bfloat16
            assert torch.equal(ya, yb) and torch.equal(xa, xb)


def test_first_batch_of_a_gpu_loader_is_quick(gpu_wds):
    import time

    t0 = time.perf_counter()
    with fastfeed.Loader(gpu_wds, batch_size=64, device="cuda") as L:
        next(iter(L))
        elapsed = time.perf_counter() - t0
    print(f"time to first batch: {elapsed:.2f} s")
    assert elapsed < 30  # the 3 s target is measured in benchmarks/bench_gpu.py, not asserted here


def test_a_gpu_training_loader_decodes_epoch_0_before_its_first_iteration(gpu_wds):
    """NOTE [Reading before the first iteration] in fastfeed/loader/loader.py: with decoders on the GPU the constructor starts
    epoch 0's decode, and the first iteration continues it with exactly the batches of a Loader whose early work was
    dropped (the CUDA decoder alone: bit-exact)."""
    from test_epoch_chain import epoch_0_restarted, wait_for_read_on

    kw = dict(batch_size=16, train=True, image_size=64, device="cuda", decoder="dali", hw_decoder_load=0.0)
    with fastfeed.Loader(gpu_wds, **kw) as early:
        assert wait_for_read_on(early, consumed=0, timeout=60) > 0, "nothing decoded before the first iteration"
        run = early._parked
        it = iter(early)
        got = [tuple(t.clone() for t in next(it))]
        assert early._active is run, "the first iteration did not continue the early run"
        got += [(x.clone(), y.clone()) for x, y in it]
    with fastfeed.Loader(gpu_wds, **kw) as ref:
        want = epoch_0_restarted(ref)
    assert len(got) == len(want) > 2
    for (xa, ya), (xb, yb) in zip(got, want):
        assert torch.equal(ya, yb) and torch.equal(xa, xb)
    with fastfeed.Loader(gpu_wds, batch_size=16, device="cuda", decoder="hybrid") as hybrid:
        assert hybrid._parked is not None  # started too


def test_forked_children_of_a_gpu_loader_work_and_exit_cleanly(gpu_wds):
    """A multiprocessing (fork) child reads the dataset with its own CPU Loader and exits 0; a hand-forked child
    that leaves with os._exit exits 0. (CUDA cannot be used in either: docs/user-guide.md, "Processes that fork".)"""
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(f"""
        import multiprocessing as mp, os, fastfeed

        def child(q):
            with fastfeed.Loader({str(gpu_wds)!r}, batch_size=8, device="cpu", train=False) as C:
                x, y = next(iter(C))
            q.put((tuple(x.shape), len(y)))

        if __name__ == "__main__":
            L = fastfeed.Loader({str(gpu_wds)!r}, batch_size=32, device="cuda")
            it = iter(L); next(it)
            ctx = mp.get_context("fork")
            q = ctx.Queue()
            p = ctx.Process(target=child, args=(q,)); p.start(); got = q.get(timeout=120); p.join(120)
            print("mp child", p.exitcode, got)
            pid = os.fork()
            if pid == 0:
                os._exit(0)
            _, status = os.waitpid(pid, 0)
            print("fork child", os.waitstatus_to_exitcode(status))
            next(it)  # the parent's Loader still works
            print("parent ok")
    """)], capture_output=True, text=True, timeout=300)
    out = proc.stdout
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "mp child 0 ((8, 3, 224, 224), 8)" in out and "fork child 0" in out and "parent ok" in out, out


def test_ring_slots_are_page_locked_when_first_used(gpu_wds):
    """The ring pins each slot the first time one of its batches is handed out (ring.py): the batch's memory is
    then page-locked as CUDA sees it, and every slot is pinned once the ring has gone round."""
    from fastfeed.datasets import open_dataset
    from fastfeed.loader.ring import PrefetchRing

    ext = open_dataset(gpu_wds).extents()
    with PrefetchRing(ext, 8, num_slots=3) as ring:
        assert ring.stats()["pinned"] is True
        ring.start(np.arange(len(ext.size)))
        seen = 0
        while (b := ring.next_batch(timeout=10)) is not None:
            with b:
                assert b.pinned, f"batch {b.position} sits in a slot that was not page-locked"
                assert torch.from_numpy(b.data).is_pinned()
            seen += 1
        assert seen > 3


def test_samples_handed_to_dali_as_page_locked_decode_to_the_same_bits(gpu_wds, monkeypatch):
    """pinned_input (decode/dali.py): the ring's page-locked slots handed to DALI as such (no copy of its own), each
    batch waiting until DALI has read them. On real ring batches it takes that path and decodes, bit for bit, what
    DALI's own copy of the same bytes decodes; a sample that is not in the slot (read again on its own) is not
    marked."""
    from fastfeed.datasets import open_dataset
    from fastfeed.decode.crop import crop_windows
    import fastfeed.decode.dali as D
    from fastfeed.loader.ring import PrefetchRing

    waits = []
    inputs_read = D._inputs_read
    monkeypatch.setattr(D, "_inputs_read", lambda device: (waits.append(device), inputs_read(device)))
    ds = open_dataset(gpu_wds)
    ext = ds.extents()
    kw = dict(device_id=0, image_size=64, dtype=torch.float16, batch_size=16, hw_decoder_load=0.0)  # bit-exact
    inplace, copied = D.DaliDecoder(pinned_input=True, **kw), D.DaliDecoder(**kw)
    seen = 0
    with PrefetchRing(ext, 16, num_slots=3) as ring:
        ring.start(np.arange(len(ext.size)))
        while (b := ring.next_batch(timeout=10)) is not None:
            with b:
                idx = np.asarray(b.indices)
                windows = crop_windows(np.asarray(ds.widths)[idx], np.asarray(ds.heights)[idx], idx, seed=1,
                                       epoch=0, train=True, image_size=64)
                samples = b.samples()
                assert b.pinned and D._page_locked(samples)
                assert not D._page_locked(samples[:-1] + [np.array(samples[-1])])
                before = len(waits)
                a = inplace(samples, windows).images
                assert len(waits) == before + 1
                c = copied(samples, windows).images
                assert len(waits) == before + 1 and torch.equal(a, c)
            seen += 1
    assert seen > 3


def test_zero_copy_batches_stay_valid_after_later_batches(gpu_wds):
    """zero_copy hands DALI's output buffer to torch without a copy (decode/dali_capi.py: _CudaArray keeps it alive):
    a batch kept while the decoder runs on must still hold its own pixels, equal to a copied decode of the same
    samples."""
    from fastfeed.datasets import open_dataset
    from fastfeed.decode.crop import crop_windows
    from fastfeed.decode.dali import DaliDecoder

    ds = open_dataset(gpu_wds)
    n = 16
    batches = []
    for start in range(0, 4 * n, n):
        idx = np.arange(start, start + n)
        samples = [np.frombuffer(ds.read(int(i)), dtype=np.uint8) for i in idx]
        batches.append((samples, crop_windows(np.asarray(ds.widths)[idx], np.asarray(ds.heights)[idx], idx, seed=1,
                                              epoch=0, train=True, image_size=64)))
    kw = dict(device_id=0, image_size=64, dtype=torch.float16, batch_size=n, hw_decoder_load=0.0)  # bit-exact
    shared, copied = DaliDecoder(zero_copy=True, **kw), DaliDecoder(**kw)
    kept = [shared(*b).images for b in batches]  # each kept while the next ones are decoded
    torch.cuda.synchronize()
    for k, b in zip(kept, batches):
        assert torch.equal(k, copied(*b).images)
    assert not torch.equal(kept[0], kept[1])
    shared.close()
    copied.close()
    assert kept[0].float().std() > 0.1  # still readable after the decoder is gone


def test_cpu_decode_for_a_gpu_is_the_cpu_paths_bits_on_the_gpu(gpu_wds):
    """decoder="cpu-dali" with a CUDA device decodes on the CPU and normalises on the GPU (decode/split.py): the
    batches equal, bit for bit, the same decoder's batches on the CPU device."""
    kw = dict(batch_size=32, train=True, image_size=64, decoder="cpu-dali", dtype=torch.bfloat16,
              channels_last=True, seed=3)
    with fastfeed.Loader(gpu_wds, device="cuda", **kw) as g, fastfeed.Loader(gpu_wds, device="cpu", **kw) as c:
        n = 0
        for (xg, yg), (xc, yc) in zip(g, c):
            assert xg.is_cuda and xg.dtype == torch.bfloat16
            assert xg.is_contiguous(memory_format=torch.channels_last)
            assert torch.equal(yg.cpu(), yc) and torch.equal(xg.cpu(), xc)
            n += 1
        assert n == len(g) > 1


def test_auto_decodes_thumbnails_on_the_cpu_and_photos_on_both(gpu_wds, tmp_path, pack_cli):
    from PIL import Image

    from fastfeed.decode import CPU_DECODE_MAX_PIXELS, HYBRID_MIN_CORES, THUMBNAIL_CPU_MIN_CORES

    src = tmp_path / "thumbs"
    rng = np.random.default_rng(0)
    for c in range(2):
        (src / f"c{c}").mkdir(parents=True)
        for i in range(40):
            Image.fromarray(rng.integers(0, 255, (96, 80, 3), dtype=np.uint8)).save(src / f"c{c}" / f"{i}.jpg")
    assert 96 * 80 <= CPU_DECODE_MAX_PIXELS
    pack_cli(src, tmp_path / "wds", "--format", "wds")
    with fastfeed.Loader(tmp_path / "wds", batch_size=16, device="cuda") as thumbs, \
            fastfeed.Loader(gpu_wds, batch_size=16, device="cuda") as photos:
        # photos: split between CPU and GPU on a rank with cores to spare (decode/__init__.py, resolve_kind)
        spare = photos.world.cpus_per_rank >= HYBRID_MIN_CORES
        assert photos.settings.decoder == ("hybrid" if spare else "dali")
        # thumbnails: on the CPU where the rank has the cores to keep up, else on the GPU
        cpu = thumbs.world.cpus_per_rank >= THUMBNAIL_CPU_MIN_CORES
        assert thumbs.settings.decoder == ("cpu-dali" if cpu else "dali")
        x, y = next(iter(thumbs))
        assert x.is_cuda and y.is_cuda and x.shape == (16, 3, 224, 224)


def test_hybrid_batches_match_the_cpu_path_and_use_both_parts(gpu_wds):
    """decoder="hybrid" splits every batch between DALI's CPU backend and the GPU (decode/hybrid.py): eval
    batches match the CPU path sample for sample (within the decode contract), and both parts decode. The climber
    starts on the GPU alone and a few batches give it nothing to measure, so the split is fixed at half here."""
    kw = dict(batch_size=32, train=False, image_size=64)
    with fastfeed.Loader(gpu_wds, device="cuda", decoder="hybrid", channels_last=True, **kw) as h, \
            fastfeed.Loader(gpu_wds, device="cpu", decoder="cpu", **kw) as c:
        assert h.settings.decoder == "hybrid"
        for d in h._decoders:
            d.split = lambda n: n // 2
        for (xh, yh), (xc, yc) in zip(h, c):
            assert xh.is_cuda and xh.is_contiguous(memory_format=torch.channels_last)
            assert torch.equal(yh.cpu(), yc)
            diff = (_unnormalise(xh).cpu() - _unnormalise(xc)).abs().mean().item()
            assert diff < 2.0, f"hybrid and CPU eval outputs differ by {diff:.2f}/255 on average"
        assert sum(d.cpu_images for d in h._decoders) > 0 and sum(d.gpu_images for d in h._decoders) > 0


def test_the_pipeline_tuner_changes_no_batch(gpu_wds):
    """A GPU Loader whose `pipelines` is not given tunes their number on the loop (fastfeed/tuning/pipelines.py); a loop
    that does nothing waits for every batch, so the one pipeline it starts with is measured and a second tried.
    Whatever it runs, the batches are those of a fixed count (the CUDA decoder alone: bit-exact), over epochs read on
    one into the next."""
    from fastfeed.tuning.pipelines import GROW_WAIT

    kw = dict(batch_size=8, train=True, image_size=64, device="cuda", decoder="dali", hw_decoder_load=0.0)
    epochs = 8  # 20 batches each: enough for a few measurements
    with fastfeed.Loader(gpu_wds, **kw) as tuned:
        limit = tuned.settings.pipeline_limit
        assert limit == max(2, min(4, tuned.world.cpus_per_rank // 4))
        assert tuned.settings.pipelines == tuned.settings.pipeline_floor == 1
        got = [(x.clone(), y.clone()) for _ in range(epochs) for x, y in tuned]
        history = tuned.stats()["pipeline_history"]
        now = tuned.stats()["info"]["pipelines"]
        built = tuned.stats()["counters"]["pipelines_built"]  # one before the first batch, the rest by the workers
    print(f"pipelines now {now}, measured (count, period s, wait share): {history}")
    assert history and all(1 <= count <= limit for count, _, _ in history) and 1 <= now <= limit
    assert history[0][0] == 1 and history[0][2] >= GROW_WAIT and any(c == 2 for c, _, _ in history)
    assert max(c for c, _, _ in history) <= built <= limit  # a pipeline dropped stays built: never built twice
    with fastfeed.Loader(gpu_wds, pipelines=2, **kw) as fixed:
        assert fixed.settings.pipeline_limit == 2 and "pipeline_history" not in fixed.stats()
        want = [(x.clone(), y.clone()) for _ in range(epochs) for x, y in fixed]
        assert fixed.stats()["counters"]["pipelines_built"] == 2
    assert len(got) == len(want) == epochs * 20
    for (xa, ya), (xb, yb) in zip(got, want):
        assert torch.equal(ya, yb) and torch.equal(xa, xb)


def test_a_gpu_pipeline_beside_cpu_ones_gives_the_same_batches(gpu_wds, monkeypatch):
    """A "cpu-dali" Loader on a GPU whose tuner reaches past its CPU pipelines decodes on the GPU there
    (`gpu_pipelines_from`, fastfeed/loader/settings.py); the workers take batches in turn, so the pool is mixed within an
    epoch. Here the second of two fixed pipelines is the GPU one: every eval batch matches the CPU path."""
    from fastfeed.decode.dali import DaliDecoder
    import fastfeed.loader.loader as loader_module

    resolve = loader_module.resolve_settings

    def mixed(**kw):
        s = resolve(**kw)
        return s.replace(gpu_pipelines_from=1) if kw.get("images") is not None else s
    monkeypatch.setattr(loader_module, "resolve_settings", mixed)
    kw = dict(batch_size=16, train=False, image_size=64)
    with fastfeed.Loader(gpu_wds, device="cuda", decoder="cpu-dali", pipelines=2, channels_last=True, **kw) as m, \
            fastfeed.Loader(gpu_wds, device="cpu", decoder="cpu", **kw) as c:
        gpu = m._decoders[1]
        assert isinstance(gpu, DaliDecoder) and gpu.device.type == "cuda"
        assert not isinstance(m._decoders[0], DaliDecoder)  # the CPU backend, normalised on the GPU (split.py)
        n = 0
        for (xm, ym), (xc, yc) in zip(m, c):
            assert xm.is_cuda and xm.is_contiguous(memory_format=torch.channels_last) and xm.dtype == torch.float32
            assert torch.equal(ym.cpu(), yc)
            diff = (_unnormalise(xm).cpu() - _unnormalise(xc)).abs().mean().item()
            assert diff < 2.0, f"batch {n}: mixed pool and CPU eval outputs differ by {diff:.2f}/255 on average"
            n += 1
        assert n == len(c) > 2


@pytest.mark.parametrize("decoder", ["dali", "hybrid"])
def test_fields_on_adopted_shards_come_with_each_image_on_the_gpu_decoders(tmp_path, decoder):
    """Adopted webdataset shards with captions and arrays, on the GPU decoders (which read the image out of the ring
    read that also holds its members): each caption and array with its own image, the pixels the CPU path's."""
    wds = pytest.importorskip("webdataset")
    from test_index import N, check_batch, sample

    from fastfeed.pack.index import index_shards

    src = tmp_path / "shards"
    src.mkdir()
    with wds.ShardWriter(str(src / "part-%04d.tar"), maxcount=16, verbose=0) as sink:
        for i in range(N):
            sink.write(sample(i))
    index_shards(str(src))
    kw = dict(batch_size=8, train=False, image_size=16, dtype=torch.uint8, fields=["txt", "json", "npy", "cls"])
    with fastfeed.Loader(src, device="cuda", decoder=decoder, **kw) as g, \
            fastfeed.Loader(src, device="cpu", decoder="cpu", **kw) as c:
        seen = []
        for bg, bc in zip(g, c):
            assert bg["images"].is_cuda
            assert bg["npy"].is_cuda and bg["cls"].is_cuda  # tensor fields on the device, with the labels
            assert (bg["txt"], bg["json"]) == (bc["txt"], bc["json"]) and torch.equal(bg["npy"].cpu(), bc["npy"])
            assert (bg["images"].float().cpu() - bc["images"].float()).abs().mean() < 2.0
            seen += check_batch({**bg, "images": bg["images"].cpu(), "labels": bg["labels"].cpu(),
                                 "cls": bg["cls"].cpu(), "npy": bg["npy"].cpu()})
    assert sorted(seen) == list(range(N))
