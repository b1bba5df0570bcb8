"""`DetectDecoder`: a ring batch of encoded images -> a detection batch on the device, on the CPU's threads.

Per batch: every image is decoded once (PIL; the decode contract's RGB); a sample that does not decode is replaced by
another of its batch (decode/base.py's rule, as on every path) before anything else, so a replaced position is an
exact copy of its replacement; the batch's geometry is drawn (`geometry.plan_batch`, a function of the seed, the
epoch and the sample ids), each output is rendered (`render.render`) and its boxes transformed by the same geometry.
The pixels go to the device as uint8 (a quarter of float32's bytes) and are normalised there.

`GpuDetectDecoder` (detect/gpu.py) differs in two steps only: DALI decodes on the GPU and gpu_render.py draws there.
"""
from __future__ import annotations

import importlib.util
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import torch

from fastfeed.decode.base import (BAD_FIELD, DECODE_ERROR, MISSING_FIELD, NOT_IMAGE, Replaced, is_image,
                                  replaced_list, resolve_errors, starts_with_png)
from fastfeed.decode.cpu import starts_with_soi
from fastfeed.decode.recycle import OutputBuffers, SourceArena
from fastfeed.detect.geometry import plan_batch, transform_batch_boxes, transform_boxes
from fastfeed.detect.hsv import apply_hsv_torch, finish_nhwc
from fastfeed.detect.instances import has_masks, outline_boxes, render_instances
from fastfeed.detect.masks import DEFAULT_IGNORE_INDEX, MaskError, decode_mask, render_mask
from fastfeed.detect.render import DRAFT_MIN_SCALE, decode_for, decoded_nbytes, render, source_zooms
from fastfeed.targets import Targets

__all__ = ["DetectDecoder", "DetectRequest", "DetectResult"]

# torch's CUDA wheels bring Triton; without it the HSV gains take torch's operations. Found, not imported: that
# costs a second, paid only when a batch first goes to a GPU.
_HAVE_TRITON = importlib.util.find_spec("triton") is not None


@dataclass(frozen=True)
class DetectRequest:
    """What the detection geometry of a batch is drawn from: its sample ids and the epoch; for segmentation also
    each position's encoded mask (None where the sample has none: it is replaced)."""

    ids: np.ndarray
    epoch: int
    masks: list | None = None
    pil: np.ndarray | None = None  # bool [B]: Windows.pil's flags, for the GPU path's decoder

    def __len__(self) -> int:
        return len(self.ids)


@dataclass
class DetectResult:
    """images [B, 3, S, S]; targets: boxes float32 [N, 4] XYXY output pixels, labels int64 [N], batch_idx int64 [N]
    (the image each box belongs to), ids int64 [B] (sample ids), orig_size int64 [B, 2] (stored height, width),
    scale and pad float32 [B, 2] (x, y): output = stored * scale + pad, for each image's own sample (exact unless
    the training geometry rotates or shears); for a request with masks, masks uint8 or uint16 [B, S, S] (class ids,
    `ignore_index` where no source pixel is) and no boxes, labels or batch_idx;
    replaced: positions holding another sample of the batch."""

    images: torch.Tensor
    targets: dict
    replaced: list[Replaced]


def _one_pass(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether the GPU's last pass is hsv.finish_nhwc (Triton): with Triton, and for bfloat16 output on a GPU that
    stores it natively (compute capability 8 or more); else torch's operations."""
    if not _HAVE_TRITON:
        return False
    return dtype != torch.bfloat16 or torch.cuda.get_device_capability(device)[0] >= 8


class DetectDecoder:
    def __init__(self, *, targets: Targets, widths, heights, image_size: int, augment, train: bool, seed: int,
                 epochs: int | None, device, dtype, channels_last: bool, mean, std, num_threads: int,
                 on_error: str, ignore_index: int = DEFAULT_IGNORE_INDEX, instances: bool = False,
                 orientations=None):
        self.targets = targets
        # uint8 [N] EXIF tags when the annotations are in the displayed frame (widths/heights are then displayed
        # sizes): each image is decoded as displayed. None: as stored.
        self.orientations = None if orientations is None else np.asarray(orientations, np.uint8)
        self._objects = targets.trainable()
        self.widths, self.heights = np.asarray(widths, np.int64), np.asarray(heights, np.int64)
        self.image_size, self.augment, self.train, self.seed, self.epochs = image_size, augment, train, seed, epochs
        self.device, self.dtype, self.channels_last = torch.device(device), dtype, channels_last
        self.on_error, self.ignore_index, self.instances = on_error, ignore_index, instances
        if instances and not has_masks(targets):
            raise ValueError("instance masks are drawn from the objects' polygons or RLE masks; this dataset's "
                             "annotations have none (COCO polygons or RLE, YOLO segments)")
        self._object_of_row = np.flatnonzero(~targets.iscrowd)  # Targets.trainable() row -> Targets row
        self._mean = torch.tensor(mean, dtype=torch.float32).view(1, 3, 1, 1) * 255
        self._std = torch.tensor(std, dtype=torch.float32).view(1, 3, 1, 1) * 255
        self._pool = ThreadPoolExecutor(max_workers=num_threads, thread_name_prefix="fastfeed-detect")
        self._threads = num_threads
        self._buffers = OutputBuffers()  # _render's batches (one layout and size per decoder)
        self._arena = SourceArena()  # _decode_all's decoded sources

    @classmethod
    def from_settings(cls, s, targets: Targets, widths, heights, orientations=None) -> "DetectDecoder":
        """The decoder of a Loader with LoaderSettings `s` over a dataset with `targets`, the images' sizes in the
        annotations' frame and their EXIF tags when that frame is the displayed one."""
        return cls(**cls.settings_kwargs(s, targets, widths, heights, orientations))

    @staticmethod
    def settings_kwargs(s, targets: Targets, widths, heights, orientations=None) -> dict:
        """DetectDecoder's arguments from LoaderSettings `s` (subclasses add their own)."""
        return dict(targets=targets, widths=widths, heights=heights, orientations=orientations,
                    image_size=s.image_size, augment=s.augment,
                    train=s.train, seed=s.seed, epochs=s.epochs, device=s.device, dtype=s.dtype,
                    channels_last=s.channels_last, mean=s.mean, std=s.std, num_threads=s.decode_threads,
                    on_error=s.on_error, ignore_index=s.ignore_index, instances=s.task == "segment")

    def __call__(self, samples, request: DetectRequest) -> DetectResult:
        n = len(samples)
        if n != len(request):
            raise ValueError(f"{n} samples but {len(request)} sample ids")
        drawn = self._plan(np.asarray(request.ids, dtype=np.int64), request.epoch)  # before any replacement
        decoded, bad = self._decode_all(samples, request, drawn)
        bad.update(self._other_size(decoded, request.ids, bad))
        masks = None
        if request.masks is not None:
            masks, mask_bad = self._decode_masks(request)
            for p, why in mask_bad.items():
                bad.setdefault(p, why)
        repl = resolve_errors(bad, n, self.on_error)  # raises under "raise", or when nothing in the batch decodes
        src = np.array([repl.get(k, k) for k in range(n)], dtype=np.int64)
        ids = np.asarray(request.ids, dtype=np.int64)[src]
        geometry = drawn
        if repl:  # drawn again; a replacement may show a source larger than the draft its own position needed
            geometry = self._plan(ids, request.epoch)
            self._redecode_where_short(decoded, samples, request, src, geometry)
        # On a GPU the HSV gains are one batched pass there (fastfeed/detect/hsv.py): a third of the CPU's work.
        gpu_hsv = self.device.type == "cuda" and bool((geometry.hsv != 1).any())
        pixels = self._render(decoded, src, geometry, hsv=not gpu_hsv)

        targets = {
            "ids": torch.from_numpy(ids.copy()),
            "orig_size": torch.from_numpy(np.stack([self.heights[ids], self.widths[ids]], axis=1)),
            # The own tile's map: diag(scale) and pad, exact for evaluation and axis-aligned training batches; the
            # flips come after it (x -> S - x, y -> S - y), so each output says whether it was flipped.
            "scale": torch.from_numpy(geometry.affine[:, 0, [0, 1], [0, 1]].astype(np.float32)),
            "pad": torch.from_numpy(geometry.affine[:, 0, :, 2].astype(np.float32)),
            "flipped": torch.from_numpy(geometry.flip.copy()),
            "flipped_ud": torch.from_numpy(geometry.flipud.copy()),
        }
        if masks is not None:
            targets["masks"] = self._render_masks(masks, src, geometry)
        else:
            boxes, labels, batch_idx, rows, tiles = self._boxes(geometry, ids)
            if self.train:
                keep = outline_boxes(geometry, self.targets, self._object_of_row[rows], batch_idx, tiles, boxes)
                if not keep.all():
                    boxes, labels, batch_idx, rows, tiles = (a[keep] for a in (boxes, labels, batch_idx, rows, tiles))
            targets.update(boxes=torch.from_numpy(boxes.reshape(-1, 4)), labels=torch.from_numpy(labels),
                           batch_idx=torch.from_numpy(batch_idx))
            if self.instances:
                targets["masks"] = self._render_instances(geometry, boxes, batch_idx, rows, tiles)
        return DetectResult(self._to_device(pixels, geometry.hsv if gpu_hsv else None), targets, replaced_list(bad))

    def _boxes(self, geometry, ids):
        """(boxes float32 [N, 4], labels int64 [N], batch_idx int64 [N], rows int64 [N], tiles int64 [N]) of the
        batch, rows being each box's object in `Targets.trainable()` and tiles the tile it came through: in one pass
        for an axis-aligned geometry, else output by output."""
        if geometry.axis_aligned:
            return transform_batch_boxes(geometry, ids, self._objects, return_source=True)
        start = self._objects[2]

        def one(k: int):
            per_tile = [np.arange(start[ids[t.source]], start[ids[t.source] + 1]) for t in geometry.tiles(k)]
            b, lab, keep = transform_boxes(geometry, k, [self._objects[0][r] for r in per_tile],
                                           [self._objects[1][r] for r in per_tile], return_keep=True)
            none = [np.zeros(0, np.int64)]
            rows = np.concatenate(per_tile + none)
            tile = np.concatenate([np.full(len(r), t, np.int64) for t, r in enumerate(per_tile)] + none)
            return b, lab, rows[keep], tile[keep]

        per_image = self._each(one, range(len(ids)))
        counts = [len(lab) for _, lab, _, _ in per_image]
        return (np.concatenate([b for b, _, _, _ in per_image]).astype(np.float32, copy=False).reshape(-1, 4),
                np.concatenate([lab for _, lab, _, _ in per_image]).astype(np.int64, copy=False),
                np.repeat(np.arange(len(ids), dtype=np.int64), counts),
                np.concatenate([r for _, _, r, _ in per_image]).astype(np.int64, copy=False),
                np.concatenate([t for _, _, _, t in per_image]).astype(np.int64, copy=False))

    def _render_instances(self, geometry, boxes, batch_idx, rows, tiles) -> torch.Tensor:
        """The outputs' instance index maps int16 [B, S, S] (fastfeed/detect/instances.py), on the CPU."""
        objects = self._object_of_row[rows]  # Targets rows (crowd regions included) hold the polygons
        S = self.image_size
        out = np.empty((len(geometry), S, S), np.int16)
        bounds = np.searchsorted(batch_idx, np.arange(len(geometry) + 1))

        def one(k: int):
            a, b = bounds[k], bounds[k + 1]
            render_instances(geometry, k, self.targets, objects[a:b], tiles[a:b], boxes[a:b], out[k])

        self._each(one, range(len(geometry)))
        return torch.from_numpy(out)

    def _decode_masks(self, request: DetectRequest):
        """Each position's mask decoded and checked against its image's stored size (None where it fails), and
        {position: (code, detail)} of the failures."""
        def decode(p: int):
            data, i = request.masks[p], int(request.ids[p])
            if data is None:
                return None, (MISSING_FIELD, "no mask member")
            try:
                return decode_mask(data, (int(self.widths[i]), int(self.heights[i]))), None
            except MaskError as e:
                return None, (BAD_FIELD, f"mask: {e}")

        results = self._each(decode, range(len(request.ids)))
        return [m for m, _ in results], {p: why for p, (_, why) in enumerate(results) if why is not None}

    def _render_masks(self, masks, src, geometry) -> torch.Tensor:
        """The outputs' masks [B, S, S] on the CPU (both paths: a gather, fastfeed/detect/masks.py), uint16 when
        any source mask of the batch or the ignore index needs it."""
        sources = [masks[j] for j in src]
        wide = self.ignore_index > 255 or any(m.dtype == np.uint16 for m in sources)
        dtype = np.uint16 if wide else np.uint8
        sources = [m.astype(dtype, copy=False) for m in sources]
        S = self.image_size
        out = np.empty((len(src), S, S), dtype=dtype)
        self._each(lambda k: render_mask(sources, geometry, k, self.ignore_index, out=out[k]), range(len(src)))
        return torch.from_numpy(out)

    def _render(self, decoded, src, geometry, hsv: bool) -> torch.Tensor:
        """The outputs as uint8 [B, S, S, 3] (here on the CPU): position k's sources are decoded[src[...]]. For a
        CPU batch in NCHW (the default layout) the memory is already NCHW: each output's last pass writes it planar,
        on its own thread (one more pass over the batch on the consumer's side otherwise)."""
        images = [decoded[j] for j in src]
        S, B = self.image_size, len(src)
        planar = self.device.type == "cpu" and not self.channels_last
        shape = (B, 3, S, S) if planar else (B, S, S, 3)
        batch = self._buffers.take(B, lambda: torch.empty(shape, dtype=torch.uint8))
        pixels = batch.numpy()
        self._each(lambda k: render(images, geometry, k, hsv=hsv, out=pixels[k], planar=planar), range(B))
        return batch.permute(0, 2, 3, 1) if planar else batch

    def _each(self, fn, *columns) -> list:
        """[fn(*row) for row in zip(*columns)] on the pool, several rows a task: about four tasks a thread, so each
        thread stays busy to the batch's end, where a task a row costs the hand-off (a future, a lock, a wake-up)
        per image and per output: 6% of the CPU path's time on one core."""
        rows = list(zip(*columns))
        per = max(1, -(-len(rows) // (4 * self._threads)))
        parts = self._pool.map(lambda a: [fn(*row) for row in rows[a:a + per]], range(0, len(rows), per))
        return [r for part in parts for r in part]

    def _plan(self, ids: np.ndarray, epoch: int):
        sizes = np.stack([self.widths[ids], self.heights[ids]], axis=1)
        return plan_batch(ids, sizes, self.image_size, epoch=epoch, seed=self.seed, aug=self.augment,
                          train=self.train, epochs=self.epochs, objects=self._objects)

    def _decode_all(self, samples, request: DetectRequest, drawn):
        """Each sample decoded once for every tile that shows it (render.Decoded; None where it fails), and
        {position: (code, detail)} of the failures. The batch's geometry as `drawn` says how far each source is
        shrunk, so a JPEG shrunk enough decodes at a DCT-scaled draft. Every sample is decoded by the decode
        contract here, `request.pil` (for the GPU path) or not."""
        ids = np.asarray(request.ids, np.int64)
        zooms = source_zooms(drawn)
        pil = request.pil if request.pil is not None else np.zeros(len(samples), dtype=bool)
        # the JPEGs and PNGs the native core decodes (all but PIL's) go into one recycled buffer
        tags = np.ones(len(ids), np.int64) if self.orientations is None else self.orientations[ids]
        outs = self._arena.take([decoded_nbytes((self.widths[i], self.heights[i]), z, t, draft=starts_with_soi(s))
                                 if (starts_with_soi(s) or starts_with_png(s)) and not p else 0
                                 for s, i, z, t, p in zip(samples, ids.tolist(), zooms.tolist(), tags.tolist(),
                                                          pil.tolist())])
        results = self._each(self._decode_one, samples, ids.tolist(), zooms.tolist(), pil.tolist(), outs)
        return [img for img, _ in results], {p: why for p, (_, why) in enumerate(results) if why is not None}

    def _decode_one(self, sample, i: int, zoom: float, pil_only: bool = False, out: np.ndarray | None = None):
        """(render.Decoded, None) or (None, (code, detail)) for sample id `i`'s bytes, its tiles magnifying it by at
        most `zoom` (into `out` when the native core decodes it and it fits)."""
        if not is_image(sample, pil_only):
            return None, (NOT_IMAGE, "unknown file signature")
        tag = 1 if self.orientations is None else int(self.orientations[i])
        try:
            size = (self.widths[i], self.heights[i])
            return decode_for(sample, size, zoom, tag, native=not pil_only, out=out), None
        except Exception as e:  # noqa: BLE001 - any decoder failure is this sample's, reported by its key
            return None, (DECODE_ERROR, f"{type(e).__name__}: {e}")

    def _redecode_where_short(self, decoded, samples, request, src, geometry) -> None:
        """Decode again, at the draft `geometry` needs, each source whose draft was for a smaller zoom (a replaced
        position shows its replacement with its own draws)."""
        zooms = source_zooms(geometry)
        pil = request.pil if request.pil is not None else np.zeros(len(samples), dtype=bool)
        for j in sorted(set(src.tolist())):
            need = zooms[src == j].max()
            d = decoded[j]
            if d is not None and min(d.fx, d.fy) < min(1.0, DRAFT_MIN_SCALE * need):
                i = int(request.ids[j])
                decoded[j] = self._decode_one(samples[j], i, need, bool(pil[j]))[0] or d

    def _decoded_sizes(self, decoded) -> np.ndarray:
        """(width, height) int64 [n, 2] of each decoded position's full-size image (anything for the failed ones)."""
        return np.array([(0, 0) if d is None else (d.width, d.height) for d in decoded], np.int64).reshape(-1, 2)

    def _other_size(self, decoded, ids, bad) -> dict:
        """{position: (code, detail)} of the decoded images whose size is not the sample table's: the geometry and
        the boxes are drawn on that size, so such an image (a decoder that read another EXIF tag, say) is a bad
        sample, never a batch with boxes off its pixels."""
        got = self._decoded_sizes(decoded)
        ids = np.asarray(ids, np.int64)
        want = np.stack([self.widths[ids], self.heights[ids]], axis=1)
        out = {}
        for p in np.flatnonzero((got != want).any(axis=1)).tolist():
            if p not in bad:
                out[p] = (DECODE_ERROR, f"decoded {got[p, 0]}x{got[p, 1]}, the sample table says "
                                        f"{want[p, 0]}x{want[p, 1]}")
        return out

    def _to_device(self, pixels: torch.Tensor, hsv_gains: np.ndarray | None = None) -> torch.Tensor:
        """[B, S, S, 3] uint8 (NHWC memory, or NCHW memory seen as NHWC: `_render`) -> [B, 3, S, S] in the Loader's
        dtype and layout, HSV gains [B, 3] applied (when given) and normalised on the device."""
        t = pixels
        if t.device.type != self.device.type:
            t = t.pin_memory().to(self.device, non_blocking=True)
        fmt = torch.channels_last if self.channels_last else torch.contiguous_format
        gains = None if hsv_gains is None else torch.from_numpy(hsv_gains.astype(np.float32))
        if t.is_cuda and t.is_contiguous() and _one_pass(t.device, self.dtype):
            out = torch.empty((t.shape[0], 3, t.shape[1], t.shape[2]), dtype=self.dtype, device=t.device,
                              memory_format=fmt)
            norm = self.dtype != torch.uint8
            return finish_nhwc(t, gains, out=out, mean=self._mean.view(3) if norm else None,
                               std=self._std.view(3) if norm else None)
        t = t.permute(0, 3, 1, 2)  # NCHW view of NHWC memory: channels_last already
        if gains is not None:
            t = apply_hsv_torch(t, gains)
        if self.dtype != torch.uint8:
            t = ((t.float() - self._mean.to(t.device)) / self._std.to(t.device)).to(self.dtype)
        return t.contiguous(memory_format=fmt)

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        self._buffers.clear()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

