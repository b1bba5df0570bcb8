"""PyTorch Lightning 2.6 with fastfeed.Loader, as a user writes it (tests/clients/lightning_train.py: the Loader
returned from `train_dataloader()`/`val_dataloader()`, `use_distributed_sampler=False`, nothing else), on 1 process
and on 2 (strategy="ddp", CPU, gloo; Lightning launches rank 1 itself).

- Mid-epoch resume: the reference run saves a Lightning checkpoint every 3 steps (ModelCheckpoint
  every_n_train_steps) over 2 epochs of 6 steps: step 3 (mid-epoch 0), 6 (end of epoch 0, before its validation)
  and 9 (mid-epoch 1). `Trainer.fit(ckpt_path=...)` from each must train exactly the batches the reference trained
  from that step on (labels and image bytes, every rank), and nothing else.
- Validation: every val sample scored exactly once per validation run, on 1 and 2 processes (21 samples: the
  last batch is short, and with 2 ranks one position is padding that carries IGNORE_INDEX), both in what the
  model saw and in the count Lightning aggregated (`self.log(..., reduce_fx="sum", sync_dist=True)`).

Each run is a fresh interpreter (Lightning's launcher re-executes the script for rank 1), ~10-25 s on 2 cores.
"""
from __future__ import annotations

import collections
import json
import subprocess
import sys
from pathlib import Path

import pytest

import fastfeed
from clients.common import client_env, make_tiny_tree, pack, row_fingerprints

pytestmark = pytest.mark.integration

SCRIPT = Path(__file__).parent / "clients" / "lightning_train.py"
N_TRAIN, N_VAL = 48, 21
EPOCHS, STEPS_PER_EPOCH, CKPT_EVERY = 2, 6, 3
BATCH = {1: 8, 2: 4}  # 6 steps per epoch per rank either way (48 = 6 * 8 = 2 * 6 * 4)
IMAGE_SIZE = 32
RUN_TIMEOUT_S = 300


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("lightning")
    train = pack(make_tiny_tree(root / "train-src", N_TRAIN), root / "train", "wds")
    val = pack(make_tiny_tree(root / "val-src", N_VAL, seed=1), root / "val", "lmdb")
    # Every val sample's eval-mode pixels, decoded once on one process: what "scored once" is checked against.
    with fastfeed.Loader(val, batch_size=8, train=False, image_size=IMAGE_SIZE, device="cpu") as loader:
        rows = [(h, int(y)) for images, labels in loader for h, y in zip(row_fingerprints(images), labels)]
    assert len(rows) == N_VAL and len({h for h, _ in rows}) == N_VAL, "the val images must be distinct"
    return {"root": root, "train": train, "val": val, "val_rows": collections.Counter(rows)}


def run(data: dict, devices: int, tag: str, *extra: str, prefix: tuple = ()) -> list[dict]:
    """The script's run (under `prefix`, a command it runs inside: `fastfeed profile ... --`)."""
    out = data["root"] / f"run-{devices}"
    cmd = [*prefix, sys.executable, str(SCRIPT), "--train", str(data["train"]), "--val", str(data["val"]), "--out",
           str(out), "--tag", tag, "--devices", str(devices), "--epochs", str(EPOCHS), "--batch-size",
           str(BATCH[devices]), "--image-size", str(IMAGE_SIZE), *extra]
    env = client_env()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=RUN_TIMEOUT_S, env=env)
    assert proc.returncode == 0, f"{' '.join(cmd)} exited {proc.returncode}:\n{proc.stdout[-3000:]}\n" \
                                 f"{proc.stderr[-6000:]}"
    return [json.loads((out / f"{tag}-rank{r}.json").read_text()) for r in range(devices)]


def resume(data: dict, devices: int, step: int) -> list[dict]:
    """A fresh run from the reference run's Lightning checkpoint at `step` (ModelCheckpoint every CKPT_EVERY)."""
    ckpt = data["root"] / f"run-{devices}" / "ckpt" / f"step={step}.ckpt"
    assert ckpt.exists(), f"ModelCheckpoint did not write {ckpt.name}"
    return run(data, devices, f"resume{step}", "--ckpt-path", str(ckpt))


def assert_every_step_trained(rec: dict, devices: int) -> None:
    """One rank's record: every step of every epoch, in order, each a full batch."""
    got = [(b["step"], b["epoch"], b["batch_idx"]) for b in rec["train"]]
    assert got == [(s, s // STEPS_PER_EPOCH, s % STEPS_PER_EPOCH) for s in range(EPOCHS * STEPS_PER_EPOCH)]
    assert all(len(b["labels"]) == BATCH[devices] for b in rec["train"])


@pytest.fixture(scope="module")
def references(data):
    """The uninterrupted run (checkpointing every CKPT_EVERY steps) on 1 or 2 processes, each run once per module."""
    runs: dict[int, list[dict]] = {}

    def reference(devices: int) -> list[dict]:
        if devices not in runs:
            runs[devices] = run(data, devices, "reference", "--ckpt-every", str(CKPT_EVERY))
        return runs[devices]

    return reference


DEVICES = pytest.mark.parametrize("devices", [1, 2], ids=["1proc", "2proc-ddp"])


@DEVICES
def test_uninterrupted_run_trains_every_batch_of_every_epoch(references, devices):
    ranks = references(devices)
    for r, rec in enumerate(ranks):
        assert rec["world_size"] == devices
        assert_every_step_trained(rec, devices)
        epochs = [[b["images"] for b in rec["train"] if b["epoch"] == e] for e in range(EPOCHS)]
        assert epochs[0] != epochs[1], "epoch 1 repeated epoch 0 (set_epoch / re-iteration did not advance it)"
    if devices == 2:  # the ranks read disjoint shares
        assert [b["images"] for b in ranks[0]["train"]] != [b["images"] for b in ranks[1]["train"]]


# One process resumes from every kind of point; under DDP, the point that crosses an epoch end is the telling one.
@pytest.mark.parametrize("devices, step", [(1, 3), (1, 6), (1, 9), (2, 9)],
                         ids=["1proc-mid-epoch0", "1proc-end-epoch0", "1proc-mid-epoch1", "2proc-ddp-mid-epoch1"])
def test_resume_from_a_mid_epoch_checkpoint_trains_exactly_the_rest(data, references, devices, step):
    ref = references(devices)
    resumed = resume(data, devices, step)
    for r in range(devices):
        want = [(b["step"], b["labels"], b["images"]) for b in ref[r]["train"] if b["step"] >= step]
        got = [(b["step"], b["labels"], b["images"]) for b in resumed[r]["train"]]
        assert [g[0] for g in got] == [w[0] for w in want], f"rank {r}: resumed run trained other steps"
        for (s, labels, images), (_, want_labels, want_images) in zip(got, want):
            assert labels == want_labels, f"rank {r}, step {s}: other samples than the uninterrupted run"
            assert images == want_images, f"rank {r}, step {s}: other pixels than the uninterrupted run"


def test_ddp_runs_unmodified_under_fastfeed_profile(data, references, tmp_path):
    """`fastfeed profile -- python lightning_train.py --devices 2`: Lightning's DDP (its launcher starts rank 1, the
    profiler times DDP's gradient all-reduce through a communication hook) trains exactly the batches it trains
    unprofiled, and the report covers both ranks with parts that add up to the step, each counted once."""
    ref = references(2)
    report = tmp_path / "report.json"
    prefix = (sys.executable, "-m", "fastfeed.cli", "profile", "--warmup", "2", "--steps", "6", "--json",
              str(report), "--")
    profiled = run(data, 2, "profiled", prefix=prefix)
    for r in range(2):
        assert [(b["step"], b["labels"], b["images"]) for b in profiled[r]["train"]] == \
               [(b["step"], b["labels"], b["images"]) for b in ref[r]["train"]], f"rank {r}"
    rep = json.loads(report.read_text())
    assert rep["run"]["ranks"] == 2 and abs(sum(rep["run"]["share"].values()) - 1.0) < 0.05
    # Lightning runs forward and backward in a closure inside optimizer.step: they are not the optimizer's time. (The
    # optimizer's own share grows on a loaded machine, so it is held against the model's, not a fixed bound.)
    share = rep["run"]["share"]
    assert share["forward+other"] > 0.05 and share["optimizer"] < share["forward+other"] + share["backward"]
    assert all(p["steps"] == 6 for p in rep["processes"])


@DEVICES
def test_validation_scores_every_sample_exactly_once(data, references, devices):
    ranks = references(devices)
    epochs = sorted({v["epoch"] for v in ranks[0]["val"]})
    assert epochs == list(range(EPOCHS)), f"validation ran after epochs {epochs}"
    pad = -(-N_VAL // devices) * devices - N_VAL  # positions that even out the ranks' shares
    for e in epochs:
        per_rank = [[v for v in rec["val"] if v["epoch"] == e] for rec in ranks]
        assert len({len(b) for b in per_rank}) == 1, "ranks ran different numbers of val batches (DDP would hang)"
        scored, ignored = collections.Counter(), 0
        for batches in per_rank:
            for v in batches:
                for h, y in zip(v["rows"], v["labels"]):
                    if y == fastfeed.IGNORE_INDEX:
                        ignored += 1
                    else:
                        scored[(h, y)] += 1
        assert scored == data["val_rows"], f"epoch {e}: val samples scored != each sample once"
        assert ignored == pad
        for r, rec in enumerate(ranks):
            assert rec["val_counts"][str(e)] == N_VAL, f"rank {r}: Lightning's summed val_count for epoch {e}"
