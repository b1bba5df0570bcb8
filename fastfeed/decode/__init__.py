"""Decoders: encoded records + crop windows -> a normalized image batch (torch [B, 3, S, S]) on the device.

    crop_windows(widths, heights, sample_ids, *, seed, epoch, train, image_size) -> Windows
    make_decoder(kind, ...) -> decoder;  decoder(samples, windows) -> DecodeResult(images, replaced);  .close()

Kinds (the registry below): "dali" (GPU, `mixed` hardware decode), "cpu-dali" (DALI's CPU backend), "cpu-pil"
(pillow-simd + numba), "hybrid" (each batch split between DALI's CPU backend and the GPU: decode/hybrid.py),
"cpu" (the faster CPU one on a 2-core machine: benchmarks/bench_decode.py), "auto" ("dali" when DALI and CUDA are
there and device is cuda — "cpu-dali" for datasets of thumbnails, "hybrid" for photos on a rank with cores to
spare, see resolve_kind — else "cpu"). With a CUDA device "cpu-dali" decodes to uint8 and normalises on the GPU
(decode/split.py). DALI is imported only when a DALI kind is built.
"""
from __future__ import annotations

from fastfeed.constants import (DALI_CPU_SHARE_FOR_MORE_THREADS, DEFAULT_DALI_THREADS, DEFAULT_HW_DECODER_LOAD,
                                IMAGENET_MEAN, IMAGENET_STD)
from fastfeed.decode.base import CorruptSampleError, DecodeResult, Replaced
from fastfeed.decode.crop import DEFAULT_ORIENTATION, ORIENTATIONS, Windows, crop_windows, oriented_size

__all__ = ["crop_windows", "oriented_size", "Windows", "make_decoder", "build_decoder", "pipeline_kind",
           "DecodeResult", "Replaced", "CorruptSampleError", "KINDS", "CPU_DEFAULT", "CPU_DECODE_MAX_PIXELS",
           "CPU_DALI_MAX_OUTPUT", "THUMBNAIL_CPU_MIN_CORES", "HYBRID_MIN_CORES", "HYBRID_MAX_PIXELS", "ORIENTATIONS",
           "resolve_kind", "GPU_DECODERS"]

KINDS = ("auto", "dali", "hybrid", "cpu", "cpu-dali", "cpu-pil")
GPU_DECODERS = ("dali", "hybrid")  # the kinds that decode on the GPU ("hybrid": with a CPU share beside it)
# Measured with benchmarks/bench_decode.py on the 2-core CI machine (RRC 224, batch 64, train): see the report.
CPU_DEFAULT = "cpu-pil"


# `auto` for a GPU decodes on the CPU (DALI's CPU backend, normalised on the GPU: decode/split.py) when the
# dataset's median image has at most this many pixels: see resolve_kind. Measured on an H200 (benchmarks/RESULTS.md,
# third and fourth sessions): thumbnails (median ~11,500 px) train a 64-px ResNet-50 6-14% faster so; ImageNet-like
# photos (~190,000 px) are decoded on the GPU. Sizes in between were not measured: the bound sits near the thumbnails.
# Without a GPU the same bound picks DALI's CPU backend over CPU_DEFAULT for outputs of at most CPU_DALI_MAX_OUTPUT
# px (2 cores, thirteenth session, benchmarks/RESULTS.md). Loaders with 64-px crops: ~100-px thumbnails 5,229-5,294
# against 3,530-3,995 img/s (the pillow-simd path's per-image Python, under the GIL, left 0.6 of 2 cores idle), ~150
# px even, ~230 px the other way (2,856-2,998 against 3,064-3,351); ImageNet-like photos 0.6x. The decoders alone on
# thumbnails, by output size (benchmarks/bench_decode.py, float16): 1.8-2.2x at 32-64 px, 1.1-1.6x at 96-128, 1.0-1.1x
# at 160, 0.7-0.8x at 224 (float32: 0.37x): DALI's CPU resize and the normalisation after it, which runs in one
# thread, grow with the output, pillow-simd's cost per image hardly does.
CPU_DECODE_MAX_PIXELS = 128 * 128
CPU_DALI_MAX_OUTPUT = 128
# ... but only on a rank with THUMBNAIL_CPU_MIN_CORES cores: with fewer the CPU cannot decode thumbnails as fast as a
# small model takes them, and the GPU decodes them. On an H200 under `taskset` (twenty-first session, 64-px crops,
# the CPU decode with the GPU pipeline past its CPU ones, settings.py, against the GPU decode): on 4 cores ResNet-18
# 12,602 against 15,175 img/s, ResNet-50 6,816 against 6,848, the loader alone 21,402 against 34,183; on 6 cores
# 11,459 against 13,253, 8,210 against 8,075, 22,947 against 27,469; on 8 cores 17,244 against 15,489, 9,368 against
# 7,754, 32,795 against 36,634; on 16 cores 15,845 against 13,873 and 10,202 against 8,208 (DALI's reader: 16,267
# and 7,170).
THUMBNAIL_CPU_MIN_CORES = 8
# Above it, `auto` splits each batch between the CPU and the GPU (decoder "hybrid", decode/hybrid.py) when the rank
# has HYBRID_MIN_CORES cores, the median image is at most HYBRID_MAX_PIXELS, and JPEGs the hardware decoder takes
# are nearly all of the data. Measured on an H200 x2, each next to "dali" in the same run: ImageNet-like photos
# trained ResNet-18 5-9% faster on one GPU and ResNet-50 as fast (fifth session, two runs), the loader alone 17%
# faster; ResNet-50 on two GPUs (DDP) 6.8% faster (fourth session). On a 16-core H200 host (sixth session, two runs)
# ResNet-50 trained as fast as with "dali" and ResNet-18 0.95x / 1.09x, since the climber starts on the GPU alone
# (decode/hybrid.py; started at 1/8 it made ResNet-18 12-19% slower there). 12-MP photos gained nothing with an
# earlier split rule (the CPU decodes them too slowly to take a useful share), sizes in between were not measured;
# PNG-heavy sets keep "dali", whose CPU threads are sized for them (fastfeed/settings.py).
HYBRID_MIN_CORES = 8
HYBRID_MAX_PIXELS = 1_000_000


def resolve_kind(kind: str, device: str, images=None, cpus_per_rank: int | None = None,
                 image_size: int | None = None) -> str:
    """The concrete decoder `make_decoder(kind, device=device)` builds ("auto"/"cpu" resolved).

    "auto" with a CUDA device and DALI, given the dataset's `images` (a types.ImageProfile; None: not known yet)
    and this rank's cores: "cpu-dali" for thumbnails (median <= CPU_DECODE_MAX_PIXELS; per image the GPU path's fixed
    costs — launches from decoder threads of the training process — outweigh a thumbnail's decode and slow the
    training step itself) on a rank with THUMBNAIL_CPU_MIN_CORES cores, "hybrid" for photos up to HYBRID_MAX_PIXELS
    on a rank with HYBRID_MIN_CORES cores, else "dali". Without a CUDA device: "cpu-dali" for thumbnails cropped to
    at most CPU_DALI_MAX_OUTPUT px (`image_size`; when DALI is installed), else CPU_DEFAULT (see the constants above
    for what was measured)."""
    import torch

    from fastfeed.decode.dali import dali_available

    if kind not in KINDS:
        raise ValueError(f"unknown decoder kind {kind!r}; expected one of {KINDS}")
    if kind == "auto":
        if not dali_available():
            return CPU_DEFAULT
        thumbnails = images is not None and images.median_pixels <= CPU_DECODE_MAX_PIXELS
        if not (str(device).startswith("cuda") and torch.cuda.is_available()):
            small_output = image_size is not None and image_size <= CPU_DALI_MAX_OUTPUT
            return "cpu-dali" if thumbnails and small_output else CPU_DEFAULT
        if images is None:
            return "dali"
        if thumbnails:
            return "cpu-dali" if (cpus_per_rank or 0) >= THUMBNAIL_CPU_MIN_CORES else "dali"
        if (cpus_per_rank or 0) >= HYBRID_MIN_CORES and images.median_pixels <= HYBRID_MAX_PIXELS \
                and images.cpu_decode_share < DALI_CPU_SHARE_FOR_MORE_THREADS:
            return "hybrid"
        return "dali"
    return CPU_DEFAULT if kind == "cpu" else kind


def make_decoder(kind: str = "auto", *, device: str = "cuda", device_id: int = 0, image_size: int = 224,
                 dtype=None, channels_last: bool = False, mean=None, std=None, batch_size: int = 256,
                 num_threads: int = DEFAULT_DALI_THREADS, hw_decoder_load: float = DEFAULT_HW_DECODER_LOAD,
                 on_error: str = "skip", draft: bool = False, zero_copy: bool = False,
                 orientation: str = DEFAULT_ORIENTATION, pace=None, settle: int = 0,
                 start_share: float | None = None, pinned_input: bool = False, preallocate=None):
    """Build a decoder. `device` is where the images go ("cuda" | "cuda:N" | "cpu"); device_id is the GPU DALI
    decodes on (the rank's local GPU). `draft` applies to cpu-pil only (see fastfeed/decode/cpu.py), zero_copy,
    hw_decoder_load, pinned_input and preallocate ((width, height) or None) to dali (and hybrid's GPU part) only.
    hybrid: num_threads are its CPU part's threads (the GPU part has DEFAULT_DALI_THREADS); `pace` is the loop's
    ConsumerPace its CPU share is tuned on, `settle` the batches in flight when the share changes, `start_share` the
    share it starts at (None: one process's, decode/hybrid.py). `orientation` is the EXIF policy of the decode
    contract ("ignore" | "exif", docs/decode_contract.md); the windows passed in must be computed on
    `oriented_size(...)` under the same policy.
    Returns an object with __call__(samples, windows) -> DecodeResult and close()."""
    import torch

    resolved = resolve_kind(kind, device)
    dev = torch.device(device)
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", int(device_id))
    common = dict(image_size=image_size, dtype=dtype, channels_last=channels_last, mean=mean, std=std,
                  batch_size=batch_size, num_threads=num_threads, on_error=on_error, orientation=orientation)
    if resolved == "dali":
        if dev.type != "cuda":
            raise ValueError("kind='dali' decodes on the GPU: pass device='cuda' (or use kind='cpu-dali')")
        from fastfeed.decode.dali import DaliDecoder

        return DaliDecoder(device_id=dev.index, hw_decoder_load=hw_decoder_load, zero_copy=zero_copy,
                           pinned_input=pinned_input, preallocate=preallocate, **common)
    if resolved == "hybrid":
        if dev.type != "cuda":
            raise ValueError("kind='hybrid' splits batches between the CPU and a GPU: pass device='cuda'")
        from fastfeed.decode.dali import DaliDecoder
        from fastfeed.decode.hybrid import START_SHARE, HybridDecoder, climber_for

        # The parts raise on corrupt records; the hybrid applies on_error over the whole batch (see hybrid.py).
        parts = {**common, "on_error": "raise"}
        gpu = DaliDecoder(device_id=dev.index, hw_decoder_load=hw_decoder_load, zero_copy=zero_copy,
                          pinned_input=pinned_input, preallocate=preallocate,
                          **{**parts, "num_threads": DEFAULT_DALI_THREADS})
        start = START_SHARE if start_share is None else start_share
        climber = climber_for(pace, settle, start) if pace is not None else None
        return HybridDecoder(_cpu_dali_to_device(parts, dev), gpu, device=dev, climber=climber, on_error=on_error)
    if resolved == "cpu-dali":
        from fastfeed.decode.dali import DaliDecoder

        if dev.type == "cpu":
            return DaliDecoder(device_id=None, **common)
        return _cpu_dali_to_device(common, dev)
    from fastfeed.decode.cpu import PilDecoder

    return PilDecoder(device=dev, draft=draft, **common)


def _cpu_dali_to_device(common: dict, dev):
    """DALI's CPU backend for a CUDA device: uint8 NHWC batches in page-locked memory, normalised on the GPU
    (split.py)."""
    import torch

    from fastfeed.decode.dali import DaliDecoder
    from fastfeed.decode.split import NormalizeOnDevice

    dtype, mean, std = common["dtype"], common["mean"], common["std"]
    inner = DaliDecoder(device_id=None, pinned_output=True, **{**common, "dtype": torch.uint8, "channels_last": True})
    return NormalizeOnDevice(inner, dev, dtype=torch.float32 if dtype is None else dtype,
                             mean=IMAGENET_MEAN if mean is None else mean, std=IMAGENET_STD if std is None else std,
                             channels_last=common["channels_last"])


def pipeline_kind(settings, index: int) -> str:
    """The decoder kind of a Loader's pipeline number `index` (from 0): `settings.decoder`, but "dali" (the GPU) for
    a "cpu-dali" Loader's pipelines from `settings.gpu_pipelines_from` on (why: fastfeed/settings.py)."""
    start = settings.gpu_pipelines_from
    return "dali" if start is not None and index >= start else settings.decoder


def build_decoder(settings, *, index: int = 0, num_threads: int | None = None, hw_decoder_load: float | None = None,
                  pace=None):
    """The decoder of pipeline number `index` of a Loader with `settings` (a fastfeed.settings.LoaderSettings); the
    tuner overrides the two knobs it measures; `pace` is the Loader's ConsumerPace (hybrid only). The one place where
    Loader settings become decoder arguments."""
    dev = settings.device
    kind = pipeline_kind(settings, index)
    if kind != settings.decoder:  # a GPU pipeline beside CPU ones: the GPU decoder's own thread count
        num_threads = num_threads or DEFAULT_DALI_THREADS
    return make_decoder(
        kind, device=str(dev), device_id=dev.index or 0, image_size=settings.image_size,
        dtype=settings.dtype, channels_last=settings.channels_last, mean=settings.mean, std=settings.std,
        batch_size=settings.batch_size, num_threads=num_threads or settings.decode_threads,
        hw_decoder_load=settings.hw_decoder_load if hw_decoder_load is None else hw_decoder_load,
        on_error=settings.on_error, orientation=settings.orientation, pace=pace, settle=settings.ring_slots,
        start_share=settings.hybrid_start_share, pinned_input=settings.pinned_input, preallocate=settings.preallocate,
        # JPEG draft mode (DCT-domain downscaling) only pays in train mode on large images (16-30% faster on
        # ~1,500 px photos, no change on ImageNet-sized ones); eval keeps exact torchvision parity.
        draft=settings.train)

