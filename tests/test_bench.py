"""fastfeed bench on the CPU path: every field present and sane, exact sample counts, stable schema, real PNG."""
from __future__ import annotations

import json
import math
import time

import numpy as np
import pytest
import torch
from PIL import Image

from fastfeed.bench.plot import plot_report
from fastfeed.bench.report import REPORT_KEYS, format_table, write_json
from fastfeed.bench.runner import PERCENTILE_KEYS, RESULT_KEYS, run_loader
from fastfeed.bench.session import BenchConfig, run_bench
from fastfeed.bench.torch_baseline import make_torch_loader
from fastfeed.cli import main

HOST_KEYS = {"cpu_cores_busy", "cpu_count", "system_cpu_busy_frac", "iowait_frac", "rss_peak_bytes"}


@pytest.fixture(scope="module")
def image_folder(tmp_path_factory):
    """24 real JPEGs (2 classes, varied sizes) in ImageFolder layout."""
    root = tmp_path_factory.mktemp("images")
    rng = np.random.default_rng(0)
    for i in range(24):
        d = root / f"class_{i % 2}"
        d.mkdir(exist_ok=True)
        h, w = int(rng.integers(40, 90)), int(rng.integers(40, 90))
        grad = np.linspace(0, 255, w, dtype=np.float32)[None, :, None]
        img = np.clip(grad + rng.normal(0, 30, (h, w, 3)), 0, 255).astype(np.uint8)
        Image.fromarray(img).save(d / f"img_{i:03d}.jpg", quality=85)
    return root


def _check_result(r: dict, steps: int, batch: int) -> None:
    assert tuple(r) == RESULT_KEYS
    assert r["steps"] == steps
    assert r["samples"] == steps * batch  # drop_last: every batch is full, counted exactly
    assert r["per_step"]["samples"] == [batch] * steps
    assert 0.0 <= r["wait_fraction"] <= 1.0
    assert r["wall_s"] == pytest.approx(sum(r["per_step"]["step_s"]))
    assert r["samples_per_s"] == pytest.approx(r["samples"] / r["wall_s"])
    for key in ("step_s", "wait_s"):
        assert set(PERCENTILE_KEYS) <= set(r[key])
        assert 0 <= r[key]["p50"] <= r[key]["p90"] <= r[key]["p99"]
    assert all(w <= s for w, s in zip(r["per_step"]["wait_s"], r["per_step"]["step_s"]))
    assert set(r["host"]) == HOST_KEYS
    assert r["host"]["rss_peak_bytes"] > 10 * 2**20  # at least this Python process with torch loaded
    assert r["host"]["cpu_cores_busy"] >= 0
    assert r["gpu"] is None  # no CUDA here
    for v in (r["host"]["system_cpu_busy_frac"], r["host"]["iowait_frac"]):
        assert v is None or 0.0 <= v <= 1.0


def test_bench_torch_baseline_report_is_complete(image_folder, tmp_path):
    steps, batch = 8, 4  # 24 images / 4 = 6 batches per epoch: the run crosses an epoch boundary
    cfg = BenchConfig(dataset=None, batch_size=batch, image_size=32, steps=steps, warmup=1, device="cpu",
                      dtype="float32")

    def torch_loader():
        return make_torch_loader(image_folder, batch_size=batch, image_size=32, device="cpu",
                                 dtype=torch.float32, num_workers=0)

    report = run_bench(cfg, loaders={"torch": torch_loader}, progress=False)
    assert tuple(report) == REPORT_KEYS
    _check_result(report["loaders"]["torch"], steps, batch)
    assert report["consumer"] == {"name": "none", "compute_only_step_s": None, "compute_only_samples_per_s": None}
    assert report["comparison"] is None
    out = tmp_path / "r.json"
    write_json(report, out)  # allow_nan=False: raises on any NaN/inf
    again = json.loads(out.read_text())
    assert again["schema_version"] == 1 and again["loaders"]["torch"]["samples"] == steps * batch
    table = format_table(report)
    assert "samples/s" in table and "data wait" in table and "torch" in table


def test_baseline_with_worker_processes_counts_children(image_folder):
    loader = make_torch_loader(image_folder, batch_size=4, image_size=32, device="cpu", dtype=torch.float16,
                               channels_last=True, num_workers=1)
    try:
        from fastfeed.bench.consumers import make_consumer

        res = run_loader(loader, make_consumer("none", "cpu"), name="torch", steps=5, warmup=1,
                         progress=False).to_dict()
        images, labels = next(iter(loader))
    finally:
        loader.close()
    _check_result(res, 5, 4)
    assert images.shape == (4, 3, 32, 32) and images.dtype == torch.float16
    assert images.is_contiguous(memory_format=torch.channels_last)
    assert labels.dtype == torch.int64 and set(labels.tolist()) <= {0, 1}
    assert -3.0 < float(images.float().mean()) < 3.0  # normalised, not 0..255


def test_wait_fraction_attributes_slow_loader_vs_slow_consumer():
    batch = (torch.zeros(2, 3, 8, 8), torch.zeros(2, dtype=torch.int64))

    def slow_data():
        for _ in range(100):
            time.sleep(0.01)
            yield batch

    class SlowData:
        def __iter__(self):
            return slow_data()

    def slow_step(images, labels):
        time.sleep(0.01)

    fast_consumer = run_loader(SlowData(), lambda x, y: None, name="a", steps=6, warmup=1, progress=False)
    fast_loader = run_loader([batch] * 3, slow_step, name="b", steps=6, warmup=1, progress=False)
    assert fast_consumer.to_dict()["wait_fraction"] > 0.9
    assert fast_loader.to_dict()["wait_fraction"] < 0.1
    assert fast_loader.to_dict()["samples"] == 12


def test_empty_loader_raises_clear_error():
    with pytest.raises(RuntimeError, match="no batch"):
        run_loader([], lambda x, y: None, name="empty", steps=2, warmup=0, progress=False)


def test_resnet_consumer_and_compute_ceiling_and_plot(image_folder, tmp_path):
    cfg = BenchConfig(dataset=None, batch_size=4, image_size=32, steps=3, warmup=1, device="cpu", dtype="float16",
                      consumer="resnet18")
    loaders = {name: (lambda: make_torch_loader(image_folder, batch_size=4, image_size=32, device="cpu",
                                                num_workers=0)) for name in ("fastfeed", "torch")}
    report = run_bench(cfg, loaders=loaders, progress=False)
    ceiling = report["consumer"]["compute_only_step_s"]
    assert ceiling is not None and math.isfinite(ceiling["p50"]) and ceiling["p50"] > 0
    assert report["consumer"]["compute_only_samples_per_s"] == pytest.approx(4 / ceiling["p50"])
    assert report["comparison"]["samples_per_s_ratio"] > 0
    assert any("faster" in v for v in report["verdict"])
    png = tmp_path / "bench.png"
    plot_report(report, png)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with Image.open(png) as im:
        im.verify()
    with Image.open(png) as im:
        assert im.size[0] > 500


def test_cli_compare_without_images_is_a_clear_error(tmp_path, capsys):
    (tmp_path / "fastfeed.json").write_text(json.dumps({"source": str(tmp_path / "gone"), "classes": ["a"]}))
    rc = main(["bench", str(tmp_path), "--compare", "torch", "--device", "cpu", "--no-progress"])
    assert rc == 2
    assert "--images" in capsys.readouterr().err


def test_cli_rejects_bad_numbers(tmp_path, capsys):
    rc = main(["bench", str(tmp_path), "--steps", "0", "--device", "cpu", "--no-progress"])
    assert rc == 2
    assert "steps must be >= 1" in capsys.readouterr().err
