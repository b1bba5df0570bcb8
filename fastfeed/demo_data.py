"""A synthetic, ImageNet-like JPEG folder tree for demos, tests and benchmarks.

Decode cost is what the loader's benchmarks measure, so the images must cost what real photos cost: flat colours
decode absurdly fast and pure noise absurdly slowly. Every image is therefore a random crop/scale/flip/colour jitter
of one of the public-domain photographs scikit-image ships, with a little film grain so that the upscaled crops
carry the high-frequency detail (and the ~110 KB file size) of a real camera JPEG.

Shape of the output (the statistics of ImageNet-1k train):
    short side 300-600 px, aspect 3:4-4:3, JPEG quality 75-95, mean size ~100-130 KB,
    `out_dir/class_XXX/img_XXXXXXX.jpg`, image i in class i % num_classes.

Seed discipline: image i depends only on (seed, i) through `SeedSequence([seed, i])`, and the shared grain texture
only on a fixed constant, so the same seed gives byte-identical files whatever the worker count. Which images are
progressive is one permutation drawn from `SeedSequence([seed, _PROGRESSIVE_STREAM])`.
"""
from __future__ import annotations

import io
import json
import math
import multiprocessing
import os
import re
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from fastfeed.world import usable_cpus

__all__ = ["make_dataset", "dataset_present", "image_path", "DemoSpec", "MARKER_NAME", "SOURCE_PHOTOS"]

MARKER_NAME = ".fastfeed-demo.json"
# Bump when the generator's output changes, so an old folder is not mistaken for the current dataset.
GENERATOR_VERSION = 1
# RGB photographs bundled with scikit-image (no download needed); stereo_motorcycle returns (left, right, disparity).
SOURCE_PHOTOS = ("astronaut", "coffee", "chelsea", "rocket", "immunohistochemistry", "stereo_motorcycle")

_SHORT_SIDE = (300, 600)
_ASPECT = (3 / 4, 4 / 3)
_QUALITY = (75, 95)
# Tuned so the mean file is ~115 KB (measured over the first 2000 images of seed 0).
_GRAIN_SIGMA = (14.0, 6.0)  # (luma, per-channel) std-dev in 8-bit levels
_GRAIN_SIZE = 1024
_SATURATIONS = (0.65, 0.85, 1.0, 1.2, 1.4)
_SOURCE_MAX_SIDE = 720  # pre-scale big sources once so per-image resizes stay cheap
_PROGRESSIVE_STREAM = 0x9E3779B9
_CHUNK = 64
_IMAGES_PER_WORKER_MIN = 500

_CLASS_RE = re.compile(r"class_\d{3,}")
_IMAGE_RE = re.compile(r"img_\d{7,}\.jpg")


@dataclass(frozen=True)
class DemoSpec:
    """Everything that determines the dataset's bytes; stored in the marker file to make re-runs idempotent."""

    num_images: int
    num_classes: int
    seed: int
    progressive_fraction: float
    generator_version: int = GENERATOR_VERSION


def _validate(num_images: int, num_classes: int, seed: int, workers: int | None, fraction: float) -> None:
    if not isinstance(num_images, int) or num_images < 1:
        raise ValueError(f"num_images must be a positive integer, got {num_images!r}")
    if not isinstance(num_classes, int) or not 1 <= num_classes <= 1000:
        raise ValueError(f"num_classes must be an integer in 1..1000, got {num_classes!r}")
    if not isinstance(seed, int) or seed < 0:
        raise ValueError(f"seed must be a non-negative integer, got {seed!r}")
    if workers is not None and (not isinstance(workers, int) or workers < 1):
        raise ValueError(f"workers must be a positive integer or None, got {workers!r}")
    if not 0.0 <= fraction <= 1.0:
        raise ValueError(f"progressive_fraction must be within [0, 1], got {fraction!r}")


def image_path(out_dir: Path, index: int, num_classes: int) -> Path:
    """Where image `index` lives: its class is `index % num_classes`."""
    return out_dir / f"class_{index % num_classes:03d}" / f"img_{index:07d}.jpg"


def _progressive_mask(spec: DemoSpec) -> np.ndarray:
    count = int(round(spec.progressive_fraction * spec.num_images))
    rng = np.random.default_rng(np.random.SeedSequence([spec.seed, _PROGRESSIVE_STREAM]))
    mask = np.zeros(spec.num_images, dtype=bool)
    mask[rng.permutation(spec.num_images)[:count]] = True
    return mask


# ---- worker side -----------------------------------------------------------------------------------------------
# Per-process state, built once by _init_worker (photos decoded and pre-scaled, grain texture drawn).
_SOURCES: list = []
_GRAIN = None


def _load_sources() -> list:
    from PIL import Image

    try:
        import skimage.data as skdata
    except ImportError as exc:  # scikit-image is an optional (dev/bench) dependency
        raise RuntimeError("demo data needs scikit-image: pip install 'fastfeed[dev]' or scikit-image") from exc
    sources = []
    for name in SOURCE_PHOTOS:
        # Every photo is required: silently skipping one would change the bytes a seed produces on this machine.
        try:
            array = getattr(skdata, name)()
        except Exception as exc:  # noqa: BLE001 - scikit-image raises several types for a missing data file
            raise RuntimeError(f"scikit-image cannot load its sample photo {name!r}: {exc}") from exc
        if isinstance(array, tuple):
            array = array[0]
        if array.ndim != 3 or array.shape[2] != 3 or array.dtype != np.uint8:
            raise RuntimeError(f"scikit-image's {name!r} is {array.shape} {array.dtype}, expected H x W x 3 uint8")
        img = Image.fromarray(array, "RGB")
        scale = _SOURCE_MAX_SIDE / max(img.size)
        if scale < 1:
            img = img.resize((round(img.width * scale), round(img.height * scale)), Image.LANCZOS)
        sources.append(img)
    return sources


def _make_grain() -> np.ndarray:
    # Mostly luma grain (the same offset on R, G and B), like a camera's sensor noise after demosaicing: chroma
    # noise is largely thrown away by 4:2:0 subsampling, so it adds little of the detail real photos carry.
    # A fixed seed: the texture is shared by every image, so it must not depend on the worker or the dataset seed.
    rng = np.random.default_rng(20240601)
    luma = rng.normal(0.0, _GRAIN_SIGMA[0], size=(_GRAIN_SIZE, _GRAIN_SIZE, 1))
    chroma = rng.normal(0.0, _GRAIN_SIGMA[1], size=(_GRAIN_SIZE, _GRAIN_SIZE, 3))
    return np.rint(luma + chroma).astype(np.int16)


def _init_worker() -> None:
    global _SOURCES, _GRAIN
    if not _SOURCES:
        from PIL import ImageEnhance

        # Saturation needs channel mixing (slow per image), so each photo is pre-rendered at a few saturations.
        photos = _load_sources()
        _SOURCES = [[ImageEnhance.Color(p).enhance(f) for f in _SATURATIONS] for p in photos]
        _GRAIN = _make_grain()


def _render(seed: int, index: int, progressive: bool) -> tuple[bytes, tuple[int, int], int]:
    """Encode image `index`: returns (jpeg bytes, (width, height), quality)."""
    from PIL import Image

    rng = np.random.default_rng(np.random.SeedSequence([seed, index]))
    variants = _SOURCES[int(rng.integers(len(_SOURCES)))]
    src = variants[int(rng.integers(len(variants)))]
    short = int(rng.integers(_SHORT_SIDE[0], _SHORT_SIDE[1] + 1))
    aspect = math.exp(rng.uniform(math.log(_ASPECT[0]), math.log(_ASPECT[1])))  # width / height
    long = min(round(short * max(aspect, 1 / aspect)), short * 4 // 3)
    width, height = (long, short) if aspect >= 1 else (short, long)

    # A crop of the source with the target's aspect, covering 30-100% of the area of the largest such crop.
    fit = min(src.width / width, src.height / height)
    scale = fit * math.sqrt(rng.uniform(0.3, 1.0))
    cw, ch = width * scale, height * scale
    x0 = rng.uniform(0, src.width - cw)
    y0 = rng.uniform(0, src.height - ch)
    img = src.resize((width, height), Image.BILINEAR, box=(x0, y0, x0 + cw, y0 + ch))
    if rng.random() < 0.5:
        img = img.transpose(Image.FLIP_LEFT_RIGHT)

    # Colour jitter in one LUT pass: per-channel gain (white balance) x brightness, then contrast about mid-grey.
    gains = rng.uniform(0.88, 1.12, size=3) * rng.uniform(0.75, 1.25)
    contrast = rng.uniform(0.75, 1.25)
    base = np.arange(256, dtype=np.float64)
    lut = np.concatenate([(base * g - 128.0) * contrast + 128.0 for g in gains])
    img = img.point(np.clip(np.rint(lut), 0, 255).astype(np.uint8).tolist())

    gx = int(rng.integers(_GRAIN_SIZE - width + 1))
    gy = int(rng.integers(_GRAIN_SIZE - height + 1))
    pixels = np.asarray(img).astype(np.int16)
    pixels += _GRAIN[gy : gy + height, gx : gx + width]
    img = Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8), "RGB")

    # Skewed towards the top of the range, as in ImageNet (most of its JPEGs are q90+).
    quality = _QUALITY[0] + int(math.sqrt(rng.random()) * (_QUALITY[1] - _QUALITY[0] + 1))
    buf = io.BytesIO()
    img.save(buf, "JPEG", quality=quality, progressive=progressive)
    return buf.getvalue(), (width, height), quality


def _write_chunk(job: tuple[str, int, int, np.ndarray]) -> tuple[int, int]:
    """Render and write a run of images; `job` is (out_dir, seed, num_classes, [[index, progressive], ...])."""
    out_dir, seed, num_classes, indices_and_flags = job
    _init_worker()
    out = Path(out_dir)
    total = 0
    for index, progressive in indices_and_flags:
        data, _, _ = _render(seed, int(index), bool(progressive))
        path = image_path(out, int(index), num_classes)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_bytes(data)
        os.replace(tmp, path)  # a killed run never leaves a truncated JPEG under the final name
        total += len(data)
    return len(indices_and_flags), total


# ---- parent side -----------------------------------------------------------------------------------------------
def _read_marker(out_dir: Path) -> dict | None:
    try:
        return json.loads((out_dir / MARKER_NAME).read_text())
    except (OSError, ValueError):
        return None


def _is_complete(out_dir: Path, spec: DemoSpec) -> bool:
    marker = _read_marker(out_dir)
    if marker is None or marker.get("spec") != asdict(spec):
        return False
    return sum(1 for _ in out_dir.glob("class_*/img_*.jpg")) == spec.num_images


def _clear_previous(out_dir: Path) -> None:
    """Remove an earlier (other-parameter or interrupted) demo dataset; refuse to touch anything else."""
    foreign = []
    for entry in out_dir.iterdir():
        if entry.name == MARKER_NAME:
            continue
        if entry.is_dir() and not entry.is_symlink() and _CLASS_RE.fullmatch(entry.name):
            foreign += [p for p in entry.iterdir() if not (_IMAGE_RE.fullmatch(p.name) or p.name.endswith(".tmp"))]
        else:
            foreign.append(entry)
    if foreign:
        raise FileExistsError(
            f"{out_dir} is not empty and does not look like a fastfeed demo dataset "
            f"(e.g. {foreign[0]}); choose an empty or new folder"
        )
    (out_dir / MARKER_NAME).unlink(missing_ok=True)  # first: a half-cleared folder must not look complete
    for entry in out_dir.iterdir():
        shutil.rmtree(entry)


def dataset_present(
    out_dir: str | os.PathLike,
    num_images: int = 2000,
    num_classes: int = 10,
    seed: int = 0,
    progressive_fraction: float = 0.0,
) -> bool:
    """True when `out_dir` already holds exactly the dataset `make_dataset` would write with these parameters."""
    out = Path(out_dir)
    spec = DemoSpec(num_images, num_classes, seed, float(progressive_fraction))
    return out.is_dir() and _is_complete(out, spec)


def make_dataset(
    out_dir: str | os.PathLike,
    num_images: int = 2000,
    num_classes: int = 10,
    seed: int = 0,
    workers: int | None = None,
    progressive_fraction: float = 0.0,
) -> Path:
    """Write `num_images` JPEGs under `out_dir/class_XXX/` and return `out_dir`.

    If `out_dir` already holds exactly this dataset (same parameters, marker file present, all files there) nothing
    is written. A folder holding a different or interrupted demo dataset is regenerated; a folder holding anything
    else raises `FileExistsError`. `workers` defaults to the cores this process may use; results do not depend on it.
    """
    _validate(num_images, num_classes, seed, workers, progressive_fraction)
    out = Path(out_dir)
    spec = DemoSpec(num_images, num_classes, seed, float(progressive_fraction))
    if out.exists():
        if not out.is_dir():
            raise NotADirectoryError(f"{out} exists and is not a directory")
        if _is_complete(out, spec):
            return out
        _clear_previous(out)
    out.mkdir(parents=True, exist_ok=True)
    for c in range(min(num_classes, num_images)):
        (out / f"class_{c:03d}").mkdir(exist_ok=True)

    flags = _progressive_mask(spec)
    table = np.stack([np.arange(num_images), flags.astype(np.int64)], axis=1)
    jobs = [(str(out), seed, num_classes, table[i : i + _CHUNK]) for i in range(0, num_images, _CHUNK)]
    if workers is None:
        # Starting a worker costs ~1 s (imports, photo decoding), so small datasets use fewer processes.
        workers = min(usable_cpus(), -(-num_images // _IMAGES_PER_WORKER_MIN))
    workers = min(workers, len(jobs))
    total_bytes = 0
    if workers == 1:
        for job in jobs:
            total_bytes += _write_chunk(job)[1]
    else:
        # spawn: the caller may hold threads (torch, a test runner), which make fork unsafe.
        ctx = multiprocessing.get_context("spawn")
        with ctx.Pool(workers, initializer=_init_worker) as pool:
            for _, nbytes in pool.imap_unordered(_write_chunk, jobs):
                total_bytes += nbytes

    marker = {"spec": asdict(spec), "bytes": total_bytes, "progressive": int(flags.sum())}
    tmp = out / (MARKER_NAME + ".tmp")
    tmp.write_text(json.dumps(marker, indent=1, sort_keys=True))
    os.replace(tmp, out / MARKER_NAME)
    return out
