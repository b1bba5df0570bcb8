"""SSD-style detection batches per second: `fastfeed.Loader` with `DetectAugment(iou_crop=1)` against torchvision's
`transforms.v2` on `tv_tensors` boxes in a DataLoader (on the CPU), or against DALI's SSD pipeline (`--device
cuda`), same images, same cores, same run.

    python benchmarks/bench_ssd.py [--workdir DIR] [--num-images 1000] [--batch 32] [--size 640] [--seconds 40]
                                   [--warmup 4] [--workers N] [--rounds 1] [--device cpu|cuda]
                                   [--baseline torchvision|dali] [--json FILE]

Data: bench_detect.py's (ImageNet-like JPEGs of 300-800 px with 1-8 boxes each, a YOLO folder and its pack).
Both sides do the SSD pipeline: torchvision's RandomIoUCrop sampler, a horizontal flip with probability 0.5 and a
resize of the window to `--size` x `--size`, and hand over uint8 [B, 3, S, S] images on the CPU with their boxes.
torchvision: a Dataset that reads each JPEG with PIL and its YOLO boxes, `v2.Compose([PILToTensor, RandomIoUCrop,
RandomHorizontalFlip, Resize((S, S)), SanitizeBoundingBoxes])` (its detection references' SSD recipe, without the
photometric distortion and the zoom-out), a DataLoader with `--workers` workers (default: the usable cores).
DALI (the issue's baseline, NVIDIA's SSD example): `fn.readers.coco` on the same JPEGs (a COCO file written from the
YOLO labels), `fn.random_bbox_crop` (IoU thresholds 0-0.9, scaling 0.3-1, aspect 0.5-2, 50 attempts), the window
decoded alone (`fn.decoders.image_slice`, on the GPU: "mixed"), `fn.bb_flip` with a coin flip, `fn.resize` to S x S,
`fn.crop_mirror_normalize` (mirror, ImageNet mean/std, float16 CHW), `--workers` threads; on the CPU with `--device
cpu --baseline dali`. On cuda fastfeed hands over float16 on the GPU too, and each batch is synchronised.
fastfeed: `Loader(augment=DetectAugment(mosaic=0, iou_crop=1, hsv off))` on the pack, its defaults otherwise. Each
runs `--warmup` untimed batches, then as many as fit in `--seconds`, one after the other, torchvision first, in
`--rounds` rounds, the page cache warm. Numbers: benchmarks/README.md.
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_detect import NAMES, run_rounds, start  # noqa: E402


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


def coco_file(yolo: Path) -> Path:
    """The YOLO folder's boxes as a COCO instances file (pixel XYWH, category ids 1..n), written once."""
    import json

    from PIL import Image

    out = yolo / "instances.json"
    if out.exists():
        return out
    images, anns = [], []
    for i, f in enumerate(sorted((yolo / "images").glob("*.jpg"))):
        w, h = Image.open(f).size
        images.append({"id": i + 1, "file_name": f.name, "width": w, "height": h})
        for line in (yolo / "labels" / f"{f.stem}.txt").read_text().splitlines():
            c, cx, cy, bw, bh = line.split()
            cx, cy, bw, bh = float(cx) * w, float(cy) * h, float(bw) * w, float(bh) * h
            anns.append({"id": len(anns) + 1, "image_id": i + 1, "category_id": int(c) + 1, "iscrowd": 0,
                         "bbox": [cx - bw / 2, cy - bh / 2, bw, bh], "area": bw * bh})
    cats = [{"id": k + 1, "name": n} for k, n in enumerate(NAMES)]
    out.write_text(json.dumps({"images": images, "annotations": anns, "categories": cats}))
    return out


class DaliSSD:
    """NVIDIA's SSD training input pipeline on the YOLO folder's JPEGs; iterating yields (images, boxes, labels)
    TensorLists, endlessly (the reader wraps around)."""

    def __init__(self, yolo: Path, batch: int, size: int, threads: int, device: str):
        from nvidia.dali import fn, pipeline_def, types

        gpu = device != "cpu"

        @pipeline_def(batch_size=batch, num_threads=threads, device_id=0 if gpu else None, seed=0,
                      prefetch_queue_depth=2)
        def ssd():
            jpegs, boxes, labels = fn.readers.coco(
                file_root=str(yolo / "images"), annotations_file=str(coco_file(yolo)), ltrb=True, ratio=True,
                random_shuffle=True, skip_empty=True, name="reader")
            begin, extent, boxes, labels = fn.random_bbox_crop(
                boxes, labels, device="cpu", aspect_ratio=[0.5, 2.0], thresholds=[0, 0.1, 0.3, 0.5, 0.7, 0.9],
                scaling=[0.3, 1.0], bbox_layout="xyXY", allow_no_crop=True, num_attempts=50)
            images = fn.decoders.image_slice(jpegs, begin, extent, device="mixed" if gpu else "cpu",
                                             output_type=types.RGB)
            flip = fn.random.coin_flip(probability=0.5)
            boxes = fn.bb_flip(boxes, ltrb=True, horizontal=flip)
            images = fn.resize(images, resize_x=size, resize_y=size)
            images = fn.crop_mirror_normalize(images, mirror=flip, dtype=types.FLOAT16, output_layout="CHW",
                                              mean=[0.485 * 255, 0.456 * 255, 0.406 * 255],
                                              std=[0.229 * 255, 0.224 * 255, 0.225 * 255])
            return images, boxes, labels

        self.pipe = ssd()
        self.pipe.build()
        self.gpu = gpu

    def __iter__(self):
        while True:
            yield self.pipe.run()

    def images_of(self, out) -> int:
        if self.gpu:
            import torch

            torch.cuda.synchronize()
        return len(out[0])

    def close(self) -> None:
        del self.pipe


def fastfeed_loader(packed: Path, batch: int, size: int, extra: dict, device: str = "cpu"):
    import torch

    import fastfeed
    from fastfeed.detect import DetectAugment

    aug = DetectAugment(mosaic=0.0, iou_crop=1.0, hsv_h=0.0, hsv_s=0.0, hsv_v=0.0)
    dtype = torch.uint8 if device == "cpu" else torch.float16
    return fastfeed.Loader(packed, batch_size=batch, image_size=size, device=device, dtype=dtype, augment=aug, **extra)


def main(argv=None) -> int:
    a, yolo, packed = start(__doc__, argv, device=True,
                            more=lambda p: p.add_argument("--baseline", choices=("torchvision", "dali")))
    baseline = a.baseline or ("torchvision" if a.device == "cpu" else "dali")
    if baseline == "dali":
        def base():
            dali = DaliSSD(yolo, a.batch, a.size, a.workers, a.device)
            return dali, dali.images_of
    else:
        def base():
            return torchvision_loader(yolo, a.batch, a.size, a.workers), lambda b: len(b[0])

    def fastfeed_images(b) -> int:
        if a.device != "cpu":
            import torch

            torch.cuda.synchronize()
        return len(b["images"])

    run_rounds({baseline: base,
                "fastfeed": lambda: (fastfeed_loader(packed, a.batch, a.size, a.loader_kwargs, a.device),
                                     fastfeed_images)}, a)
    return 0

if __name__ == "__main__":
    sys.exit(main())
