"""Hugging Face Accelerate 1.15 with fastfeed.Loader on 2 CPU processes (gloo), launched with `accelerate launch`
as a user does (tests/clients/accelerate_train.py, written like Accelerate's examples).

- Training: both ranks take 6 steps per epoch; the learning-rate schedule, sized as docs/recipes.md says
  (`len(loader) * epochs * num_processes` for a scheduler that went through `prepare`), ends exactly at its last
  step, not half-way.
- Evaluation: `gather_for_metrics` returns every val sample exactly once (21 samples on 2 ranks: one padded
  position, which Accelerate trims because the Loader reports `end_of_dataloader`/`remainder` to its GradientState).
- Resume: `register_for_checkpointing(loader)` + `save_state` after steps 3 (mid-epoch 0), 6 (end of epoch 0) and
  9 (mid-epoch 1); `load_state` in a fresh launch trains exactly the batches of the uninterrupted run from there.
"""
from __future__ import annotations

import collections
import json
import subprocess
import sys
from pathlib import Path

import pytest

import fastfeed
from clients.common import client_env, free_port, make_tiny_tree, pack, row_fingerprint_ints

pytestmark = pytest.mark.integration

SCRIPT = Path(__file__).parent / "clients" / "accelerate_train.py"
N_TRAIN, N_VAL, BATCH, WORLD, EPOCHS = 48, 21, 4, 2, 2
STEPS_PER_EPOCH = N_TRAIN // (WORLD * BATCH)
SAVE_AT = (3, 6, 9)
IMAGE_SIZE = 32
RUN_TIMEOUT_S = 300


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("accelerate")
    train = pack(make_tiny_tree(root / "train-src", N_TRAIN), root / "train", "lmdb")
    val = pack(make_tiny_tree(root / "val-src", N_VAL, seed=1), root / "val", "wds")
    with fastfeed.Loader(val, batch_size=8, train=False, image_size=IMAGE_SIZE, device="cpu") as loader:
        rows = [(int(h), int(y)) for images, labels in loader for h, y in zip(row_fingerprint_ints(images), labels)]
    assert len(rows) == N_VAL and len({h for h, _ in rows}) == N_VAL, "the val images must be distinct"
    return {"root": root, "train": train, "val": val, "val_rows": collections.Counter(rows)}


def launch(data: dict, tag: str, *extra: str) -> list[dict]:
    out = data["root"] / "out"
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", str(WORLD),
           "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port",
           str(free_port()), str(SCRIPT), "--train", str(data["train"]), "--val", str(data["val"]), "--out",
           str(out), "--tag", tag, "--epochs", str(EPOCHS), "--batch-size", str(BATCH), "--image-size",
           str(IMAGE_SIZE), *extra]
    env = client_env(ACCELERATE_USE_CPU="1")  # what `accelerate config` writes for a CPU-only machine
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=RUN_TIMEOUT_S, env=env)
    assert proc.returncode == 0, f"{' '.join(cmd)} exited {proc.returncode}:\n{proc.stdout[-3000:]}\n" \
                                 f"{proc.stderr[-6000:]}"
    return [json.loads((out / f"{tag}-rank{r}.json").read_text()) for r in range(WORLD)]


@pytest.fixture(scope="module")
def reference(data) -> list[dict]:
    return launch(data, "reference", "--save-every", str(SAVE_AT[0]))


def test_training_steps_and_a_schedule_sized_for_all_processes(reference):
    for r, rec in enumerate(reference):
        assert rec["world_size"] == WORLD
        assert [b["step"] for b in rec["train"]] == list(range(EPOCHS * STEPS_PER_EPOCH)), f"rank {r}"
        assert [b["epoch"] for b in rec["train"]] == [s // STEPS_PER_EPOCH for s in range(EPOCHS * STEPS_PER_EPOCH)]
        assert all(len(b["labels"]) == BATCH for b in rec["train"])
        # The schedule ran to its end: stepped num_processes times per optimizer step, as many steps as planned.
        assert rec["lr_steps"] == rec["total_steps"] == EPOCHS * STEPS_PER_EPOCH * WORLD
        assert rec["final_lr_factor"] == pytest.approx(0.0, abs=1e-9)
    assert [b["images"] for b in reference[0]["train"]] != [b["images"] for b in reference[1]["train"]]


def test_gather_for_metrics_returns_every_val_sample_exactly_once(data, reference):
    for r, rec in enumerate(reference):
        assert sorted(rec["eval"]) == [str(e) for e in range(EPOCHS)]
        for e, ev in rec["eval"].items():
            assert ev["count"] == N_VAL, f"rank {r}, epoch {e}: scored {ev['count']} of {N_VAL} val samples"
            got = collections.Counter(zip(ev["rows"], ev["labels"]))
            assert got == data["val_rows"], f"rank {r}, epoch {e}: gathered samples != each val sample once"


# A checkpoint at an epoch's end and one in a later epoch (the 1-process Lightning test covers every kind of point).
@pytest.mark.parametrize("step", SAVE_AT[1:], ids=["end-epoch0", "mid-epoch1"])
def test_load_state_resumes_exactly_where_save_state_was_called(data, reference, step):
    resumed = launch(data, f"resume{step}", "--resume", str(data["root"] / "out" / f"step_{step}"))
    for r in range(WORLD):
        want = [(b["step"], b["labels"], b["images"]) for b in reference[r]["train"] if b["step"] >= step]
        got = [(b["step"], b["labels"], b["images"]) for b in resumed[r]["train"]]
        assert [g[0] for g in got] == [w[0] for w in want], f"rank {r}: resumed run trained other steps"
        for (s, labels, images), (_, want_labels, want_images) in zip(got, want):
            assert labels == want_labels, f"rank {r}, step {s}: other samples than the uninterrupted run"
            assert images == want_images, f"rank {r}, step {s}: other pixels than the uninterrupted run"
        assert resumed[r]["lr_steps"] == reference[r]["lr_steps"], "the schedule did not resume with the loader"
        for ev in resumed[r]["eval"].values():
            assert ev["count"] == N_VAL
