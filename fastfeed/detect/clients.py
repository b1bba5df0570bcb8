"""A detection batch (the dict `Loader(task="detect")` yields) in the shapes two training stacks take.

    to_torchvision(batch)  -> (images, targets): torchvision's detection models (`model(images, targets)`)
    to_ultralytics(batch)  -> the dict ultralytics' YOLO trainers get from their own collate function
    UltralyticsLoader(loader, trainer) -> what ultralytics' DetectionTrainer.get_dataloader returns (train, val)
    augment_from_ultralytics(args) -> the DetectAugment of a trainer's hyperparameters
"""
from __future__ import annotations

import dataclasses
import warnings

import torch

from fastfeed.detect.geometry import DetectAugment

__all__ = ["to_torchvision", "to_ultralytics", "UltralyticsLoader", "augment_from_ultralytics"]


def to_torchvision(batch: dict, label_offset: int = 0) -> tuple[list[torch.Tensor], list[dict]]:
    """(images, targets) as torchvision's detection models take them: a list of [3, S, S] images and per image
    {"boxes": float [n, 4] XYXY pixels, "labels": int64 [n]}, with task "segment" also "masks": uint8 [n, S, S],
    box i's binary mask. `label_offset=1` for the R-CNN family (Faster R-CNN, Mask R-CNN), which reserve class 0 for
    the background; RetinaNet and FCOS take the classes as they are."""
    images, idx = batch["images"], batch["batch_idx"]
    targets = []
    for k in range(len(images)):
        mine = idx == k
        t = {"boxes": batch["boxes"][mine], "labels": batch["labels"][mine] + label_offset}
        if "masks" in batch and "boxes" in batch:  # the instance index map: 1 + the box's index in its image
            n = int(mine.sum())
            which = torch.arange(1, n + 1, device=batch["masks"].device, dtype=batch["masks"].dtype)
            t["masks"] = (batch["masks"][k][None] == which.view(-1, 1, 1)).to(torch.uint8)
        targets.append(t)
    return list(images), targets


def to_ultralytics(batch: dict, names=None, overlap_mask: bool = True, mask_ratio: int = 4) -> dict:
    """The batch dict of ultralytics' `YOLODataset.collate_fn`: "img" uint8 [B, 3, S, S] (its trainer divides by
    255 itself, so build the Loader with dtype=torch.uint8), "cls" float [N, 1], "bboxes" float [N, 4] normalised
    centre-x, centre-y, width, height, "batch_idx" float [N], and per image "ori_shape" (h, w), "resized_shape",
    "ratio_pad" ((scale y, scale x), (pad x, pad y)) and "im_file" (`names[id]`, e.g. the dataset's `sources`,
    its images' paths; default the sample ids as strings);
    with task "segment" also "masks" in the form of its trainer's `overlap_mask`: True (its default), [B, S, S], each
    image's index map (1 + the box's index in its image); False, uint8 [N, S, S], box i's binary mask, in the boxes'
    order (what its loss and validator index by `batch_idx`); at 1 / `mask_ratio` of the images' side (its default 4),
    its own masks' resolution and its prototypes': its loss (8.4) otherwise upsamples the prototypes to the masks,
    which at full resolution cost 2.1-2.6x YOLOv8n-seg's loss step on the CPU (batch 8, 320-640 px). A low-resolution
    pixel takes the map's pixel nearest its centre, the pixel cv2's bilinear resize of its masks reads. Positions
    whose `valid` is False (an evaluation batch's padding and replaced bad records) are left out with their boxes, as
    ultralytics' validator scores every image it gets: so each image is scored once over all ranks."""
    batch = _scored(batch)
    images = batch["images"]
    if images.dtype != torch.uint8:
        raise ValueError("ultralytics normalises the images itself (img / 255): build the Loader with "
                         f"dtype=torch.uint8 (this batch is {images.dtype})")
    size = images.shape[-1]
    xywh = _centre_xywh(batch["boxes"]) / size
    ids = batch["ids"].tolist()
    scale, pad, orig = batch["scale"].tolist(), batch["pad"].tolist(), batch["orig_size"].tolist()
    out = {
        "img": images,
        "cls": batch["labels"].to(torch.float32).view(-1, 1),
        "bboxes": xywh,
        "batch_idx": batch["batch_idx"].to(torch.float32),
        "ori_shape": [tuple(o) for o in orig],
        "resized_shape": [(size, size)] * len(images),
        "ratio_pad": [((sy, sx), tuple(p)) for (sx, sy), p in zip(scale, pad)],
        "im_file": [str(i) if names is None else str(names[i]) for i in ids],
    }
    if "masks" in batch:
        r, masks = int(mask_ratio), batch["masks"]
        if r > 1:
            h, w = masks.shape[-2] // r, masks.shape[-1] // r
            masks = masks[:, r // 2::r, r // 2::r][:, :h, :w].contiguous()
        out["masks"] = masks if overlap_mask else _per_box_masks(masks, batch["batch_idx"])
    return out


def _per_box_masks(index_map: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """uint8 [N, H, W]: box i's binary mask, where its image's index map holds 1 + its index among that image's
    boxes (their order in the batch, as `to_torchvision` numbers them)."""
    order = torch.argsort(idx, stable=True)
    counts = torch.bincount(idx, minlength=len(index_map))
    rank = torch.empty_like(idx)
    rank[order] = torch.arange(len(idx), device=idx.device) - (counts.cumsum(0) - counts)[idx[order]]
    return (index_map[idx] == (rank + 1).to(index_map.dtype).view(-1, 1, 1)).to(torch.uint8)


_PER_IMAGE = ("images", "masks", "ids", "scale", "pad", "orig_size", "flipped", "flipped_ud")
_PER_BOX = ("boxes", "labels")


def _scored(batch: dict) -> dict:
    """`batch` with only the positions its `valid` mask keeps, and their boxes (batch_idx numbered again)."""
    valid = batch.get("valid")
    if valid is None or bool(valid.all()):
        return batch
    keep = valid.nonzero().flatten()
    out = dict(batch, valid=valid[keep])
    for name in _PER_IMAGE:
        if name in batch:
            out[name] = batch[name][keep.to(batch[name].device)]
    if "batch_idx" not in batch:
        return out
    idx = batch["batch_idx"]
    on_kept = valid.to(idx.device)[idx]
    renumber = torch.cumsum(valid.to(idx.device, torch.int64), 0) - 1
    for name in _PER_BOX:
        out[name] = batch[name][on_kept]
    out["batch_idx"] = renumber[idx[on_kept]].to(idx.dtype)
    return out


def _centre_xywh(b: torch.Tensor) -> torch.Tensor:
    """XYXY boxes [n, 4] -> centre x, centre y, width, height (ultralytics' box format), in the same units."""
    return torch.stack(((b[:, 0] + b[:, 2]) / 2, (b[:, 1] + b[:, 3]) / 2, b[:, 2] - b[:, 0], b[:, 3] - b[:, 1]), dim=1)


class UltralyticsLoader:
    """A detection `fastfeed.Loader` as the training DataLoader ultralytics' trainers read: iterating yields
    `to_ultralytics` dicts, and the attributes the trainer reads from its own InfiniteDataLoader are there (len,
    batch_size, drop_last, num_workers, sampler.set_epoch, dataset with its labels). Build the Loader with
    `dtype=torch.uint8`, `image_size=args.imgsz`, `epochs=args.epochs` and `augment=augment_from_ultralytics(args)`:
    it then turns mosaic off for the trainer's last `close_mosaic` epochs itself, so the trainer's call to
    `dataset.close_mosaic` has nothing left to do. `trainer`: each epoch is then the trainer's `epoch` (on one
    process ultralytics calls `sampler.set_epoch` only under DDP, so a run resumed from last.pt would otherwise
    start the Loader at epoch 0 again: epoch 0's order and augmentation, mosaic past close_mosaic); a `task="segment"`
    Loader's masks then take the form of the trainer's `overlap_mask` and `mask_ratio` (without a trainer: True and 4,
    ultralytics' defaults).

        class Trainer(DetectionTrainer):
            def get_dataloader(self, dataset_path, batch_size=16, rank=0, mode="train"):
                if mode != "train":
                    return super().get_dataloader(dataset_path, batch_size, rank, mode)
                loader = fastfeed.Loader(PACKED, batch_size=batch_size, image_size=self.args.imgsz,
                                         dtype=torch.uint8, epochs=self.args.epochs,
                                         augment=augment_from_ultralytics(self.args))
                return UltralyticsLoader(loader, trainer=self)

    Its validator takes one too (`mode="val"`, with `trainer=self` for the masks' form): an evaluation Loader
    (`train=False`, the letterbox) of the validation pack, whose padding and replaced records `to_ultralytics` leaves
    out, so each image is scored once over all ranks."""

    num_workers = 0  # the Loader's threads are its own

    def __init__(self, loader, trainer=None):
        _check_task(loader.settings.task, getattr(getattr(trainer, "args", None), "task", None))
        self.loader = loader
        self._trainer = trainer
        # the masks' form its loss and validator read (the trainer's args, which its validator copies): a Loader of
        # either given none would get the other form, an IndexError there or, where N == B, wrong masks unnoticed
        args = getattr(trainer, "args", None)
        self._overlap_mask = bool(getattr(args, "overlap_mask", True))
        self._mask_ratio = int(getattr(args, "mask_ratio", 4))
        self.batch_size = loader.settings.batch_size
        self.drop_last = loader.settings.drop_last
        self.sampler = _Sampler(loader)
        self.dataset = _Labels(loader)

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self):
        # A generator: the trainer calls iter() twice an epoch and reads only the second; the first never starts.
        epoch = getattr(self._trainer, "epoch", None)
        if epoch is not None and self.loader.train:  # the epoch the Loader would run next costs nothing (its
            self.loader.set_epoch(int(epoch))        # read-ahead goes on); every evaluation pass is the same
        for batch in self.loader:
            out = to_ultralytics(batch, self.loader.dataset.sources, overlap_mask=self._overlap_mask,
                                 mask_ratio=self._mask_ratio)
            if len(out["img"]):  # (a rank's last evaluation batch may be padding only)
                yield out

    def reset(self) -> None:
        """ultralytics' InfiniteDataLoader restarts its workers here; the Loader needs nothing."""

    def close(self) -> None:
        self.loader.close()


def _check_task(loader_task: str, trainer_task: str | None) -> None:
    """Refuse a trainer whose batches the Loader does not make, before its loss fails on a missing key."""
    if trainer_task in (None, "detect", loader_task):
        return
    if trainer_task == "segment":
        raise ValueError(f"ultralytics' segment trainer reads instance masks: build the Loader with task='segment' "
                         f"(this one is task={loader_task!r})")
    raise ValueError(f"ultralytics' {trainer_task} trainer needs what fastfeed's Loader does not put in its batches "
                     f"(pose: keypoints; obb: rotated boxes; classify: its own loader): UltralyticsLoader feeds the "
                     f"detect and segment trainers; train this one on ultralytics' own DataLoader (a pose set packs "
                     f"as detection, its keypoints kept in the annotations only)")


class _Sampler:
    def __init__(self, loader):
        self._loader = loader

    def __len__(self) -> int:  # the samples of this rank's epoch
        return self._loader.samples_per_epoch

    def __iter__(self):
        """The sample ids of this rank's next pass in order, without its padding: what the validator's JSON export
        numbers the images it scores by."""
        plan = self._loader.epoch_plan()
        return iter(plan.indices[~plan.padded].tolist())

    def set_epoch(self, epoch: int) -> None:
        self._loader.set_epoch(epoch)


class _Labels:
    """The dataset side the trainer and its validator read: its length, `im_files` (each sample's source path, the
    batches' "im_file") and, per image, "cls" [n, 1] and "bboxes" [n, 4] (normalised centre x, centre y, width,
    height of the image in its boxes' frame) for its label statistics. Both are built when first read (only a
    validator saving its labels reads `im_files`)."""

    def __init__(self, loader):
        self._loader = loader
        self._labels = None
        self._im_files = None

    @property
    def im_files(self) -> list[str]:
        if self._im_files is None:  # to_ultralytics' im_file for each id: the source, else the id
            sources = self._loader.dataset.sources
            ids = range(len(self)) if sources is None else sources
            self._im_files = [str(s) for s in ids]
        return self._im_files

    def __len__(self) -> int:
        return len(self._loader.dataset)

    @property
    def labels(self) -> list[dict]:
        if self._labels is None:
            targets, (widths, heights) = self._loader.targets, self._loader.image_sizes
            out = []
            for i in range(len(widths)):
                b, c = targets.of(i)
                wh = torch.tensor([widths[i], heights[i]] * 2, dtype=torch.float32)
                xywh = _centre_xywh(torch.from_numpy(b.copy())) / wh
                out.append({"cls": c.astype("float32").reshape(-1, 1), "bboxes": xywh.numpy()})
            self._labels = out
        return self._labels

    def close_mosaic(self, hyp=None) -> None:
        """The Loader, built with `epochs=`, has turned mosaic off at this epoch by itself."""


# ultralytics' detection augmentation hyperparameters the Loader does not implement, with their no-op defaults
# (default.yaml).
UNSUPPORTED = {"perspective": 0.0, "bgr": 0.0, "mixup": 0.0, "cutmix": 0.0, "copy_paste": 0.0}


def augment_from_ultralytics(args) -> DetectAugment:
    """The DetectAugment of an ultralytics trainer's `args` (or any object or dict with its hyperparameter names):
    the names both share are taken, the rest keep DetectAugment's defaults, which are ultralytics' own. One warning
    names each hyperparameter of `UNSUPPORTED` set to other than its no-op default: the run trains without it."""
    get = args.get if isinstance(args, dict) else (lambda name, default: getattr(args, name, default))
    names = [f.name for f in dataclasses.fields(DetectAugment) if f.name != "pad_value"]
    given = {name: get(name, None) for name in names}
    ignored = {k: v for k, off in UNSUPPORTED.items() if (v := get(k, None)) is not None and v != off}
    if ignored:
        warnings.warn(f"fastfeed's detection Loader does not implement the ultralytics hyperparameter(s) "
                      f"{', '.join(f'{k}={v!r}' for k, v in ignored.items())}: this run trains without them "
                      f"(docs/detection.md, What differs from ultralytics)", UserWarning, stacklevel=2)
    return DetectAugment(**{k: v for k, v in given.items() if v is not None})
