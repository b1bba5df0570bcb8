"""The hybrid decoder (decode/hybrid.py) on the CPU: its split rule, the loop's pace, and that a batch split
anywhere between two parts is the batch one decoder makes — images, replacements of corrupt records, errors.

Both parts here are DALI's CPU backend (the GPU part needs CUDA: tests/test_gpu.py runs the real pair), so the
merged batch must equal the one-decoder batch bit for bit."""
from __future__ import annotations

import io

import numpy as np
import pytest
import skimage.data
import torch
from PIL import Image

import fastfeed
from fastfeed.decode import CorruptSampleError, crop_windows, make_decoder
from fastfeed.decode.dali import DaliDecoder
from fastfeed.decode.hybrid import FILL_MARGIN, START_SHARE, HybridDecoder, plan_split
from fastfeed.pace import PACE_MIN_INTERVALS, ConsumerPace
from fastfeed.settings import HYBRID_RESERVED_CORES
from fastfeed.world import World
from decode_samples import corrupt_variants
from test_epoch import settings_for

S = 48


def _jpeg(rgb, quality=90) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(rgb).save(buf, "JPEG", quality=quality)
    return buf.getvalue()


PHOTOS = [_jpeg(getattr(skimage.data, n)()) for n in ("astronaut", "coffee", "chelsea", "rocket")]
BAD = corrupt_variants(PHOTOS[0])


def _batch(kinds: str):
    """'g' = a good photo, 'b' = a corrupt record, one letter per position."""
    out, sizes = [], []
    for i, c in enumerate(kinds):
        data = PHOTOS[i % len(PHOTOS)] if c == "g" else list(BAD.values())[i % len(BAD)]
        out.append(np.frombuffer(data, dtype=np.uint8))
        sizes.append(Image.open(io.BytesIO(PHOTOS[i % len(PHOTOS)])).size)
    windows = crop_windows([s[0] for s in sizes], [s[1] for s in sizes], np.arange(len(kinds)), seed=1, epoch=0,
                           train=True, image_size=S)
    return out, windows


def _dali(on_error, channels_last=False):
    return DaliDecoder(device_id=None, image_size=S, dtype=torch.float16, batch_size=16, num_threads=1,
                       on_error=on_error, channels_last=channels_last)


@pytest.fixture(scope="module", params=[False, True], ids=["nchw", "nhwc"])
def pair(request):
    """(hybrid with on_error='skip', one decoder with on_error='skip', hybrid with on_error='raise')"""
    cl = request.param
    skip = HybridDecoder(_dali("raise", cl), _dali("raise", cl), device="cpu", on_error="skip")
    ref = _dali("skip", cl)
    strict = HybridDecoder(_dali("raise", cl), _dali("raise", cl), device="cpu", on_error="raise")
    yield skip, ref, strict
    for d in (skip, ref, strict):
        d.close()


def _split_at(decoder, k):
    decoder.split = lambda n: k


@pytest.mark.parametrize("kinds", ["gggggggg", "gbggbggb", "bbbggggg", "gggggbbb", "bgggggggb"])
def test_any_split_gives_the_one_decoder_batch(pair, kinds):
    hybrid, ref, _ = pair
    samples, windows = _batch(kinds)
    want = ref(samples, windows)
    for k in range(len(kinds) + 1):
        _split_at(hybrid, k)
        got = hybrid(samples, windows)
        assert got.images.shape == want.images.shape and got.images.dtype == want.images.dtype
        assert got.images.stride() == want.images.stride()
        assert torch.equal(got.images, want.images), f"split at {k} of {kinds}"
        assert [(r.position, r.code) for r in got.replaced] == [(r.position, r.code) for r in want.replaced]


def test_raise_names_every_bad_record_across_both_parts(pair):
    _, ref_skip, strict = pair
    samples, windows = _batch("gbggggbg")
    _split_at(strict, 4)
    with pytest.raises(CorruptSampleError) as e:
        strict(samples, windows)
    assert e.value.positions == [1, 6]
    assert e.value.codes == [r.code for r in ref_skip(samples, windows).replaced]


def test_a_batch_with_no_good_record_raises_in_skip_mode(pair):
    hybrid, _, _ = pair
    samples, windows = _batch("bbbb")
    _split_at(hybrid, 2)
    with pytest.raises(CorruptSampleError, match="no good sample left"):
        hybrid(samples, windows)


def test_the_split_learns_from_both_parts_and_counts_images():
    hybrid = HybridDecoder(_dali("raise"), _dali("raise"), device="cpu")
    try:
        samples, windows = _batch("g" * 16)
        assert hybrid.split(16) == round(16 * START_SHARE)  # nothing measured yet
        hybrid(samples, windows)
        assert hybrid.cpu_images == 4 and hybrid.gpu_images == 12
        # Both parts are the same decoder here: balance puts about half of the batch on each.
        for _ in range(3):
            hybrid(samples, windows)
        assert 3 <= hybrid.split(16) <= 13
    finally:
        hybrid.close()


def test_split_rule():
    n = 256
    assert plan_split(n, None, 1e-4, 0.05, 2) == round(n * START_SHARE)
    # No pace yet: balance, both parts end together (CPU 3x slower per image takes a quarter).
    assert plan_split(n, 3e-4, 1e-4, None, 1) == 64
    # A slow loop: the CPU fills FILL_MARGIN of the pipelines' time, here more than balance.
    assert plan_split(n, 1e-3, 1e-4, 0.05, 2) == int(FILL_MARGIN * 2 * 0.05 / 1e-3)
    # A loop slow enough for the CPU alone: every image on the CPU.
    assert plan_split(n, 1e-4, 1e-4, 1.0, 2) == n
    # The loader is the bottleneck (its period is the loader's own): fill falls below balance, balance holds.
    k = plan_split(n, 2e-4, 1e-4, 0.01, 2)
    assert k == int(n * 1e-4 / 3e-4)


def test_pace_is_the_median_interval_and_ignores_the_gap_before_an_epoch():
    now = [0.0]
    pace = ConsumerPace(clock=lambda: now[0])
    pace.start()
    for _ in range(PACE_MIN_INTERVALS):
        pace.tick()
        now[0] += 0.05
        assert pace.period() is None  # not enough intervals yet
    pace.tick()
    assert pace.period() == pytest.approx(0.05)
    now[0] += 10.0  # evaluation, a checkpoint: one long interval does not move the median
    pace.tick()
    assert pace.period() == pytest.approx(0.05)
    now[0] += 100.0
    pace.start()  # the next epoch's first batch: its wait is not a step
    pace.tick()
    assert pace.period() == pytest.approx(0.05)


def test_the_loader_tells_the_pace_each_batch_it_hands_out(wds_path):
    with fastfeed.Loader(wds_path, batch_size=8, device="cpu", image_size=32) as loader:
        assert loader._pace.period() is None
        for k, _ in enumerate(loader):
            if k >= PACE_MIN_INTERVALS:
                break
        assert loader._pace.period() is not None and loader._pace.period() > 0


def test_hybrid_settings_and_errors():
    s = settings_for(world=World(cpus=32, local_world_size=2), decoder="hybrid", num_threads="auto", pipelines=None)
    assert s.decoder == "hybrid" and s.pipelines == 2
    assert s.decode_threads == (16 - HYBRID_RESERVED_CORES) // 2  # the rank's cores but the reserve, per pipeline
    assert settings_for(world=World(cpus=2), decoder="hybrid", num_threads="auto").decode_threads == 1
    with pytest.raises(ValueError, match="device='cuda'"):
        make_decoder("hybrid", device="cpu")
