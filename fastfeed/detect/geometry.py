"""YOLO-style detection augmentation as pure functions of (seed, epoch, sample id), drawn before any pixel is decoded.

Exactly ultralytics 8.x (names, defaults, geometry, box rule): with probability `mosaic` (off for the last
`close_mosaic` of `epochs`) `_mosaic4` of the output's sample and 3 partners on a 2S canvas (centre int(U(S/2, 3S/2)),
each long side resized to S by `load_image`'s ceil rule), else that resize and a centred `LetterBox`; then
`RandomPerspective` (M = T @ Shear @ Rotation-Scale @ C, border -S/2 with mosaic, 0 without), `RandomHSV` gains,
`RandomFlip` (vertical with probability `flipud`, then horizontal). Boxes: clipped to the tile, 4 corners through M, min/max, clipped to [0, S], `box_candidates(wh_thr=2,
ar_thr=100, area_thr=0.10)` against the box times M's scale, flipped. Evaluation: resize + LetterBox(scaleup=False).
Differences: (1) resize, placement and M form ONE affine per tile (source -> output pixels, pixel edges at
integers): each source is resampled once, with PIL's antialiased filter (ultralytics: cv2 INTER_LINEAR resize, then
a warp mapping pixel centres, which puts its pixels up to |1 - s| / 2 px off its own labels; here pixels and boxes
share one map). An axis-aligned tile paints whole pixels (those whose centres it covers), its boxes are clipped to
them and its source rectangle is their exact inverse. (2) Mosaic partners come from the same batch (the loader reads
batches through a ring): 3 positions other than the output's own, with replacement. (3) LetterBox shifts labels by
dw / 2 but pixels by round(dw / 2 - 0.1): boxes here take the pixels' whole-pixel shift.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from numbers import Integral, Real

import numpy as np

from fastfeed.decode.numba_import import import_numba
from fastfeed.detect import iou_crop
from fastfeed.detect.streams import first_draws

numba = import_numba()

__all__ = ["DetectAugment", "BatchGeometry", "Tile", "plan_batch", "transform_boxes", "transform_batch_boxes",
           "box_candidates",
           "sample_rng", "long_side_size", "letterbox_padding", "SALT"]

# Mixed into every sample's seed sequence, so detection draws never coincide with another user of (seed, epoch, id).
SALT = 0x64657465  # b"dete"
_MAX_TILES = 4
# Indices into the fixed vector of uniforms every output draws: the same draws whatever the hyperparameters, so
# changing one (say degrees) leaves every other choice of the run as it was.
_MOSAIC, _PARTNERS, _XC, _YC, _ANGLE, _SCALE, _SHEAR_X, _SHEAR_Y, _TX, _TY, _FLIP, _HSV, _IOU_CROP, _FLIP_UD = (
    0, 1, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 16, 17)
# A generator's first n draws do not depend on how many follow: a new draw goes last (the IoU crop's own draws come
# after these, so a new one moves those).
_DRAWS = 18


@dataclass(frozen=True)
class DetectAugment:
    """Detection training augmentation, with ultralytics' hyperparameter names and defaults (default.yaml):
    mosaic (probability), degrees (+-rotation), translate (fraction of S), scale (gain +-), shear (+-degrees),
    flipud, fliplr (probabilities), hsv_h/hsv_s/hsv_v (gain fractions), close_mosaic (mosaic off for the last N epochs when
    the Loader knows `epochs`), pad_value (grey of the padding); iou_crop (probability that an output without mosaic
    is the SSD-style IoU crop of its image stretched to S x S instead: fastfeed/detect/iou_crop.py; 0 by default,
    as in ultralytics, which has none)."""

    mosaic: float = 1.0
    degrees: float = 0.0
    translate: float = 0.1
    scale: float = 0.5
    shear: float = 0.0
    flipud: float = 0.0
    fliplr: float = 0.5
    hsv_h: float = 0.015
    hsv_s: float = 0.7
    hsv_v: float = 0.4
    close_mosaic: int = 10
    pad_value: int = 114
    iou_crop: float = 0.0

    def __post_init__(self):
        # (low, high, high included): scale < 1 keeps the gain positive, shear < 90 keeps tan finite
        ranges = {"mosaic": (0, 1, True), "degrees": (0, 180, True), "translate": (0, 1, True),
                  "scale": (0, 1, False), "shear": (0, 90, False), "flipud": (0, 1, True), "fliplr": (0, 1, True), "hsv_h": (0, 1, True),
                  "hsv_s": (0, 1, True), "hsv_v": (0, 1, True), "iou_crop": (0, 1, True)}
        for name, (lo, hi, closed) in ranges.items():
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, Real) or not math.isfinite(v) or not (
                    lo <= v <= hi if closed else lo <= v < hi):
                raise ValueError(f"DetectAugment.{name} must be a number in [{lo}, {hi}{']' if closed else ')'}, "
                                 f"got {v!r}")
        for name, lo, hi in (("close_mosaic", 0, math.inf), ("pad_value", 0, 255)):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, Integral) or not lo <= v <= hi:
                raise ValueError(f"DetectAugment.{name} must be an integer in [{lo}, {hi}], got {v!r}")

    @property
    def axis_aligned(self) -> bool:
        """Whether every training affine keeps rectangles rectangles (no rotation, no shear)."""
        return self.degrees == 0 and self.shear == 0


@dataclass(frozen=True)
class Tile:
    """One source image's part of an output. source: batch position; affine float64 [2, 3]: source pixels ->
    output pixels; region: the source's visible part (x0, y0, x1, y1 float, source pixels); dst_rect (x0, y0, x1,
    y1 int, clipped to [0, S]): the output pixels it paints (the pixels whose centres lie inside); src_rect: for an
    axis-aligned affine the exact inverse image of dst_rect (it may overhang the image by under half an output
    pixel), else `region`; quad float64 [4, 2]: region's corners in output pixels; box_scale: (sx, sy) that scale
    a source box's width and height to ultralytics' box1 of box_candidates."""

    source: int
    affine: np.ndarray
    region: tuple
    dst_rect: tuple
    src_rect: tuple
    quad: np.ndarray
    box_scale: tuple


@dataclass(frozen=True)
class BatchGeometry:
    """The drawn geometry of a batch of B outputs (up to 4 tiles each; `n_tiles` says how many are used).

    Per output: n_tiles int [B]; flip, flipud bool [B] (mirrored left to right, top to bottom); hsv float64 [B, 3]
    (hue, saturation, value gains); scale float64 [B] and pad float64 [B, 2] (x, y): output = stored * scale + pad
    for the output's own sample (tile 0; exact for the long side, the short side's ceil rounding moves it by under a
    pixel; `affine` is exact), before the flips. Per tile [B, 4, ...]:
    source int64 (batch position, -1 unused), affine [2, 3], region [4], dst_rect int64 [4], src_rect [4],
    quad [4, 2], box_scale [2] (see `Tile`). sizes int64 [B, 2]: each position's stored (width, height)."""

    image_size: int
    train: bool
    axis_aligned: bool
    pad_value: int
    sizes: np.ndarray
    n_tiles: np.ndarray
    source: np.ndarray
    affine: np.ndarray
    region: np.ndarray
    dst_rect: np.ndarray
    src_rect: np.ndarray
    quad: np.ndarray
    box_scale: np.ndarray
    flip: np.ndarray
    flipud: np.ndarray
    hsv: np.ndarray
    scale: np.ndarray
    pad: np.ndarray

    def __len__(self) -> int:
        return len(self.n_tiles)

    def tiles(self, k: int) -> list[Tile]:
        """Output k's tiles, in ultralytics' order (own sample first; with mosaic: top-left, top-right, bottom-left,
        bottom-right)."""
        n = int(self.n_tiles[k])
        # one conversion per array, not per tile: the renderer's threads hold the GIL here
        source, region, dst, src = (a[k, :n].tolist() for a in (self.source, self.region, self.dst_rect,
                                                                   self.src_rect))
        box_scale = self.box_scale[k, :n].tolist()
        return [Tile(source[t], self.affine[k, t], tuple(region[t]), tuple(dst[t]), tuple(src[t]), self.quad[k, t],
                     tuple(box_scale[t])) for t in range(n)]


def sample_rng(seed: int, epoch: int, sample_id: int) -> np.random.Generator:
    """The generator of one sample's draws: a function of (seed, epoch, sample id) only, never the global RNG."""
    entropy = [int(v) % 2 ** 64 for v in (seed, epoch, sample_id)]  # SeedSequence takes non-negative ints
    return np.random.default_rng(np.random.SeedSequence(entropy + [SALT]))


def sample_entropy(seed: int, epoch: int, sample_ids) -> np.ndarray:
    """uint64 [len(sample_ids), 4]: each sample's SeedSequence entropy, as `sample_rng` builds it: the streams of
    fastfeed/detect/streams.py draw what those generators draw, for a whole batch in one compiled call."""
    ids = np.asarray(sample_ids, dtype=np.int64).reshape(-1).view(np.uint64)  # % 2**64, as sample_rng takes them
    entropy = np.empty((len(ids), 4), np.uint64)
    entropy[:, 0], entropy[:, 1] = int(seed) % 2 ** 64, int(epoch) % 2 ** 64
    entropy[:, 2], entropy[:, 3] = ids, SALT
    return entropy


@numba.njit(cache=True)
def long_side_size(w0: int, h0: int, S: int) -> tuple[int, int]:
    """ultralytics' `load_image` (rect_mode): the long side resized to S, the short one rounded up."""
    r = S / max(w0, h0)
    if r == 1:
        return w0, h0
    return min(math.ceil(w0 * r), S), min(math.ceil(h0 * r), S)


@numba.njit(cache=True)
def letterbox_padding(w: int, h: int, S: int) -> tuple[int, int, int, int]:
    """ultralytics' centred `LetterBox` padding (left, top, right, bottom) of a w x h image already fitting S x S."""
    # round(d -+ 0.1) of a multiple of 0.5 never meets a tie, so floor(x + 0.5) is Python's round here
    dw, dh = (S - w) / 2, (S - h) / 2
    return (math.floor(dw - 0.1 + 0.5), math.floor(dh - 0.1 + 0.5), math.floor(dw + 0.1 + 0.5),
            math.floor(dh + 0.1 + 0.5))


@numba.njit(cache=True)
def _mosaic4(S, xc, yc, wh):
    """ultralytics' `Mosaic._mosaic4` placement: per tile (rows of int64 [4, 6]) the canvas rectangle (x1a, y1a,
    x2a, y2a) it fills and the offset (padw, padh) of its resized image's origin on the 2S x 2S canvas."""
    out = np.zeros((4, 6), np.int64)
    for i in range(4):
        w, h = wh[i, 0], wh[i, 1]
        if i == 0:  # top left
            x1a, y1a, x2a, y2a = max(xc - w, 0), max(yc - h, 0), xc, yc
            x1b, y1b = w - (x2a - x1a), h - (y2a - y1a)
        elif i == 1:  # top right
            x1a, y1a, x2a, y2a = xc, max(yc - h, 0), min(xc + w, S * 2), yc
            x1b, y1b = 0, h - (y2a - y1a)
        elif i == 2:  # bottom left
            x1a, y1a, x2a, y2a = max(xc - w, 0), yc, xc, min(S * 2, yc + h)
            x1b, y1b = w - (x2a - x1a), 0
        else:  # bottom right
            x1a, y1a, x2a, y2a = xc, yc, min(xc + w, S * 2), min(S * 2, yc + h)
            x1b, y1b = 0, 0
        out[i, 0], out[i, 1], out[i, 2], out[i, 3] = x1a, y1a, x2a, y2a
        out[i, 4], out[i, 5] = x1a - x1b, y1a - y1b
    return out


@numba.njit(cache=True)
def _matmul3(a, b):
    out = np.zeros((3, 3))
    for i in range(3):
        for j in range(3):
            out[i, j] = a[i, 0] * b[0, j] + a[i, 1] * b[1, j] + a[i, 2] * b[2, j]
    return out


@numba.njit(cache=True)
def _perspective(u, degrees, translate, scale, shear, canvas, S):
    """ultralytics' `RandomPerspective.affine_transform` matrix (perspective 0) for a canvas x canvas input and an
    S x S output, and its scale draw s (box_candidates' factor)."""
    C = np.eye(3)
    C[0, 2] = C[1, 2] = -canvas / 2
    a = math.radians(-degrees + 2 * degrees * u[_ANGLE])
    s = 1 - scale + 2 * scale * u[_SCALE]
    R = np.eye(3)  # cv2.getRotationMatrix2D(angle=a, center=(0, 0), scale=s)
    R[0, 0], R[0, 1], R[1, 0], R[1, 1] = s * math.cos(a), s * math.sin(a), -s * math.sin(a), s * math.cos(a)
    Sh = np.eye(3)
    Sh[0, 1] = math.tan(math.radians(-shear + 2 * shear * u[_SHEAR_X]))
    Sh[1, 0] = math.tan(math.radians(-shear + 2 * shear * u[_SHEAR_Y]))
    T = np.eye(3)
    T[0, 2] = (0.5 - translate + 2 * translate * u[_TX]) * S
    T[1, 2] = (0.5 - translate + 2 * translate * u[_TY]) * S
    return _matmul3(_matmul3(_matmul3(T, Sh), R), C), s


@numba.njit(cache=True)
def _centre_rule(lo, hi):
    """The whole pixels [X0, X1) whose centres lie in [lo, hi): shared edges give neither a gap nor an overlap."""
    a, b = math.ceil(lo - 0.5), math.ceil(hi - 0.5)
    return a, max(a, b)


def plan_batch(sample_ids, sizes, image_size: int, epoch: int, seed: int, aug: DetectAugment | None = None,
               train: bool = True, epochs: int | None = None, objects=None) -> BatchGeometry:
    """The geometry of one batch: sample_ids int [B] (each output's own sample), sizes int [B, 2] (stored width,
    height of each position), image_size S, the epoch and seed, the augmentation (None: DetectAugment()), train
    (False: the evaluation letterbox) and the run's `epochs` (for close_mosaic); `objects`: (boxes [M, 4], labels
    [M], start [N + 1]) of every sample (`Targets.trainable`), which the IoU crop needs (aug.iou_crop > 0). Output
    k's draws depend on (seed, epoch, sample_ids[k]) and, for its partners, the batch size only."""
    ids = np.asarray(sample_ids, dtype=np.int64).reshape(-1)
    wh0 = np.ascontiguousarray(np.asarray(sizes, dtype=np.int64).reshape(-1, 2))
    aug = DetectAugment() if aug is None else aug
    if not isinstance(aug, DetectAugment):
        raise ValueError(f"aug must be a DetectAugment, got {type(aug).__name__}")
    S = int(image_size)
    B = len(ids)
    if B == 0 or len(wh0) != B:
        raise ValueError(f"need one (width, height) per sample id and at least one sample: {B} ids, {len(wh0)} sizes")
    if S < 1 or (wh0 < 1).any():
        raise ValueError("image_size and every stored width and height must be >= 1")
    mosaic_allowed = train and aug.mosaic > 0 and not (epochs is not None and epoch >= epochs - aug.close_mosaic)
    axis_aligned = aug.axis_aligned or not train

    g = dict(n_tiles=np.ones(B, np.int64), source=np.full((B, _MAX_TILES), -1, np.int64),
             affine=np.zeros((B, _MAX_TILES, 2, 3)), region=np.zeros((B, _MAX_TILES, 4)),
             dst_rect=np.zeros((B, _MAX_TILES, 4), np.int64), src_rect=np.zeros((B, _MAX_TILES, 4)),
             quad=np.zeros((B, _MAX_TILES, 4, 2)), box_scale=np.ones((B, _MAX_TILES, 2)), flip=np.zeros(B, bool),
             flipud=np.zeros(B, bool), hsv=np.ones((B, 3)), scale=np.zeros(B), pad=np.zeros((B, 2)))
    if train:
        entropy = sample_entropy(seed, epoch, ids)
        u = first_draws(entropy, _DRAWS)
        mosaic = (u[:, _MOSAIC] < aug.mosaic) & mosaic_allowed
        _plan_train(u, mosaic, wh0, S, (-S) // 2, aug.degrees, aug.translate, aug.scale, aug.shear, axis_aligned,
                    g["n_tiles"], g["source"], g["affine"], g["region"], g["dst_rect"], g["src_rect"], g["quad"],
                    g["box_scale"], g["scale"], g["pad"])
        cropped = np.flatnonzero(~mosaic & (u[:, _IOU_CROP] < aug.iou_crop))
        if len(cropped) and objects is None:
            raise ValueError("DetectAugment(iou_crop=...) draws windows around the boxes: pass objects=")
        if len(cropped):
            windows = iou_crop.crop_windows(entropy[cropped], _DRAWS, wh0[cropped], objects[0], objects[2],
                                            ids[cropped])
            iou_crop.fill_tiles(g, cropped, windows, wh0[cropped], S)
        g["flip"] = u[:, _FLIP] < aug.fliplr
        g["flipud"] = u[:, _FLIP_UD] < aug.flipud
        g["hsv"] = (2 * u[:, _HSV:_HSV + 3] - 1) * (aug.hsv_h, aug.hsv_s, aug.hsv_v) + 1
    else:
        _plan_eval(wh0, S, g["source"], g["affine"], g["region"], g["dst_rect"], g["src_rect"], g["quad"],
                   g["scale"], g["pad"])
    return BatchGeometry(image_size=S, train=bool(train), axis_aligned=axis_aligned, pad_value=int(aug.pad_value),
                         sizes=wh0, **g)


# The planners fill the batch's arrays in numba with the GIL released: in the Loader they run beside the training
# loop's own Python.
@numba.njit(nogil=True, cache=True)
def _plan_eval(wh0, S, source, affine, region, dst_rect, src_rect, quad, scale, pad):
    """Long-side resize + centred LetterBox(S, scaleup=False): exact whole-pixel rectangles, no resampling error."""
    for k in range(len(wh0)):
        w0, h0 = wh0[k, 0], wh0[k, 1]
        w, h = long_side_size(w0, h0, S)
        left, top, _, _ = letterbox_padding(w, h, S)
        source[k, 0] = k
        affine[k, 0, 0, 0], affine[k, 0, 0, 2] = w / w0, left
        affine[k, 0, 1, 1], affine[k, 0, 1, 2] = h / h0, top
        region[k, 0, 2], region[k, 0, 3] = w0, h0
        src_rect[k, 0, 2], src_rect[k, 0, 3] = w0, h0
        dst_rect[k, 0, 0], dst_rect[k, 0, 1], dst_rect[k, 0, 2], dst_rect[k, 0, 3] = left, top, left + w, top + h
        for c, (x, y) in enumerate(((left, top), (left + w, top), (left + w, top + h), (left, top + h))):
            quad[k, 0, c, 0], quad[k, 0, c, 1] = x, y
        scale[k] = S / max(w0, h0)
        pad[k, 0], pad[k, 1] = left, top


@numba.njit(nogil=True, cache=True)
def _plan_train(u, mosaic, wh0, S, border, degrees, translate, scale_gain, shear, axis_aligned, n_tiles, source,
                affine, region, dst_rect, src_rect, quad, box_scale, scale, pad):
    B = len(wh0)
    sources = np.zeros(4, np.int64)
    resized = np.zeros((4, 2), np.int64)
    for k in range(B):
        if mosaic[k]:
            sources[0] = k
            for i in range(3):  # 3 partners other than k, with replacement
                j = min(int(u[k, _PARTNERS + i] * (B - 1)), B - 2)
                sources[i + 1] = k if B == 1 else j + (j >= k)
            n = 4
            xc = int(-border + (2 * S + 2 * border) * u[k, _XC])
            yc = int(-border + (2 * S + 2 * border) * u[k, _YC])
            for i in range(4):
                resized[i, 0], resized[i, 1] = long_side_size(wh0[sources[i], 0], wh0[sources[i], 1], S)
            places = _mosaic4(S, xc, yc, resized)
            canvas = 2 * S
        else:
            sources[0] = k
            n = 1
            w, h = long_side_size(wh0[k, 0], wh0[k, 1], S)
            left, top, _, _ = letterbox_padding(w, h, S)
            resized[0, 0], resized[0, 1] = w, h
            places = np.zeros((4, 6), np.int64)
            places[0, 0], places[0, 1], places[0, 2], places[0, 3] = left, top, left + w, top + h
            places[0, 4], places[0, 5] = left, top
            canvas = S
        M, s = _perspective(u[k], degrees, translate, scale_gain, shear, canvas, S)
        n_tiles[k] = n
        for t in range(n):
            j = sources[t]
            w, h = resized[t, 0], resized[t, 1]
            x1a, y1a, x2a, y2a, padw, padh = places[t]
            w0, h0 = wh0[j, 0], wh0[j, 1]
            sx, sy = w / w0, h / h0
            place = np.eye(3)
            place[0, 0], place[0, 2], place[1, 1], place[1, 2] = sx, padw, sy, padh
            A = _matmul3(M, place)
            r = ((x1a - padw) / sx, (y1a - padh) / sy, (x2a - padw) / sx, (y2a - padh) / sy)
            # quad from canvas coordinates: tiles sharing an edge get bit-identical edges
            lo_x = lo_y = np.inf
            hi_x = hi_y = -np.inf
            for c, (x, y) in enumerate(((x1a, y1a), (x2a, y1a), (x2a, y2a), (x1a, y2a))):
                qx = x * M[0, 0] + y * M[0, 1] + M[0, 2]
                qy = x * M[1, 0] + y * M[1, 1] + M[1, 2]
                quad[k, t, c, 0], quad[k, t, c, 1] = qx, qy
                lo_x, hi_x, lo_y, hi_y = min(lo_x, qx), max(hi_x, qx), min(lo_y, qy), max(hi_y, qy)
            X0, X1 = _centre_rule(min(max(lo_x, 0.0), S), min(max(hi_x, 0.0), S))
            Y0, Y1 = _centre_rule(min(max(lo_y, 0.0), S), min(max(hi_y, 0.0), S))
            source[k, t] = j
            for a in range(2):
                for b in range(3):
                    affine[k, t, a, b] = A[a, b]
            for i in range(4):
                region[k, t, i] = r[i]
            dst_rect[k, t, 0], dst_rect[k, t, 1], dst_rect[k, t, 2], dst_rect[k, t, 3] = X0, Y0, X1, Y1
            if axis_aligned:
                src_rect[k, t, 0] = (X0 - A[0, 2]) / A[0, 0]
                src_rect[k, t, 1] = (Y0 - A[1, 2]) / A[1, 1]
                src_rect[k, t, 2] = (X1 - A[0, 2]) / A[0, 0]
                src_rect[k, t, 3] = (Y1 - A[1, 2]) / A[1, 1]
            else:
                for i in range(4):
                    src_rect[k, t, i] = r[i]
            box_scale[k, t, 0], box_scale[k, t, 1] = s * sx, s * sy
            if t == 0:
                scale[k] = s * S / max(w0, h0)
                pad[k, 0], pad[k, 1] = A[0, 2], A[1, 2]


def box_candidates(box1: np.ndarray, box2: np.ndarray, wh_thr: float = 2, ar_thr: float = 100,
                   area_thr: float = 0.1, eps: float = 1e-16) -> np.ndarray:
    """ultralytics' `RandomPerspective.box_candidates` on [n, 4] XYXY arrays: box2 (after the augmentation) is kept
    when it is over wh_thr pixels wide and high, keeps over area_thr of box1's area (box1: before, at the same
    scale) and has an aspect ratio under ar_thr."""
    w1, h1 = box1[:, 2] - box1[:, 0], box1[:, 3] - box1[:, 1]
    w2, h2 = box2[:, 2] - box2[:, 0], box2[:, 3] - box2[:, 1]
    ar = np.maximum(w2 / (h2 + eps), h2 / (w2 + eps))
    return (w2 > wh_thr) & (h2 > wh_thr) & (w2 * h2 / (w1 * h1 + eps) > area_thr) & (ar < ar_thr)


def transform_boxes(geometry: BatchGeometry, k: int, boxes_per_tile, labels_per_tile, return_keep: bool = False):
    """Output k's boxes (float32 [n, 4] XYXY output pixels) and labels (int64 [n]) from each tile's source boxes
    (stored-image pixels, XYXY; one array per tile of `geometry.tiles(k)`, in that order). ultralytics' rule: clip
    to what the tile shows, transform (4 corners, min/max), clip to [0, S], keep the box_candidates (training
    only), flip. return_keep: also which of the given boxes (all tiles' in order, bool) were kept."""
    S = geometry.image_size
    out_boxes, out_labels, kept = [], [], []
    tiles = geometry.tiles(k)
    if len(boxes_per_tile) != len(tiles) or len(labels_per_tile) != len(tiles):
        raise ValueError(f"output {k} has {len(tiles)} tiles: give one box array and one label array per tile")
    for tile, boxes, labels in zip(tiles, boxes_per_tile, labels_per_tile):
        b = np.asarray(boxes, dtype=np.float64).reshape(-1, 4)
        lab = np.asarray(labels, dtype=np.int64).reshape(-1)
        if len(b) != len(lab):
            raise ValueError(f"{len(b)} boxes but {len(lab)} labels")
        if not len(b):
            kept.append(np.zeros(0, bool))
            continue
        A = tile.affine
        if geometry.axis_aligned:
            # Mosaic's clip to the tile (in output pixels: M and the resize are diagonal), then to the pixels drawn.
            lin, off = np.array([A[0, 0], A[1, 1]] * 2), np.array([A[0, 2], A[1, 2]] * 2)
            region = np.array(tile.region) * lin + off
            before = _clip(b * lin + off, region)
            after = _clip(before, np.array(tile.dst_rect, dtype=np.float64))
        else:
            inside = _clip(b, np.array(tile.region))
            bs = np.array(tile.box_scale * 2)
            before = inside * bs  # box1: only its width and height matter
            xs, ys = inside[:, [0, 2, 2, 0]], inside[:, [1, 1, 3, 3]]
            X = A[0, 0] * xs + A[0, 1] * ys + A[0, 2]
            Y = A[1, 0] * xs + A[1, 1] * ys + A[1, 2]
            after = _clip(np.stack([X.min(1), Y.min(1), X.max(1), Y.max(1)], axis=1), np.array([0, 0, S, S], float))
        # Mosaic drops boxes its clip leaves without area before RandomPerspective sees them.
        keep = (before[:, 2] > before[:, 0]) & (before[:, 3] > before[:, 1])
        if geometry.train:
            keep &= box_candidates(before, after)
        else:
            keep &= (after[:, 2] > after[:, 0]) & (after[:, 3] > after[:, 1])
        out_boxes.append(after[keep])
        out_labels.append(lab[keep])
        kept.append(keep)
    boxes = np.concatenate(out_boxes) if out_boxes else np.zeros((0, 4))
    labels = np.concatenate(out_labels) if out_labels else np.zeros(0, np.int64)
    n = len(boxes)
    _mirror(boxes, np.full(n, geometry.flip[k]), np.full(n, geometry.flipud[k]), S)
    if return_keep:
        return boxes.astype(np.float32), labels.astype(np.int64), np.concatenate(kept) if kept else np.zeros(0, bool)
    return boxes.astype(np.float32), labels.astype(np.int64)


def _mirror(boxes: np.ndarray, lr: np.ndarray, ud: np.ndarray, S: int) -> None:
    """Boxes [n, 4] of S x S outputs mirrored in place, x -> S - x where `lr`, y -> S - y where `ud` (bool [n])."""
    b = boxes[lr]
    boxes[lr] = np.stack([S - b[:, 2], b[:, 1], S - b[:, 0], b[:, 3]], axis=1)
    b = boxes[ud]
    boxes[ud] = np.stack([b[:, 0], S - b[:, 3], b[:, 2], S - b[:, 1]], axis=1)


def _clip(boxes: np.ndarray, rect: np.ndarray) -> np.ndarray:
    """Boxes [n, 4] clipped to rect (x0, y0, x1, y1)."""
    out = boxes.copy()
    np.clip(out[:, 0::2], rect[0], rect[2], out=out[:, 0::2])
    np.clip(out[:, 1::2], rect[1], rect[3], out=out[:, 1::2])
    return out


def transform_batch_boxes(geometry: BatchGeometry, sample_of_position, objects, return_source: bool = False):
    """`transform_boxes` for every output of an axis-aligned geometry at once, to the same bits: (boxes float32
    [N, 4], labels int64 [N], the output of each box int64 [N]), in output, tile and object order.
    sample_of_position: int [B], the sample id at each batch position; objects: (boxes [M, 4], labels [M],
    start [S + 1]) of every sample's objects to train on (`Targets.trainable`). return_source: also each box's
    row in `objects` and its tile (int64 [N] each)."""
    if not geometry.axis_aligned:
        raise ValueError("transform_batch_boxes takes axis-aligned geometries; see transform_boxes")
    S = geometry.image_size
    all_boxes, all_labels, start = objects
    used = np.arange(geometry.source.shape[1])[None, :] < geometry.n_tiles[:, None]
    k, t = np.nonzero(used)  # row-major: output, then tile order
    ids = np.asarray(sample_of_position, np.int64)[geometry.source[k, t]]
    counts = start[ids + 1] - start[ids]
    first = np.repeat(start[ids], counts)
    within = np.arange(int(counts.sum()), dtype=np.int64) - np.repeat(np.cumsum(counts) - counts, counts)
    rows = first + within
    tile_of = np.repeat(np.arange(len(k)), counts)
    b = all_boxes[rows].astype(np.float64)
    A = geometry.affine[k, t][tile_of]
    lin = np.stack([A[:, 0, 0], A[:, 1, 1], A[:, 0, 0], A[:, 1, 1]], axis=1)
    off = np.stack([A[:, 0, 2], A[:, 1, 2], A[:, 0, 2], A[:, 1, 2]], axis=1)
    region = geometry.region[k, t][tile_of] * lin + off
    before = _clip_rows(b * lin + off, region)
    after = _clip_rows(before, geometry.dst_rect[k, t][tile_of].astype(np.float64))
    keep = (before[:, 2] > before[:, 0]) & (before[:, 3] > before[:, 1])
    if geometry.train:
        keep &= box_candidates(before, after)
    else:
        keep &= (after[:, 2] > after[:, 0]) & (after[:, 3] > after[:, 1])
    out = k[tile_of][keep]
    boxes = after[keep]
    _mirror(boxes, geometry.flip[out], geometry.flipud[out], S)
    result = boxes.astype(np.float32), all_labels[rows][keep].astype(np.int64), out.astype(np.int64)
    if return_source:
        return (*result, rows[keep].astype(np.int64), t[tile_of][keep].astype(np.int64))
    return result


def _clip_rows(boxes: np.ndarray, rect: np.ndarray) -> np.ndarray:
    """Boxes [n, 4] each clipped to its own rect [n, 4] (x0, y0, x1, y1), as `_clip` does with one rect."""
    lo = rect[:, [0, 1, 0, 1]]
    hi = rect[:, [2, 3, 2, 3]]
    return np.minimum(np.maximum(boxes, lo), hi)
