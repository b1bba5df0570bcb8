"""Constants users and several modules share. A leaf module: imports nothing from fastfeed, no torch."""
from __future__ import annotations

__all__ = ["IMAGENET_MEAN", "IMAGENET_STD", "IGNORE_INDEX", "DTYPE_NAMES", "DEFAULT_HW_DECODER_LOAD",
           "DEFAULT_DALI_THREADS", "DEFAULT_DALI_PIPELINES", "DALI_CPU_SHARE_FOR_MORE_THREADS"]

# torchvision's ImageNet normalisation, in [0, 1] units.
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)

# The label of a batch position that holds no sample of its own in evaluation (train=False): the wrap-around padding
# that gives every rank the same number of batches, and a corrupt sample replaced by another one. It is
# `torch.nn.CrossEntropyLoss`'s default ignore_index (and torchmetrics' `ignore_index=-100`), so losses skip such
# positions unchanged and `labels != IGNORE_INDEX` is the mask of samples to score.
IGNORE_INDEX = -100

# Output dtypes a decoder can write (torch names).
DTYPE_NAMES = ("float32", "float16", "bfloat16", "uint8")

# DALI's defaults are the setting that trained fastest on an H200 (benchmarks/RESULTS.md, 2026-11-30: ResNet-18
# 9,680-10,275 img/s, ResNet-50 within 1-4% of the best fixed setting, 2.3 s to the first batch, 2.8 cores): the
# hardware JPEG decoder takes every JPEG it can (1.0 was never slower than 0.9 in training and needs fewer CPU
# threads), two threads per pipeline, two pipelines side by side (while one waits for its GPU work the other
# parses and submits the next batch). More pipelines decode faster on the loader alone (3: 18.2k img/s) but slow
# the training step that shares the GPU (ResNet-50 12.6% below its ceiling, against 5-10%), and measuring
# settings at start-up on the loader alone chose them and cost 6-7 s before the first batch: no start-up tuning.
DEFAULT_HW_DECODER_LOAD = 1.0
DEFAULT_DALI_THREADS = 2
DEFAULT_DALI_PIPELINES = 2

# With DALI, a dataset with at least this share of images the hardware decoder cannot take (PNG, progressive or CMYK
# JPEG) gets more CPU threads (fastfeed/settings.py), and `auto` keeps it on "dali" (decode/__init__.py).
DALI_CPU_SHARE_FOR_MORE_THREADS = 0.1
