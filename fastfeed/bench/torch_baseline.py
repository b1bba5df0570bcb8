"""The baseline fastfeed is measured against: torch DataLoader + PIL + torchvision transforms.

It reads either an ImageFolder tree (torchvision's `ImageFolder`) or, given a folder written by `fastfeed pack`,
the packed samples themselves through `fastfeed.open_dataset` (`PackedImages`): then both loaders see exactly the
same images, not the source folder with the files pack rejected.

Configured the way a careful user would (num_workers = usable cores, pin_memory when CUDA, persistent_workers,
prefetch_factor 4) and producing the same output as `fastfeed.Loader`: [B, 3, S, S] normalised images of `dtype`
on `device` (channels_last when asked), int64 labels. Train: RandomResizedCrop(S) + horizontal flip; eval:
Resize(S / 0.875) + CenterCrop(S). Reused by benchmarks/bench_loader.py and the GPU benchmark.
"""
from __future__ import annotations

import io
import os
from pathlib import Path

import torch

from fastfeed.world import usable_cpus

__all__ = ["TorchBaseline", "PackedImages", "make_torch_loader", "default_num_workers", "is_packed",
           "EVAL_CROP_RATIO"]

EVAL_CROP_RATIO = 0.875  # the usual ImageNet eval: resize the short side to S/0.875, centre-crop S
_MEAN = (0.485, 0.456, 0.406)
_STD = (0.229, 0.224, 0.225)


def default_num_workers() -> int:
    return usable_cpus()


def is_packed(path: str | os.PathLike) -> bool:
    """A folder written by `fastfeed pack` (it holds the manifest), as opposed to an image tree."""
    return (Path(path) / "fastfeed.json").is_file()


class PackedImages(torch.utils.data.Dataset):
    """A map-style dataset over a packed folder: sample i -> (transform(PIL image), label), as ImageFolder gives.

    The reader is opened lazily in each process that reads (DataLoader workers fork: an LMDB environment must not
    cross a fork), and never pickled. A sample PIL cannot decode raises naming the dataset, index and key.
    """

    def __init__(self, root: str | os.PathLike, transform=None):
        from fastfeed.datasets import open_dataset

        self.root = os.fspath(root)
        self.transform = transform
        with open_dataset(self.root) as ds:
            self.labels = ds.labels.astype("int64", copy=True)
            self.keys = ds.keys.copy()
            self.classes = list(ds.classes)
        self._ds, self._pid = None, None

    def __len__(self) -> int:
        return len(self.labels)

    def _reader(self):
        if self._pid != os.getpid():
            from fastfeed.datasets import open_dataset

            self._ds, self._pid = open_dataset(self.root), os.getpid()
        return self._ds

    def __getitem__(self, i: int):
        from PIL import Image

        data = self._reader().read(i)
        try:
            with Image.open(io.BytesIO(data)) as im:
                img = im.convert("RGB")
        except Exception as e:  # PIL raises many types for bad bytes; the report needs which sample it was
            raise ValueError(f"{self.root}: sample {i} ({self.keys[i]}): PIL cannot decode it: "
                             f"{type(e).__name__}: {e}") from e
        return (self.transform(img) if self.transform is not None else img), int(self.labels[i])

    def __getstate__(self):
        return {**self.__dict__, "_ds": None, "_pid": None}


class TorchBaseline:
    """An iterable over (images, labels) batches on `device`; `len()`, `set_epoch()`, `close()` like `Loader`.

    Args: see `make_torch_loader`.
    """

    def __init__(self, images_dir: str | os.PathLike, *, batch_size: int = 256, image_size: int = 224,
                 train: bool = True, device: str | torch.device | None = None, dtype: torch.dtype = torch.float16,
                 channels_last: bool = False, num_workers: int | None = None, seed: int = 0,
                 drop_last: bool = True, prefetch_factor: int = 4, shuffle: bool | None = None):
        import torchvision.transforms as T
        from torchvision.datasets import ImageFolder

        root = Path(images_dir)
        if not root.is_dir():
            raise FileNotFoundError(f"baseline image folder not found: {root}")
        self.source = os.fspath(root)
        if batch_size < 1 or image_size < 1:
            raise ValueError("batch_size and image_size must be >= 1")
        self.device = torch.device(device) if device is not None else (
            torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu"))
        self.dtype = dtype
        self.channels_last = channels_last
        if train:
            tf = T.Compose([T.RandomResizedCrop(image_size), T.RandomHorizontalFlip(),
                            T.ToTensor(), T.Normalize(_MEAN, _STD)])
        else:
            tf = T.Compose([T.Resize(int(round(image_size / EVAL_CROP_RATIO))), T.CenterCrop(image_size),
                            T.ToTensor(), T.Normalize(_MEAN, _STD)])
        self.dataset = PackedImages(root, tf) if is_packed(root) else ImageFolder(str(root), transform=tf)
        self.num_workers = default_num_workers() if num_workers is None else int(num_workers)
        if self.num_workers < 0:
            raise ValueError(f"num_workers must be >= 0, got {num_workers}")
        self._generator = torch.Generator()
        self._seed = seed
        self._generator.manual_seed(seed)
        workers = self.num_workers > 0
        self.loader = torch.utils.data.DataLoader(
            self.dataset, batch_size=batch_size, shuffle=train if shuffle is None else shuffle,
            num_workers=self.num_workers, pin_memory=self.device.type == "cuda", drop_last=drop_last,
            persistent_workers=workers, prefetch_factor=prefetch_factor if workers else None,
            generator=self._generator,
        )

    def __len__(self) -> int:
        return len(self.loader)

    def set_epoch(self, epoch: int) -> None:
        self._generator.manual_seed(self._seed + epoch)

    def __iter__(self):
        fmt = torch.channels_last if self.channels_last else torch.contiguous_format
        for images, labels in self.loader:
            images = images.to(self.device, non_blocking=True).to(self.dtype).contiguous(memory_format=fmt)
            yield images, labels.to(self.device, non_blocking=True)

    def stats(self) -> dict | None:
        return None

    def close(self) -> None:
        # persistent workers live as long as the DataLoader's iterator; dropping it shuts them down
        it = getattr(self.loader, "_iterator", None)
        if it is not None and hasattr(it, "_shutdown_workers"):
            it._shutdown_workers()
        self.loader._iterator = None


def make_torch_loader(images_dir: str | os.PathLike, **kwargs) -> TorchBaseline:
    """Build the torch baseline over an ImageFolder tree (`images_dir/<class>/<image>`) or a packed dataset folder.

    Keyword args: batch_size=256, image_size=224, train=True, device=None (cuda if available), dtype=float16,
    channels_last=False, num_workers=None (usable cores), seed=0, drop_last=True, prefetch_factor=4, shuffle=None
    (= train).
    """
    return TorchBaseline(images_dir, **kwargs)
