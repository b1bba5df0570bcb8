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
from fastfeed.decode import CPU_DEFAULT

pytestmark = pytest.mark.serial  # verdicts and wait shares from timings: alone

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


@pytest.fixture
def one_torch_thread():
    """ResNet steps on tiny CPU batches run several times faster on one intra-op thread on a small shared machine
    (two threads spin against each other and every other process); the same setting for runs and ceiling."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


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


@pytest.mark.integration  # a DataLoader worker process
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


@pytest.mark.integration  # ResNet-18 steps on the CPU
def test_resnet_consumer_and_compute_ceiling_and_plot(image_folder, tmp_path, one_torch_thread):
    cfg = BenchConfig(dataset=None, batch_size=4, image_size=32, steps=3, warmup=1, device="cpu", dtype="float16",
                      consumer="resnet18")
    loaders = {name: (lambda: make_torch_loader(image_folder, batch_size=4, image_size=32, device="cpu",
                                                num_workers=0)) for name in ("fastfeed", "torch")}
    report = run_bench(cfg, loaders=loaders, progress=False)
    ceiling = report["consumer"]["compute_only_step_s"]
    assert ceiling is not None and math.isfinite(ceiling["p50"]) and ceiling["p50"] > 0
    assert report["consumer"]["compute_only_samples_per_s"] == pytest.approx(4 / ceiling["p50"])
    assert report["comparison"]["samples_per_s_ratio"] > 0
    assert all("resident-data ceiling" in v for v in report["verdict"])
    png = tmp_path / "bench.png"
    plot_report(report, png)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with Image.open(png) as im:
        im.verify()
    with Image.open(png) as im:
        assert im.size[0] > 500


def test_cli_compare_with_a_missing_images_folder_is_a_clear_error(wds_path, tmp_path, capsys):
    rc = main(["bench", str(wds_path), "--compare", "torch", "--images", str(tmp_path / "gone"), "--device", "cpu",
               "--no-progress"])
    assert rc == 2
    assert f"--images {tmp_path / 'gone'}: not a directory" in capsys.readouterr().err


def test_cli_rejects_bad_numbers(tmp_path, capsys):
    rc = main(["bench", str(tmp_path), "--steps", "0", "--device", "cpu", "--no-progress"])
    assert rc == 2
    assert "steps must be >= 1" in capsys.readouterr().err


CONFIG_KEYS = ("dataset", "images", "batch_size", "image_size", "decoder", "device", "dtype", "channels_last",
               "num_threads", "prefetch", "pipelines", "reader_threads", "hw_decoder_load", "train", "steps",
               "warmup", "max_warmup", "consumer", "compare", "torch_workers", "seed")


def _finite_numbers(obj, where="report"):
    """Every number anywhere in the report is finite (json.dumps(allow_nan=False) is checked separately)."""
    if isinstance(obj, bool) or obj is None or isinstance(obj, str):
        return
    if isinstance(obj, (int, float)):
        assert math.isfinite(obj), where
    elif isinstance(obj, dict):
        for k, v in obj.items():
            _finite_numbers(v, f"{where}.{k}")
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            _finite_numbers(v, f"{where}[{i}]")
    else:
        raise AssertionError(f"{where}: unexpected {type(obj).__name__}")


@pytest.mark.integration  # a whole bench run, both loaders
def test_run_bench_real_loader_against_torch(wds_path):
    # 160 images / batch 8 = 20 batches per epoch: 2 warm-up + 24 timed steps cross an epoch boundary on both.
    steps, batch = 24, 8
    cfg = BenchConfig(dataset=str(wds_path), batch_size=batch, image_size=32, steps=steps, warmup=2,
                      device="cpu", dtype="float32", decoder="cpu", compare="torch", torch_workers=0,
                      num_threads=2)
    report = run_bench(cfg, progress=False)
    assert tuple(report) == REPORT_KEYS
    assert list(report["loaders"]) == ["fastfeed", "torch"]
    assert tuple(report["config"]) == CONFIG_KEYS
    assert report["config"]["images"] is None
    assert report["comparison"]["source"] == str(wds_path)  # the baseline read the packed samples, not demo_tree
    for r in report["loaders"].values():
        _check_result(r, steps, batch)
    _finite_numbers(report)
    ff = report["loaders"]["fastfeed"]["loader_stats"]
    info = ff["info"]
    assert info["decoder"] == CPU_DEFAULT and info["num_threads"] == 2 and info["pipelines"] == 1
    # The delta covers the timed steps only: at least those samples were decoded, at most the prefetched ones more.
    assert steps * batch <= ff["counters"]["samples"] <= (steps + 2 + info["prefetch"] + 2) * batch
    assert report["loaders"]["torch"]["loader_stats"] is None
    cmp = report["comparison"]
    ratio = report["loaders"]["fastfeed"]["samples_per_s"] / report["loaders"]["torch"]["samples_per_s"]
    assert cmp["baseline"] == "torch" and cmp["samples_per_s_ratio"] == pytest.approx(ratio)
    assert len(report["verdict"]) == 2
    assert report["verdict"][0].startswith("fastfeed: ") and "samples/s" in report["verdict"][0]
    table = format_table(report)
    assert f"fastfeed settings: decoder={CPU_DEFAULT} device=cpu num_threads=2 pipelines=1" in table
    assert "hw_decoder_load" not in table  # a DALI-only setting is not shown for a CPU decoder
    assert "fastfeed / torch throughput:" in table


def test_bench_measures_a_detection_loader_alone(tmp_path):
    """A detection pack's batches are dicts with per-box labels: bench counts the images, and refuses the
    classifier's consumers and DataLoader baseline, which have nothing to train on such a batch."""
    from conftest import run_pack
    from test_detect_loader import make_yolo

    make_yolo(tmp_path / "src", n=12)
    run_pack(tmp_path / "src", tmp_path / "out", "--format", "wds")
    steps, batch = 5, 4
    cfg = BenchConfig(dataset=str(tmp_path / "out"), batch_size=batch, image_size=64, steps=steps, warmup=1,
                      device="cpu", dtype="uint8", num_threads=2)
    report = run_bench(cfg, progress=False)
    assert report["loaders"]["fastfeed"]["samples"] == steps * batch  # images, not boxes
    for consumer, compare in (("resnet18", None), ("none", "torch")):
        with pytest.raises(ValueError, match="'detect' dataset: bench measures its loader alone"):
            run_bench(BenchConfig(dataset=str(tmp_path / "out"), batch_size=batch, image_size=64, steps=1,
                                  warmup=0, device="cpu", consumer=consumer, compare=compare), progress=False)


@pytest.mark.integration  # the bench command end to end
def test_cli_bench_compare_writes_json_and_png(wds_path, tmp_path, capsys):
    out_json, out_png = tmp_path / "bench.json", tmp_path / "bench.png"
    rc = main(["bench", str(wds_path), "--compare", "torch", "--device", "cpu", "--batch-size", "8",
               "--image-size", "32", "--steps", "5", "--warmup", "1", "--torch-workers", "0", "--decoder", "cpu",
               "--json", str(out_json), "--plot", str(out_png), "--no-progress"])
    printed = capsys.readouterr().out
    assert rc == 0
    assert f"fastfeed settings: decoder={CPU_DEFAULT}" in printed and "fastfeed / torch throughput" in printed
    report = json.loads(out_json.read_text())  # written with allow_nan=False
    assert tuple(report) == REPORT_KEYS and tuple(report["config"]) == CONFIG_KEYS
    for r in report["loaders"].values():
        _check_result(r, 5, 8)
    for line in report["verdict"]:
        assert line in printed
    assert out_png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with Image.open(out_png) as im:
        im.verify()


def test_verdicts_name_the_bottleneck_and_the_change_to_try():
    from fastfeed.bench.report import verdicts

    def result(wait, busy, machine=0.5, iowait=0.0, info=None, read_wait=0.0):
        stats = {"info": info, "stages": {"read_wait": {"seconds": read_wait}}} if info else None
        return {"wait_fraction": wait, "samples_per_s": 100.0, "wall_s": 10.0, "step_s": {"p50": 0.2},
                "host": {"cpu_cores_busy": busy, "cpu_count": 2, "system_cpu_busy_frac": machine,
                         "iowait_frac": iowait}, "loader_stats": stats}

    cpu_info = {"decoder": "cpu", "device": "cuda:0", "num_threads": 2, "pipelines": 1, "prefetch": 2,
                "reader_threads": 4}
    # 100 samples/s against a 200 samples/s ceiling: half the step is lost, 45% of it waiting for data
    [v] = verdicts({"fastfeed": result(0.45, 1.95, 0.99, info=cpu_info)}, 200.0, "resnet50")
    assert v.startswith("fastfeed: 100.0 samples/s, 50% below the resident-data ceiling (200.0 samples/s)")
    assert "data wait 45%, loader work slowing the step 5%, model 50%: input-bound" in v
    assert "CPU-bound" in v and "--device cuda --decoder dali" in v
    [v] = verdicts({"fastfeed": result(0.45, 0.8, 0.4, info=cpu_info)}, 200.0, "resnet50")
    assert "raise --num-threads (now 2)" in v
    # iowait alone (a machine-wide number) does not make fastfeed storage-bound; its own ring timer does
    [v] = verdicts({"fastfeed": result(0.45, 0.8, 0.5, iowait=0.4, info=cpu_info)}, 200.0, "resnet50")
    assert "storage" not in v and "raise --num-threads (now 2)" in v
    [v] = verdicts({"fastfeed": result(0.45, 0.8, 0.5, iowait=0.4, info=cpu_info, read_wait=5.0)}, 200.0, "resnet50")
    assert "reads lag decoding" in v and "iowait 40%" in v and "--reader-threads (now 4)" in v
    [v] = verdicts({"torch": result(0.45, 0.8, 0.5, iowait=0.4)}, 200.0, "resnet50")
    assert "storage-bound (machine iowait 40%)" in v
    [v] = verdicts({"torch": result(0.45, 1.9)}, 200.0, "resnet50")
    assert "PIL decode" in v and "fastfeed.Loader" in v
    [v] = verdicts({"fastfeed": result(0.03, 0.5, info=cpu_info)}, 102.0, "resnet50")
    assert "at the resident-data ceiling" not in v and "compute-bound, the model sets the pace" in v


def test_a_gpu_loader_whose_tuner_tried_more_pipelines_is_not_told_to_raise_them():
    """Photos of ~2.5 MP beside ResNet-50 on an H200: the loop waited 50% with 5.7 of 16 cores busy, the tuner had
    tried a third pipeline and gone back to two. "Raise --pipelines" sent the user after what the tuner had measured;
    the limit was the GPU's JPEG decode (DALI's reader waited as long)."""
    from fastfeed.bench.report import verdicts

    def result(history, settled=True, pipelines=2):
        info = {"decoder": "dali", "device": "cuda:0", "num_threads": 4, "pipelines": pipelines, "prefetch": 2,
                "reader_threads": 4, "hw_decoder_load": 0.9, "pipeline_limit": 4, "tuning_settled": settled}
        return {"wait_fraction": 0.497, "samples_per_s": 1865.6, "wall_s": 10.0, "step_s": {"p50": 0.0985},
                "host": {"cpu_cores_busy": 5.73, "cpu_count": 16, "system_cpu_busy_frac": 0.37, "iowait_frac": 0.0},
                "loader_stats": {"info": info, "stages": {"read_wait": {"seconds": 0.0}},
                                 "pipeline_history": history}}

    measured = [[1, 0.150, 0.571], [2, 0.120, 0.319], [3, 0.121, 0.245], [2, 0.121, 0.389], [2, 0.118, 0.399]]
    [v] = verdicts({"fastfeed": result(measured)}, 4583.3, "resnet50")
    assert "input-bound" in v
    assert "the GPU's JPEG decode is the limit (the pipeline tuner tried 3 pipelines, no faster than 2" in v
    assert "`fastfeed pack --max-side 512`" in v and "--hw-decoder-load (now 0.9)" in v and "raise" not in v
    # still tuning, or never tried more than it runs: more pipelines are still worth trying
    for r in (result(measured, settled=False), result(measured[:2]), result(measured, pipelines=3)):
        [v] = verdicts({"fastfeed": r}, 4583.3, "resnet50")
        assert "raise --num-threads (now 4), --pipelines (now" in v


def test_max_seconds_ends_the_timed_steps_early_and_counts_what_ran():
    batch = (torch.zeros(2, 3, 8, 8), torch.zeros(2, dtype=torch.int64))

    def slow_step(images, labels):
        time.sleep(0.01)

    r = run_loader([batch] * 5, slow_step, name="t", steps=10_000, warmup=1, max_seconds=0.1,
                   progress=False).to_dict()
    assert 5 <= r["steps"] <= 15
    assert r["samples"] == 2 * r["steps"] == sum(r["per_step"]["samples"])
    with pytest.raises(ValueError, match="max_seconds"):
        run_loader([batch], slow_step, name="t", steps=1, max_seconds=0, progress=False)


class _SettlesAfter:
    """A loader that says, as a tuned fastfeed.Loader does (`stats()["info"]["tuning_settled"]`), that it is
    still tuning itself until `batches` batches were taken; `batches` None: no tuner (no such key)."""

    def __init__(self, batches):
        self.batches, self.taken = batches, 0

    def __iter__(self):
        for _ in range(1000):
            self.taken += 1
            yield torch.zeros(2, 3, 8, 8), torch.zeros(2, dtype=torch.int64)

    def stats(self):
        if self.batches is None:
            return {"info": {"pipelines": 1}}
        return {"info": {"tuning_settled": self.taken >= self.batches}}


def test_a_loader_still_tuning_itself_is_warmed_up_until_it_settles():
    def warmup_steps(loader, **kw):
        return run_loader(loader, lambda x, y: None, name="t", steps=3, warmup=2, progress=False, **kw).warmup_steps
    assert warmup_steps(_SettlesAfter(40), max_warmup=500) == 40
    assert warmup_steps(_SettlesAfter(1), max_warmup=500) == 2  # never fewer than asked
    assert warmup_steps(_SettlesAfter(10_000), max_warmup=25) == 25  # bounded
    assert warmup_steps(_SettlesAfter(40)) == 2  # not asked for
    assert warmup_steps(_SettlesAfter(None), max_warmup=500) == 2  # nothing tuned
    with pytest.raises(ValueError, match="max_warmup"):
        warmup_steps(_SettlesAfter(None), max_warmup=-1)


def test_bench_notes_how_long_a_tuning_loader_warmed_up(wds_path):
    """run_bench's note when the Loader warmed up longer than asked, and when it hit the bound unsettled."""
    from fastfeed.bench.session import BenchConfig, run_bench

    for settles, max_warmup, want in ((30, 500, "warmed up 30 steps (asked 5), until its online tuning"),
                                      (10_000, 20, "had not settled after 20 warm-up steps")):
        cfg = BenchConfig(dataset=wds_path, batch_size=2, image_size=8, device="cpu", steps=3, warmup=5,
                          max_warmup=max_warmup)
        report = run_bench(cfg, loaders={"fastfeed": lambda s=settles: _SettlesAfter(s)}, progress=False)
        assert any(want in n for n in report["notes"]), report["notes"]


class _BuildsAt:
    """A loader whose stats are fastfeed's (a real StageStats) and that counts a decode pipeline built when batch
    `at` is taken, as a tuned Loader's worker does when its tuner asks for one more."""

    def __init__(self, at):
        from fastfeed.loader.stats import StageStats

        self.at, self.taken, self._stats = at, 0, StageStats(stages=("wait",))
        self._stats.add("pipelines_built")  # the one built before the first batch

    def __iter__(self):
        for _ in range(1000):
            self.taken += 1
            if self.taken == self.at:
                self._stats.add("pipelines_built")
            yield torch.zeros(2, 3, 8, 8), torch.zeros(2, dtype=torch.int64)

    def stats(self):
        return self._stats.snapshot()


def test_bench_notes_a_pipeline_built_during_the_timed_steps(wds_path):
    """A pipeline built during the timed steps means the tuner was still trying (its try is in the rate): a run that
    timed one says so, one that built it while warming up, or before the first batch, does not."""
    from fastfeed.bench.session import BenchConfig, run_bench

    cfg = BenchConfig(dataset=wds_path, batch_size=2, image_size=8, device="cpu", steps=4, warmup=5, max_warmup=5)
    for at, noted in ((3, False), (7, True), (10_000, False)):
        report = run_bench(cfg, loaders={"fastfeed": lambda at=at: _BuildsAt(at)}, progress=False)
        want = "fastfeed: 1 decode pipeline built during the timed steps; the pipeline tuner was still trying"
        assert any(want in n for n in report["notes"]) == noted, (at, report["notes"])


def test_settings_lines_show_the_dali_settings():
    from fastfeed.bench.report import settings_lines

    info = {"decoder": "dali", "device": "cuda:0", "num_threads": 2, "hw_decoder_load": 1.0, "pipelines": 2,
            "reader_threads": 4, "prefetch": 2, "pinned": True}
    lines = settings_lines({"fastfeed": {"loader_stats": {"info": info}}, "torch": {"loader_stats": None}})
    assert lines == ["fastfeed settings: decoder=dali device=cuda:0 num_threads=2 pipelines=2 "
                     "hw_decoder_load=1.0 reader_threads=4 prefetch=2 pinned=True"]
    # a Loader whose pipeline count was tuned (fastfeed/tuning/pipelines.py): the count it ran last, and its range
    stats = {"info": {**info, "pipelines": 3, "pipeline_limit": 4, "pipeline_floor": 1},
             "pipeline_history": [[2, 0.02, 0.5]]}
    lines = settings_lines({"fastfeed": {"loader_stats": stats}})
    assert "num_threads=2 pipelines=3 (tuned, 1 to 4) hw_decoder_load=1.0" in lines[0]
    # thumbnails on DALI's CPU backend whose tuner added the pipeline that decodes on the GPU
    cpu = {**info, "decoder": "cpu-dali", "pipelines": 3, "pipeline_limit": 3, "pipeline_floor": 2, "gpu_pipelines": 1}
    lines = settings_lines({"fastfeed": {"loader_stats": {"info": cpu, "pipeline_history": [[3, 0.02, 0.05]]}}})
    assert "pipelines=3 (tuned, 2 to 3, 1 on the GPU)" in lines[0]


# ---------------------------------------------------------------------------------------------------------------
# The verdict against the resident-data ceiling: a run 38% below the ceiling is never "the loader keeps up"
def _host(busy=1.0, cpus=16, machine=0.5):
    return {"cpu_cores_busy": busy, "cpu_count": cpus, "system_cpu_busy_frac": machine, "iowait_frac": 0.0}


def test_attribution_shares_of_a_measured_run():
    from fastfeed.bench.verdict import attribute

    # ResNet-18 bf16 on the H200: ceiling 12,653 img/s; the DataLoader trained at 3,542 with 49% data wait
    a = attribute(3542.0, 0.49, 12653.0)
    assert a["below_ceiling"] == pytest.approx(1 - 3542 / 12653)
    assert a["model_share"] == pytest.approx(3542 / 12653)
    assert a["slowed_share"] == pytest.approx(1 - 0.49 - 3542 / 12653)
    assert a["wait_share"] + a["slowed_share"] + a["model_share"] == pytest.approx(1.0)
    # fastfeed at 8,983 img/s with 1.9% data wait: 29% below, nearly all of it the slowed step
    a = attribute(8983.0, 0.019, 12653.0)
    assert a["slowed_share"] == pytest.approx(1 - 0.019 - 8983 / 12653) and a["slowed_share"] > 0.25
    # beating the ceiling measurement (noise) never gives negative shares
    a = attribute(105.0, 0.02, 100.0)
    assert a["below_ceiling"] < 0 and a["slowed_share"] == 0.0 and a["model_share"] == pytest.approx(0.98)
    with pytest.raises(ValueError):
        attribute(0.0, 0.1, 100.0)


def test_a_run_38_percent_below_the_ceiling_is_not_called_compute_bound():
    from fastfeed.bench.report import verdicts

    # a DataLoader run with little data wait but 38% below the ceiling (its workers slow the step)
    r = {"wait_fraction": 0.04, "samples_per_s": 0.62 * 4621.0, "wall_s": 10.0, "step_s": {"p50": 0.1},
         "host": _host(busy=12.0), "loader_stats": None}
    [v] = verdicts({"torch": r}, 4621.0, "resnet50")
    assert "38% below the resident-data ceiling" in v
    assert "compute-bound" not in v and "will not speed" not in v
    assert "data wait 4%, loader work slowing the step 34%, model 62%" in v
    assert "its own work slows the step" in v and "--torch-workers" in v
    # fastfeed with the DALI decoder in the same situation: the advice is about its GPU work
    info = {"decoder": "dali", "device": "cuda:0", "num_threads": 4, "pipelines": 3, "hw_decoder_load": 0.65,
            "prefetch": 2, "reader_threads": 4}
    [v] = verdicts({"fastfeed": {**r, "loader_stats": {"info": info}}}, 4621.0, "resnet50")
    assert "fewer --pipelines (now 3)" in v and "--hw-decoder-load (now 0.65)" in v
    # the hybrid: its CPU share is still being tuned, or GPU decode alone is the alternative
    info = {**info, "decoder": "hybrid", "num_threads": 6}
    [v] = verdicts({"fastfeed": {**r, "loader_stats": {"info": info}}}, 4621.0, "resnet50")
    assert "tuned on the step" in v and "--decoder dali" in v and "fewer --num-threads (now 6)" in v
    # and a run within 5% of the ceiling is compute-bound whatever its (small) wait
    [v] = verdicts({"torch": {**r, "samples_per_s": 0.97 * 4621.0, "wait_fraction": 0.02}}, 4621.0, "resnet50")
    assert "compute-bound" in v


def _bench_flags() -> set[str]:
    import argparse

    from fastfeed.commands import bench

    p = argparse.ArgumentParser()
    bench.configure(p)
    return {s for a in p._actions for s in a.option_strings}


def test_every_flag_the_advice_names_exists():
    import re

    from fastfeed.bench.report import verdicts

    infos = [None, {"decoder": "cpu", "device": "cpu", "num_threads": 1, "pipelines": 1, "prefetch": 2,
                    "reader_threads": 4},
             {"decoder": "cpu-pil", "device": "cuda:0", "num_threads": 8, "pipelines": 1, "prefetch": 2,
              "reader_threads": 4},
             {"decoder": "dali", "device": "cuda:0", "num_threads": 4, "pipelines": 2, "hw_decoder_load": 0.9,
              "prefetch": 2, "reader_threads": 4},
             {"decoder": "hybrid", "device": "cuda:0", "num_threads": 6, "pipelines": 2, "hw_decoder_load": 1.0,
              "prefetch": 2, "reader_threads": 4}]
    lines = []
    for info in infos:
        for wait, rate, busy, machine, iowait, read_wait in [(0.5, 50, 15.9, 0.99, 0, 0), (0.5, 50, 2, 0.3, 0, 0),
                                                               (0.5, 50, 2, 0.3, 0.5, 0), (0.5, 50, 2, 0.3, 0, 9),
                                                               (0.02, 50, 2, 0.3, 0, 0), (0.5, 50, 2, 0.95, 0, 0)]:
            stats = {"info": info, "stages": {"read_wait": {"seconds": read_wait}}} if info else None
            r = {"wait_fraction": wait, "samples_per_s": rate, "wall_s": 10.0, "step_s": {"p50": 0.1},
                 "host": {**_host(busy, 16, machine), "iowait_frac": iowait}, "loader_stats": stats}
            for consumer, ceiling in (("resnet50", 100.0), ("none", None)):
                lines += verdicts({"x": r}, ceiling, consumer)
    # on a machine without a GPU the advice never sends the user to one
    no_gpu = [v for info in infos if info is None or info["device"] == "cpu" for v in verdicts(
        {"x": {"wait_fraction": 0.5, "samples_per_s": 50, "wall_s": 10.0, "step_s": {"p50": 0.1},
               "host": _host(15.9, 16, 0.5), "loader_stats": {"info": info} if info else None}},
        100.0, "resnet50", gpu=False)]
    assert no_gpu and not any("cuda" in v or "GPU" in v for v in no_gpu), no_gpu
    named = set()
    for line in lines:
        line = re.sub(r"`fastfeed pack[^`]*`", "", line)  # pack's own flags, quoted as a command
        named |= set(re.findall(r"--[a-z][a-z-]+", line))
    assert named and named <= _bench_flags(), named - _bench_flags()


class _Batches:
    """A loader yielding one resident batch; `starve` sleeps twice as long as the consumer's last step before each
    batch (a loader that can't keep up, on a machine of any speed), `hog` runs a GIL-holding Python thread while
    iterating (a loader whose own work slows the consumer's step)."""

    def __init__(self, batch, starve=False, hog=False):
        self.batch, self.starve, self.hog = batch, starve, hog
        self._stop = None

    def __iter__(self):
        import threading

        if self.hog and self._stop is None:
            self._stop = threading.Event()

            def spin():
                x = 0
                while not self._stop.is_set():
                    for _ in range(10_000):
                        x += 1

            threading.Thread(target=spin, daemon=True).start()
        for _ in range(1000):
            yielded = time.perf_counter()
            yield self.batch
            if self.starve:  # resumed by the next next(): the consumer's step took the time since the yield
                time.sleep(2 * (time.perf_counter() - yielded))

    def close(self):
        if self._stop is not None:
            self._stop.set()


@pytest.mark.integration  # ResNet-18 steps on the CPU
def test_verdict_end_to_end_on_the_cpu_with_a_real_model(one_torch_thread):
    from fastfeed.bench.consumers import synthetic_batch

    batch = synthetic_batch(2, 32, "cpu", torch.float32, num_classes=2)
    cfg = BenchConfig(dataset=None, batch_size=2, image_size=32, steps=3, warmup=1, device="cpu",
                      dtype="float32", consumer="resnet18")
    report = run_bench(cfg, loaders={"starving": lambda: _Batches(batch, starve=True),
                                     "hog": lambda: _Batches(batch, hog=True)}, progress=False)
    att = report["attribution"]
    assert set(att) == {"starving", "hog"}
    for a in att.values():
        assert a["wait_share"] + a["slowed_share"] + a["model_share"] == pytest.approx(1.0)
    starving, hog = report["verdict"]
    assert att["starving"]["wait_share"] > 0.4 and "input-bound" in starving
    # the hog's batches are ready at once, yet its thread slows every step: attributed to the loader, not the model
    assert att["hog"]["wait_share"] < 0.05 and att["hog"]["slowed_share"] > 0.2
    assert "its own work slows the step" in hog and "compute-bound" not in hog
    table = format_table(report)
    assert "below ceiling" in table and "wait/slowed/model" in table


# ---------------------------------------------------------------------------------------------------------------
# `fastfeed bench` as a new user runs it (docs/measure.md): small datasets, comparing on what was packed, baseline
# failure
@pytest.mark.integration  # the bench command end to end
def test_cli_bench_dataset_smaller_than_the_batch_fits_the_batch(wds_path, tmp_path, capsys):
    out_json = tmp_path / "b.json"
    rc = main(["bench", str(wds_path), "--device", "cpu", "--decoder", "cpu", "--image-size", "32", "--steps", "2",
               "--warmup", "1", "--num-threads", "2", "--json", str(out_json), "--no-progress"])
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    report = json.loads(out_json.read_text())
    assert report["config"]["batch_size"] == 160  # the whole 160-sample dataset, not the default 256
    _check_result(report["loaders"]["fastfeed"], 2, 160)
    assert "fewer than --batch-size 256" in report["notes"][0] and "fewer than --batch-size 256" in captured.err


def test_fit_batch_size():
    from fastfeed.bench.session import fit_batch_size

    assert fit_batch_size(256, 1000) == (256, None)
    size, note = fit_batch_size(256, 124)
    assert size == 124 and "124 samples" in note
    with pytest.raises(ValueError):
        fit_batch_size(8, 0)


@pytest.mark.integration  # pack, then a whole bench run
def test_compare_reads_what_was_packed_not_the_source_folder(image_folder, tmp_path, pack_cli):
    # the source holds a file pack rejects; the baseline must not see it (it crashed on one after 12 minutes)
    import shutil

    src = tmp_path / "src"
    shutil.copytree(image_folder, src)
    (src / "class_0" / "broken.jpg").write_bytes(b"\xff\xd8\xff\xe0 not really a jpeg")
    out = tmp_path / "out"
    pack_cli(src, out)
    cfg = BenchConfig(dataset=str(out), batch_size=4, image_size=32, steps=8, warmup=1, device="cpu",
                      dtype="float32", decoder="cpu", compare="torch", torch_workers=0, num_threads=1)
    report = run_bench(cfg, progress=False)
    assert report["errors"] == {} and report["comparison"]["source"] == str(out)
    _check_result(report["loaders"]["torch"], 8, 4)  # 24 packed images / 4 = 6 batches: crosses an epoch

    from fastfeed.bench.torch_baseline import PackedImages
    from fastfeed.datasets import open_dataset

    with open_dataset(out) as ds:
        packed_labels = ds.labels.tolist()
    images = PackedImages(out)
    assert len(images) == 24 == len(packed_labels)
    assert [images[i][1] for i in range(len(images))] == packed_labels
    assert images[0][0].mode == "RGB"


@pytest.mark.integration  # the bench command end to end
def test_baseline_failure_keeps_the_fastfeed_half(wds_path, image_folder, tmp_path, capsys):
    import shutil

    bad = tmp_path / "bad"
    shutil.copytree(image_folder, bad)
    for p in sorted(bad.glob("class_*/*.jpg")):
        p.write_bytes(p.read_bytes()[:200])  # truncated: PIL fails on the first sample it reads
    out_json, out_png = tmp_path / "b.json", tmp_path / "b.png"
    rc = main(["bench", str(wds_path), "--compare", "torch", "--images", str(bad), "--device", "cpu",
               "--decoder", "cpu", "--batch-size", "8", "--image-size", "32", "--steps", "3", "--warmup", "1",
               "--torch-workers", "0", "--num-threads", "2", "--json", str(out_json), "--plot", str(out_png),
               "--no-progress"])
    captured = capsys.readouterr()
    assert rc == 1  # partial: said by the exit status, but everything measured is written
    report = json.loads(out_json.read_text())
    assert list(report["loaders"]) == ["fastfeed"]
    _check_result(report["loaders"]["fastfeed"], 3, 8)
    assert report["errors"]["torch"] and report["comparison"]["error"] == report["errors"]["torch"]
    assert report["comparison"]["samples_per_s_ratio"] is None
    assert "torch: FAILED, not measured" in captured.out and "torch failed" in captured.err
    assert out_png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plot_helpers():
    from fastfeed.bench.plot import format_rate, shared_bins

    assert [format_rate(x) for x in (1.7, 0.456, 12.34, 123.4, 12653.2)] == ["1.7", "0.46", "12.3", "123", "12,653"]
    edges = shared_bins([[1.0, 2.0], [5.0, 9.0]])
    assert edges[0] == 1.0 and edges[-1] == 9.0 and edges == sorted(edges)
    assert shared_bins([[3.0, 3.0], [3.0]]) == [2.5, 3.5]
