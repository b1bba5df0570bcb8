"""Constants users and several modules share. A leaf module: imports nothing from fastfeed, no torch."""
from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["__version__", "IMAGENET_MEAN", "IMAGENET_STD", "IGNORE_INDEX", "DTYPE_NAMES", "ORIENTATIONS",
           "DEFAULT_ORIENTATION", "DEFAULT_ANNOTATION_ORIENTATION", "DEFAULT_HW_DECODER_LOAD", "DEFAULT_DALI_THREADS",
           "DEFAULT_DALI_PIPELINES", "DALI_CPU_SHARE_FOR_MORE_THREADS", "IMAGE_EXTS", "BENCH_CONSUMERS",
           "MAX_CLASSES"]

# torchvision's ImageNet normalisation, in [0, 1] units.
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)

# The label of a batch position that holds no sample of its own in evaluation (train=False): the wrap-around padding
# that gives every rank the same number of batches, and a corrupt sample replaced by another one. It is
# `torch.nn.CrossEntropyLoss`'s default ignore_index (and torchmetrics' `ignore_index=-100`), so losses skip such
# positions unchanged and `labels != IGNORE_INDEX` is the mask of samples to score.
IGNORE_INDEX = -100

# EXIF orientation policy of the decode contract (docs/decode-contract.md): "ignore" decodes the pixels as stored, like
# torchvision's ImageFolder, so a model trained here sees what the same model trained with ImageFolder saw; "exif"
# shows JPEGs as a photo viewer does.
ORIENTATIONS = ("ignore", "exif")
DEFAULT_ORIENTATION = "ignore"
# The frame detection annotations are in unless `fastfeed pack --orientation` says otherwise: the image as displayed
# (EXIF orientation applied), as labelling tools show it and ultralytics and detectron2 read it.
DEFAULT_ANNOTATION_ORIENTATION = "exif"

# The most classes a dataset's integer labels may imply: its manifest names every class up to the largest label, so a
# label past this is an id of another kind (a species or product id), whose list would fill the manifest and memory.
MAX_CLASSES = 1_000_000

# Output dtypes a decoder can write (torch names).
DTYPE_NAMES = ("float32", "float16", "bfloat16", "uint8")

# DALI's defaults, the setting that trained fastest: the hardware JPEG decoder takes every JPEG it can (never slower
# than 0.9 in training, and fewer CPU threads), two threads and two pipelines (one submits the next batch while the
# other waits for its GPU work). More pipelines feed faster alone but slow the training step sharing the GPU, which
# is why the count is tuned on the loop, not at start-up: docs/design/decoders.md#dali-defaults.
DEFAULT_HW_DECODER_LOAD = 1.0
DEFAULT_DALI_THREADS = 2
DEFAULT_DALI_PIPELINES = 2

# With DALI, a dataset with at least this share of images the hardware decoder cannot take (PNG, progressive or CMYK
# JPEG) gets more CPU threads (fastfeed/loader/settings.py), and `auto` keeps it on "dali" (decode/__init__.py).
DALI_CPU_SHARE_FOR_MORE_THREADS = 0.1

# A webdataset sample's image member (`fastfeed index`), in order of preference: what every decoder reads as stored,
# then what PIL reads.
IMAGE_EXTS = ("jpg", "jpeg", "png", "webp", "bmp", "gif", "tif", "tiff", "ppm", "pgm", "pbm", "pnm", "jp2", "tga",
              "pcx", "qoi", "dds", "sgi")

# What `fastfeed bench --consumer` feeds each batch to (fastfeed/bench/consumers.py builds them).
BENCH_CONSUMERS = ("none", "resnet18", "resnet50")
