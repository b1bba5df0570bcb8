"""Package-wide constants with no imports, so any module can use them without importing the package root."""
from __future__ import annotations

__all__ = ["IMAGENET_MEAN", "IMAGENET_STD"]

# torchvision's ImageNet normalization, in [0, 1] units.
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
