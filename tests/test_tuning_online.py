"""OnlineTuner: the decode settings follow the training loop (issue 14). The tuner only sees (wait, step) per batch,
so these tests drive it with a training loop whose timings follow the H200 measurements' shape: each rung decodes
faster but slows the step a little more (its GPU work shares the chip with the model)."""
import numpy as np
import pytest

from fastfeed.tuning import LADDER, START, DecodeSettings, OnlineTuner

BATCH = 256
CAPACITY = (10_500, 14_800, 16_900, 18_200)  # img/s per rung of LADDER, consumer "none" (RESULTS.md)
INTERFERENCE = (0.0, 0.03, 0.05, 0.07)  # step slowdown per rung


class Loop:
    """A training loop: compute `compute_s` per batch, the loader's decode capacity set by the tuner's rung."""

    def __init__(self, tuner, compute_s, seed=0, noise=0.005):
        self.tuner, self.compute_s, self.noise = tuner, compute_s, noise
        self.rng = np.random.default_rng(seed)
        self.switches = []

    def run(self, steps):
        for _ in range(steps):
            lv = self.tuner.level
            compute = self.compute_s * (1 + INTERFERENCE[lv]) * (1 + self.rng.normal(0, self.noise))
            produce = BATCH / CAPACITY[lv] * (1 + self.rng.normal(0, self.noise))
            wait = max(0.0, produce - compute)
            new = self.tuner.observe(wait, wait + compute)
            if new is not None:
                assert new == self.tuner.current == LADDER[self.tuner.level]
                self.switches.append(self.tuner.level)
        return self


def test_starts_at_the_training_winner_and_stays_there_for_a_slow_model():
    # ResNet-50-like: 55 ms per batch, far more than any rung needs (20 ms): no wait, so no reason to add work
    t = OnlineTuner()
    assert t.current == START == DecodeSettings(1.0, 2, 1)
    loop = Loop(t, 0.055).run(600)
    assert loop.switches == [] and t.level == 0


def test_climbs_while_the_loop_waits_and_stops_where_the_wait_is_gone():
    # ResNet-18-like: 15 ms compute; rung 0 needs 24.4 ms per batch, rung 1 17.3 ms, rung 2 15.1 ms (15.75 ms
    # compute there), rung 3 14.1 ms (16.05 ms compute): rung 2 trains fastest
    steps = [max(0.015 * (1 + INTERFERENCE[i]), BATCH / CAPACITY[i]) for i in range(len(LADDER))]
    assert int(np.argmin(steps)) == 2
    t = OnlineTuner()
    loop = Loop(t, 0.015).run(800)
    assert t.level == 2, t.history
    assert loop.switches[:2] == [1, 2]
    assert t._step_at[t.level] == pytest.approx(steps[2], rel=0.03)
    # settled: from then on only the periodic probe down (and its undo), one per probe_every windows at most
    assert len(loop.switches) <= 2 + 2 * (800 // (t.probe_every * t.window)), t.history


def test_a_climb_that_does_not_pay_is_undone_and_not_retried_at_the_same_wait():
    # decode capacity that does not grow with the rungs: more pipelines only slow the step
    global CAPACITY
    saved, CAPACITY = CAPACITY, (10_500, 10_500, 10_500, 10_500)
    try:
        t = OnlineTuner()
        loop = Loop(t, 0.017).run(1000)
    finally:
        CAPACITY = saved
    assert t.level == 0
    assert loop.switches[:2] == [1, 0]
    assert len(loop.switches) == 2, t.history
    assert [h["decision"] for h in t.history] == ["climb", "reverted"]


def test_follows_a_consumer_that_changes():
    t = OnlineTuner(probe_every=4)
    loop = Loop(t, 0.015).run(600)  # fast model: climbs
    high = t.level
    assert high >= 2
    loop.compute_s = 0.055  # the loop now trains a slow model: less decode work trains faster
    loop.run(2500)
    assert t.level == 0, t.history
    assert any(h["decision"] == "probe down" for h in t.history)
    loop.compute_s = 0.012  # and a faster one again
    loop.run(600)
    assert t.level >= 2


def test_cpu_budget_drops_rungs_that_need_more_threads_than_allowed():
    t = OnlineTuner(max_threads=4)
    assert all(r.num_threads * r.pipelines <= 4 for r in t.ladder)
    assert t.current == START
    assert OnlineTuner(max_threads=1).ladder[0] == START  # never empty: the start rung stays


def test_settle_steps_after_a_switch_are_not_measured():
    t = OnlineTuner(window=4, settle=3)
    decisions = [t.observe(0.010, 0.020) for _ in range(3 + 4)]  # 3 settle + one window with 50% wait
    assert decisions[:-1] == [None] * 6 and decisions[-1] == LADDER[1]
    assert [t.observe(0.5, 1.0) for _ in range(3)] == [None] * 3  # after the switch: settling, ignored
    assert t._waits == []


@pytest.mark.parametrize("kw", [dict(window=1), dict(settle=-1), dict(wait_low=0.2, wait_high=0.1),
                                dict(tolerance=1.5), dict(probe_every=0)])
def test_bad_arguments_are_refused(kw):
    with pytest.raises(ValueError):
        OnlineTuner(**kw)
    with pytest.raises(ValueError):
        OnlineTuner(ladder=())


def test_switching_decoders_mid_epoch_keeps_every_batch_in_order(wds_path):
    """The wiring the tuner drives (EpochRun.set_decoders): grow to 3 pipelines, shrink to 1, swap for new decoders
    of another thread count, all mid-epoch; the batches must be exactly those of an undisturbed run."""
    import torch

    from fastfeed import Loader
    from fastfeed.decode import make_decoder

    opts = dict(batch_size=8, image_size=32, device="cpu", decoder="cpu-pil", dtype=torch.uint8, num_threads=1,
                pipelines=1, seed=3)

    def make(threads):
        return make_decoder("cpu-pil", device="cpu", image_size=32, dtype=torch.uint8, batch_size=8,
                            num_threads=threads, draft=True)

    with Loader(wds_path, **opts) as ref:
        want = [(x.clone(), y.clone()) for x, y in ref]
    with Loader(wds_path, **{**opts, "pipelines": 3}) as loader:  # a ring sized for 3 pipelines
        got, it = [], iter(loader)
        first, second, third = loader._decoders
        for k, (x, y) in enumerate(it):
            got.append((x.clone(), y.clone()))
            if k == 0:
                loader._active.set_decoders([first])
            elif k == 2:
                loader._active.set_decoders([first, make(1), third])
            elif k == 4:
                loader._active.set_decoders([second, first])  # swapped places: each waits for the other's
            elif k == 6:
                loader._active.set_decoders([make(2), make(1)])
            with pytest.raises(ValueError):
                loader._active.set_decoders([first] * 4)
        assert len(loader._decoders) == 2
    assert len(got) == len(want) >= 9
    for (gx, gy), (wx, wy) in zip(got, want):
        assert torch.equal(gy, wy)
        assert torch.equal(gx, wx)


def test_loader_retunes_online_and_keeps_every_batch(wds_path):
    """The Loader's own path: a tuner that climbs as soon as the loop waits (always, on this CPU loop) switches
    pipelines mid-epoch through Loader._retune (build + warm in the background); the batches are unchanged."""
    import torch

    from fastfeed import Loader

    opts = dict(batch_size=8, image_size=32, device="cpu", decoder="cpu-pil", dtype=torch.uint8, num_threads=1,
                pipelines=1, seed=5)
    with Loader(wds_path, **opts) as ref:
        want = [(x.clone(), y.clone()) for x, y in ref]
    ladder = (DecodeSettings(1.0, 1, 1), DecodeSettings(1.0, 1, 2), DecodeSettings(1.0, 2, 2),
              DecodeSettings(1.0, 2, 3))  # the ring below has room for 2 pipelines: the last rung is refused
    with Loader(wds_path, **{**opts, "pipelines": 2}) as loader:
        built = list(loader._every)
        loader._tuner = OnlineTuner(ladder, window=2, settle=0, tolerance=0.0)
        loader._settings = ladder[0]
        got = []
        for x, y in loader:
            got.append((x.clone(), y.clone()))
            if loader._retuning is not None:
                loader._retuning.join()  # make the switches happen within this short epoch
        assert any(h["decision"] == "climb" for h in loader._tuner.history)
        assert loader.stats()["info"]["online_tuning"] == loader._tuner.history
        # switches reuse what was built: the 1-thread pipeline of the start is kept, idle or active
        assert built[0] in loader._every and len(loader._every) <= 2 + 2 + 3
        assert loader._tuner.current.pipelines <= 2 and loader._settings == loader._tuner.current
    assert len(got) == len(want)
    for (gx, gy), (wx, wy) in zip(got, want):
        assert torch.equal(gy, wy) and torch.equal(gx, wx)


def test_a_refused_switch_goes_back_and_is_not_proposed_again():
    t = OnlineTuner(window=2, settle=0)
    assert t.observe(0.5, 1.0) is None and t.observe(0.5, 1.0) == LADDER[1]
    t.refused(LADDER[0])
    assert t.current == LADDER[0]
    assert all(t.observe(0.5, 1.0) is None for _ in range(20))
