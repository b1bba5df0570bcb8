"""fastfeed: keep GPUs fed during PyTorch training.

    fastfeed.open_dataset(path)      -> a packed dataset reader (WebDataset shards or LMDB)
    fastfeed.Loader(path, ...)       -> a drop-in for a torch DataLoader loop (GPU decode with DALI)

Heavy imports (torch, DALI) happen only when the object that needs them is first used.
"""
from __future__ import annotations

__version__ = "0.1.0"
__all__ = ["open_dataset", "Loader", "IMAGENET_MEAN", "IMAGENET_STD", "__version__"]

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


def __getattr__(name: str):
    if name == "open_dataset":
        from fastfeed.formats import open_dataset

        return open_dataset
    if name == "Loader":
        from fastfeed.loader import Loader

        return Loader
    raise AttributeError(f"module 'fastfeed' has no attribute {name!r}")
