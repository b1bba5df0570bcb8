"""`fastfeed profile -- python script.py` on scripts whose bottleneck is known by construction
(tests/profile_cases/): each must get its verdict, and the attribution must agree with what the script does."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytestmark = [pytest.mark.integration, pytest.mark.serial]  # verdicts from timings: alone

CASES = Path(__file__).parent / "profile_cases"


def profile(tmp_path, *cmd: str, steps: int = 12, warmup: int = 3) -> tuple[subprocess.CompletedProcess, dict]:
    """The report of `cmd` profiled, with its timeline drawn to tmp_path/timeline.png."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    out = tmp_path / "report.json"
    proc = subprocess.run([sys.executable, "-m", "fastfeed.cli", "profile", "--steps", str(steps), "--warmup",
                           str(warmup), "--then", "stop", "--json", str(out), "--plot",
                           str(tmp_path / "timeline.png"), "--", *cmd],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc, json.loads(out.read_text())


def families(report: dict) -> list[str]:
    return [f["family"] for f in report["verdict"]]


def part_pixels(png: Path) -> dict:
    """How many pixels of the timeline have each part's colour."""
    from PIL import Image

    from fastfeed.profile.timeline import COLOURS

    rgb = np.asarray(Image.open(png).convert("RGB")).reshape(-1, 3).astype(int)
    return {part: int((np.abs(rgb - [int(c[i:i + 2], 16) for i in (1, 3, 5)]).sum(1) < 6).sum())
            for part, c in COLOURS.items()}


@pytest.fixture(scope="module")
def slow_data(tmp_path_factory):
    root = tmp_path_factory.mktemp("slow")
    return (*profile(root, sys.executable, str(CASES / "slow_data.py")), root / "timeline.png")


def test_a_slow_dataset_is_data_supply(slow_data):
    proc, rep, _ = slow_data
    run = rep["run"]
    assert families(rep)[0] == "data supply", proc.stdout
    # 16 samples of 10 ms each on 2 workers: a batch every >= 80 ms, of which the model's step is a sliver.
    assert run["s_per_step"] >= 0.075 and run["share"]["data"] > 0.5
    assert abs(sum(run["share"].values()) - 1.0) < 0.05  # the parts add up to the measured step
    assert 150 < run["samples_per_s"] < 16 / 0.075
    assert "num_workers=2" in proc.stdout and "fastfeed pack" in proc.stdout


def test_matrix_products_on_in_memory_data_are_compute(tmp_path):
    proc, rep = profile(tmp_path, sys.executable, str(CASES / "matmul_bound.py"))
    run = rep["run"]
    assert families(rep) == ["compute"], proc.stdout
    assert run["share"]["data"] < 0.1
    assert run["share"]["forward+other"] + run["share"]["backward"] + run["share"]["optimizer"] > 0.85
    pixels = part_pixels(tmp_path / "timeline.png")  # the timeline: mostly the model's colours
    assert pixels["forward+other"] + pixels["backward"] + pixels["optimizer"] > 5 * pixels["data"], pixels


def test_an_evaluation_pass_between_two_steps_is_left_out_not_charged_to_data(tmp_path):
    """Compute-bound training with a slow evaluation pass (under no_grad) after every fifth step: the steps holding
    an evaluation are left out and measured again, so the verdict is compute and data stays a sliver."""
    proc, rep = profile(tmp_path, sys.executable, str(CASES / "eval_inside.py"))
    run, left = rep["run"], rep["processes"][0]["left_out"]
    assert families(rep) == ["compute"], proc.stdout
    assert run["share"]["data"] < 0.1 and rep["processes"][0]["steps"] == 12
    assert len(left) >= 2 and all(s["eval_batches"] == 4 and s["batches"] == 5 for s in left), left
    assert f"{len(left)} step(s) left out and measured again" in proc.stdout


def test_a_model_compiled_by_torch_compile_is_noted(tmp_path):
    """torch.compile (backend "eager": no compiler needed) and nn.Module.compile are seen, so the verdict does not
    tell a compiled model to compile."""
    script = tmp_path / "compiled.py"
    script.write_text(SMALL_LOOP.format(compile="model = torch.compile(model, backend='eager')"))
    _, rep = profile(tmp_path / "a", sys.executable, str(script), steps=3, warmup=1)
    assert rep["processes"][0]["facts"]["compiled"] is True
    script.write_text(SMALL_LOOP.format(compile="model.compile(backend='eager')"))
    _, rep = profile(tmp_path / "b", sys.executable, str(script), steps=3, warmup=1)
    assert rep["processes"][0]["facts"]["compiled"] is True
    script.write_text(SMALL_LOOP.format(compile=""))
    _, rep = profile(tmp_path / "c", sys.executable, str(script), steps=3, warmup=1)
    assert "compiled" not in rep["processes"][0]["facts"]


SMALL_LOOP = """
import torch
model = torch.nn.Linear(8, 2)
{compile}
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for i in range(20):
    loss = model(torch.randn(4, 8)).sum()
    opt.zero_grad(); loss.backward(); opt.step()
"""


def test_the_timeline_draws_each_steps_parts(slow_data):
    """--plot: a bar per step cut into the table's parts, in their colours, so the data-bound run is mostly the
    data colour (the compute-bound one, mostly the model's: the test above)."""
    _, rep, png = slow_data
    pixels = part_pixels(png)
    assert pixels["data"] > 2 * (pixels["forward+other"] + pixels["backward"]), pixels
    for p in rep["processes"]:  # the bars are the steps' parts: they add up to each measured step
        assert len(p["per_step"]) == p["steps"]
        assert abs(sum(sum(s.values()) for s in p["per_step"]) / p["steps"] - p["s_per_step"]) < 1e-6


def test_ddp_findings_on_two_gloo_processes(tmp_path):
    proc, rep = profile(tmp_path, sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
                        str(CASES / "ddp_gloo.py"), steps=8)
    assert rep["run"]["ranks"] == 2
    titles = [f["title"] for f in rep["verdict"]]
    assert "find_unused_parameters=True, and no parameter went unused" in titles, proc.stdout
    assert "every rank reads the whole dataset" in titles
    assert "communication" in families(rep) and rep["run"]["share"]["comm"] > 0.2


def test_ddp_all_reduce_that_outlasts_backward_is_communication(tmp_path):
    """DDP's own gradient all-reduce (no collective from Python): the time backward waits for it at its end is
    communication, the rest of backward stays backward, and the parts still add up to the step."""
    proc, rep = profile(tmp_path, sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
                        str(CASES / "ddp_big_gradients.py"), steps=6, warmup=2)
    run = rep["run"]
    assert families(rep)[0] == "communication", proc.stdout
    assert run["share"]["comm"] > 0.25 and abs(sum(run["share"].values()) - 1.0) < 0.05
    for p in rep["processes"]:
        assert p["ddp_comm_share"] >= p["share"]["comm"] - 1e-9  # the buckets' busy time holds the exposed part
    assert "DDP's gradient all-reduce" in proc.stdout


@pytest.mark.gpu
def test_a_loop_of_tiny_kernels_is_launch_bound(tmp_path):
    """On a GPU: the GPU idle between microsecond kernels while nothing waits for data, "the GPU is idle between
    kernels" (compute efficiency), with the SM clock and the power limit in the machine rows."""
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU (run on the GPU machine: pytest -m gpu)")
    proc, rep = profile(tmp_path, sys.executable, str(CASES / "launch_bound.py"), steps=200, warmup=20)
    titles = [f["title"] for f in rep["verdict"]]
    assert "the GPU is idle between kernels" in titles, proc.stdout
    assert rep["run"]["share"]["data"] < 0.1
    gpu = rep["run"]["machine"]["gpu"]
    assert gpu["sm_clock_mean_mhz"] > 0 and gpu["sm_clock_max_mhz"] >= gpu["sm_clock_mean_mhz"] * 0.5, gpu
    assert "SM clock" in proc.stdout and "of" in next(ln for ln in proc.stdout.splitlines() if "SM clock" in ln)


def test_python_m_fastfeed_profile_then_the_report_against_a_baseline(slow_data, tmp_path):
    """The torchrun form (`-m fastfeed.profile script.py`) writes each process's records; `--report DIR` reads
    them, and `--baseline` prints each row's change against an earlier report. The script wraps its model in
    DataParallel: a framework finding."""
    base = tmp_path / "before.json"
    base.write_text(json.dumps(slow_data[1]))
    env = dict(os.environ, FASTFEED_PROFILE_DIR=str(tmp_path / "records"),
               FASTFEED_PROFILE_OPTIONS=json.dumps({"warmup": 2, "steps": 6, "then": "stop"}))
    run = subprocess.run([sys.executable, "-m", "fastfeed.profile", str(CASES / "data_parallel.py")], env=env,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    proc = subprocess.run([sys.executable, "-m", "fastfeed.cli", "profile", "--report", str(tmp_path / "records"),
                           "--baseline", str(base)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(s for s in proc.stdout.splitlines() if s.strip().startswith("s/step"))
    assert "baseline" in line and "%" in line.split("baseline")[1]
    assert "6 steps measured" in proc.stdout
    assert "framework configuration: torch.nn.DataParallel is in use" in proc.stdout
    assert "use DistributedDataParallel" in proc.stdout


def test_a_batch_counts_its_samples_whatever_its_collate_put_first():
    """samples/s comes from each batch's size: a tensor's first dimension, a pair's first member, a dict's "images",
    else its first value that counts samples (a collate_fn may put a list of names first)."""
    import torch

    from fastfeed.profile.probe import _batch_len

    x = torch.zeros(5, 3)
    assert _batch_len(x) == 5 and _batch_len((x, torch.zeros(5))) == 5
    assert _batch_len({"images": torch.zeros(4, 3, 2, 2), "labels": torch.zeros(9)}) == 4
    assert _batch_len({"names": ["a", "b", "c"], "x": torch.zeros(3, 7), "y": torch.zeros(3)}) == 3
    assert _batch_len({"names": ["a"]}) == 0 and _batch_len(torch.tensor(1.0)) == 0
