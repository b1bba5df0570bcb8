"""`LoaderSettings`: every choice a Loader makes, resolved and validated once, then passed down as one frozen value.

`resolve_settings(...)` is the only place that validates a Loader argument, maps the DataLoader keywords users pass
out of habit, and derives a default that depends on the machine (decode threads, pipelines, hardware-decoder
share, read-ahead). The user-facing defaults are the ones in `Loader.__init__`'s signature; the machine-dependent
ones are the DEFAULT_* constants below. Components (the epoch runner, decoders, the tuners) take the
settings they need from this value and never re-derive them.
"""
from __future__ import annotations

import dataclasses
import math
import numbers
import os
import warnings
from dataclasses import dataclass

import torch

from fastfeed import sampling
from fastfeed.constants import (DALI_CPU_SHARE_FOR_MORE_THREADS, DEFAULT_DALI_PIPELINES, DEFAULT_DALI_THREADS,
                                DEFAULT_HW_DECODER_LOAD, DTYPE_NAMES, IMAGENET_MEAN, IMAGENET_STD)
from fastfeed.decode import KINDS as DECODERS
from fastfeed.decode import resolve_kind
from fastfeed.decode.base import ON_ERROR
from fastfeed.decode.crop import DEFAULT_ORIENTATION, ORIENTATIONS
from fastfeed.detect.geometry import DetectAugment
from fastfeed.formats.fields import value_kind
from fastfeed.detect.masks import DEFAULT_IGNORE_INDEX
from fastfeed.targets import BOX_TASKS, GEOMETRY_TASKS, TASKS
from fastfeed.tuning.climber import DDP_START_MIN_CORES, DDP_START_SHARE, START_SHARE
from fastfeed.types import ImageProfile
from fastfeed.world import World

__all__ = ["LoaderSettings", "resolve_settings", "DTYPES", "ORIENTATIONS", "ON_ERROR", "DEFAULT_HW_DECODER_LOAD",
           "DEFAULT_READER_THREADS", "DEFAULT_PREFETCH", "MAX_BATCH_SIZE", "MAX_IMAGE_SIZE", "RING_MEMORY_SHARE",
           "ring_budget_bytes"]

DTYPES = {getattr(torch, name): name for name in DTYPE_NAMES}


# Native ring reader threads: enough in-flight preads for local NVMe; cold or network storage wants more.
DEFAULT_READER_THREADS = 4
# Decoded batches queued ahead of the training step.
DEFAULT_PREFETCH = 2
# More CPU decode threads than this stop paying on the machines measured (the pool's hand-off dominates).
MAX_DEFAULT_DECODE_THREADS = 8
# The hybrid decoder's CPU threads get a rank's cores but these: the training loop's thread, the ring's readers and
# the GPU part's DALI threads need theirs, or the training step itself waits for a core.
HYBRID_RESERVED_CORES = 4

# A GPU Loader ("dali", "hybrid") whose `pipelines` is not given tunes the count on the loop (tuning/pipelines.py);
# "cpu-dali" starts and stays at DEFAULT_DALI_PIPELINES or more (resolve_settings). Decode threads are sized for
# DEFAULT_DALI_PIPELINES whatever the start. Numbers: docs/design/tuning.md#pipeline-count.
AUTO_START_PIPELINES = 1  # each pipeline is built before the first batch and delays it; the tuner adds more later
MAX_AUTO_PIPELINES = 4  # and one per CORES_PER_PIPELINE cores of the rank, but at least DEFAULT_DALI_PIPELINES
CORES_PER_PIPELINE = 4  # each pipeline brings its DALI threads and a Python worker
MIN_AUTO_PIPELINES = 1  # fewer while the loop barely waits: they hold less of the GPU and the cores

# Photos of LARGE_PHOTO_PIXELS or more (median) send a tenth of the JPEGs to DALI's CUDA decoder, its Huffman stage on
# LARGE_PHOTO_DALI_THREADS threads, beside the hardware decoder, their bottleneck; smaller photos train fastest with
# the DEFAULT_* setting. The bound is the hybrid's (HYBRID_MAX_PIXELS): docs/design/decoders.md#large-photos.
LARGE_PHOTO_PIXELS = 1_000_000
LARGE_PHOTO_HW_DECODER_LOAD = 0.9
LARGE_PHOTO_DALI_THREADS = 4
# From PINNED_INPUT_PIXELS the GPU decoders read the ring's page-locked slots in place (`pinned_input`, decode/dali.py),
# saving DALI's copy of each batch into its own pinned buffer; smaller photos keep the copy: read in place, they slowed
# the training step (docs/design/decoders.md#pinned-input).
PINNED_INPUT_PIXELS = 4_000_000
# Large photos also have the hardware JPEG decoder preallocate at build for a batch of the table's 99th-percentile size
# (`preallocate`, nvjpegDecodeBatchedPreAllocate): a sooner first batch for a little device memory; the percentile, not
# the largest, so one outlier does not size every pipeline's buffers (docs/design/decoders.md#preallocation).

# The ring's read-ahead (encoded batches in host memory, page-locked on a GPU) may take at most this share of the
# machine's memory, split evenly between the ranks on it: 6 slots of 12-MP photos are ~12 GB per rank, 8 ranks would
# page-lock ~100 GB (docs/design/ring.md#memory-share).
RING_MEMORY_SHARE = 0.125

# Bounds that catch typos before they become a 100 GB allocation or an hour-long first batch.
MAX_BATCH_SIZE = 1 << 16
MAX_IMAGE_SIZE = 8192
MAX_THREADS = 256

# DataLoader keywords with a meaning here (mapped) and the ones that have none (warned about once, ignored).
_DATALOADER_MAPPED = ("num_workers", "prefetch_factor", "pin_memory", "persistent_workers")
_DATALOADER_IGNORED = ("collate_fn", "worker_init_fn", "timeout", "generator", "multiprocessing_context", "sampler",
                       "batch_sampler", "pin_memory_device", "in_order", "snapshot_every_n_steps")
_warned: set[str] = set()


@dataclass(frozen=True)
class LoaderSettings:
    """What one Loader does, fully resolved. Build it with `resolve_settings`, never by hand in library code."""

    batch_size: int
    train: bool
    image_size: int
    device: torch.device
    decoder: str  # the concrete kind: "dali", "hybrid", "cpu-dali" or "cpu-pil"
    dtype: torch.dtype
    channels_last: bool
    mean: tuple[float, float, float]
    std: tuple[float, float, float]
    shuffle: bool
    drop_last: bool
    seed: int
    order: str
    on_error: str
    orientation: str
    verify_checksums: bool
    decode_threads: int  # threads per decoder (DALI's num_threads, the CPU decoder's pool, hybrid's CPU part)
    pipelines: int  # decoders working side by side on consecutive batches (at the start)
    pipeline_limit: int  # the most the pipeline tuner may run (fastfeed/tuning/pipelines.py); == pipelines: fixed
    pipeline_floor: int  # the fewest it may run; == pipelines: fixed
    hw_decoder_load: float
    pinned_input: bool  # the GPU decoders read the ring's page-locked samples in place (large photos, see above)
    preallocate: tuple[int, int] | None  # (width, height) the GPU decoders preallocate a batch for (large photos)
    gpu_pipelines_from: int | None  # "cpu-dali" feeding a GPU: pipelines from this one on decode on the GPU (DALI)
    hybrid_start_share: float  # the CPU share decoder "hybrid" starts tuning from (tuning/climber.py)
    prefetch: int  # decoded batches allowed ahead of the consumer
    reader_threads: int
    log_every: int | None
    task: str = "classify"  # what a batch holds: fastfeed.targets.TASKS
    augment: object = None  # task "detect": the fastfeed.detect.geometry.DetectAugment of training batches
    epochs: int | None = None  # the training run's length, for augmentations that end early (close_mosaic)
    fields: tuple[str, ...] = ()  # members returned with each image (fastfeed/formats/fields.py); () = none
    mask: str | None = None  # task "semantic": the member holding each image's mask (None: chosen at open)
    ignore_index: int = DEFAULT_IGNORE_INDEX  # task "semantic": the class id of mask pixels no image pixel is under

    @property
    def dtype_name(self) -> str:
        return DTYPES[self.dtype]

    @property
    def ring_slots(self) -> int:
        """Encoded batches the ring reads ahead: the decoded window plus one batch in every pipeline's hands, for as
        many pipelines as the tuner may run."""
        return self.prefetch + 2 * self.pipeline_limit

    def ring_slots_within(self, slot_bytes: int, budget_bytes: int) -> int:
        """`ring_slots`, fewer if they do not fit in `budget_bytes` (`ring_budget_bytes`), but never fewer than one
        slot per starting pipeline plus one being read: each pipeline holds the slot it decodes from."""
        fit = budget_bytes // max(1, slot_bytes)
        return max(self.pipelines + 1, min(self.ring_slots, fit))

    def pipeline_limit_within(self, slots: int) -> int:
        """`pipeline_limit`, lower when the ring got fewer `slots`: every pipeline holds one, and one is read ahead."""
        return max(self.pipelines, min(self.pipeline_limit, slots - 1))

    def replace(self, **changes) -> "LoaderSettings":
        return dataclasses.replace(self, **changes)

    def describe(self) -> dict:
        """JSON-friendly view for stats() and logs."""
        out = {}
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if isinstance(v, (torch.device, torch.dtype)):
                v = str(v)
            elif isinstance(v, tuple):
                v = list(v)  # JSON's types, as before
            out[f.name] = v
        out["dtype"] = self.dtype_name
        return out


def resolve_settings(*, world: World, batch_size, train, image_size, device, decoder, dtype, channels_last, mean,
                     std, shuffle, seed, drop_last, order, num_threads, reader_threads, prefetch, hw_decoder_load,
                     pipelines, on_error, orientation, verify_checksums, log_every, task="classify", augment=None,
                     epochs=None, fields=None, mask=None, ignore_index=DEFAULT_IGNORE_INDEX,
                     dataloader_kwargs: dict | None = None,
                     images: ImageProfile | None = None, frame: str | None = None) -> LoaderSettings:
    """Validate every Loader argument (clear messages, up front) and derive the machine-dependent defaults.
    `images`: what the dataset's table says about its images, once it is open; decoder="auto" and the DALI thread
    count depend on it (resolve_kind, _default_decode_threads). `frame`: the EXIF policy a detection dataset's
    annotations were packed in (`Manifest.annotation_frame`), once it is open."""
    batch_size = _int("batch_size", batch_size, 1, MAX_BATCH_SIZE)
    train = _bool("train", train)
    image_size = _int("image_size", image_size, 1, MAX_IMAGE_SIZE)
    seed = _int("seed", seed, 0, 2**63 - 1)
    shuffle = train if shuffle is None else _bool("shuffle", shuffle)
    drop_last = train if drop_last is None else _bool("drop_last", drop_last)
    if order not in sampling.ORDERS:
        raise ValueError(f"order must be one of {sorted(sampling.ORDERS)}, got {order!r}")
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of torch.float32/float16/bfloat16/uint8, got {dtype!r}")
    task, augment, epochs, decoder = _resolve_task(task, augment, epochs, decoder)
    orientation = _resolve_orientation(task, orientation, frame)
    # Defaults per task: ImageNet's normalisation for classification and segmentation (ToTensor + Normalize, what
    # torchvision's backbones take); pixels in [0, 1] for detection, what YOLO-style and torchvision's detection
    # models take.
    plain = task in BOX_TASKS
    mean = _triple("mean", (0.0, 0.0, 0.0) if plain else IMAGENET_MEAN) if mean is None else _triple("mean", mean)
    std = _triple("std", (1.0, 1.0, 1.0) if plain else IMAGENET_STD) if std is None else _triple("std", std)
    if any(s <= 0 for s in std):
        raise ValueError(f"std must be > 0, got {std}")
    if on_error not in ON_ERROR:
        raise ValueError(f"on_error must be one of {ON_ERROR}, got {on_error!r}")
    if decoder not in DECODERS:
        raise ValueError(f"decoder must be one of {DECODERS}, got {decoder!r}")
    if log_every is not None:
        log_every = _int("log_every", log_every, 1, None)

    num_threads, prefetch = _map_dataloader_kwargs(dataloader_kwargs or {}, num_threads, prefetch)
    dev = _resolve_device(device, world)
    if task in GEOMETRY_TASKS:
        kind = _detect_kind(decoder, dev, augment, train)
    else:
        kind = resolve_kind(decoder, str(dev), images, world.cpus_per_rank, image_size)
    auto = num_threads is None or num_threads == "auto"
    if not auto:
        num_threads = _int("num_threads", num_threads, 1, MAX_THREADS)
    fixed_pipelines = pipelines is not None
    if fixed_pipelines:
        pipelines = _int("pipelines", pipelines, 1, 16)
    # CPU decoders spread a batch over their own thread pool: one pipeline, except DALI's CPU backend, where a second
    # pipeline overlaps one batch's copy and normalisation (after DALI's run, outside its threads) with the next one's
    # decode. Feeding a GPU, its count is tuned like the GPU decoders', from those two and never under them (with a
    # floor of one the tuner dropped to it where two trained faster). Chosen by `auto`, past its CPU pipelines the
    # tuner's next one decodes on the GPU, for a loop that still waits for data with the CPU pipelines at their limit
    # (a small model, a rank with few cores); "cpu-dali" asked for by name decodes on the CPU only. Numbers:
    # docs/design/tuning.md#pipeline-count (and decode/__init__.py, THUMBNAIL_CPU_MIN_CORES, for what `auto` picks).
    dali_cpu = kind == "cpu-dali"
    dali = kind in ("dali", "hybrid", "cpu-dali")  # DALI pipelines (pillow-simd's path runs one pool per batch)
    tuned = not fixed_pipelines and dali and dev.type == "cuda"
    if tuned:
        pipelines = DEFAULT_DALI_PIPELINES if dali_cpu else AUTO_START_PIPELINES
        # Threads for two pipelines; but a detection-like pipeline decodes its PNGs on them alone until the tuner adds
        # a second, so there they are sized for one (benchmarks/README.md#yolov8-training, PNG photos).
        threads_for = 1 if task in GEOMETRY_TASKS else DEFAULT_DALI_PIPELINES
        limit = max(DEFAULT_DALI_PIPELINES, min(MAX_AUTO_PIPELINES, world.cpus_per_rank // CORES_PER_PIPELINE))
        floor = DEFAULT_DALI_PIPELINES if dali_cpu else MIN_AUTO_PIPELINES
        gpu_from = None
        if dali_cpu and decoder == "auto":  # one pipeline more, decoding on the GPU (see above)
            gpu_from, limit = limit, limit + 1
    else:
        # The CPU detection decoder's batch runs in steps (decode every source, then draw every output) that wait
        # for their slowest thread: a second pipeline's batch fills those waits
        # (benchmarks/README.md#detection-batches-on-the-cpu).
        cpu_geometry = task in GEOMETRY_TASKS and kind == "cpu"
        pipelines = pipelines or (DEFAULT_DALI_PIPELINES if dali or cpu_geometry else 1)
        threads_for = limit = floor = pipelines
        gpu_from = None
    if hw_decoder_load is not None:
        if isinstance(hw_decoder_load, bool) or not isinstance(hw_decoder_load, numbers.Real) \
                or not 0.0 <= float(hw_decoder_load) <= 1.0:
            raise ValueError(f"hw_decoder_load must be a number in [0, 1], got {hw_decoder_load!r}")
    return LoaderSettings(
        batch_size=batch_size, train=train, image_size=image_size, device=dev, decoder=kind, dtype=dtype,
        channels_last=_bool("channels_last", channels_last), mean=mean, std=std, shuffle=shuffle,
        drop_last=drop_last, seed=seed, order=order, on_error=on_error, orientation=orientation,
        verify_checksums=_bool("verify_checksums", verify_checksums),
        decode_threads=_default_decode_threads(kind, world, threads_for, images) if auto else num_threads,
        pipelines=pipelines,
        pipeline_limit=limit,
        pipeline_floor=floor,
        hw_decoder_load=_default_hw_decoder_load(images) if hw_decoder_load is None else float(hw_decoder_load),
        pinned_input=_default_pinned_input(images),
        preallocate=images.large_size if _large_photos(images) and dev.type == "cuda" else None,
        gpu_pipelines_from=gpu_from,
        hybrid_start_share=_hybrid_start_share(world),
        prefetch=DEFAULT_PREFETCH if prefetch is None else _int("prefetch", prefetch, 1, 64),
        reader_threads=DEFAULT_READER_THREADS if reader_threads is None else _int(
            "reader_threads", reader_threads, 1, MAX_THREADS),
        log_every=log_every,
        task=task,
        augment=augment,
        epochs=epochs,
        fields=_fields(fields),
        mask=_mask(task, mask, fields),
        ignore_index=_int("ignore_index", ignore_index, 0, 0xFFFF),
    )


def _mask(task: str, mask, fields) -> str | None:
    """mask= checked: a member name, for task "semantic" only."""
    if mask is None:
        return None
    if task != "semantic":
        raise ValueError(f"mask= names the mask member of task='semantic', not of task={task!r}")
    if not isinstance(mask, str) or value_kind(mask) != "bytes":
        raise ValueError(f"mask must name an image member such as 'seg.png', got {mask!r}")
    if fields and mask in fields:
        raise ValueError(f"the mask member {mask!r} is the batch's 'masks'; leave it out of fields=")
    return mask


def _fields(fields) -> tuple[str, ...]:
    """fields= as a tuple of distinct names, each of a kind that may be read (no pickles: value_kind raises)."""
    if fields is None:
        return ()
    if isinstance(fields, str) or not all(isinstance(f, str) for f in fields):
        raise ValueError(f"fields must be a list of member names such as ['txt', 'json'], got {fields!r}")
    fields = tuple(fields)
    if len(set(fields)) != len(fields) or {"images", "labels"} & set(fields):
        raise ValueError(f"fields must be distinct names other than 'images' and 'labels', got {list(fields)}")
    for f in fields:
        value_kind(f)
    return fields


def _resolve_task(task, augment, epochs, decoder):
    """(task, augment, epochs, decoder) checked; detection's decoder is chosen by `_detect_kind` once the device is
    known."""
    if task not in TASKS:
        raise ValueError(f"task must be one of {TASKS}, got {task!r}")
    if epochs is not None:
        epochs = _int("epochs", epochs, 1, None)
    if task == "classify":
        if augment is not None:
            raise ValueError("augment= applies to task='detect' and 'semantic'; classification's augmentation is "
                             "train=True/False")
        return task, None, epochs, decoder
    if augment is None:
        # Segmentation trains on random scale, translate and flip; mosaic is YOLO's (give mosaic= to have it).
        augment = DetectAugment(mosaic=0.0) if task == "semantic" else DetectAugment()
    elif not isinstance(augment, DetectAugment):
        raise ValueError(f"augment must be a fastfeed.detect.DetectAugment, got {type(augment).__name__}")
    if decoder not in DETECT_DECODERS:
        raise ValueError(f"task={task!r} decodes with one of {DETECT_DECODERS}, got decoder={decoder!r}")
    return task, augment, epochs, decoder


def _resolve_orientation(task: str, orientation: str | None, frame: str | None) -> str:
    """The EXIF policy: classification's is the one asked (None: DEFAULT_ORIENTATION); a detection or segmentation
    batch's is the frame its dataset's annotations are in (`frame`, None until the dataset is open). Asking for
    another is an error: boxes and masks would not match their pixels."""
    if orientation is not None and orientation not in ORIENTATIONS:
        raise ValueError(f"orientation must be one of {ORIENTATIONS}, got {orientation!r}")
    if task == "classify":
        return orientation or DEFAULT_ORIENTATION
    if frame is None:
        return orientation or "ignore"
    if orientation is not None and orientation != frame:
        what = ("the pixels of each image as displayed (EXIF orientation applied)" if frame == "exif"
                else "the stored pixels")
        raise ValueError(f"task={task!r}: this dataset's annotations are in {what}: orientation must be {frame!r} "
                         "or left out")
    return frame


DETECT_DECODERS = ("auto", "dali", "cpu", "cpu-pil")


def _detect_kind(decoder: str, dev, augment, train: bool) -> str:
    """Detection's decoder: "dali" (DALI decodes on the GPU, fastfeed/detect/gpu_render.py draws there) or "cpu"
    (fastfeed/detect/render.py). "auto" takes the GPU where it can: a CUDA device, DALI installed, and tiles that
    stay axis-aligned (the GPU renderer has no rotation or shear). "dali" by name where it cannot is an error."""
    from fastfeed.decode.dali import dali_available

    aligned = augment.axis_aligned or not train
    gpu = dev.type == "cuda"
    if decoder == "dali":
        if not gpu:
            raise ValueError(f"decoder='dali' for detection decodes on a CUDA device, got device={str(dev)!r}")
        if not aligned:
            raise ValueError("decoder='dali' for detection draws axis-aligned tiles only: degrees and shear are "
                             "the CPU renderer's (decoder='cpu')")
        if not dali_available():
            raise ValueError("decoder='dali' needs nvidia-dali (pip install nvidia-dali-cuda130)")
        return "dali"
    if decoder == "auto" and gpu and aligned and dali_available():
        return "dali"
    return "cpu"


def ring_budget_bytes(world: World, total_bytes: int | None = None) -> int:
    """This rank's share of RING_MEMORY_SHARE of the machine's memory (`total_bytes`, default: physical memory, or
    the cgroup's limit when it is lower)."""
    if total_bytes is None:
        total_bytes = _memory_bytes()
    return int(total_bytes * RING_MEMORY_SHARE) // world.local_world_size


def _memory_bytes() -> int:
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    try:  # a container's limit (cgroup v2), when it has one
        with open("/sys/fs/cgroup/memory.max") as f:
            limit = f.read().strip()
        if limit.isdigit():
            total = min(total, int(limit))
    except OSError:
        pass
    return total


def _default_decode_threads(kind: str, world: World, pipelines: int, images: ImageProfile | None) -> int:
    """DALI: few threads while the hardware decoder does the work (LARGE_PHOTO_DALI_THREADS for large photos, whose
    CUDA-decoded tenth has its Huffman stage on them); when a share of the images is something it
    cannot take (PNG, progressive or CMYK JPEG: `images.cpu_decode_share`), DALI decodes those on these threads, so
    they get that share of this rank's cores, split over the pipelines, capped. A CPU decoder: this rank's share of
    the machine's cores split over its pipelines, capped. Hybrid: its CPU part's threads, the rank's cores but
    HYBRID_RESERVED_CORES split over the pipelines."""
    if kind == "hybrid":
        free = max(1, world.cpus_per_rank - HYBRID_RESERVED_CORES)
        return max(1, min(MAX_DEFAULT_DECODE_THREADS, free // pipelines))
    if kind == "dali":
        base = LARGE_PHOTO_DALI_THREADS if _large_photos(images) else DEFAULT_DALI_THREADS
        if images is None or images.cpu_decode_share < DALI_CPU_SHARE_FOR_MORE_THREADS:
            return base
        want = round(world.cpus_per_rank * images.cpu_decode_share / pipelines)
        return max(base, min(MAX_DEFAULT_DECODE_THREADS, want))
    return max(1, min(MAX_DEFAULT_DECODE_THREADS, world.cpus_per_rank // pipelines))


def _hybrid_start_share(world: World) -> float:
    """A rank of a distributed job with DDP_START_MIN_CORES cores of its own starts the hybrid's climber with a
    quarter of each batch on the CPU; one process, or a rank with fewer cores, with none (why: tuning/climber.py)."""
    ddp = world.world_size > 1 and world.cpus_per_rank >= DDP_START_MIN_CORES
    return DDP_START_SHARE if ddp else START_SHARE


def _large_photos(images: ImageProfile | None) -> bool:
    return images is not None and images.median_pixels >= LARGE_PHOTO_PIXELS


def _default_hw_decoder_load(images: ImageProfile | None) -> float:
    """The hardware decoder's share of the JPEGs: all it can take, but for large photos (see LARGE_PHOTO_PIXELS)."""
    return LARGE_PHOTO_HW_DECODER_LOAD if _large_photos(images) else DEFAULT_HW_DECODER_LOAD


def _default_pinned_input(images: ImageProfile | None) -> bool:
    """Whether DALI reads the ring's page-locked samples in place: for photos of PINNED_INPUT_PIXELS or more."""
    return images is not None and images.median_pixels >= PINNED_INPUT_PIXELS


def _map_dataloader_kwargs(kwargs: dict, num_threads, prefetch):
    """DataLoader keywords: num_workers -> decode threads, prefetch_factor -> prefetch; pin_memory and
    persistent_workers are what fastfeed always does; the rest have no meaning here and are ignored with one warning
    each. A keyword DataLoader does not have either is a TypeError, as Python would raise."""
    unknown = [k for k in kwargs if k not in _DATALOADER_MAPPED and k not in _DATALOADER_IGNORED]
    if unknown:
        raise TypeError(f"Loader() got unexpected keyword argument(s) {', '.join(map(repr, sorted(unknown)))}")
    workers = kwargs.get("num_workers")
    if workers is not None:
        workers = _int("num_workers", workers, 0, MAX_THREADS)
        if workers > 0 and (num_threads is None or num_threads == "auto"):
            num_threads = workers  # DataLoader processes decode; here threads do, one per worker asked for
    factor = kwargs.get("prefetch_factor")
    if factor is not None and prefetch is None:
        prefetch = _int("prefetch_factor", factor, 1, 64)
    ignored = sorted(k for k in kwargs if k in _DATALOADER_IGNORED and kwargs[k] is not None)
    fresh = [k for k in ignored if k not in _warned]
    if fresh:
        _warned.update(fresh)
        warnings.warn(f"fastfeed.Loader ignores the DataLoader argument(s) {', '.join(fresh)}: sampling, batching "
                      "and collation happen inside the Loader (see docs/coming-from-dataloader.md; per-batch "
                      "transforms go to batch_transform=)", UserWarning, stacklevel=4)
    return num_threads, prefetch


def _resolve_device(device, world: World) -> torch.device:
    if device is None:
        if torch.cuda.is_available():
            return torch.device("cuda", world.local_rank % max(1, torch.cuda.device_count()))
        return torch.device("cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        raise ValueError(f"device must be 'cuda', 'cuda:N' or 'cpu', got {device!r}") from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError("device='cuda' but CUDA is not available; use device='cpu'")
        if dev.index is None:
            dev = torch.device("cuda", world.local_rank % torch.cuda.device_count())
        elif dev.index >= torch.cuda.device_count():
            raise ValueError(f"device {dev} does not exist: this machine has {torch.cuda.device_count()} GPU(s)")
    elif dev.type != "cpu":
        raise ValueError(f"device must be 'cuda', 'cuda:N' or 'cpu', got {device!r}")
    return dev


def _int(name: str, value, lo: int, hi: int | None) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    value = int(value)
    if value < lo or (hi is not None and value > hi):
        bound = f">= {lo}" if hi is None else f"in [{lo}, {hi}]"
        raise ValueError(f"{name} must be {bound}, got {value}")
    return value


def _bool(name: str, value) -> bool:
    if not isinstance(value, (bool, numbers.Integral)) or value not in (0, 1):
        raise ValueError(f"{name} must be True or False, got {value!r}")
    return bool(value)


def _triple(name: str, value) -> tuple[float, float, float]:
    try:
        out = tuple(float(v) for v in value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be 3 numbers (one per RGB channel, in [0, 1] units), got {value!r}") from None
    if len(out) != 3 or not all(math.isfinite(v) for v in out):
        raise ValueError(f"{name} must be 3 finite numbers (one per RGB channel, in [0, 1] units), got {value!r}")
    return out
