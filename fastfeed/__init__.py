"""fastfeed: keep GPUs fed during PyTorch training.

    fastfeed.open_dataset(path)      -> a packed dataset reader (WebDataset shards or LMDB)
    fastfeed.Loader(path, ...)       -> a drop-in for a torch DataLoader loop (GPU decode with DALI)

Heavy imports (torch, DALI) happen only when the object that needs them is first used. Nothing inside the package
imports this module for its constants: they live in `fastfeed.constants`.
"""
from __future__ import annotations

from fastfeed.constants import IGNORE_INDEX, IMAGENET_MEAN, IMAGENET_STD, __version__

__all__ = ["open_dataset", "Loader", "LoaderError", "IMAGENET_MEAN", "IMAGENET_STD", "IGNORE_INDEX", "__version__"]


def __getattr__(name: str):
    if name == "open_dataset":
        from fastfeed.datasets import open_dataset

        return open_dataset
    if name in ("Loader", "LoaderError"):
        from fastfeed.loader import loader

        return getattr(loader, name)
    raise AttributeError(f"module 'fastfeed' has no attribute {name!r}")
