"""ultralytics' own DetectionTrainer (YOLOv8n from its yaml, no weights, offline, on the CPU) trained on batches from
`fastfeed.Loader(task="detect")` through `fastfeed.detect.clients.UltralyticsLoader`: the trainer runs its epochs
unmodified, every batch it trains on comes from the Loader, and what it reads of its DataLoader (length, sampler,
dataset labels, close_mosaic) is there."""
from __future__ import annotations

import csv
import math

import numpy as np
import pytest
import torch

import fastfeed
from fastfeed.detect.clients import UltralyticsLoader, augment_from_ultralytics

pytestmark = [pytest.mark.integration, pytest.mark.filterwarnings("ignore::FutureWarning"),
              pytest.mark.filterwarnings("ignore::UserWarning")]

EPOCHS, BATCH, SIZE = 2, 8, 160


@pytest.fixture(scope="module")
def yolo_data(tmp_path_factory):
    from conftest import run_pack
    from test_detect_loader import NAMES, make_yolo

    root = tmp_path_factory.mktemp("ultralytics")
    truth = make_yolo(root / "src", n=40, seed=1)
    run_pack(root / "src", root / "packed", "--format", "wds")
    names = "".join(f"  {i}: {n}\n" for i, n in enumerate(NAMES))
    (root / "data.yaml").write_text(f"path: {root / 'src'}\ntrain: images\nval: images\nnames:\n{names}")
    return root, truth


def test_detection_trainer_trains_on_the_loaders_batches(yolo_data, tmp_path, monkeypatch):
    root, truth = yolo_data
    monkeypatch.setenv("YOLO_OFFLINE", "1")
    monkeypatch.setenv("YOLO_CONFIG_DIR", str(tmp_path / "config"))
    from ultralytics.models.yolo.detect import DetectionTrainer

    built, seen = [], []

    class Counting(UltralyticsLoader):
        def __iter__(self):
            seen.append([])
            for batch in super().__iter__():
                seen[-1].extend(int(f) for f in batch["im_file"])
                yield batch

    class Trainer(DetectionTrainer):
        def get_dataloader(self, dataset_path, batch_size=16, rank=0, mode="train"):
            if mode != "train":
                return super().get_dataloader(dataset_path, batch_size, rank, mode)
            loader = fastfeed.Loader(root / "packed", batch_size=batch_size, image_size=self.args.imgsz,
                                     dtype=torch.uint8, device="cpu", epochs=self.args.epochs, seed=0,
                                     augment=augment_from_ultralytics(self.args))
            built.append(Counting(loader))
            return built[-1]

    torch.manual_seed(0)
    trainer = Trainer(overrides=dict(model="yolov8n.yaml", data=str(root / "data.yaml"), epochs=EPOCHS, imgsz=SIZE,
                                     batch=BATCH, device="cpu", workers=0, plots=False, val=False, amp=False,
                                     pretrained=False, project=str(tmp_path / "runs"), name="fastfeed",
                                     exist_ok=True, close_mosaic=1, verbose=False))
    trainer.train()

    assert len(built) == 1
    loader = built[0].loader
    assert loader.settings.task == "detect" and loader.settings.epochs == EPOCHS
    aug = loader.settings.augment
    assert (aug.close_mosaic, aug.mosaic, aug.scale, aug.fliplr) == (1, trainer.args.mosaic, trainer.args.scale,
                                                                     trainer.args.fliplr)
    # the trainer trained on the Loader's batches: each epoch a full epoch of distinct samples, a new order each
    assert len(seen) == EPOCHS and all(len(ids) == len(loader) * BATCH == len(set(ids)) for ids in seen)
    assert seen[0] != seen[1]
    rows = list(csv.DictReader((trainer.save_dir / "results.csv").open()))
    assert [int(float(r["epoch"])) for r in rows] == list(range(1, EPOCHS + 1))
    losses = [float(r["train/box_loss"]) for r in rows] + [float(r["train/cls_loss"]) for r in rows]
    assert all(math.isfinite(v) and v > 0 for v in losses)
    # the labels the trainer reads for its statistics are the pack's, in its own normalised centre format
    labels = built[0].dataset.labels
    assert len(labels) == len(truth) == len(built[0].dataset)
    assert sum(len(lb["cls"]) for lb in labels) == sum(len(t["labels"]) for t in truth)
    ds = loader.dataset
    for i in range(len(ds)):
        src = truth[int(str(ds.sources[i]).rsplit("im", 1)[1][:3])]
        w, h = src["size"]
        want = np.array([((x0 + x1) / 2 / w, (y0 + y1) / 2 / h, (x1 - x0) / w, (y1 - y0) / h)
                         for x0, y0, x1, y1 in src["boxes"]], dtype=np.float32).reshape(-1, 4)
        assert np.allclose(labels[i]["bboxes"], want, atol=1e-5)
        assert labels[i]["cls"].ravel().tolist() == src["labels"]
    built[0].close()


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
