"""A detection batch (the dict `Loader(task="detect")` yields) in the shapes two training stacks take.

    to_torchvision(batch)  -> (images, targets): torchvision's detection models (`model(images, targets)`)
    to_ultralytics(batch)  -> the dict ultralytics' YOLO trainers get from their own collate function
"""
from __future__ import annotations

import torch

__all__ = ["to_torchvision", "to_ultralytics"]


def to_torchvision(batch: dict, label_offset: int = 0) -> tuple[list[torch.Tensor], list[dict]]:
    """(images, targets) as torchvision's detection models take them: a list of [3, S, S] images and per image
    {"boxes": float [n, 4] XYXY pixels, "labels": int64 [n]}. `label_offset=1` for the R-CNN family (Faster R-CNN,
    Mask R-CNN), which reserve class 0 for the background; RetinaNet and FCOS take the classes as they are."""
    images, idx = batch["images"], batch["batch_idx"]
    targets = []
    for k in range(len(images)):
        mine = idx == k
        targets.append({"boxes": batch["boxes"][mine], "labels": batch["labels"][mine] + label_offset})
    return list(images), targets


def to_ultralytics(batch: dict, files: list[str] | None = None) -> dict:
    """The batch dict of ultralytics' `YOLODataset.collate_fn`: "img" uint8 [B, 3, S, S] (its trainer divides by
    255 itself, so build the Loader with dtype=torch.uint8), "cls" float [N, 1], "bboxes" float [N, 4] normalised
    centre-x, centre-y, width, height, "batch_idx" float [N], and per image "ori_shape" (h, w), "resized_shape",
    "ratio_pad" ((scale y, scale x), (pad x, pad y)) and "im_file" (`files`, default the sample ids as strings)."""
    images = batch["images"]
    if images.dtype != torch.uint8:
        raise ValueError("ultralytics normalises the images itself (img / 255): build the Loader with "
                         f"dtype=torch.uint8 (this batch is {images.dtype})")
    size = images.shape[-1]
    b = batch["boxes"]
    xywh = torch.stack(((b[:, 0] + b[:, 2]) / 2, (b[:, 1] + b[:, 3]) / 2, b[:, 2] - b[:, 0], b[:, 3] - b[:, 1]),
                       dim=1) / size
    ids = batch["ids"].tolist()
    scale, pad, orig = batch["scale"].tolist(), batch["pad"].tolist(), batch["orig_size"].tolist()
    return {
        "img": images,
        "cls": batch["labels"].to(torch.float32).view(-1, 1),
        "bboxes": xywh,
        "batch_idx": batch["batch_idx"].to(torch.float32),
        "ori_shape": [tuple(o) for o in orig],
        "resized_shape": [(size, size)] * len(images),
        "ratio_pad": [((sy, sx), tuple(p)) for (sx, sy), p in zip(scale, pad)],
        "im_file": list(files) if files is not None else [str(i) for i in ids],
    }
