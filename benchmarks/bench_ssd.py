"""SSD-style detection batches per second: `fastfeed.Loader` with `DetectAugment(iou_crop=1)` against torchvision's
`transforms.v2` on `tv_tensors` boxes in a DataLoader, same images, same cores, same run.

    python benchmarks/bench_ssd.py [--workdir DIR] [--num-images 1000] [--batch 32] [--size 640] [--seconds 40]
                                   [--warmup 4] [--workers N] [--rounds 1] [--json FILE]

Data: bench_detect.py's (ImageNet-like JPEGs of 300-800 px with 1-8 boxes each, a YOLO folder and its pack).
Both sides do the SSD pipeline: torchvision's RandomIoUCrop sampler, a horizontal flip with probability 0.5 and a
resize of the window to `--size` x `--size`, and hand over uint8 [B, 3, S, S] images on the CPU with their boxes.
torchvision: a Dataset that reads each JPEG with PIL and its YOLO boxes, `v2.Compose([PILToTensor, RandomIoUCrop,
RandomHorizontalFlip, Resize((S, S)), SanitizeBoundingBoxes])` (its detection references' SSD recipe, without the
photometric distortion and the zoom-out), a DataLoader with `--workers` workers (default: the usable cores).
fastfeed: `Loader(augment=DetectAugment(mosaic=0, iou_crop=1, hsv off))` on the pack, its defaults otherwise. Each
runs `--warmup` untimed batches, then as many as fit in `--seconds`, one after the other, torchvision first, in
`--rounds` rounds, the page cache warm. Numbers: benchmarks/README.md.
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_detect import run_rounds, start  # noqa: E402


class YoloTorchvision:
    """The YOLO folder as a map-style Dataset of (uint8 image, {"boxes", "labels"}) through `transform`."""

    def __init__(self, yolo: Path, transform):
        self.images = sorted((yolo / "images").glob("*.jpg"))
        self.labels = yolo / "labels"
        self.transform = transform

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, i: int):
        import torch
        from PIL import Image
        from torchvision import tv_tensors

        img = Image.open(self.images[i]).convert("RGB")
        w, h = img.size
        rows = [line.split() for line in (self.labels / f"{self.images[i].stem}.txt").read_text().splitlines()]
        cls = torch.tensor([int(r[0]) for r in rows], dtype=torch.int64)
        cx, cy, bw, bh = (torch.tensor([float(r[k]) for r in rows]) for k in (1, 2, 3, 4))
        xyxy = torch.stack([(cx - bw / 2) * w, (cy - bh / 2) * h, (cx + bw / 2) * w, (cy + bh / 2) * h], dim=1)
        target = {"boxes": tv_tensors.BoundingBoxes(xyxy, format="XYXY", canvas_size=(h, w)), "labels": cls}
        return self.transform(img, target)


def torchvision_loader(yolo: Path, batch: int, size: int, workers: int):
    import torch
    from torchvision.transforms import v2

    transform = v2.Compose([v2.PILToTensor(), v2.RandomIoUCrop(), v2.RandomHorizontalFlip(),
                            v2.Resize((size, size), antialias=True), v2.SanitizeBoundingBoxes()])

    def collate(items):
        return torch.stack([img for img, _ in items]), [t for _, t in items]

    return torch.utils.data.DataLoader(YoloTorchvision(yolo, transform), batch_size=batch, shuffle=True,
                                       num_workers=workers, collate_fn=collate, drop_last=True,
                                       persistent_workers=workers > 0)


def fastfeed_loader(packed: Path, batch: int, size: int, extra: dict):
    import torch

    import fastfeed
    from fastfeed.detect import DetectAugment

    aug = DetectAugment(mosaic=0.0, iou_crop=1.0, hsv_h=0.0, hsv_s=0.0, hsv_v=0.0)
    return fastfeed.Loader(packed, batch_size=batch, image_size=size, device="cpu", dtype=torch.uint8, augment=aug,
                           **extra)


def main(argv=None) -> int:
    a, yolo, packed = start(__doc__, argv, device=False)
    run_rounds({"torchvision": lambda: (torchvision_loader(yolo, a.batch, a.size, a.workers), lambda b: len(b[0])),
                "fastfeed": lambda: (fastfeed_loader(packed, a.batch, a.size, a.loader_kwargs),
                                     lambda b: len(b["images"]))}, a)
    return 0

if __name__ == "__main__":
    sys.exit(main())
