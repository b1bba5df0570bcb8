"""Constants users and several modules share. A leaf module: imports nothing from fastfeed, no torch."""
from __future__ import annotations

__all__ = ["IMAGENET_MEAN", "IMAGENET_STD", "IGNORE_INDEX"]

# torchvision's ImageNet normalisation, in [0, 1] units.
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)

# The label of a batch position that holds no sample of its own in evaluation (train=False): the wrap-around padding
# that gives every rank the same number of batches, and a corrupt sample replaced by another one. It is
# `torch.nn.CrossEntropyLoss`'s default ignore_index (and torchmetrics' `ignore_index=-100`), so losses skip such
# positions unchanged and `labels != IGNORE_INDEX` is the mask of samples to score.
IGNORE_INDEX = -100
