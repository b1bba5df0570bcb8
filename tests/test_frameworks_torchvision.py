"""A torchrun script in the style of torchvision's references/classification/train.py (tests/clients/
torchvision_train.py) on 2 CPU processes with gloo: `builtins.print` replaced before the loaders are built,
MixUp/CutMix from torchvision.transforms.v2 as the Loader's batch_transform, `train_sampler.set_epoch(epoch)`
through `loader.sampler`, and an evaluation whose all-reduced sample count must equal the dataset size.

Plus the sampler contract in one process: `loader.sampler` names exactly the samples the Loader feeds.
"""
from __future__ import annotations

import collections
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import fastfeed
from clients.common import client_env, make_tiny_tree, pack, row_fingerprints

pytestmark = pytest.mark.integration  # torchrun and the script as processes
SCRIPT = Path(__file__).parent / "clients" / "torchvision_train.py"
N_TRAIN, N_VAL, BATCH, WORLD, EPOCHS, CLASSES = 48, 21, 4, 2, 2, 4
IMAGE_SIZE = 32
RUN_TIMEOUT_S = 300


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("torchvision")
    train = pack(make_tiny_tree(root / "train-src", N_TRAIN, CLASSES), root / "train", "wds")
    val = pack(make_tiny_tree(root / "val-src", N_VAL, CLASSES, seed=1), root / "val", "lmdb")
    with fastfeed.Loader(val, batch_size=8, train=False, image_size=IMAGE_SIZE, device="cpu") as loader:
        rows = [(h, int(y)) for images, labels in loader for h, y in zip(row_fingerprints(images), labels)]
    assert len(rows) == N_VAL and len({h for h, _ in rows}) == N_VAL, "the val images must be distinct"
    return {"root": root, "train": train, "val": val, "val_rows": collections.Counter(rows)}


@pytest.fixture(scope="module")
def torchrun(data) -> list[dict]:
    out = data["root"] / "out"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(WORLD),
           str(SCRIPT), "--train", str(data["train"]), "--val", str(data["val"]), "--out", str(out),
           "--epochs", str(EPOCHS), "--batch-size", str(BATCH), "--image-size", str(IMAGE_SIZE)]
    env = client_env(NUMBA_CACHE_DIR=str(data["root"] / "numba-cache"))  # a fresh machine: numba compiles
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=RUN_TIMEOUT_S, env=env)
    assert proc.returncode == 0, f"{' '.join(cmd)} exited {proc.returncode}:\n{proc.stdout[-3000:]}\n" \
                                 f"{proc.stderr[-8000:]}"
    assert proc.stdout.count("Test: Acc@1") == EPOCHS, "only rank 0 prints (setup_for_distributed)"
    return [json.loads((out / f"run-rank{r}.json").read_text()) for r in range(WORLD)]


def test_reference_style_script_trains_and_evaluates_exactly(data, torchrun):
    per_rank = N_TRAIN // (WORLD * BATCH) * BATCH  # drop_last in training: 24 samples, 6 batches per rank
    for r, rec in enumerate(torchrun):
        assert rec["print_replaced"], "the script did not replace builtins.print before building its loaders"
        assert [s["epoch"] for s in rec["sampler"]] == list(range(EPOCHS)), "sampler.set_epoch(epoch) not seen"
        for s in rec["sampler"]:
            assert (s["num_replicas"], s["rank"], s["len"], len(s["ids"])) == (WORLD, r, per_rank, per_rank)
        for e in range(EPOCHS):
            batches = [b for b in rec["train"] if b["epoch"] == e]
            assert len(batches) == per_rank // BATCH
            # MixUp/CutMix ran: soft targets [B, classes] (label smoothing is the loss's), rows summing to 1.
            assert all(b["target_shape"] == [BATCH, CLASSES] for b in batches)
            assert all(abs(sum(row) - 1) < 1e-5 for b in batches for row in b["labels"])
        for e, ev in enumerate(rec["eval"]):
            assert ev["count"] == N_VAL, f"rank {r}, epoch {e}: evaluate() all-reduced {ev['count']} samples"
            assert collections.Counter(map(tuple, ev["scored"])) == data["val_rows"], \
                f"rank {r}, epoch {e}: the IGNORE_INDEX mask did not leave each val sample exactly once"
    for e in range(EPOCHS):  # the ranks' shares are disjoint, and the epoch changes them
        ids = [set(rec["sampler"][e]["ids"]) for rec in torchrun]
        assert not ids[0] & ids[1] and max(ids[0] | ids[1]) < N_TRAIN
    assert torchrun[0]["sampler"][0]["ids"] != torchrun[0]["sampler"][1]["ids"]


def test_the_script_runs_unmodified_under_the_profiler(data, torchrun):
    """`torchrun ... -m fastfeed.profile SCRIPT ...` (fastfeed profile's form for every rank): the script does
    exactly what it did without the profiler (the same samples, batches digest by digest, evaluation counts), and
    the report has both ranks' measured steps, ending at the optimizer's step."""
    out, records = data["root"] / "profiled", data["root"] / "records"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(WORLD),
           "-m", "fastfeed.profile", str(SCRIPT), "--train", str(data["train"]), "--val", str(data["val"]),
           "--out", str(out), "--epochs", str(EPOCHS), "--batch-size", str(BATCH), "--image-size", str(IMAGE_SIZE)]
    env = client_env(NUMBA_CACHE_DIR=str(data["root"] / "numba-cache"), FASTFEED_PROFILE_DIR=str(records),
                     FASTFEED_PROFILE_OPTIONS=json.dumps({"warmup": 2, "steps": 6, "then": "continue"}))
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=RUN_TIMEOUT_S, env=env)
    assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-8000:]}"
    for r, plain in enumerate(torchrun):
        profiled = json.loads((out / f"run-rank{r}.json").read_text())
        for key in ("sampler", "train", "eval"):
            assert profiled[key] == plain[key], f"rank {r}: the profiled run's {key} differs"
    report = data["root"] / "profile.json"
    done = subprocess.run([sys.executable, "-m", "fastfeed.cli", "profile", "--report", str(records), "--json",
                           str(report)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-3000:]
    rep = json.loads(report.read_text())
    assert rep["run"]["ranks"] == WORLD
    assert [p["steps"] for p in rep["processes"]] == [6] * WORLD
    assert {p["step_boundary"] for p in rep["processes"]} == {"optimizer"}
    assert rep["verdict"], done.stdout


@pytest.mark.parametrize("train", [True, False], ids=["train", "eval"])
@pytest.mark.parametrize("rank", [0, 1])
def test_sampler_names_exactly_the_samples_the_loader_feeds(data, rank, train):
    loader = fastfeed.Loader(data["train"] if train else data["val"], batch_size=BATCH, train=train,
                             image_size=IMAGE_SIZE, device="cpu", rank=rank, world_size=WORLD, seed=5)
    sampler = loader.sampler
    assert (sampler.num_replicas, sampler.rank, sampler.seed, sampler.shuffle, sampler.drop_last) == \
        (WORLD, rank, 5, train, train)
    labels_of = np.asarray(loader.dataset.labels)
    for epoch in (1, 0):  # set_epoch decides the epoch that the next iteration runs (also going back)
        sampler.set_epoch(epoch)
        assert sampler.epoch == epoch
        ids = list(sampler)
        assert len(ids) == len(sampler)
        fed = [int(y) for _, labels in loader for y in labels]
        assert len(fed) == len(ids) and len(loader) == -(-len(ids) // BATCH)
        want = [int(labels_of[i]) for i in ids]
        if not train:  # positions that hold no sample of this rank's own (wrap-around padding) are ignored
            n = len(loader.dataset)
            pad = -(-n // WORLD) * WORLD - n
            if rank == WORLD - 1 and pad:
                want[-pad:] = [fastfeed.IGNORE_INDEX] * pad
        assert fed == want, f"rank {rank}, epoch {epoch}: the labels fed differ from the sampler's samples"
    if train:
        sampler.set_epoch(0)
        first = list(sampler)
        sampler.set_epoch(1)
        assert list(sampler) != first
    loader.close()


def test_a_loader_builds_after_setup_for_distributed_replaced_print(data, tmp_path):
    """One process, no torchrun: the script's own setup_for_distributed (a closure, as in torchvision's utils.py,
    so the replacement is not reachable as `<module>.print`) runs before the first Loader is built."""
    code = (f"import sys; sys.path.insert(0, {str(SCRIPT.parent)!r})\n"
            "import fastfeed, torchvision_train\n"
            "torchvision_train.setup_for_distributed(False)\n"
            f"loader = fastfeed.Loader({str(data['train'])!r}, batch_size={BATCH}, image_size={IMAGE_SIZE})\n"
            "n = sum(len(labels) for _, labels in loader)\n"
            "print('samples', n, force=True)\n"
            "print('hidden on a non-master rank')\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=RUN_TIMEOUT_S,
                          env=client_env(NUMBA_CACHE_DIR=str(tmp_path / "numba-cache")))
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert proc.stdout.split("\n")[:-1] == [f"samples {N_TRAIN}"]
