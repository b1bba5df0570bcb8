"""ultralytics' own DetectionTrainer (YOLOv8n from its yaml, no weights, offline, on the CPU) trained on batches from
`fastfeed.Loader(task="detect")` through `fastfeed.detect.clients.UltralyticsLoader`
(tests/clients/ultralytics_train.py, in a process of its own): the trainer runs its epochs unmodified, every batch it trains on comes from the Loader, and
what it reads of its DataLoader (length, sampler, dataset labels, close_mosaic) is there."""
from __future__ import annotations

import csv
import dataclasses
import json
import math
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import fastfeed
from fastfeed.detect.clients import UltralyticsLoader, augment_from_ultralytics

pytestmark = pytest.mark.integration

CLIENT = Path(__file__).with_name("clients") / "ultralytics_train.py"

EPOCHS, BATCH, SIZE = 2, 8, 160


@pytest.fixture(scope="module")
def yolo_data(tmp_path_factory):
    from conftest import run_pack
    from test_detect_loader import NAMES, make_yolo

    root = tmp_path_factory.mktemp("ultralytics")
    truth = make_yolo(root / "src", n=24, seed=1)
    run_pack(root / "src", root / "packed", "--format", "wds")
    names = "".join(f"  {i}: {n}\n" for i, n in enumerate(NAMES))
    (root / "data.yaml").write_text(f"path: {root / 'src'}\ntrain: images\nval: images\nnames:\n{names}")
    return root, truth


def train(root: Path, out: Path, *more: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, str(CLIENT), "--packed", str(root / "packed"), "--data", str(root / "data.yaml"),
           "--out", str(out), "--epochs", str(EPOCHS), "--batch", str(BATCH), "--imgsz", str(SIZE), *more]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def uninterrupted(yolo_data, tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("run")
    proc = train(yolo_data[0], out)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-6000:]
    return json.loads((out / "report.json").read_text())


def test_detection_trainer_trains_on_the_loaders_batches(yolo_data, uninterrupted):
    _, truth = yolo_data
    r = uninterrupted

    assert r["loaders_built"] == 1 and r["task"] == "detect" and r["epochs"] == EPOCHS
    assert r["augment"] == r["trainer"] and r["augment"]["close_mosaic"] == 1  # the trainer's hyperparameters
    # the trainer trained on the Loader's batches: each epoch a full epoch of distinct samples, a new order each
    seen, per_epoch = r["seen"], r["batches_per_epoch"] * BATCH
    assert len(seen) == EPOCHS and all(len(ids) == per_epoch == len(set(ids)) for ids in seen)
    assert seen[0] != seen[1]
    with open(r["results_csv"]) as f:
        rows = list(csv.DictReader(f))
    assert [int(float(row["epoch"])) for row in rows] == list(range(1, EPOCHS + 1))
    losses = [float(row["train/box_loss"]) for row in rows] + [float(row["train/cls_loss"]) for row in rows]
    assert all(math.isfinite(v) and v > 0 for v in losses)
    # the labels the trainer reads for its statistics are the pack's, in its own normalised centre format
    labels = r["labels"]
    assert len(labels) == len(truth) == r["dataset_len"]
    for lb, source in zip(labels, r["sources"]):
        src = truth[int(re.search(r"im(\d+)\.png$", source).group(1))]
        w, h = src["size"]
        want = [((x0 + x1) / 2 / w, (y0 + y1) / 2 / h, (x1 - x0) / w, (y1 - y0) / h) for x0, y0, x1, y1 in src["boxes"]]
        assert np.allclose(np.array(lb["bboxes"]).reshape(-1, 4), np.array(want).reshape(-1, 4), atol=1e-5)
        assert lb["cls"] == src["labels"]


def test_a_run_resumed_from_last_pt_trains_the_epochs_it_had_left_exactly(yolo_data, uninterrupted, tmp_path):
    """Stopped after epoch 0 and resumed from last.pt (one process, where ultralytics never calls set_epoch): the
    resumed epoch is the uninterrupted run's epoch 1, the same samples in the same order and the same pixels
    (mosaic off: it is the close_mosaic epoch), not the Loader's epoch 0 again."""
    root, _ = yolo_data
    stopped = train(root, tmp_path, "--stop-after", "0")
    assert stopped.returncode != 0 and "stopped after epoch 0" in stopped.stderr, stopped.stderr[-3000:]
    resumed = train(root, tmp_path, "--resume")
    assert resumed.returncode == 0, (resumed.stdout + resumed.stderr)[-6000:]
    r = json.loads((tmp_path / "report.json").read_text())
    assert r["seen"] == uninterrupted["seen"][1:] and r["first_batch"] == uninterrupted["first_batch"][1:]
    assert uninterrupted["first_batch"][0] != uninterrupted["first_batch"][1]


def test_the_trainers_validator_scores_every_image_of_an_evaluation_loader_once(yolo_data, tmp_path):
    """The trainer's get_dataloader gives its validator an evaluation Loader too (the letterbox): each epoch's
    validation takes every image of the validation pack once, and the validator counts exactly the pack's images
    and objects; save_txt, which reads the dataset's image files, works as on ultralytics' own loader."""
    from conftest import run_pack
    from test_detect_loader import make_yolo

    root, _ = yolo_data
    truth = make_yolo(tmp_path / "val", n=11, seed=7)
    run_pack(tmp_path / "val", tmp_path / "val-packed", "--format", "wds")
    proc = train(root, tmp_path / "run", "--val-packed", str(tmp_path / "val-packed"))
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-6000:]
    r = json.loads((tmp_path / "run" / "report.json").read_text())
    # each epoch's validation and the final one with best.pt
    assert len(r["scored"]) == len(r["validated"]) == EPOCHS + 1
    assert all(sorted(ids) == list(range(len(truth))) for ids in r["scored"])
    objects = sum(len(t["boxes"]) for t in truth)
    assert all(v["seen"] == len(truth) and v["instances"] == objects for v in r["validated"])
    # save_txt: the validator names each image's predictions by its file (the batches' im_file, the pack's sources)
    assert set(r["saved_labels"]) <= {f"im{i:03d}.txt" for i in range(len(truth))}
    with open(r["results_csv"]) as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == EPOCHS and all(math.isfinite(float(row["metrics/mAP50(B)"])) for row in rows)


def test_mosaic_ends_for_the_last_close_mosaic_epochs_as_in_the_trainer(yolo_data):
    """The trainer turns mosaic off when epoch >= epochs - close_mosaic; the Loader, told `epochs` and the trainer's
    close_mosaic, draws its batches that way: 4 tiles an output before, 1 after."""
    from fastfeed.detect import plan_batch

    root, _ = yolo_data
    args = {"close_mosaic": 2, "mosaic": 1.0, "degrees": 0.0}
    loader = fastfeed.Loader(root / "packed", batch_size=BATCH, image_size=SIZE, dtype=torch.uint8, device="cpu",
                             epochs=5, augment=augment_from_ultralytics(args))
    s = loader.settings
    tiles = [plan_batch(np.arange(BATCH), np.full((BATCH, 2), 100), SIZE, epoch=e, seed=s.seed, aug=s.augment,
                        epochs=s.epochs).n_tiles.max() for e in range(5)]
    assert tiles == [4, 4, 4, 1, 1]
    UltralyticsLoader(loader).dataset.close_mosaic(hyp=args)  # the trainer's call: nothing left for it to do
    loader.close()


def test_hyperparameters_the_loader_does_not_implement_are_named_in_one_warning():
    """A trainer's mixup, perspective, copy_paste (...) set on are named with their values in one warning,
    not silently dropped; ultralytics' own defaults (read from its default.yaml, without importing it) warn of
    nothing, and every augmentation hyperparameter there is either taken or among those named."""
    import importlib.util
    import warnings

    import yaml

    from fastfeed.detect.clients import UNSUPPORTED
    from fastfeed.detect.geometry import DetectAugment

    spec = importlib.util.find_spec("ultralytics")
    text = (Path(spec.origin).parent / "cfg" / "default.yaml").read_text()
    defaults = yaml.safe_load(text)
    block = text[text.index("hsv_h:"):].split("\n\n")[0]  # the augmentation hyperparameters, hsv_h to the gap
    augment_keys = [line.split(":")[0] for line in block.splitlines()]
    classify_only = {"auto_augment", "erasing", "copy_paste_mode"}
    taken = {f.name for f in dataclasses.fields(DetectAugment)}
    assert set(augment_keys) - classify_only - taken == set(UNSUPPORTED)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert augment_from_ultralytics(defaults) == DetectAugment(close_mosaic=defaults["close_mosaic"])
    asked = dict(defaults, flipud=0.5, mixup=0.3, perspective=0.001, copy_paste=0.5, fliplr=0.25)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        aug = augment_from_ultralytics(asked)
    assert aug.fliplr == 0.25 and aug.flipud == 0.5
    assert len(caught) == 1
    msg = str(caught[0].message)
    for shown in ("mixup=0.3", "perspective=0.001", "copy_paste=0.5"):
        assert shown in msg
    assert "flip" not in msg and "cutmix" not in msg and "bgr" not in msg


@pytest.fixture(scope="module")
def yolo_segments(tmp_path_factory):
    from conftest import run_pack
    from test_detect_loader import NAMES
    from test_instance_loader import make_yolo_segments

    root = tmp_path_factory.mktemp("ultralytics-seg")
    for split, n, seed in (("train", 24, 1), ("val", 11, 7)):
        make_yolo_segments(root / split, n=n, seed=seed)
        run_pack(root / split, root / f"{split}-packed", "--format", "wds")
    names = "".join(f"  {i}: {n}\n" for i, n in enumerate(NAMES))
    (root / "data.yaml").write_text(f"path: {root}\ntrain: train/images\nval: val/images\nnames:\n{names}")
    return root


@pytest.mark.parametrize("overlap_mask", [True, False])
def test_the_segmentation_trainer_and_its_validator_take_the_masks_in_the_form_of_its_overlap_mask(
        yolo_segments, tmp_path, overlap_mask):
    """The SegmentationTrainer (YOLOv8n-seg) on `Loader(task="segment")`s for training and validation: with its
    overlap_mask (the default) each batch's masks are the images' index maps, [B, S/4, S/4] (its mask_ratio 4: its
    prototypes' resolution, which its loss otherwise upsamples to the masks'); without, one binary mask a box,
    [N, S/4, S/4] uint8, which its loss and validator index by batch_idx (the index maps there: an IndexError in the
    loss, found by training with overlap_mask=False, or wrong masks unnoticed where a batch has as many boxes as
    images). Either way it trains with finite losses and its validator counts exactly the pack's images and
    objects."""
    root = yolo_segments
    objects = sum(len(f.read_text().splitlines()) for f in (root / "val" / "labels").glob("*.txt"))
    more = () if overlap_mask else ("--no-overlap-mask",)
    cmd = [sys.executable, str(CLIENT), "--packed", str(root / "train-packed"), "--data", str(root / "data.yaml"),
           "--out", str(tmp_path), "--epochs", "1", "--batch", str(BATCH), "--imgsz", str(SIZE),
           "--val-packed", str(root / "val-packed"), "--task", "segment", *more]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-6000:]
    r = json.loads((tmp_path / "report.json").read_text())
    assert r["task"] == "segment" and r["overlap_mask"] is overlap_mask
    assert {m["where"] for m in r["masks"]} == {"train", "val"}
    for m in r["masks"]:
        if overlap_mask:
            assert m["shape"] == [m["images"], SIZE // 4, SIZE // 4] and m["dtype"] == "torch.int16", m
        else:
            assert m["shape"] == [m["boxes"], SIZE // 4, SIZE // 4] and m["dtype"] == "torch.uint8", m
    assert len(r["validated"]) == 2 and all(v["seen"] == 11 and v["instances"] == objects for v in r["validated"])
    assert all(math.isfinite(v["mask_map50"]) for v in r["validated"])
    with open(r["results_csv"]) as f:
        rows = list(csv.DictReader(f))
    losses = [float(rows[0][k]) for k in ("train/box_loss", "train/seg_loss", "train/cls_loss", "val/seg_loss")]
    assert all(math.isfinite(v) and v > 0 for v in losses), rows


def test_a_pose_trainer_is_refused_saying_the_batches_have_no_keypoints(tmp_path):
    """A YOLO pose set packs as detection (its keypoints kept in the annotations, not in batches): ultralytics'
    PoseTrainer given UltralyticsLoader stops at get_dataloader saying so, instead of training until its loss fails
    on KeyError: 'keypoints' (found by training YOLOv8n-pose on a packed pose set)."""
    from conftest import run_pack
    from test_detect_loader import NAMES, make_yolo

    make_yolo(tmp_path / "src", n=8, seed=1)
    for f in (tmp_path / "src" / "labels").glob("*.txt"):  # one keypoint a box, at its centre, visible
        f.write_text("".join(f"{line} {line.split()[1]} {line.split()[2]} 2\n" for line in f.read_text().splitlines()))
    names = "".join(f"  {i}: {n}\n" for i, n in enumerate(NAMES))
    (tmp_path / "src" / "data.yaml").write_text(f"kpt_shape: [1, 3]\nnames:\n{names}")
    run_pack(tmp_path / "src", tmp_path / "packed", "--format", "wds")
    (tmp_path / "data.yaml").write_text(f"path: {tmp_path / 'src'}\ntrain: images\nval: images\nkpt_shape: [1, 3]\n"
                                        f"names:\n{names}")
    cmd = [sys.executable, str(CLIENT), "--packed", str(tmp_path / "packed"), "--data", str(tmp_path / "data.yaml"),
           "--out", str(tmp_path / "run"), "--epochs", "1", "--batch", str(BATCH), "--imgsz", str(SIZE),
           "--task", "pose"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert proc.returncode != 0
    assert "ValueError: ultralytics' pose trainer needs" in proc.stderr and "keypoints" in proc.stderr, \
        proc.stderr[-3000:]
    assert "KeyError" not in proc.stderr


def test_a_segment_trainer_given_a_detection_loader_is_told_to_ask_for_masks(yolo_data):
    """The SegmentationTrainer's args (task "segment") with a detection Loader: refused naming task='segment', not a
    KeyError: 'masks' in its loss; a detection trainer takes it."""
    from types import SimpleNamespace

    loader = fastfeed.Loader(yolo_data[0] / "packed", batch_size=BATCH, image_size=SIZE, dtype=torch.uint8,
                             device="cpu")
    with pytest.raises(ValueError, match="task='segment'"):
        UltralyticsLoader(loader, trainer=SimpleNamespace(args=SimpleNamespace(task="segment")))
    UltralyticsLoader(loader, trainer=SimpleNamespace(args=SimpleNamespace(task="detect")))
    loader.close()
