"""CPU decoder: pillow-simd decode with JPEG draft mode, SIMD crop+resize, numba-fused flip/normalize/layout.

Per sample, on a thread pool, a few samples per task (PIL and the numba kernel both release the GIL):
  1. `Image.draft("RGB", size)` lets libjpeg-turbo downscale by 1/2, 1/4 or 1/8 in the DCT domain, choosing the
     largest factor that still leaves the crop window at least `draft_min_scale * S` pixels on each side. DCT
     scaling is sharper than PIL's antialiased bilinear, so on large detailed photos it can move the output past
     the contract's 2/255 of a full decode: use draft=False where the output must match torchvision's eval
     transform; for training augmentation the speed is worth it (docs/design/decoders.md#draft);
  2. the decode contract (docs/decode-contract.md; fastfeed/image/contract.py): EXIF orientation applied when
     orientation="exif" (JPEG only), any mode (L, CMYK, P, RGBA, LA, 1, I;16, ...) -> RGB, alpha dropped, 16-bit ->
     v >> 8;
  3. `Image.resize((S, S), BILINEAR, box=window)` crops and antialias-resizes in one SIMD pass (the box is in float
     source coordinates, so the draft scale costs no precision, and the filter reads pixels just outside the box
     exactly as resize-then-crop would). A training crop (a box on whole pixels) of an RGB or grey JPEG shown as stored
     decodes only the rows and columns that resize reads, through the native core's window decode
     (`_resized_region`): the same bits for less decode work (docs/design/decoders.md#cpu-pil);
  4. a numba kernel flips, normalizes through a [3, 256] lookup table of the output dtype's bit patterns (exact, and
     float16/bfloat16 need no float16 support in numba) and writes CHW or HWC straight into the batch tensor.

Output buffers: with device="cpu" a batch is written into memory of an earlier batch only once nothing references
that memory any more (fastfeed/decode/recycle.py), else into a new tensor; so nothing handed out is ever
overwritten.
With a CUDA device the batch is built in one of two pinned staging buffers and copied on torch's current stream;
a staging buffer is reused only after the CUDA event recorded behind its copy has completed.
"""
from __future__ import annotations

import io
import math
from concurrent.futures import ThreadPoolExecutor

import numpy as np
from PIL import Image

from fastfeed import _native
from fastfeed.constants import IMAGENET_MEAN, IMAGENET_STD
from fastfeed.decode.base import (DECODE_ERROR, NOT_IMAGE, DecodeResult, apply_replacements, check_common,
                                  is_image, replaced_list, resolve_errors, starts_with_png)
from fastfeed.decode.crop import DEFAULT_ORIENTATION, Windows
from fastfeed.decode.kernels import emit_chw, emit_hwc
from fastfeed.decode.lut import make_lut, numpy_view
from fastfeed.decode.recycle import OutputBuffers
from fastfeed.image.contract import TRANSPOSE, contract_image, orientation_tag, to_rgb
from fastfeed.image.headers import png_text_over_limit, swaps_axes, without_png_text

__all__ = ["PilDecoder", "decode_rgb", "starts_with_soi", "whole_jpeg_rgbx", "whole_png_rgbx"]

_STAGING_BUFFERS = 2


def _draft_size(W: int, H: int, w: float, h: float, S: float) -> tuple[int, int]:
    """Smallest full-image size at which the window is still >= S on both axes (draft never goes below it)."""
    f = max(S / max(w, 1), S / max(h, 1))
    return max(1, int(np.ceil(W * f))), max(1, int(np.ceil(H * f)))


_MIN_BOX = 1e-3  # the narrowest box side, in source pixels: only keeps a degenerate window valid


def decode_rgb(sample, box: tuple[float, float, float, float], image_size: int, draft_min_scale=None,
               orientation: str = DEFAULT_ORIENTATION):
    """Decode one record and return the float source box (x0, y0, x1, y1), in displayed-image coordinates,
    resized to uint8 [S, S, 3] (no flip).

    draft_min_scale: use JPEG draft mode only while the box stays >= draft_min_scale * S pixels (None: never).
    orientation: "exif" displays JPEGs by their EXIF orientation tag first; "ignore" decodes them as stored.
    Raises on a bad record.
    """
    bx0, by0, bx1, by1 = box
    # PIL raises on truncated data (ImageFile.LOAD_TRUNCATED_IMAGES stays False), so a cut record is reported.
    img = Image.open(io.BytesIO(memoryview(sample)))
    tag = orientation_tag(sample, img, orientation)
    W0, H0 = img.size
    if swaps_axes(tag):  # the displayed image is the stored one transposed
        W0, H0 = H0, W0
    # Clamp to the decoded image: the packer's header size may disagree with what the file really holds.
    # (draft's scale factor is the same on both axes, so the box may be in displayed or stored coordinates.)
    # A box may be under a pixel wide (eval's centre crop of a 1 x 4000 image): it is kept as it is, not widened.
    x0 = min(max(bx0, 0.0), W0 - _MIN_BOX)
    y0 = min(max(by0, 0.0), H0 - _MIN_BOX)
    x1 = min(max(bx1, x0 + _MIN_BOX), float(W0))
    y1 = min(max(by1, y0 + _MIN_BOX), float(H0))
    if img.format == "JPEG" and draft_min_scale is not None:
        img.draft("RGB", _draft_size(W0, H0, x1 - x0, y1 - y0, image_size * draft_min_scale))
    if tag == 1 and img.format == "JPEG" and img.mode in ("RGB", "L") and img.size == (W0, H0) and _REGION_DECODE \
            and all(float(v).is_integer() for v in (x0, y0, x1, y1)) and _ends_with_eoi(sample):
        out = _resized_region(sample, (x0, y0, x1, y1), image_size)
        if out is not None:
            return out
    if img.format == "PNG":
        got = whole_png_rgbx(sample)
        if got is not None:  # PIL's pixels, in PIL's layout for RGB: resized as RGBX, the pad byte dropped after
            img = Image.frombuffer("RGBX", got[1], got[0], "raw", "RGBX", 0, 1)
            if tag != 1:
                img = img.transpose(TRANSPOSE[tag])
            out = img.resize((image_size, image_size), Image.BILINEAR, box=(x0, y0, x1, y1))
            return np.asarray(out)[:, :, :3]
    img.load()
    if tag != 1:
        img = img.transpose(TRANSPOSE[tag])
    W1, H1 = img.size
    sx, sy = W1 / W0, H1 / H0
    img = to_rgb(img)
    out = img.resize((image_size, image_size), Image.BILINEAR, box=(x0 * sx, y0 * sy, x1 * sx, y1 * sy))
    return np.asarray(out)


# The native core's window decode (csrc/jpeg_transcode.h decode_jpeg_region), when it was built with libjpeg.
_REGION_DECODE = _native.decode_jpeg_region if _native.HAVE_LIBJPEG else None


def starts_with_soi(sample) -> bool:
    """Whether the record starts with JPEG's start-of-image marker."""
    return len(sample) >= 4 and sample[0] == 0xFF and sample[1] == 0xD8


def _ends_with_eoi(sample) -> bool:
    """Whether the record ends with JPEG's end-of-image marker. A window decode never reads the rows below the
    window, so it would not notice a file cut short there, which PIL's full decode reports: such a record (or one
    with bytes after its EOI) is decoded whole."""
    return len(sample) >= 2 and sample[-2] == 0xFF and sample[-1] == 0xD9


def whole_jpeg_rgbx(sample, out: np.ndarray | None = None, scale: int = 1):
    """(uint8 [h, w, 4] RGBX, the full image's (width, height)): the stored pixels of an RGB or grey JPEG (grey
    replicated into R, G and B, as PIL converts L to RGB), decoded by the native core: libjpeg's pixels with PIL's
    settings, in PIL's own layout, so a PIL image can wrap them (`Image.frombuffer`) where PIL's decode would need a
    copy out of its memory for numpy. `scale` 2, 4 or 8: at that DCT scale, as PIL's draft decodes (the same
    pixels). Into `out` (a uint8 buffer, from its start) when they fit:
    the array is then a view of it. None where that does not apply (another format or colour space, a record that
    does not end with its end marker, no native libjpeg) or the native decode refuses the file: the caller decodes it
    with PIL, by the contract's rules. No PIL header parse first: the native decode reads the header and refuses what
    PIL would hold in another mode than RGB or L."""
    if not (_REGION_DECODE and starts_with_soi(sample) and _ends_with_eoi(sample)):
        return None
    got = _REGION_DECODE(sample, 0, 0, _WHOLE, _WHOLE, out, scale)
    if isinstance(got, str):
        return None
    rgbx, _, _, W, H = got
    if rgbx.shape[:2] != (-(-H // scale), -(-W // scale)):
        return None
    return rgbx, (W, H)


_WHOLE = 1 << 30  # a window edge past any image's: the whole image


def whole_png_rgbx(sample, out: np.ndarray | None = None):
    """(uint8 [h, w, 4] RGBX, the image's (width, height)): an 8-bit grey, RGB or palette PNG without transparency,
    decoded by the native core (csrc/png_decode.h: PIL's pixels, its inflate about 2.5x faster than zlib's), into
    `out` (a uint8 buffer, from its start) when they fit. None for any other file or PNG, or where the native decode
    refuses it (damaged data): the caller decodes it with PIL, by the contract's rules."""
    if not starts_with_png(sample):
        return None
    got = _native.decode_png_rgbx(sample, out)
    if isinstance(got, str):
        return None
    return got, (got.shape[1], got.shape[0])


def _resized_region(sample, box, image_size: int):
    """`decode_rgb` of an RGB or grey JPEG shown as stored, decoding only the rows and columns the resize reads: the
    window plus the filter's support (the downscale factor, at least a pixel) and two pixels more, which keep the
    first and last column of a cropped decode (upsampled without their outer neighbours: they differ from a full
    decode's) out of reach. The pixels equal the full decode's and the resize sees the same box shifted by whole
    pixels: for a box on whole pixels (training crops) the output is the full decode's bit for bit
    (tests/test_decode_cpu.py); a fractional box (eval's exact resize) would round the filter's weights differently
    (1/255 on 0.02% of values), so it is decoded whole. Why: libjpeg's full decode is most of the CPU path's time per
    image, and a RandomResizedCrop window covers about half of the image on average
    (docs/design/decoders.md#cpu-pil). None when the native decode refuses the file (corrupt data, another colour
    space): the caller decodes it whole, with PIL's rules."""
    x0, y0, x1, y1 = box
    mx = math.ceil(max((x1 - x0) / image_size, 1.0)) + 2
    my = math.ceil(max((y1 - y0) / image_size, 1.0)) + 2
    got = _REGION_DECODE(sample, int(x0) - mx, int(y0) - my, math.ceil(x1) + mx, math.ceil(y1) + my)
    if isinstance(got, str):
        return None
    pixels, rx, ry, _, _ = got
    # RGBX, PIL's own layout for RGB: wrapped, not copied (an RGB buffer would be converted pixel by pixel)
    img = Image.frombuffer("RGBX", (pixels.shape[1], pixels.shape[0]), pixels, "raw", "RGBX", 0, 1)
    out = img.resize((image_size, image_size), Image.BILINEAR, box=(x0 - rx, y0 - ry, x1 - rx, y1 - ry))
    return np.asarray(out)[:, :, :3]


# Pool tasks per decode thread and batch (PilDecoder.__call__): 4 images per task for a batch of 64 on 2 threads.
# Several images per task save the pool's per-task cost, which matters for small images, and still leave enough
# tasks to keep every thread busy. docs/design/decoders.md#cpu-pil
TASKS_PER_THREAD = 8


class PilDecoder:
    """pillow-simd + numba batch decoder.

    Args: device ("cpu" or "cuda"/"cuda:N"), image_size S, dtype (torch float16/bfloat16/float32/uint8; uint8 skips
    normalization), channels_last (NHWC memory), mean/std (in [0, 1] units), num_threads (decode threads),
    on_error ("skip" replaces a corrupt record by another sample of the batch, "raise" raises
    CorruptSampleError), batch_size (size of the staging buffers; larger batches are accepted and grow them),
    draft (JPEG DCT-domain downscaling, see the module docstring), draft_min_scale (the crop keeps at least this
    many times S pixels per side after drafting), orientation ("ignore" | "exif": the EXIF policy of the decode
    contract; windows must be on the displayed size, fastfeed.decode.crop.oriented_size).
    """

    def __init__(self, *, device="cpu", image_size=224, dtype=None, channels_last=False, mean=None, std=None,
                 num_threads=2, on_error="skip", batch_size=256, draft=True, draft_min_scale=2.0,
                 orientation=DEFAULT_ORIENTATION):
        import torch

        dtype = torch.float32 if dtype is None else dtype  # what the Loader gives by default
        mean = IMAGENET_MEAN if mean is None else tuple(mean)
        std = IMAGENET_STD if std is None else tuple(std)
        self._dtype_name = check_common(image_size, dtype, mean, std, on_error, batch_size, num_threads, orientation)
        self.orientation = orientation
        self.device = torch.device(device)
        self.image_size = int(image_size)
        self.dtype = dtype
        self.channels_last = bool(channels_last)
        self.on_error = on_error
        self._lut = make_lut(self._dtype_name, mean, std)
        self._threads = int(num_threads)
        self._pool = ThreadPoolExecutor(max_workers=self._threads, thread_name_prefix="fastfeed-decode")
        self._staging: list = []  # (pinned tensor, event or None) when the output goes to a CUDA device
        self._recycle = OutputBuffers()
        self._next_staging = 0
        self._batch_size = int(batch_size)
        self._draft = float(draft_min_scale) if draft else None
        if self._draft is not None and self._draft < 1.0:
            raise ValueError(f"draft_min_scale must be >= 1, got {draft_min_scale}")
        self._closed = False

    def _alloc(self, n: int, pinned: bool):
        import torch

        S = self.image_size
        shape = (n, S, S, 3) if self.channels_last else (n, 3, S, S)
        return torch.empty(shape, dtype=self.dtype, pin_memory=pinned)

    def _cpu_output(self, n: int):
        return self._recycle.take(n, lambda: self._alloc(max(n, self._batch_size), pinned=False))

    def _host_buffer(self, n: int):
        if self.device.type == "cpu":
            return self._cpu_output(n), None
        if not self._staging:
            self._staging = [[None, None] for _ in range(_STAGING_BUFFERS)]
        slot = self._staging[self._next_staging]
        self._next_staging = (self._next_staging + 1) % _STAGING_BUFFERS
        if slot[1] is not None:
            slot[1].synchronize()  # the H2D copy that last read this buffer has finished
        if slot[0] is None or slot[0].shape[0] < n:
            slot[0] = self._alloc(max(n, self._batch_size), pinned=True)
        return slot[0][:n], slot

    def _some(self, lo, hi, samples, boxes, flips, pil, out_np):
        return [self._one(i, samples[i], boxes[i], flips[i], pil is not None and pil[i], out_np)
                for i in range(lo, hi)]

    def _one(self, i, sample, box, flip, pil_only, out_np):
        if not is_image(sample, pil_only):
            return i, (NOT_IMAGE, "unknown file signature")
        try:
            try:
                rgb = decode_rgb(sample, box, self.image_size, self._draft, self.orientation)
            except ValueError as e:  # PIL's text-chunk limit: the pixels decode without the text
                if not png_text_over_limit(e):
                    raise
                rgb = decode_rgb(without_png_text(sample), box, self.image_size, self._draft, self.orientation)
        except Exception as e:  # noqa: BLE001 - any decode failure is a corrupt record, reported per position
            return i, (DECODE_ERROR, f"{type(e).__name__}: {e}")
        (emit_hwc if self.channels_last else emit_chw)(rgb, self._lut, bool(flip), out_np[i])
        return i, None

    def __call__(self, samples, windows: Windows) -> DecodeResult:
        if self._closed:
            raise RuntimeError("decoder is closed")
        n = len(samples)
        if n != len(windows):
            raise ValueError(f"{n} samples but {len(windows)} windows")
        if n == 0:
            raise ValueError("empty batch")
        host, slot = self._host_buffer(n)
        out_np = numpy_view(host)
        boxes = windows.box.tolist()
        # A few images per pool task, not one: every task's hand-off (its future, the wake-up of this thread, the GIL
        # changing hands) costs about what decoding a thumbnail does. TASKS_PER_THREAD tasks per thread keep the
        # threads evenly loaded when image sizes differ.
        step = max(1, n // (self._threads * TASKS_PER_THREAD))
        futs = [self._pool.submit(self._some, lo, min(lo + step, n), samples, boxes, windows.flip, windows.pil, out_np)
                for lo in range(0, n, step)]
        bad = {}
        for f in futs:
            for i, err in f.result():
                if err is not None:
                    bad[i] = err
        repl = resolve_errors(bad, n, self.on_error)
        apply_replacements(host, repl)
        images = host if slot is None else self._to_device(host, slot)
        if self.channels_last:
            images = images.permute(0, 3, 1, 2)
        return DecodeResult(images, replaced_list(bad))

    def whole(self, samples, pil_only: bool = False) -> list:
        """Each sample decoded whole by the decode contract, pixels as stored (no orientation): (uint8 [h, w, 3],
        None), or (None, (code, detail)) where it fails. DALI's decoder uses this for the samples it routes here
        (decode/dali.py decode_whole): `pil_only` ones (is_image), and PNGs the native core decodes."""
        def one(sample):
            if not is_image(sample, pil_only):
                return None, (NOT_IMAGE, "unknown file signature")
            try:
                rgb = _native.decode_png_rgb(sample) if starts_with_png(sample) else None
                if isinstance(rgb, np.ndarray):  # (else a reason: PIL decodes it)
                    return rgb, None
                return np.asarray(contract_image(sample, "ignore")), None
            except Exception as e:  # noqa: BLE001 - any decode failure is a corrupt record, reported per position
                return None, (DECODE_ERROR, f"{type(e).__name__}: {e}")

        if self._closed:
            raise RuntimeError("decoder is closed")
        return list(self._pool.map(one, samples))

    def _to_device(self, host, slot):
        import torch

        out = torch.empty(host.shape, dtype=host.dtype, device=self.device)
        out.copy_(host, non_blocking=True)
        ev = torch.cuda.Event()
        ev.record(torch.cuda.current_stream(self.device))
        slot[1] = ev
        return out

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._pool.shutdown(wait=True)
            self._staging = []
            self._recycle.clear()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
