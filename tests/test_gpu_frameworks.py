"""The Lightning client of tests/test_frameworks_lightning.py on this machine's GPUs (`pytest -m gpu`): one GPU, or
two with DDP over NCCL, fed photos (240-360 px) so that `auto` decodes them on the GPU — the hybrid on a rank with
8 or more cores, DALI's GPU decoder on fewer. That is what a Lightning user with GPUs gets from the recipe in
docs/recipes.md, unchanged; the CPU tests cover the same client with thumbnails, which `auto` decodes on the CPU.

The same runs and checks as tests/test_frameworks_lightning.py (every step of every epoch, a mid-epoch resume trains
exactly the rest, every val sample scored once), with pixels compared within a tolerance instead of by hash: the GPU
decoders may differ from the CPU path by a fraction of a grey level (docs/decode-contract.md), and which part of the
hybrid decodes a sample depends on timing. A sample is named by its label and `row_signatures` (12 means over
quarters of the image).
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

import fastfeed
from clients.common import make_tiny_tree, pack, row_signatures
from test_frameworks_lightning import CKPT_EVERY, EPOCHS, IMAGE_SIZE, N_TRAIN, N_VAL, assert_every_step_trained, \
    resume, run

pytestmark = [pytest.mark.gpu, pytest.mark.integration]

PHOTO_SIDES = (240, 360)  # median ~300x300 px: above the thumbnail limit, so the GPU decodes
# Max difference of a signature entry (normalised units; 1/255 of a grey level is ~0.017) between two decodes of
# one sample: the contract's bound (0.69/255 mean absolute, eval) averaged over a quarter of the image is far below.
TOL = 0.05
GPU_KINDS = ("hybrid", "dali")


def _devices() -> int:
    return min(2, torch.cuda.device_count()) if torch.cuda.is_available() else 0


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> dict:
    pytest.importorskip("lightning")
    root = tmp_path_factory.mktemp("lightning-gpu")
    train = pack(make_tiny_tree(root / "train-src", N_TRAIN, sides=PHOTO_SIDES), root / "train", "wds", "1MB")
    val = pack(make_tiny_tree(root / "val-src", N_VAL, seed=1, sides=PHOTO_SIDES), root / "val", "lmdb")
    # The val samples as the CPU path decodes them (the contract's reference), one row per sample.
    with fastfeed.Loader(val, batch_size=8, train=False, image_size=IMAGE_SIZE, device="cpu") as loader:
        rows = [(s, int(y)) for images, labels in loader for s, y in zip(row_signatures(images), labels)]
    sigs = np.asarray([s for s, _ in rows])
    gaps = np.abs(sigs[:, None, :] - sigs[None, :, :]).max(axis=2) + np.eye(len(sigs)) * 1e9
    assert len(rows) == N_VAL and gaps.min() > 4 * TOL, "val samples must be told apart well beyond TOL"
    return {"root": root, "train": train, "val": val, "val_rows": rows}


@pytest.fixture(scope="module")
def reference(data) -> tuple[int, list[dict]]:
    devices = _devices()
    return devices, run(data, devices, "reference", "--ckpt-every", str(CKPT_EVERY))


def _close(a, b) -> bool:
    return float(np.abs(np.asarray(a) - np.asarray(b)).max()) <= TOL


def test_the_trainer_is_fed_by_the_gpu_decoders_on_every_rank(reference):
    devices, ranks = reference
    for r, rec in enumerate(ranks):
        assert rec["world_size"] == devices and rec["device"] == f"cuda:{r}"
        for name in ("train", "val"):
            d = rec["decoders"][name]
            assert d["kind"] in GPU_KINDS, f"rank {r}: `auto` chose {d['kind']} for the {name} photos"
            if d["kind"] == "hybrid":
                assert d["counters"]["gpu_decoded"] > 0, f"rank {r}, {name}: {d['counters']}"


def test_every_step_of_every_epoch_is_trained(reference):
    devices, ranks = reference
    for rec in ranks:
        assert_every_step_trained(rec, devices)
    if devices == 2:  # the ranks read disjoint shares
        assert [b["sigs"] for b in ranks[0]["train"]] != [b["sigs"] for b in ranks[1]["train"]]


@pytest.mark.parametrize("step", [3, 9], ids=["mid-epoch0", "mid-epoch1"])
def test_resume_from_a_mid_epoch_checkpoint_trains_the_same_samples(data, reference, step):
    devices, ref = reference
    resumed = resume(data, devices, step)
    for r in range(devices):
        want = [b for b in ref[r]["train"] if b["step"] >= step]
        got = resumed[r]["train"]
        assert [b["step"] for b in got] == [b["step"] for b in want], f"rank {r}: resumed run trained other steps"
        for g, w in zip(got, want):
            assert g["labels"] == w["labels"], f"rank {r}, step {g['step']}: other samples than the reference"
            assert all(_close(a, b) for a, b in zip(g["sigs"], w["sigs"])), \
                f"rank {r}, step {g['step']}: other pixels (or crops) than the uninterrupted run"


def test_validation_scores_every_sample_once_with_the_cpu_paths_pixels(data, reference):
    devices, ranks = reference
    pad = -(-N_VAL // devices) * devices - N_VAL
    for e in range(EPOCHS):
        matched, ignored = [0] * N_VAL, 0
        for rec in ranks:
            for v in (v for v in rec["val"] if v["epoch"] == e):
                for sig, y in zip(v["sigs"], v["labels"]):
                    if y == fastfeed.IGNORE_INDEX:
                        ignored += 1
                        continue
                    hits = [i for i, (s, label) in enumerate(data["val_rows"]) if label == y and _close(sig, s)]
                    assert len(hits) == 1, f"epoch {e}: a scored row matches {len(hits)} val samples"
                    matched[hits[0]] += 1
        assert matched == [1] * N_VAL, f"epoch {e}: times each val sample was scored: {matched}"
        assert ignored == pad
        for r, rec in enumerate(ranks):
            assert rec["val_counts"][str(e)] == N_VAL, f"rank {r}: Lightning's summed val_count for epoch {e}"
