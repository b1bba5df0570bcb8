"""Instance masks: each kept object's polygons through its tile's affine, drawn into its output as an index map.
An object annotated by a mask instead (COCO's RLE, fastfeed/rle.py) is drawn as semantic masks are: each output
pixel of its tile takes the mask's pixel under its centre (masks.py's nearest-neighbour rule).

An object's outline polygons (the sample's annotation, stored-image pixels: COCO polygons, YOLO segments) go through
the same affine as its pixels and its box, are clipped to what its tile shows (the tile's quadrilateral, then its
destination rectangle, both convex: Sutherland-Hodgman), mirrored when the output is flipped, and filled by the
pixels' own rule: an output pixel belongs to the polygon when its centre lies inside (even-odd, so holes stay holes).

Output k's map holds, per pixel, 1 + the index of its object among output k's boxes (batch order), 0 where none:
ultralytics' overlap masks (`overlap_mask=True`) at full resolution, and `map == i + 1` is torchvision's binary mask
of box i. Where objects overlap, the smaller one (by box area) is drawn last and stays visible, as ultralytics
orders them. Rendered on the CPU's threads on both decode paths, so both give the same maps.
"""
from __future__ import annotations

import numpy as np

from fastfeed.decode.numba_import import import_numba
from fastfeed.rle import decode_rle

numba = import_numba()

__all__ = ["render_instances", "has_masks", "outline_boxes"]


@numba.njit(nogil=True, cache=True)
def _clip(px, py, cx, cy):
    """Polygon (px, py) clipped by the convex polygon (cx, cy) (either orientation): Sutherland-Hodgman."""
    n = len(cx)
    area = 0.0
    for i in range(n):
        area += cx[i] * cy[(i + 1) % n] - cx[(i + 1) % n] * cy[i]
    sign = 1.0 if area >= 0 else -1.0
    for i in range(n):
        ax, ay, bx, by = cx[i], cy[i], cx[(i + 1) % n], cy[(i + 1) % n]
        m = len(px)
        if m == 0:
            break
        ox = np.empty(2 * m, np.float64)
        oy = np.empty(2 * m, np.float64)
        k = 0
        for j in range(m):
            sx, sy, ex, ey = px[j - 1], py[j - 1], px[j], py[j]  # j - 1 = -1 wraps to the last point
            ds = sign * ((bx - ax) * (sy - ay) - (by - ay) * (sx - ax))
            de = sign * ((bx - ax) * (ey - ay) - (by - ay) * (ex - ax))
            if de >= 0:
                if ds < 0:
                    f = ds / (ds - de)
                    ox[k], oy[k] = sx + f * (ex - sx), sy + f * (ey - sy)
                    k += 1
                ox[k], oy[k] = ex, ey
                k += 1
            elif ds >= 0:
                f = ds / (ds - de)
                ox[k], oy[k] = sx + f * (ex - sx), sy + f * (ey - sy)
                k += 1
        px, py = ox[:k], oy[:k]
    return px, py


@numba.njit(nogil=True, cache=True)
def _fill(canvas, px, py, value):
    """Set the pixels whose centres lie inside polygon (px, py) (even-odd) to `value`."""
    n = len(px)
    if n < 3:
        return
    H, W = canvas.shape
    y0 = max(0, int(np.floor(py.min() - 0.5)))
    y1 = min(H, int(np.ceil(py.max() + 0.5)))
    xs = np.empty(n, np.float64)
    for y in range(y0, y1):
        yc = y + 0.5
        m = 0
        for i in range(n):
            ay, by = py[i - 1], py[i]
            if (ay <= yc) != (by <= yc):  # the edge crosses the centre line (half-open: each vertex counted once)
                ax, bx = px[i - 1], px[i]
                xs[m] = ax + (yc - ay) * (bx - ax) / (by - ay)
                m += 1
        row = np.sort(xs[:m])
        for i in range(0, m - 1, 2):
            # the pixels whose centres x + 0.5 lie in [row[i], row[i + 1])
            a = max(0, int(np.ceil(row[i] - 0.5)))
            b = min(W, int(np.ceil(row[i + 1] - 0.5)))
            for x in range(a, b):
                canvas[y, x] = value


@numba.njit(nogil=True, cache=True)
def _draw(canvas, points, A, quad, rect, flip, S, value):
    """One polygon (source pixels, float [P, 2]) through affine A [2, 3], clipped to `quad` [4, 2] and `rect`
    (x0, y0, x1, y1), mirrored when `flip`, filled into canvas with `value`."""
    P = len(points)
    px = np.empty(P, np.float64)
    py = np.empty(P, np.float64)
    for i in range(P):
        x, y = points[i, 0], points[i, 1]
        px[i] = A[0, 0] * x + A[0, 1] * y + A[0, 2]
        py[i] = A[1, 0] * x + A[1, 1] * y + A[1, 2]
    px, py = _clip(px, py, quad[:, 0].copy(), quad[:, 1].copy())
    rx = np.array([rect[0], rect[2], rect[2], rect[0]], np.float64)
    ry = np.array([rect[1], rect[1], rect[3], rect[3]], np.float64)
    px, py = _clip(px, py, rx, ry)
    if flip:
        px = S - px
    _fill(canvas, px, py, value)


def outline_boxes(geometry, targets, objects, batch_idx, tiles, boxes: np.ndarray) -> np.ndarray:
    """Training boxes of objects with an outline made the bounds of what their tile shows of it, as ultralytics
    takes a segment's bounds after its augmentation: a box cut by a tile's or crop's edge, or turned, is otherwise
    the cut or turned box's bounds, larger than the object (a triangle's, say). `objects` int64 [N] are the boxes'
    Targets rows, `tiles` the tile each came through; `boxes` float32 [N, 4] is changed in place. Returns keep bool
    [N]: False where the object shows no outline, or one 2 px or less across (box_candidates' side rule)."""
    keep = np.ones(len(boxes), bool)
    if targets.poly_start is None or not len(boxes):
        return keep
    g = geometry
    _outline_boxes(boxes, np.asarray(objects, np.int64), np.asarray(batch_idx, np.int64),
                   np.asarray(tiles, np.int64), g.affine, g.quad, g.dst_rect.astype(np.float64), g.flip, g.flipud,
                   float(g.image_size), targets.poly_start, targets.pt_start, targets.points, keep)
    return keep


@numba.njit(nogil=True, cache=True)
def _outline_boxes(boxes, objects, batch_idx, tiles, affine, quad, dst_rect, flip, flipud, S, poly_start, pt_start,
                   points, keep):
    for i in range(len(boxes)):
        j = objects[i]
        if poly_start[j + 1] == poly_start[j]:  # no outline: the box stays
            continue
        k, t = batch_idx[i], tiles[i]
        A = affine[k, t]
        cx, cy = quad[k, t, :, 0].copy(), quad[k, t, :, 1].copy()
        r = dst_rect[k, t]
        rx = np.array([r[0], r[2], r[2], r[0]])
        ry = np.array([r[1], r[1], r[3], r[3]])
        x0 = y0 = np.inf
        x1 = y1 = -np.inf
        for q in range(poly_start[j], poly_start[j + 1]):
            pts = points[pt_start[q]:pt_start[q + 1]]
            px = A[0, 0] * pts[:, 0] + A[0, 1] * pts[:, 1] + A[0, 2]
            py = A[1, 0] * pts[:, 0] + A[1, 1] * pts[:, 1] + A[1, 2]
            px, py = _clip(px, py, cx, cy)
            px, py = _clip(px, py, rx, ry)
            if len(px) >= 3:
                x0, x1 = min(x0, px.min()), max(x1, px.max())
                y0, y1 = min(y0, py.min()), max(y1, py.max())
        if not (x1 - x0 > 2 and y1 - y0 > 2):
            keep[i] = False
            continue
        if flip[k]:
            x0, x1 = S - x1, S - x0
        if flipud[k]:
            y0, y1 = S - y1, S - y0
        boxes[i, 0], boxes[i, 1], boxes[i, 2], boxes[i, 3] = x0, y0, x1, y1


def has_masks(targets) -> bool:
    """Whether any object has an outline or a mask to draw (polygons, or an RLE)."""
    return targets.poly_start is not None or targets.rle is not None


def without_masks(targets) -> np.ndarray:
    """bool [M]: the objects trained on (not crowd regions) that have neither a polygon nor an RLE mask: their
    instance masks come out empty."""
    missing = ~targets.iscrowd
    if targets.poly_start is not None:
        missing &= np.diff(targets.poly_start) == 0
    if targets.rle is not None:
        missing &= np.array([r is None for r in targets.rle], dtype=bool)
    return missing


def missing_masks_note(targets, keys) -> str | None:
    """A warning's text when some objects trained on have no outline (a partly segmented set: their instance masks
    come out empty, which a mask loss takes for an object of no pixels), naming the first such sample; else None.
    None too for a set with no outline at all, which the decoder refuses (DetectDecoder): no promise before that."""
    if not has_masks(targets):
        return None
    rows = np.flatnonzero(without_masks(targets))
    if not len(rows):
        return None
    images = np.searchsorted(targets.start, rows, side="right") - 1  # the sample of each such object, ascending
    return (f"{len(rows)} of {int((~targets.iscrowd).sum())} objects (in {len(np.unique(images))} images, the first "
            f"{keys[int(images[0])]}) have no polygon or mask: task='segment' gives them empty instance masks (0 "
            "pixels) beside their boxes")


def render_instances(geometry, k: int, targets, objects, tiles, boxes, out: np.ndarray) -> None:
    """Output k's index map into `out` (int16 [S, S], zeroed here): `objects` int64 [n] are the Targets rows of
    output k's boxes in order, `tiles` int64 [n] the tile each came through, `boxes` float [n, 4] the boxes (for
    the drawing order)."""
    out[...] = 0
    S = geometry.image_size
    area = (boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])
    flip = bool(geometry.flip[k])
    for i in np.argsort(-area, kind="stable"):  # the largest first: smaller objects stay visible on top
        t, j = int(tiles[i]), int(objects[i])
        A, quad = geometry.affine[k, t], geometry.quad[k, t]
        rect = geometry.dst_rect[k, t].astype(np.float64)
        polygons = range(targets.poly_start[j], targets.poly_start[j + 1]) if targets.poly_start is not None else ()
        for q in polygons:
            pts = targets.points[targets.pt_start[q]:targets.pt_start[q + 1]].astype(np.float64)
            _draw(out, pts, A, quad, rect, flip, S, i + 1)
        if not len(polygons) and targets.rle is not None and targets.rle[j] is not None:
            _draw_rle(out, decode_rle(targets.rle[j]), geometry, k, t, i + 1)
    if geometry.flipud[k]:
        out[...] = out[::-1].copy()


def _draw_rle(out: np.ndarray, mask: np.ndarray, geometry, k: int, t: int, value: int) -> None:
    """A binary mask (uint8 [h, w]; its grid laid over the stored image, the same size for COCO) drawn where it is 1
    into tile t of output k, by the nearest-neighbour rule semantic masks follow."""
    from fastfeed.detect.masks import nearest_tile, tile_view

    dst = tile_view(out, geometry, k, t)
    if dst is None:
        return
    w0, h0 = geometry.sizes[int(geometry.source[k, t])]
    drawn = np.zeros(dst.shape, np.uint8)
    nearest_tile(mask, geometry, k, t, drawn, mask.shape[1] / w0, mask.shape[0] / h0)
    dst[drawn == 1] = value
