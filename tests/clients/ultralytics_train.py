"""ultralytics' DetectionTrainer (YOLOv8n from its yaml, no weights, offline, CPU) trained on a detection pack through
`fastfeed.detect.clients.UltralyticsLoader`, as a user's script would. A process of its own: importing ultralytics
replaces `PIL.Image.open` for the whole process (its HEIF patch), which the test session must not inherit.

    python tests/clients/ultralytics_train.py --packed DIR --data data.yaml --out DIR [--epochs 2] [--batch 8]
        [--imgsz 160] [--stop-after EPOCH | --resume] [--val-packed DIR] [--task segment [--no-overlap-mask]]

Writes OUT/report.json: the sample ids of every batch the trainer took, by epoch, with a digest of each epoch's
first batch of images; the Loader's settings; the trainer's hyperparameters the Loader was given; the labels the
trainer read from the adapter; results.csv's path. --stop-after E: the process exits once epoch E is saved, as a
crash would; --resume: the trainer resumes OUT's run from its last.pt, as `yolo train resume` does; --val-packed:
the trainer validates each epoch on an evaluation Loader of that pack (report: the ids each validation pass scored,
the images and instances its validator counted); --task segment: the SegmentationTrainer (YOLOv8n-seg) on
`Loader(task="segment")`s, with its `overlap_mask` or, --no-overlap-mask, without (report: the masks' shape and
dtype and the boxes of every batch the trainer and its validator took, the validator's mask mAP50); --task pose:
the PoseTrainer (YOLOv8n-pose) on a detection Loader of a pose pack, which UltralyticsLoader refuses.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
from pathlib import Path

import torch

import fastfeed
from fastfeed.detect.clients import UltralyticsLoader, augment_from_ultralytics


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--packed", required=True)
    p.add_argument("--data", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--imgsz", type=int, default=160)
    p.add_argument("--stop-after", type=int)
    p.add_argument("--resume", action="store_true")
    p.add_argument("--val-packed")
    p.add_argument("--task", choices=("detect", "segment", "pose"), default="detect")
    p.add_argument("--no-overlap-mask", action="store_true")
    a = p.parse_args()
    out = Path(a.out)
    os.environ.setdefault("YOLO_OFFLINE", "1")
    os.environ.setdefault("YOLO_CONFIG_DIR", str(out / "config"))
    from ultralytics.models.yolo.detect import DetectionTrainer
    from ultralytics.models.yolo.pose import PoseTrainer
    from ultralytics.models.yolo.segment import SegmentationTrainer

    built, seen, firsts, scored, validated, masks = [], [], [], [], [], []

    def note_masks(batch: dict, where: str) -> None:
        if "masks" in batch:
            masks.append({"where": where, "shape": list(batch["masks"].shape), "dtype": str(batch["masks"].dtype),
                          "images": len(batch["img"]), "boxes": len(batch["cls"])})

    class Counting(UltralyticsLoader):
        def __iter__(self):
            seen.append([])
            ids = {f: i for i, f in enumerate(self.dataset.im_files)}  # im_file: each image's source path
            for batch in super().__iter__():
                if not seen[-1]:
                    firsts.append(hashlib.sha256(batch["img"].numpy().tobytes()).hexdigest())
                seen[-1].extend(ids[f] for f in batch["im_file"])
                note_masks(batch, "train")
                yield batch

    class Scored(UltralyticsLoader):
        def __iter__(self):
            scored.append([])
            ids = {f: i for i, f in enumerate(self.dataset.im_files)}
            for batch in super().__iter__():
                scored[-1].extend(ids[f] for f in batch["im_file"])
                note_masks(batch, "val")
                yield batch

    base = {"detect": DetectionTrainer, "segment": SegmentationTrainer, "pose": PoseTrainer}[a.task]
    loader_task = "segment" if a.task == "segment" else "detect"  # a pose pack is a detection one

    class Trainer(base):
        def get_dataloader(self, dataset_path, batch_size=16, rank=0, mode="train"):
            if mode != "train":
                if a.val_packed is None:
                    return super().get_dataloader(dataset_path, batch_size, rank, mode)
                return Scored(fastfeed.Loader(a.val_packed, batch_size=batch_size, image_size=self.args.imgsz,
                                              dtype=torch.uint8, device="cpu", train=False, task=loader_task),
                              trainer=self)
            loader = fastfeed.Loader(a.packed, batch_size=batch_size, image_size=self.args.imgsz, dtype=torch.uint8,
                                     device="cpu", epochs=self.args.epochs, seed=0, task=loader_task,
                                     augment=augment_from_ultralytics(self.args))
            built.append(Counting(loader, trainer=self))
            return built[-1]

    def crash(trainer) -> None:  # after the epoch's last.pt is written
        if trainer.epoch == a.stop_after:
            raise SystemExit(f"stopped after epoch {trainer.epoch}")

    torch.manual_seed(0)
    model = {"detect": "yolov8n.yaml", "segment": "yolov8n-seg.yaml", "pose": "yolov8n-pose.yaml"}[a.task]
    overrides = dict(model=model, data=a.data, epochs=a.epochs, imgsz=a.imgsz, batch=a.batch, device="cpu",
                     workers=0, plots=False, val=False, amp=False, pretrained=False, project=str(out / "runs"),
                     name="fastfeed", exist_ok=True, close_mosaic=1, verbose=False)
    if a.resume:
        overrides = dict(resume=str(out / "runs" / "fastfeed" / "weights" / "last.pt"), device="cpu", workers=0,
                         plots=False)
    if a.val_packed is not None:  # with what the validator reads of its DataLoader's dataset to save its labels
        overrides.update(val=True, save_txt=True)
    if a.no_overlap_mask:
        overrides.update(overlap_mask=False)
    trainer = Trainer(overrides=overrides)
    trainer.add_callback("on_val_end", lambda v: validated.append(
        {"seen": v.seen, "instances": int(v.metrics.nt_per_class.sum()), "map50": float(v.metrics.box.map50),
         "mask_map50": float(v.metrics.seg.map50) if hasattr(v.metrics, "seg") else None}))
    if a.stop_after is not None:
        trainer.add_callback("on_fit_epoch_end", crash)
    trainer.train()
    adapter = built[0]
    s = adapter.loader.settings
    report = {
        "loaders_built": len(built),
        "batches_per_epoch": len(adapter),
        "seen": seen,
        "first_batch": firsts,
        "task": s.task, "epochs": s.epochs, "batch_size": s.batch_size,
        "augment": {k: getattr(s.augment, k) for k in ("close_mosaic", "mosaic", "scale", "fliplr", "translate")},
        "trainer": {k: getattr(trainer.args, k) for k in ("close_mosaic", "mosaic", "scale", "fliplr", "translate")},
        "dataset_len": len(adapter.dataset),
        "sources": [str(v) for v in adapter.loader.dataset.sources],
        "labels": [{"cls": lb["cls"].ravel().tolist(), "bboxes": lb["bboxes"].tolist()}
                   for lb in adapter.dataset.labels],
        "results_csv": str(trainer.save_dir / "results.csv"),
        "scored": scored,
        "validated": validated,
        "saved_labels": sorted(p.name for p in Path(trainer.save_dir).rglob("labels/*.txt")),
        "overlap_mask": trainer.args.overlap_mask,
        "masks": masks,
    }
    adapter.close()
    (out / "report.json").write_text(json.dumps(report))


if __name__ == "__main__":
    main()
