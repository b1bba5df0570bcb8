"""Real multi-process DDP runs (torchrun, gloo, CPU) through fastfeed.Loader: tests/ddp_train.py on 4 ranks.

Checks that a run finishes (no hang at an epoch end), that every rank takes the same number of steps and every
sample is read once per epoch, that a run killed mid-epoch and resumed from its checkpoint ends with bit-identical
weights, and that a 4-rank checkpoint resumed on 2 ranks reads the rest of that epoch exactly once.
Each torchrun takes ~10-15 s on a 2-core machine (4 ranks importing torch); the runs are shared per module.
"""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.integration

SCRIPT = Path(__file__).with_name("ddp_train.py")
N, BATCH, WORLD = 160, 8, 4
STEPS_PER_EPOCH = N // (WORLD * BATCH)  # 5: drop_last=True and 160 = 5 * 4 * 8, so nothing is dropped
KILL_AT = 3  # global step: mid-way through epoch 0
RUN_TIMEOUT_S = 240
KILLED_EXIT_CODE = 17


def torchrun(nproc: int, data: Path, out: Path, *extra: str) -> subprocess.CompletedProcess:
    """Run ddp_train.py under torchrun; a hang fails the test after RUN_TIMEOUT_S (the whole process group dies)."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}", str(SCRIPT),
           "--data", str(data), "--out", str(out), "--batch-size", str(BATCH), *extra]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                            start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=RUN_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        pytest.fail(f"torchrun hung for {RUN_TIMEOUT_S} s:\n{output[-4000:]}")
    return subprocess.CompletedProcess(cmd, proc.returncode, output, None)


def rank_logs(out: Path, world: int) -> list[dict]:
    logs = [json.loads((out / f"rank{r}.json").read_text()) for r in range(world)]
    assert [g["rank"] for g in logs] == list(range(world))
    assert all(g["world_size"] == world and g["label_mismatches"] == 0 for g in logs)
    return logs


def ids_of(logs: list[dict], epoch: int) -> list[int]:
    return [i for g in logs for i in g["epochs"].get(str(epoch), [])]


@pytest.fixture(scope="module")
def runs(wds_path, tmp_path_factory):
    root = tmp_path_factory.mktemp("ddp")
    full = torchrun(WORLD, wds_path, root / "full")
    killed = torchrun(WORLD, wds_path, root / "killed", "--exit-at-step", str(KILL_AT))
    return {"root": root, "full": full, "killed": killed}


def test_uninterrupted_run_finishes_with_equal_steps_and_full_coverage(runs):
    assert runs["full"].returncode == 0, runs["full"].stdout[-4000:]
    logs = rank_logs(runs["root"] / "full", WORLD)
    assert [g["steps"] for g in logs] == [2 * STEPS_PER_EPOCH] * WORLD
    for epoch in (0, 1):
        assert sorted(ids_of(logs, epoch)) == list(range(N))  # each sample once per epoch, across the ranks
    assert ids_of(logs, 0) != ids_of(logs, 1)  # a new order each epoch


def test_killed_run_resumes_to_identical_weights(runs, wds_path):
    killed, root = runs["killed"], runs["root"]
    assert runs["full"].returncode == 0
    assert killed.returncode != 0, "the run should have died at --exit-at-step"
    assert re.search(rf"exitcode\s*:\s*{KILLED_EXIT_CODE}\b", killed.stdout), killed.stdout[-4000:]
    ckpt = root / "killed" / "ckpt"
    assert sorted(p.name for p in ckpt.iterdir()) == ["rank0.json", "rank0.pt", "rank1.json", "rank2.json",
                                                     "rank3.json"]
    assert [g["steps"] for g in rank_logs(root / "killed", WORLD)] == [KILL_AT] * WORLD

    resumed = torchrun(WORLD, wds_path, root / "resumed", "--resume", str(ckpt))
    assert resumed.returncode == 0, resumed.stdout[-4000:]
    full_logs, killed_logs = rank_logs(root / "full", WORLD), rank_logs(root / "killed", WORLD)
    logs = rank_logs(root / "resumed", WORLD)
    assert [g["steps"] for g in logs] == [2 * STEPS_PER_EPOCH - KILL_AT] * WORLD
    for r in range(WORLD):  # killed + resumed read exactly what the uninterrupted run read, in the same order
        assert killed_logs[r]["epochs"]["0"] + logs[r]["epochs"]["0"] == full_logs[r]["epochs"]["0"]
        assert logs[r]["epochs"]["1"] == full_logs[r]["epochs"]["1"]

    want = torch.load(root / "full" / "final.pt", weights_only=True)
    got = torch.load(root / "resumed" / "final.pt", weights_only=True)
    assert want.keys() == got.keys()
    for name in want:
        assert torch.equal(want[name], got[name]), f"{name}: max diff {(want[name] - got[name]).abs().max()}"


def test_elastic_resume_at_two_ranks_reads_the_rest_once(runs, wds_path):
    root = runs["root"]
    assert runs["killed"].returncode != 0
    resumed = torchrun(2, wds_path, root / "elastic", "--resume", str(root / "killed" / "ckpt"))
    assert resumed.returncode == 0, resumed.stdout[-4000:]
    before = ids_of(rank_logs(root / "killed", WORLD), 0)
    logs = rank_logs(root / "elastic", 2)
    after = ids_of(logs, 0)
    assert len(before) == KILL_AT * WORLD * BATCH
    assert sorted(before + after) == list(range(N))  # the rest of epoch 0, each sample exactly once
    rest_steps = (N - len(before)) // (2 * BATCH)  # 4: 64 samples left, 2 ranks x 8
    assert [g["steps"] for g in logs] == [rest_steps + N // (2 * BATCH)] * 2  # then a normal 2-rank epoch
    assert sorted(ids_of(logs, 1)) == list(range(N))
