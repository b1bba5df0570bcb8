"""The SSD-style IoU crop, `DetectAugment(iou_crop=p)`: an output drawn for it shows a window of its image stretched to
S x S, instead of the letterbox and the random affine (what DALI's `random_bbox_crop` + resize and torchvision's SSD
recipe do).

The window is torchvision's `RandomIoUCrop` (SSD's sampler): draw a minimum IoU from OPTIONS (None: the whole
image); try TRIALS windows of 30-100% of each side with an aspect ratio in [0.5, 2], at whole-pixel offsets; the
first one that holds the centre of at least one box, and overlaps one of those boxes with at least that IoU, is it.
The draws come from the sample's own stream (geometry.sample_rng's, after its fixed draws), so the window is a
function of (seed, epoch, sample id); an image without boxes, or MAX_DRAWS draws without a window, keeps the whole
image. The boxes then follow the one rule of every training output (geometry.box_candidates against the whole box
at the output's scale), not SSD's centre rule: a box the window cuts to under 10% of its area is dropped, the rest
are clipped to it.
"""
from __future__ import annotations

import numpy as np

from fastfeed.decode.numba_import import import_numba
from fastfeed.detect.streams import STATE_WORDS, below, entropy_rows, next_double, seed_stream

numba = import_numba()

__all__ = ["crop_windows", "fill_tiles", "OPTIONS", "TRIALS", "MAX_DRAWS"]

OPTIONS = (0.0, 0.1, 0.3, 0.5, 0.7, 0.9, None)  # minimum IoU; None: no crop (torchvision's 2.0)
TRIALS = 40  # windows tried per drawn option
MAX_DRAWS = 50  # options drawn before the whole image is kept (torchvision draws until one succeeds)
SCALE = (0.3, 1.0)  # of each side
ASPECT = (0.5, 2.0)  # width / height


def crop_windows(entropy, skip: int, sizes, boxes, start, sources) -> np.ndarray:
    """int64 [n, 4]: (left, top, width, height) in whole source pixels, per output to crop: its sample's stream
    (entropy [n, words], streams.py, past its first `skip` draws), its image's size (sizes [n, 2]: w0, h0) and its
    boxes (XYXY source pixels), boxes[start[s]:start[s + 1]] for its sample s = sources[i]."""
    e = entropy_rows(entropy)
    sizes = np.ascontiguousarray(sizes, dtype=np.int64).reshape(-1, 2)
    boxes = np.ascontiguousarray(boxes, dtype=np.float64).reshape(-1, 4)
    start = np.ascontiguousarray(start, dtype=np.int64)
    sources = np.ascontiguousarray(sources, dtype=np.int64).reshape(-1)
    if not len(e) == len(sizes) == len(sources):
        raise ValueError(f"need one stream, size and sample per output: {len(e)}, {len(sizes)}, {len(sources)}")
    return _crop_windows(e, int(skip), sizes, boxes, start, sources)


# The draws are numpy's (streams.py): a window is a function of its sample's stream alone, as if drawn with the
# sample's numpy Generator (tests/test_detect_geometry.py draws them so). Compiled, because a batch of 64 drawn with
# numpy's small-array operations held the GIL for several milliseconds.
_LEAST = np.array([-1.0 if v is None else v for v in OPTIONS])  # -1: no crop


@numba.njit(cache=True, nogil=True)
def _crop_windows(entropy, skip, sizes, boxes, start, sources):
    out = np.empty((len(sources), 4), np.int64)
    state = np.empty(STATE_WORDS, np.uint64)
    for k in range(len(sources)):
        seed_stream(entropy[k], state)
        for _ in range(skip):
            next_double(state)
        s = sources[k]
        out[k] = _crop_window(state, sizes[k, 0], sizes[k, 1], boxes[start[s]:start[s + 1]])
    return out


@numba.njit(cache=True)
def _crop_window(state, w0, h0, boxes):
    n = boxes.shape[0]
    if n == 0:
        return np.array((0, 0, w0, h0), np.int64)
    u = np.empty((TRIALS, 4))
    for _ in range(MAX_DRAWS):
        least = _LEAST[below(state, len(_LEAST))]
        if least < 0:
            break
        for t in range(TRIALS):
            for c in range(4):
                u[t, c] = next_double(state)
        for t in range(TRIALS):
            w = np.int64(w0 * (SCALE[0] + (SCALE[1] - SCALE[0]) * u[t, 0]))
            h = np.int64(h0 * (SCALE[0] + (SCALE[1] - SCALE[0]) * u[t, 1]))
            if w <= 0 or h <= 0 or not ASPECT[0] <= w / max(h, 1) <= ASPECT[1]:
                continue
            left, top = np.int64((w0 - w) * u[t, 2]), np.int64((h0 - h) * u[t, 3])
            right, bottom = left + w, top + h
            best = -1.0
            for i in range(n):
                cx, cy = (boxes[i, 0] + boxes[i, 2]) / 2, (boxes[i, 1] + boxes[i, 3]) / 2
                if left < cx < right and top < cy < bottom:
                    iw = max(min(right, boxes[i, 2]) - max(left, boxes[i, 0]), 0.0)
                    ih = max(min(bottom, boxes[i, 3]) - max(top, boxes[i, 1]), 0.0)
                    inter = iw * ih
                    area = (boxes[i, 2] - boxes[i, 0]) * (boxes[i, 3] - boxes[i, 1])
                    best = max(best, inter / (w * h + area - inter))
            if best >= least:  # best stays -1 (below every least) unless a box centre lies inside
                return np.array((left, top, w, h), np.int64)
    return np.array((0, 0, w0, h0), np.int64)


def fill_tiles(g: dict, outputs, windows, sizes, S: int) -> None:
    """Make each output k of plan_batch's arrays `g` (outputs [n]) its window (windows [n, 4]: left, top, width,
    height) of its image (sizes [n, 2]) stretched to S x S: one tile of its own image. Its region is the whole image
    (what the box rule clips to before weighing what the window keeps; the rotated renderer draws it through the
    affine and the output's edges cut the window out)."""
    _fill_tiles(np.asarray(outputs, np.int64), np.asarray(windows, np.int64), np.asarray(sizes, np.int64), int(S),
                g["n_tiles"], g["source"], g["affine"], g["region"], g["dst_rect"], g["src_rect"], g["quad"],
                g["box_scale"], g["scale"], g["pad"])


@numba.njit(cache=True, nogil=True)
def _fill_tiles(outputs, windows, sizes, S, n_tiles, source, affine, region, dst_rect, src_rect, quad, box_scale,
                scale, pad):
    for i in range(len(outputs)):
        k = outputs[i]
        L, T, W, H = windows[i, 0], windows[i, 1], windows[i, 2], windows[i, 3]
        w0, h0 = sizes[i, 0], sizes[i, 1]
        sx, sy = S / W, S / H
        n_tiles[k] = 1
        source[k, :] = -1
        source[k, 0] = k
        affine[k, 0, 0, 0], affine[k, 0, 0, 1], affine[k, 0, 0, 2] = sx, 0.0, -L * sx
        affine[k, 0, 1, 0], affine[k, 0, 1, 1], affine[k, 0, 1, 2] = 0.0, sy, -T * sy
        region[k, 0, 0], region[k, 0, 1], region[k, 0, 2], region[k, 0, 3] = 0, 0, w0, h0
        dst_rect[k, 0, 0], dst_rect[k, 0, 1], dst_rect[k, 0, 2], dst_rect[k, 0, 3] = 0, 0, S, S
        src_rect[k, 0, 0], src_rect[k, 0, 1], src_rect[k, 0, 2], src_rect[k, 0, 3] = L, T, L + W, T + H
        for c, (x, y) in enumerate(((0, 0), (w0, 0), (w0, h0), (0, h0))):
            quad[k, 0, c, 0], quad[k, 0, c, 1] = x * sx + -L * sx, y * sy + -T * sy
        box_scale[k, 0, 0], box_scale[k, 0, 1] = sx, sy
        scale[k] = sx
        pad[k, 0], pad[k, 1] = -L * sx, -T * sy
