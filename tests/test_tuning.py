"""The start-up tuner behind num_threads="auto": it must measure real decodes and keep the fastest setting."""
import numpy as np
import pytest
import torch

from fastfeed import tuning
from fastfeed.decode import make_decoder


@pytest.fixture(scope="module")
def batches(wds_path):
    import fastfeed

    with fastfeed.open_dataset(wds_path) as ds:
        return tuning.sample_batches(ds, ds.widths, ds.heights, batch_size=8, count=2, seed=0, train=True,
                                     image_size=64)


def _build(hw, threads):
    return make_decoder("cpu-dali", device="cpu", image_size=64, dtype=torch.uint8, batch_size=8,
                        num_threads=threads, hw_decoder_load=hw)


def test_tuner_keeps_the_fastest_measured_setting(batches):
    cands = (tuning.DecodeSettings(1.0, 1, 1), tuning.DecodeSettings(0.9, 1, 2))
    best, decoders, table = tuning.tune_decoders(_build, batches, cands, cpu_count=2)
    assert len(table) == 2 and all(r["images_per_s"] > 0 for r in table)
    winner = max(table, key=lambda r: r["images_per_s"])
    assert (best.hw_decoder_load, best.num_threads, best.pipelines) == (
        winner["hw_decoder_load"], winner["num_threads"], winner["pipelines"])
    assert len(decoders) == best.pipelines
    out = decoders[0](*batches[0]).images  # the returned decoders are live and usable
    assert out.shape == (8, 3, 64, 64)
    for d in decoders:
        d.close()


def test_tuner_skips_settings_needing_more_cores_and_reports_failures(batches):
    def flaky(hw, threads):
        if hw == 0.5:
            raise RuntimeError("refused")
        return _build(hw, threads)

    cands = (tuning.DecodeSettings(0.5, 1, 1), tuning.DecodeSettings(1.0, 1, 1), tuning.DecodeSettings(1.0, 8, 2))
    best, decoders, table = tuning.tune_decoders(flaky, batches, cands, cpu_count=2)
    assert best == tuning.DecodeSettings(1.0, 1, 1)
    assert [r["hw_decoder_load"] for r in table] == [0.5, 1.0]  # 8 threads x 2 pipelines skipped on 2 cores
    assert table[0]["images_per_s"] is None and "refused" in table[0]["error"]
    for d in decoders:
        d.close()


def test_sample_batches_are_real_records_with_windows_inside_the_image(wds_path):
    import fastfeed

    with fastfeed.open_dataset(wds_path) as ds:
        got = tuning.sample_batches(ds, ds.widths, ds.heights, batch_size=5, count=3, seed=1, train=True,
                                    image_size=32)
        assert len(got) == 3
        for samples, w in got:
            assert len(samples) == 5 and all(s[:3].tobytes() == b"\xff\xd8\xff" for s in samples)
            assert np.all(w.x >= 0) and np.all(w.w > 0)
