"""Crop windows in source-pixel coordinates: torchvision's RandomResizedCrop (train) and Resize+CenterCrop (eval).

Pure numpy, vectorised over the batch, no torch. Every random number is a counter-based hash of
(seed, epoch, sample id, draw index) (splitmix64 finaliser), so a window depends on nothing else: resume, any
thread count and any rank split reproduce it bit for bit.

Train (torchvision.transforms.RandomResizedCrop.get_params, scale=(0.08, 1), ratio=(3/4, 4/3)), same algorithm:
up to 10 attempts of (area fraction ~ U(scale), log aspect ~ U(log ratio)), w = round(sqrt(A*r)), h = round(sqrt(A/r))
(round half to even like Python's round), the first attempt with 0 < w <= W and 0 < h <= H wins and its corner is
uniform over the valid positions; if none fits, the central crop clamped to the ratio range. All 10 attempts are
drawn for every sample (vectorised); only the first valid one is used, which is exactly torchvision's distribution.
Flip ~ Bernoulli(0.5).

Eval: torchvision Resize(R) (R = round(S / 0.875), shorter side to R, longer side int(R * long / short)) followed
by CenterCrop(S) (offset int(round((new - S) / 2))) reads, in source coordinates, exactly the window
    [off * src / new, (off + S) * src / new)        per axis (src = source length, new = resized length)
of side S * src / new ~= 0.875 * min(W, H), generally not on whole pixels. PIL's resize(box=...) with that float
box gives bit-identical output to Resize+CenterCrop (its filter reads source pixels outside the box, as
resize-then-crop does); so `Windows.box` carries the exact float window and x/y/w/h the enclosing whole-pixel ROI
that a decoder must decode. Rounding the box to whole pixels instead would cost up to ~1/255 mean abs difference.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from fastfeed.constants import DEFAULT_ORIENTATION, ORIENTATIONS

__all__ = ["Windows", "crop_windows", "eval_resize_size", "oriented_size", "ORIENTATIONS", "DEFAULT_ORIENTATION",
           "SCALE", "RATIO", "MAX_ATTEMPTS"]


SCALE = (0.08, 1.0)
RATIO = (3.0 / 4.0, 4.0 / 3.0)
MAX_ATTEMPTS = 10
EVAL_CROP_FRACTION = 0.875

_M64 = np.uint64(0xFFFFFFFFFFFFFFFF)
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_C1 = np.uint64(0xBF58476D1CE4E5B9)
_C2 = np.uint64(0x94D049BB133111EB)
# Draw streams: each random quantity has its own slot so adding one never shifts the others.
_STREAM_SCALE, _STREAM_RATIO, _STREAM_Y, _STREAM_X, _STREAM_FLIP = range(5)
_STREAMS = 5


@dataclass(frozen=True)
class Windows:
    """Per-sample crop window in source pixels: columns x..x+w, rows y..y+h; `flip` = mirror horizontally."""

    x: np.ndarray  # int32[B]
    y: np.ndarray  # int32[B]
    w: np.ndarray  # int32[B]
    h: np.ndarray  # int32[B]
    flip: np.ndarray  # bool[B]
    box: np.ndarray | None = None  # float64[B, 4] exact (x0, y0, x1, y1) inside the ROI; None: the ROI itself
    # The (displayed) image sizes the windows were drawn on, when known: a decoder may read around a window (its
    # resize filter's neighbours) up to the image's edge.
    width: np.ndarray | None = None  # int64[B]
    height: np.ndarray | None = None  # int64[B]
    # bool[B]: the samples DALI's decoders hand to the decode contract's PIL decode (samples.npz `pil_only`); None:
    # none
    pil: np.ndarray | None = None

    def __post_init__(self):
        if self.box is None:
            x, y = self.x.astype(np.float64), self.y.astype(np.float64)
            box = np.stack([x, y, x + self.w, y + self.h], axis=1).reshape(-1, 4)
            object.__setattr__(self, "box", box)

    def __len__(self) -> int:
        return len(self.x)

    def take(self, positions) -> "Windows":
        p = np.asarray(positions, dtype=np.int64)
        return Windows(self.x[p], self.y[p], self.w[p], self.h[p], self.flip[p], self.box[p],
                       None if self.width is None else self.width[p], None if self.height is None else self.height[p],
                       None if self.pil is None else self.pil[p])

    def clamped(self, widths, heights) -> "Windows":
        """The same windows clipped to images of the given (actual, decoded) sizes; never empty."""
        W = np.maximum(np.asarray(widths, dtype=np.int64), 1)
        H = np.maximum(np.asarray(heights, dtype=np.int64), 1)
        x = np.clip(self.x.astype(np.int64), 0, W - 1)
        y = np.clip(self.y.astype(np.int64), 0, H - 1)
        w = np.clip(self.w.astype(np.int64), 1, W - x)
        h = np.clip(self.h.astype(np.int64), 1, H - y)
        i32 = np.int32
        lo = np.stack([x, y, x, y], axis=1).astype(np.float64)
        hi = np.stack([x + w, y + h, x + w, y + h], axis=1).astype(np.float64)
        box = np.minimum(np.maximum(self.box, lo), hi)
        return Windows(x.astype(i32), y.astype(i32), w.astype(i32), h.astype(i32), self.flip.copy(), box, W, H,
                       self.pil)


def oriented_size(widths, heights, orientation_tags, policy: str) -> tuple[np.ndarray, np.ndarray]:
    """The displayed (width, height) of each image under `policy`: EXIF tags 5..8 (transpose, rotate 90/270,
    transverse) swap the axes when policy == "exif"; everything else keeps the stored size. Crop windows must be
    computed on these sizes, since every decoder crops the displayed image. `orientation_tags` may be None
    (a dataset without the column: all 1)."""
    if policy not in ORIENTATIONS:
        raise ValueError(f"orientation must be one of {ORIENTATIONS}, got {policy!r}")
    W = np.asarray(widths)
    H = np.asarray(heights)
    if policy == "ignore" or orientation_tags is None:
        return W, H
    tags = np.asarray(orientation_tags)
    if tags.shape != W.shape:
        raise ValueError(f"orientation_tags has shape {tags.shape}, widths {W.shape}")
    swap = (tags >= 5) & (tags <= 8)
    return np.where(swap, H, W), np.where(swap, W, H)


def _mix(z: np.ndarray) -> np.ndarray:
    """splitmix64 finaliser on uint64 arrays (wrapping arithmetic)."""
    z = z ^ (z >> np.uint64(30))
    z = z * _C1
    z = z ^ (z >> np.uint64(27))
    z = z * _C2
    return z ^ (z >> np.uint64(31))


def _key(seed: int, epoch: int) -> np.uint64:
    with np.errstate(over="ignore"):
        k = _mix(np.array([seed & 0xFFFFFFFFFFFFFFFF], dtype=np.uint64) + _GOLDEN)
        k = _mix(k ^ (np.array([epoch & 0xFFFFFFFFFFFFFFFF], dtype=np.uint64) * _GOLDEN + _C1))
    return k[0]


def _uniforms(key: np.uint64, ids: np.ndarray, n: int) -> np.ndarray:
    """float64[B, n, _STREAMS] in [0, 1): draw (sample, attempt, stream) is a pure function of (key, id, slot)."""
    slots = np.arange(n * _STREAMS, dtype=np.uint64).reshape(1, n, _STREAMS)
    with np.errstate(over="ignore"):
        z = _mix(ids.astype(np.uint64).reshape(-1, 1, 1) * _GOLDEN ^ key)
        z = _mix(z + (slots + np.uint64(1)) * _GOLDEN)
    return (z >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))


def eval_resize_size(image_size: int) -> int:
    """torchvision's standard eval resize for a crop of `image_size` (256 for 224)."""
    return int(round(image_size / EVAL_CROP_FRACTION))


def _check(widths, heights, sample_ids, image_size):
    W = np.asarray(widths, dtype=np.int64)
    H = np.asarray(heights, dtype=np.int64)
    ids = np.asarray(sample_ids, dtype=np.int64)
    if not (W.shape == H.shape == ids.shape) or W.ndim != 1:
        raise ValueError(
            f"widths, heights, sample_ids must be 1-D of one length, got {W.shape}, {H.shape}, {ids.shape}")
    if W.size and (W.min() < 1 or H.min() < 1):
        raise ValueError("image widths and heights must be >= 1")
    if ids.size and ids.min() < 0:
        raise ValueError("sample ids must be >= 0")
    if int(image_size) < 1:
        raise ValueError(f"image_size must be >= 1, got {image_size}")
    return W, H, ids


def _train(W, H, ids, key):
    n = len(W)
    u = _uniforms(key, ids, MAX_ATTEMPTS)
    area = (W * H).astype(np.float64)[:, None]
    target = area * (SCALE[0] + (SCALE[1] - SCALE[0]) * u[:, :, _STREAM_SCALE])
    lo, hi = math.log(RATIO[0]), math.log(RATIO[1])
    aspect = np.exp(lo + (hi - lo) * u[:, :, _STREAM_RATIO])
    w = np.round(np.sqrt(target * aspect)).astype(np.int64)
    h = np.round(np.sqrt(target / aspect)).astype(np.int64)
    ok = (w > 0) & (w <= W[:, None]) & (h > 0) & (h <= H[:, None])
    first = np.argmax(ok, axis=1)
    found = ok[np.arange(n), first]
    rows = np.arange(n)
    cw, ch = w[rows, first], h[rows, first]
    # torch.randint(0, H - h + 1): uniform integer; floor(u * count) of a 53-bit uniform is uniform to 2^-53.
    cy = np.floor(u[rows, first, _STREAM_Y] * (H - ch + 1)).astype(np.int64)
    cx = np.floor(u[rows, first, _STREAM_X] * (W - cw + 1)).astype(np.int64)
    # Fallback: torchvision's central crop, clamped to the ratio range.
    in_ratio = W / H
    fw = np.where(in_ratio < RATIO[0], W, np.where(in_ratio > RATIO[1], np.round(H * RATIO[1]), W)).astype(np.int64)
    fh = np.where(in_ratio < RATIO[0], np.round(W / RATIO[0]), H).astype(np.int64)
    fw, fh = np.minimum(fw, W), np.minimum(fh, H)
    cw, ch = np.where(found, cw, fw), np.where(found, ch, fh)
    cx = np.where(found, cx, (W - fw) // 2)
    cy = np.where(found, cy, (H - fh) // 2)
    flip = u[:, 0, _STREAM_FLIP] < 0.5
    return cx, cy, cw, ch, flip


def _eval(W, H, image_size):
    R = eval_resize_size(image_size)
    short = np.minimum(W, H)
    long_ = np.maximum(W, H)
    new_long = (R * long_ // short).astype(np.int64)  # int(R * long / short), exact in integers
    new_W = np.where(W <= H, R, new_long)
    new_H = np.where(W <= H, new_long, R)

    def axis(src, new):
        # CenterCrop pads when the resized image is smaller than the crop (only for tiny S/R); clamp instead.
        off = np.round(np.maximum(new - image_size, 0) / 2.0)
        scale = src / new
        start = off * scale
        end = np.minimum(start + np.minimum(image_size, new) * scale, src)
        # Enclosing whole-pixel ROI; the 1e-9 slack keeps float noise from adding a pixel.
        s = np.clip(np.floor(start + 1e-9), 0, src - 1).astype(np.int64)
        e = np.clip(np.ceil(end - 1e-9), s + 1, src).astype(np.int64)
        return s, e - s, start, end

    x, w, x0, x1 = axis(W, new_W)
    y, h, y0, y1 = axis(H, new_H)
    return x, y, w, h, np.zeros(len(W), dtype=bool), np.stack([x0, y0, x1, y1], axis=1)


def crop_windows(widths, heights, sample_ids, *, seed: int, epoch: int, train: bool, image_size: int,
                 pil=None) -> Windows:
    """Crop window (and flip) for each sample, from its header size and (seed, epoch, sample id) only; `pil`: the
    samples' `pil_only` flags (Windows.pil)."""
    W, H, ids = _check(widths, heights, sample_ids, image_size)
    box = None
    if train:
        x, y, w, h, flip = _train(W, H, ids, _key(int(seed), int(epoch)))
    else:
        x, y, w, h, flip, box = _eval(W, H, int(image_size))
    i32 = np.int32
    return Windows(x.astype(i32), y.astype(i32), w.astype(i32), h.astype(i32), np.asarray(flip, dtype=bool), box,
                   np.asarray(W, dtype=np.int64), np.asarray(H, dtype=np.int64),
                   None if pil is None else np.asarray(pil, dtype=bool))
