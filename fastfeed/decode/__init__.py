"""Decoders: encoded records + crop windows -> a normalized image batch (torch [B, 3, S, S]) on the device.

    crop_windows(widths, heights, sample_ids, *, seed, epoch, train, image_size) -> Windows
    make_decoder(kind, ...) -> decoder;  decoder(samples, windows) -> DecodeResult(images, replaced);  .close()

Kinds (the registry below): "dali" (GPU, `mixed` hardware decode), "cpu-dali" (DALI's CPU backend), "cpu-pil"
(pillow-simd + numba), "hybrid" (each batch split between DALI's CPU backend and the GPU: decode/hybrid.py),
"cpu" (the faster CPU one on a small machine: docs/design/decoders.md#cpu), "auto" ("dali" when DALI and CUDA are
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
           "PIL_ONLY_MAX_SHARE", "resolve_kind", "GPU_DECODERS", "CONCRETE_KINDS"]

KINDS = ("auto", "dali", "hybrid", "cpu", "cpu-dali", "cpu-pil")
CONCRETE_KINDS = ("dali", "hybrid", "cpu-dali", "cpu-pil")  # what resolve_kind returns
GPU_DECODERS = ("dali", "hybrid")  # the kinds that decode on the GPU ("hybrid": with a CPU share beside it)
# "cpu": the faster CPU decoder for photos at 224 px on a small machine. docs/design/decoders.md#cpu
CPU_DEFAULT = "cpu-pil"


# `auto` with a GPU decodes thumbnails (median image at most this many pixels) on the CPU and photos on the GPU: the
# GPU path's fixed costs per image outweigh a thumbnail's decode and slow the training. docs/design/decoders.md#auto
CPU_DECODE_MAX_PIXELS = 128 * 128
# Without a GPU, thumbnails cropped to at most this many px take DALI's CPU backend over CPU_DEFAULT: its resize and
# normalisation grow with the output, pillow-simd's per-image cost hardly does. docs/design/decoders.md#auto
CPU_DALI_MAX_OUTPUT = 128
# ... and with a GPU only on a rank with this many cores: with fewer the CPU cannot decode thumbnails as fast as a small
# model takes them, and the GPU decodes them. docs/design/decoders.md#auto
THUMBNAIL_CPU_MIN_CORES = 8
# Photos up to HYBRID_MAX_PIXELS, nearly all hardware-decodable JPEGs, on a rank with HYBRID_MIN_CORES cores: `auto`
# splits each batch between spare CPU cores and the GPU ("hybrid"); larger photos decode too slowly on the CPU to take
# a useful share, PNG-heavy sets keep "dali" (its CPU threads are sized for them). docs/design/decoders.md#hybrid
HYBRID_MIN_CORES = 8
HYBRID_MAX_PIXELS = 1_000_000
# A dataset where more than this share of samples only PIL reads as the decode contract says (TIFF, 16-bit, CMYK, ...:
# samples.npz `pil_only`): `auto` picks CPU_DEFAULT, whose threads the Loader sizes for it, on every device; the DALI
# kinds would hand most of each batch to the same PIL decode on their own threads.
PIL_ONLY_MAX_SHARE = 0.5


def resolve_kind(kind: str, device: str, images=None, cpus_per_rank: int | None = None,
                 image_size: int | None = None) -> str:
    """The concrete decoder `make_decoder(kind, device=device)` builds ("auto"/"cpu" resolved).

    "auto" with a CUDA device and DALI, given the dataset's `images` (a types.ImageProfile; None: not known yet)
    and this rank's cores: "cpu-dali" for thumbnails (median <= CPU_DECODE_MAX_PIXELS; per image the GPU path's fixed
    costs — launches from decoder threads of the training process — outweigh a thumbnail's decode and slow the
    training step itself) on a rank with THUMBNAIL_CPU_MIN_CORES cores, "hybrid" for photos up to HYBRID_MAX_PIXELS
    on a rank with HYBRID_MIN_CORES cores, else "dali". Without a CUDA device: "cpu-dali" for thumbnails cropped to
    at most CPU_DALI_MAX_OUTPUT px (`image_size`; when DALI is installed), else CPU_DEFAULT; CPU_DEFAULT on any
    device for a dataset mostly of images only PIL reads (PIL_ONLY_MAX_SHARE). The constants above say what each
    bound trades off."""
    import torch

    from fastfeed.decode.dali import dali_available

    if kind not in KINDS:
        raise ValueError(f"unknown decoder kind {kind!r}; expected one of {KINDS}")
    if kind == "auto":
        if not dali_available() or (images is not None and images.pil_only_share > PIL_ONLY_MAX_SHARE):
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
                 orientation: str = DEFAULT_ORIENTATION, climber=None, pinned_input: bool = False,
                 preallocate=None):
    """Build a decoder. `device` is where the images go ("cuda" | "cuda:N" | "cpu"); device_id is the GPU DALI
    decodes on (the rank's local GPU). `draft` applies to cpu-pil only (see fastfeed/decode/cpu.py), zero_copy,
    hw_decoder_load, pinned_input and preallocate ((width, height) or None) to dali (and hybrid's GPU part) only.
    hybrid: num_threads are its CPU part's threads (the GPU part has DEFAULT_DALI_THREADS); `climber` is the Loader's
    `tuning.climber.ShareClimber` that sets its CPU share (None: a fixed START_SHARE). `orientation` is the EXIF
    policy of the decode contract ("ignore" | "exif", docs/decode-contract.md); the windows passed in must be
    computed on `oriented_size(...)` under the same policy.
    Returns an object with __call__(samples, windows) -> DecodeResult and close()."""
    return _construct(resolve_kind(kind, device), device=device, device_id=device_id, image_size=image_size,
                      dtype=dtype, channels_last=channels_last, mean=mean, std=std, batch_size=batch_size,
                      num_threads=num_threads, hw_decoder_load=hw_decoder_load, on_error=on_error, draft=draft,
                      zero_copy=zero_copy, orientation=orientation, climber=climber, pinned_input=pinned_input,
                      preallocate=preallocate)


def _construct(resolved: str, *, device, device_id, image_size, dtype, channels_last, mean, std, batch_size,
               num_threads, hw_decoder_load, on_error, draft, zero_copy, orientation, climber, pinned_input,
               preallocate):
    """The decoder of a concrete kind (one of CONCRETE_KINDS: the kind was resolved by the caller, once)."""
    import torch

    if resolved not in CONCRETE_KINDS:
        raise ValueError(f"decoder kind {resolved!r} is not resolved; expected one of {CONCRETE_KINDS}")
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
        from fastfeed.decode.hybrid import HybridDecoder

        # The parts raise on corrupt records; the hybrid applies on_error over the whole batch (see hybrid.py).
        parts = {**common, "on_error": "raise"}
        gpu = DaliDecoder(device_id=dev.index, hw_decoder_load=hw_decoder_load, zero_copy=zero_copy,
                          pinned_input=pinned_input, preallocate=preallocate,
                          **{**parts, "num_threads": DEFAULT_DALI_THREADS})
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
    a "cpu-dali" Loader's pipelines from `settings.gpu_pipelines_from` on (why: fastfeed/loader/settings.py)."""
    start = settings.gpu_pipelines_from
    return "dali" if start is not None and index >= start else settings.decoder


def build_decoder(settings, *, index: int = 0, num_threads: int | None = None, hw_decoder_load: float | None = None,
                  climber=None):
    """The decoder of pipeline number `index` of a Loader with `settings` (a fastfeed.loader.settings.LoaderSettings);
    the tuner overrides the two knobs it measures; `climber` is the Loader's ShareClimber (hybrid only). The one place
    where Loader settings become decoder arguments."""
    dev = settings.device
    kind = pipeline_kind(settings, index)
    if kind != settings.decoder:  # a GPU pipeline beside CPU ones: the GPU decoder's own thread count
        num_threads = num_threads or DEFAULT_DALI_THREADS
    return _construct(
        kind, device=str(dev), zero_copy=False, device_id=dev.index or 0, image_size=settings.image_size,
        dtype=settings.dtype, channels_last=settings.channels_last, mean=settings.mean, std=settings.std,
        batch_size=settings.batch_size, num_threads=num_threads or settings.decode_threads,
        hw_decoder_load=settings.hw_decoder_load if hw_decoder_load is None else hw_decoder_load,
        on_error=settings.on_error, orientation=settings.orientation, climber=climber,
        pinned_input=settings.pinned_input, preallocate=settings.preallocate,
        # JPEG draft mode (DCT-domain downscaling) trades exactness for speed on large images: train mode only, eval
        # keeps torchvision parity. docs/design/decoders.md#draft
        draft=settings.train)

