"""DALI's own pipelines, tuned: the vendor's best that fastfeed is measured against (train_table.py, ddp_scaling.py).

Same output as `fastfeed.Loader(train=True)`: RandomResizedCrop(S, scale 0.08-1, ratio 3/4-4/3) + horizontal flip
+ ImageNet normalisation, float16 CHW on the GPU, int64 labels on the GPU.

- `file`: `fn.readers.file` over the unpacked ImageFolder tree.
- `webdataset`: `fn.readers.webdataset` over fastfeed's tar shards with fastfeed's `.idx` files (the `wds2idx`
  format), so it reads exactly what the fastfeed loader reads.
Both decode with the fused `fn.decoders.image_random_crop(device="mixed")` (ROI decode on the hardware JPEG
decoder), the fastest DALI configuration measured on the H200 (see ../shared/dali-offline/README.md).
"""
from __future__ import annotations

import glob
import os

import torch

MEAN = [0.485 * 255, 0.456 * 255, 0.406 * 255]
STD = [0.229 * 255, 0.224 * 255, 0.225 * 255]


def _augment(fn, types, jpegs, *, image_size, device, hw_decoder_load):
    decode_kw = {"hw_decoder_load": hw_decoder_load} if device == "mixed" else {}
    images = fn.decoders.image_random_crop(
        jpegs, device=device, output_type=types.RGB, random_area=[0.08, 1.0],
        random_aspect_ratio=[3 / 4, 4 / 3], num_attempts=10, **decode_kw)
    images = fn.resize(images, resize_x=image_size, resize_y=image_size, antialias=True)
    return fn.crop_mirror_normalize(images, dtype=types.FLOAT16, output_layout="CHW", mean=MEAN, std=STD,
                                    mirror=fn.random.coin_flip(probability=0.5))


def build_pipeline(source: str, root: str, *, batch_size: int, num_threads: int, device_id: int | None,
                   hw_decoder_load: float = 0.9, image_size: int = 224, seed: int = 0, prefetch: int = 2):
    """`source` = "file" (root is an ImageFolder tree) or "webdataset" (root is a fastfeed wds dataset)."""
    from nvidia.dali import fn, pipeline_def, types

    device = "mixed" if device_id is not None else "cpu"

    @pipeline_def(batch_size=batch_size, num_threads=num_threads, device_id=device_id, seed=seed,
                  prefetch_queue_depth=prefetch)
    def pipe():
        if source == "file":
            jpegs, labels = fn.readers.file(file_root=root, random_shuffle=True, name="Reader")
        elif source == "webdataset":
            tars = sorted(glob.glob(os.path.join(root, "*.tar")))
            if not tars:
                raise FileNotFoundError(f"no .tar shards in {root}")
            jpegs, cls = fn.readers.webdataset(
                paths=tars, index_paths=[t[:-4] + ".idx" for t in tars], ext=["jpg;jpeg;png", "cls"],
                missing_component_behavior="error", random_shuffle=True, initial_fill=4096, name="Reader")
            labels = fn.pad(cls, fill_value=0, shape=[12])  # ASCII digits, parsed on the GPU below
        else:
            raise ValueError(f"unknown DALI reader {source!r}")
        images = _augment(fn, types, jpegs, image_size=image_size, device=device, hw_decoder_load=hw_decoder_load)
        return images, (labels.gpu() if device_id is not None else labels)

    p = pipe()
    p.build()
    return p


def _ascii_to_int(digits: torch.Tensor) -> torch.Tensor:
    """[B, 12] uint8 ASCII digits padded with zeros -> int64 [B] (webdataset's .cls is the label as text)."""
    d = digits.long()
    valid = (d >= 48) & (d <= 57)
    vals = torch.where(valid, d - 48, torch.zeros_like(d))
    n = valid.sum(dim=1, keepdim=True)
    pos = torch.arange(d.shape[1], device=d.device).unsqueeze(0)
    power = torch.where(valid, n - 1 - pos, torch.zeros_like(d)).clamp(min=0)
    return (vals * (10 ** power)).sum(dim=1)


class DaliReference:
    """An iterable over (images, labels) like `fastfeed.Loader`, backed by DALI's C++ readers."""

    def __init__(self, source: str, root: str, *, batch_size: int = 256, num_threads: int = 8,
                 device_id: int | None = 0, hw_decoder_load: float = 0.9, image_size: int = 224):
        from nvidia.dali.plugin.pytorch import DALIGenericIterator, LastBatchPolicy

        self.source = source
        self.pipe = build_pipeline(source, root, batch_size=batch_size, num_threads=num_threads,
                                   device_id=device_id, hw_decoder_load=hw_decoder_load, image_size=image_size)
        self.it = DALIGenericIterator([self.pipe], ["images", "labels"], reader_name="Reader",
                                      last_batch_policy=LastBatchPolicy.DROP, auto_reset=True)

    def __len__(self) -> int:
        return len(self.it)

    def __iter__(self):
        for out in self.it:
            images, labels = out[0]["images"], out[0]["labels"]
            if self.source == "webdataset":
                labels = _ascii_to_int(labels)
            yield images, labels.reshape(-1).long()

    def close(self) -> None:
        del self.it, self.pipe
