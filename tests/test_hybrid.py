"""The hybrid decoder (decode/hybrid.py) on the CPU: the climber that tunes its CPU share on the loop's pace, and
that a batch split anywhere between two parts is the batch one decoder makes — images, replacements of corrupt
records, errors.

Both parts here are DALI's CPU backend (the GPU part needs CUDA: tests/test_gpu.py runs the real pair), so the
merged batch must equal the one-decoder batch bit for bit."""
from __future__ import annotations

import gzip
import io
import json
from pathlib import Path

import numpy as np
import pytest
import skimage.data
import torch
from PIL import Image

import fastfeed
from fastfeed.decode import (CPU_DALI_MAX_OUTPUT, CPU_DECODE_MAX_PIXELS, HYBRID_MIN_CORES, THUMBNAIL_CPU_MIN_CORES,
                             CorruptSampleError, crop_windows, make_decoder, resolve_kind)
from fastfeed.decode.dali import DaliDecoder
from fastfeed.decode.hybrid import HybridDecoder
from fastfeed.tuning.climber import DDP_START_SHARE, START_SHARE, STEP, ShareClimber
from fastfeed.loader.settings import HYBRID_RESERVED_CORES
from fastfeed.tuning.pace import ConsumerPace
from fastfeed.types import ImageProfile
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


def test_both_parts_decode_and_are_counted():
    hybrid = HybridDecoder(_dali("raise"), _dali("raise"), device="cpu")  # no climber: START_SHARE
    try:
        samples, windows = _batch("g" * 16)
        hybrid(samples, windows)
        assert hybrid.cpu_images == round(16 * START_SHARE) and hybrid.gpu_images == 16 - hybrid.cpu_images
        _split_at(hybrid, 5)
        hybrid(samples, windows)
        first = round(16 * START_SHARE)
        assert (hybrid.cpu_images, hybrid.gpu_images) == (first + 5, 32 - first - 5)
    finally:
        hybrid.close()


def _loop(climber, pace, clock, period_of_share, batches, noise=0.02, seed=0, settled=None):
    """A training loop whose period depends on the CPU share the climber hands out, each step `noise` (relative)
    off at random; returns the shares used. `settled`, a list, gets `climber.settled` at each batch."""
    rng = np.random.default_rng(seed)
    shares = []
    for _ in range(batches):
        share = climber.current()
        shares.append(share)
        if settled is not None:
            settled.append(climber.settled)
        clock[0] += period_of_share(share) * (1 + noise * rng.standard_normal())
        pace.tick()
    return shares


def _climber(settle=6):
    clock = [0.0]
    pace = ConsumerPace(clock=lambda: clock[0])
    pace.start()
    return ShareClimber(pace, settle=settle), pace, clock


# Simple shapes: a loop that CPU decode speeds up (a GPU-bound model), one it slows down (a launch-bound one). The
# loops measured on an H200 are replayed below.
def _cpu_helps(share):
    return 0.060 * (1 - 0.2 * share)


def _r18(share):
    return 0.026 * (1 + 0.6 * share)


@pytest.mark.parametrize("seed", range(3))
def test_climber_moves_decode_to_the_cpu_when_that_makes_the_loop_faster(seed):
    climber, pace, clock = _climber()
    shares = _loop(climber, pace, clock, _cpu_helps, 600, seed=seed)
    assert min(shares[-100:]) >= 0.875, climber.history


@pytest.mark.parametrize("seed", range(3))
def test_climber_keeps_decode_on_the_gpu_when_cpu_decode_slows_the_loop(seed):
    climber, pace, clock = _climber()
    shares = _loop(climber, pace, clock, _r18, 600, seed=seed)
    assert max(shares[-100:]) <= STEP, climber.history


def test_climber_finds_an_optimum_inside_and_follows_a_change_of_the_loop():
    climber, pace, clock = _climber()
    shares = _loop(climber, pace, clock, lambda s: 0.05 * (1 + (s - 0.6) ** 2), 600)
    assert all(abs(x - 0.6) <= 0.15 for x in shares[-100:]), climber.history
    # The loop changes (another model) and the share follows, without a restart: after the hold, the climber
    # measures again.
    shares = _loop(climber, pace, clock, _r18, 1500, seed=1)
    assert max(shares[-100:]) <= STEP, climber.history[-12:]


# The loop's period at each fixed CPU share, step by step, measured on an H200 x2 (100 training steps per share after
# 30, batch 256; 7/8 was not measured and is drawn from 3/4 and 1; the script is at git tag lab-2026-12).
SWEEP = Path(__file__).resolve().parent / "data" / "share-sweep-h200x2.json.gz"


def _measured_steps(model: str) -> dict:
    steps: dict[float, list[float]] = {}
    for row in json.loads(gzip.decompress(SWEEP.read_bytes()))["consumers"][model]["rows"]:
        steps.setdefault(round(row["share"], 3), []).extend(row["per_step_s"])
    steps[0.875] = steps[0.75] + steps[1.0]
    return steps


def _replay(steps: dict, batches: int, seed: int, lag: int = 3) -> float:
    """The climber driving a loop whose every step is drawn from the steps measured at the share in effect (runs of
    8 consecutive measured steps, so bursts stay bursts); a share takes effect `lag` batches after it is handed out
    (the batches already in the decoders). Returns the loop's mean period."""
    rng = np.random.default_rng(seed)
    climber, pace, clock = _climber()
    handed, runs, total = [], {}, 0.0
    for t in range(batches):
        handed.append(climber.current())
        share = round(handed[max(0, t - lag)], 3)
        seq = steps[share]
        pos, left = runs.get(share, (0, 0))
        if left == 0:
            pos, left = int(rng.integers(len(seq))), 8
        runs[share] = (pos + 1, left - 1)
        dt = seq[pos % len(seq)]
        clock[0] += dt
        total += dt
        pace.tick()
    return total / batches


# ResNet-18's step on one H200 with 16 cores by CPU share (the climber's own measurements and a GPU-decode run):
# any CPU share slows it, 1/8 by 14%. A climber that starts at 1/8 can take a warming-up measurement for an
# improvement and settle 19% slower than the GPU alone. 1/2 and above were not measured (drawn worse than 3/8).
_R18_16_CORES = {0.0: 0.0242, 0.125: 0.0276, 0.25: 0.0273, 0.375: 0.0373}


def _r18_16_cores(share):
    return _R18_16_CORES.get(round(share, 3), 0.0373 * (1 + share))


@pytest.mark.parametrize("seed", range(3))
def test_on_a_16_core_host_resnet18_keeps_its_decode_on_the_gpu(seed):
    climber, pace, clock = _climber()
    shares = _loop(climber, pace, clock, _r18_16_cores, 300, noise=0.05, seed=seed)
    assert shares[-1] == 0.0, climber.history
    mean = clock[0] / len(shares)
    assert mean <= _R18_16_CORES[0.0] * 1.03, (mean, climber.history)  # the probes of 1/8 cost under 3%


# ResNet-18 on one H200 with 16 cores, a second set of runs: the mean step by the share the climber ended on (3/8
# from its one window there).
_R18_16_CORES_P = {0.0: 0.0247, 0.125: 0.0255, 0.25: 0.0264, 0.375: 0.0335}


def test_on_a_16_core_host_a_first_cpu_share_is_judged_on_two_windows_of_each():
    """There every CPU share slows ResNet-18 (1/8 by 3%, 1/4 by 7%), but its 32-batch windows spread by 3-5%, and
    judged on one window of the GPU alone the climber kept 1/8 or 1/4 in 5 of 20 runs (9,683-10,190 img/s against
    10,177-10,678). Here each window of the loop is 3% off at random and the first 45 batches 5% slow (warm-up): a share
    kept on one window of the GPU alone ended above 0 in 13 of 40 runs; measured twice, in 3."""
    def run(seed):
        rng = np.random.default_rng(seed)
        climber, pace, clock = _climber(settle=10)
        for t in range(600):
            if t % 32 == 0:
                window = 1 + 0.03 * rng.standard_normal()
            share = climber.current()
            period = _R18_16_CORES_P.get(round(share, 3), 0.0335 * (1 + share))
            clock[0] += period * window * (1.05 if t < 45 else 1) * (1 + 0.02 * rng.standard_normal())
            pace.tick()
        return climber.current(), clock[0] / 600

    runs = [run(seed) for seed in range(40)]
    assert sum(share > 0 for share, _ in runs) <= 4
    assert np.mean([mean for _, mean in runs]) <= _R18_16_CORES_P[0.0] * 1.01  # the probes cost under 1%


@pytest.mark.parametrize("model", ["resnet50", "resnet18"])
@pytest.mark.parametrize("batches", [300, 3000])
def test_on_the_measured_loops_the_climber_comes_close_to_the_best_fixed_share(model, batches):
    """ResNet-50's period is flat from 1/8 to 3/4 and 4% shorter than on the GPU alone; ResNet-18's is shortest at
    0-1/8 and a third longer at 1/2. Averaged over replays, the climber's loop must come within 2.5% of the best fixed
    share (3% over 300 batches: its first share is measured twice, ~80 batches more on the GPU alone) and never be
    more than 1% slower than the GPU decode alone (a climber that started at 1/4 with steps of 1/4 made a 300-batch
    ResNet-18 loop 6% slower than the GPU alone)."""
    steps = _measured_steps(model)
    means = {share: float(np.mean(v)) for share, v in steps.items()}
    got = float(np.mean([_replay(steps, batches, seed) for seed in range(12)]))
    assert min(means.values()) / got >= (0.97 if batches <= 300 else 0.975), (got, means)
    assert got <= means[0.0] * 1.01, (got, means[0.0])


def test_the_climber_says_it_has_settled_only_while_it_holds_a_share():
    """`settled` (what fastfeed bench warms up for): False while the climber measures its base and probes a
    neighbour, True through the hold after a look that found none faster, False again when it looks again."""
    from fastfeed.tuning.climber import HOLD_BATCHES

    climber, pace, clock = _climber()
    settled = []
    got = list(zip(_loop(climber, pace, clock, _r18, 3 * HOLD_BATCHES, noise=0.0, settled=settled), settled))
    first = next(i for i, (_, settled) in enumerate(got) if settled)
    assert STEP in {share for share, _ in got[:first]}  # it probed 1/8 before holding 0
    assert not any(settled for share, settled in got if share != 0.0)
    held = next(i for i in range(first, len(got)) if not got[i][1]) - first
    assert held == HOLD_BATCHES
    assert any(settled for _, settled in got[first + held:])  # it looked again, and holds again (twice as long)


def test_pace_counts_intervals_and_skips_the_gap_before_an_epoch():
    now = [0.0]
    pace = ConsumerPace(clock=lambda: now[0])
    pace.start()
    for _ in range(5):
        pace.tick()
        now[0] += 0.05
    assert pace.ticks == 5 and pace.intervals_since(0) == pytest.approx([0.05] * 4)
    assert pace.intervals_since(3) == pytest.approx([0.05] * 2)  # the intervals ending at ticks 4 and 5
    now[0] += 100.0
    pace.start()  # the next epoch's first batch: its wait is not a step
    pace.tick()
    assert pace.ticks == 6 and pace.intervals_since(5) == []


def test_the_loader_tells_the_pace_each_batch_it_hands_out(wds_path):
    with fastfeed.Loader(wds_path, batch_size=8, device="cpu", image_size=32) as loader:
        assert loader._pace.ticks == 0
        for k, _ in enumerate(loader):
            if k == 3:
                break
        assert loader._pace.ticks == 4 and len(loader._pace.intervals_since(0)) == 3


def test_hybrid_settings_and_errors():
    s = settings_for(world=World(cpus=32, local_world_size=2), decoder="hybrid", num_threads="auto", pipelines=None)
    assert s.decoder == "hybrid" and s.pipelines == 2
    assert s.decode_threads == (16 - HYBRID_RESERVED_CORES) // 2  # the rank's cores but the reserve, per pipeline
    assert settings_for(world=World(cpus=2), decoder="hybrid", num_threads="auto").decode_threads == 1
    with pytest.raises(ValueError, match="device='cuda'"):
        make_decoder("hybrid", device="cpu")


@pytest.mark.parametrize("pixels, png_share, cores, want", [
    (11_500, 0.0, 16, "cpu-dali"),  # thumbnails: the CPU decodes them all
    (11_500, 0.0, THUMBNAIL_CPU_MIN_CORES, "cpu-dali"),
    (11_500, 0.0, THUMBNAIL_CPU_MIN_CORES - 1, "dali"),  # but on too few cores to keep up with a small model
    (190_000, 0.0, 16, "hybrid"),  # ImageNet-like photos, cores to spare
    (190_000, 0.0, HYBRID_MIN_CORES - 1, "dali"),  # too few cores per rank to split
    (12_000_000, 0.0, 16, "dali"),  # 12-MP photos: the CPU is too slow to take a useful share
    (190_000, 0.7, 16, "dali"),  # PNG-heavy: DALI's CPU threads are sized for it
])
def test_auto_for_a_gpu_follows_the_images_and_the_cores(monkeypatch, pixels, png_share, cores, want):
    import fastfeed.decode.dali as dali

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(dali, "dali_available", lambda: True)
    images = ImageProfile(median_pixels=pixels, cpu_decode_share=png_share)
    assert resolve_kind("auto", "cuda:0", images, cores) == want
    assert resolve_kind("auto", "cuda:0", None, cores) == "dali"  # before the dataset is open
    # without a GPU: DALI's CPU backend for thumbnails cropped small (1.4-1.8x pillow-simd's path on them; 0.37x at
    # 224 px), pillow-simd otherwise
    small = pixels <= CPU_DECODE_MAX_PIXELS
    assert resolve_kind("auto", "cpu", images, cores, CPU_DALI_MAX_OUTPUT) == ("cpu-dali" if small else "cpu-pil")
    assert resolve_kind("auto", "cpu", images, cores, CPU_DALI_MAX_OUTPUT + 1) == "cpu-pil"
    assert resolve_kind("auto", "cpu", images, cores) == "cpu-pil"  # output size not given
    assert resolve_kind("auto", "cpu", None, cores, 64) == "cpu-pil"  # before the dataset is open
    assert resolve_kind("cpu", "cpu", images, cores, 64) == "cpu-pil"  # "cpu" names the pillow-simd path
    monkeypatch.setattr(dali, "dali_available", lambda: False)
    assert resolve_kind("auto", "cpu", images, cores, 64) == resolve_kind("auto", "cuda:0", images, cores) == "cpu-pil"


def test_a_rank_of_a_distributed_job_starts_its_climber_at_a_quarter():
    """settings.py chooses the start (decode/hybrid.py says why) and the Loader's climber starts there (the wiring
    through build_decoder needs a GPU: on two GPUs the climber settled at 0.36 from this start, at 0.02 from 0)."""
    from test_epoch import settings_for

    from fastfeed.world import World

    def start(world_size, local_world_size, cpus):
        world = World(rank=world_size - 1, world_size=world_size, local_rank=local_world_size - 1,
                      local_world_size=local_world_size, cpus=cpus)
        return settings_for(world=world).hybrid_start_share

    assert start(1, 1, 32) == START_SHARE == 0.0  # one process
    assert start(2, 2, 32) == DDP_START_SHARE == 0.25  # two ranks of 16 cores: what was measured
    assert start(4, 2, 32) == DDP_START_SHARE  # two hosts of two
    assert start(8, 8, 64) == START_SHARE  # 8 cores per rank: a quarter of a batch may outrun the CPU part
    assert ShareClimber(ConsumerPace(), settle=6, start=DDP_START_SHARE).share == DDP_START_SHARE
