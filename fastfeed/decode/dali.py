"""DALI decoder: fused ROI decode (GPU `mixed`, hardware JPEG decoder where present, or CPU), antialiased resize,
crop-mirror-normalize; fed through external_source straight from the ring's slot views.

Pipeline (one per decoder, batch_size = the largest batch it accepts; smaller batches are fed as they are):
    raw  --decoders.image_slice(anchor, shape: whole-pixel ROI, "WH")--> RGB uint8 HWC (only the ROI is decoded)
         --resize(S x S, linear, antialias, roi = the exact float box inside the ROI)-->
         --crop_mirror_normalize(mirror, mean*255, std*255, dtype, CHW | HWC)--> output
The exact float box makes eval match torchvision's Resize+CenterCrop (see crop.py) without rounding. On the GPU
the pipeline decodes whole images instead (decoders.image) and the resize's ROI is the box itself: see chroma_mode,
the rule that keeps 4:2:0 chroma equal to libjpeg-turbo's on every path.

Input lifetime (what the caller must guarantee): with no_copy=True DALI reads the sample arrays in place; they
must stay valid and unmodified until __call__ returns. __call__ runs the pipeline with prefetch_queue_depth=1 and
returns only after DALI has handed back that iteration's outputs, which is the point from which DALI's
external_source contract allows the buffers to be reused; the caller may release the ring slots then. Samples in
page-locked memory (the ring's slots) are marked so with pinned_input=True: DALI's decoders then read them in place
instead of copying each batch into a page-locked buffer of their own, possibly after the outputs are handed back, so
__call__ also waits until the work on its stream, which follows every read, has finished. The Loader asks for it
for large photos only (fastfeed/loader/settings.py says why).

Building and running: the pipeline is defined here with DALI's Python API, serialized, and built, fed and run through
libdali's C API (dali_capi.py), whose blocking calls release the GIL: DALI's Python binding holds it through each whole
build, in which the training thread of the same process cannot launch a kernel (docs/design/dali-capi.md). A pipeline
on the CPU backend is built with nvImageCodec's CPU extensions only (codecs.py: the GPU ones slow its build).

Output lifetime and streams: run(stream=torch's current stream) makes DALI's outputs ready on torch's stream. They
are then copied into a tensor from torch's caching allocator on that same stream (a device copy, small beside the
decode), so the result's lifetime belongs to torch alone: DALI may reuse its own buffers for the next batch while
the training step still reads ours. zero_copy=True hands DALI's buffer over instead (__cuda_array_interface__; torch
keeps DALI's tensor alive until it drops the batch); it is faster by the copy but depends on DALI's stream-ordered
deallocation for safety, so it is opt-in.

Samples DALI does not decode as the decode contract says (Windows.pil, from samples.npz `pil_only`) go to the
contract's PIL decoder (decode/route.py) and take their places in the batch.

Errors: DALI fails a whole batch. A cheap signature check drops non-images first; if the run still fails, the
batch is bisected (runs on halves) to find the culprit records, and only the good ones are decoded again.

Orientation (the decode contract, docs/decode-contract.md): DALI's decoders rotate by EXIF by default and read the ROI
in the rotated (displayed) image; a window computed on the stored size then runs outside a rotated non-square image,
which crashes the process inside DALI. So `adjust_orientation` follows the policy ("ignore": off, pixels as stored,
like the CPU path and torchvision), and with "exif" each JPEG/PNG's displayed size is read from its header (the same
parser pack used for the `orientation` column) and the windows are clamped to it before DALI sees them.
"""
from __future__ import annotations

import threading
from typing import NamedTuple

import numpy as np

from fastfeed.constants import IMAGENET_MEAN, IMAGENET_STD
from fastfeed.constants import DEFAULT_DALI_THREADS, DEFAULT_HW_DECODER_LOAD
from fastfeed.decode.base import (DECODE_ERROR, NOT_IMAGE, DecodeResult, apply_replacements, check_common, is_image,
                                  replaced_list, resolve_errors, starts_with_png)
from fastfeed.decode.crop import DEFAULT_ORIENTATION, Windows
from fastfeed.decode.dali_graph import chroma_mode, graph, slice_around
from fastfeed.decode.route import ContractRoute, routed
from fastfeed.image.headers import exif_orientation

__all__ = ["DaliDecoder", "WholeImages", "dali_available"]


def dali_available() -> bool:
    try:
        import nvidia.dali  # noqa: F401
    except ImportError:
        return False
    return True


class WholeImages(NamedTuple):
    """decode_whole's result: flat uint8 [sum h*w*3] on the device; offset int64 [B] (-1 where a position failed);
    size int64 [B, 2] (width, height); bad {position: (code, detail)}."""

    flat: object
    offset: np.ndarray
    size: np.ndarray
    bad: dict


class _Closed(RuntimeError):
    """The decoder was closed, before the call or during it: no record is to blame, so nothing is bisected."""


class DaliDecoder:
    """Args: device_id (CUDA device, or None for DALI's CPU backend), image_size S, dtype (torch float16/bfloat16/
    float32/uint8; bfloat16 is produced as float16 by DALI and cast by torch, uint8 skips normalization),
    channels_last (NHWC memory, no copy), mean/std in [0, 1] units, batch_size (largest batch accepted),
    num_threads (DALI CPU threads), hw_decoder_load (share of JPEGs sent to the hardware decoder; the default is above
    DALI's 0.65: docs/design/decoders.md#hw-decoder-load), on_error ("skip" | "raise"), zero_copy (see module
    docstring), orientation ("ignore" | "exif", see the module docstring), pinned_output (CPU backend: uint8 batches
    in page-locked memory, for the asynchronous copy of decode/split.py), pinned_input (GPU: samples that are views
    of one page-locked buffer, a ring slot, are handed to DALI as page-locked; see the module docstring), preallocate
    (GPU: (width, height) of the images the hardware decoder's buffers are allocated for at the build, for a whole
    batch; None: they grow in the first runs; fastfeed/loader/settings.py says when the Loader asks for it),
    whole_images (decode only, for `decode_whole`: no crop, resize or normalisation; the detection path's).
    """

    def __init__(self, *, device_id=0, image_size=224, dtype=None, channels_last=False, mean=None, std=None,
                 batch_size=256, num_threads=DEFAULT_DALI_THREADS, hw_decoder_load=DEFAULT_HW_DECODER_LOAD,
                 on_error="skip", zero_copy=False,
                 orientation=DEFAULT_ORIENTATION, pinned_output=False, pinned_input=False, preallocate=None,
                 whole_images=False):
        import torch

        dtype = torch.float32 if dtype is None else dtype  # what the Loader gives by default
        mean = IMAGENET_MEAN if mean is None else tuple(mean)
        std = IMAGENET_STD if std is None else tuple(std)
        self._dtype_name = check_common(image_size, dtype, mean, std, on_error, batch_size, num_threads, orientation)
        self.orientation = orientation
        self._mean, self._std = mean, std
        self._route = ContractRoute(self._contract_decoder)
        if not 0.0 <= float(hw_decoder_load) <= 1.0:
            raise ValueError(f"hw_decoder_load must be in [0, 1], got {hw_decoder_load}")
        if device_id is not None and not torch.cuda.is_available():
            raise RuntimeError("DALI GPU decoding needs CUDA; use device_id=None for DALI's CPU backend")
        self.device = torch.device("cpu") if device_id is None else torch.device("cuda", int(device_id))
        self.image_size = int(image_size)
        self.dtype = dtype
        self.channels_last = bool(channels_last)
        self.on_error = on_error
        self.batch_size = int(batch_size)
        self._zero_copy = bool(zero_copy) and device_id is not None
        # CPU backend only: batches land in page-locked memory, ready for an asynchronous copy to a GPU (split.py).
        self._pinned_output = bool(pinned_output) and device_id is None
        self._pinned_input = bool(pinned_input) and device_id is not None
        # DALI's CPU crop_mirror_normalize is slow for float16 output (docs/design/decoders.md#cpu-dali): on the CPU
        # backend DALI emits flipped uint8 HWC and the numba lookup-table kernel of the PIL path normalizes and lays
        # it out.
        self._lut = None
        pipe_dtype, pipe_hwc = self._dtype_name, self.channels_last
        if device_id is None and self._dtype_name != "uint8":
            from fastfeed.decode.lut import make_lut

            self._lut = make_lut(self._dtype_name, mean, std)
            pipe_dtype, pipe_hwc = "uint8", True
        self.chroma = chroma_mode(device_id is not None)
        self._device_id = device_id
        self._num_threads = int(num_threads)
        self.whole_images = bool(whole_images)
        self._serialized = graph(self.batch_size, self._num_threads, device_id, self.image_size, pipe_dtype,
                                  pipe_hwc, mean, std, hw_decoder_load, orientation == "exif", self.chroma,
                                  preallocate, self.whole_images)
        # Guards the pipeline's replacement after a failed run against close() from another thread.
        self._swap, self._closed = threading.Lock(), False
        self._pipe = self._build()

    def _build(self):
        from fastfeed.decode.codecs import extensions_for
        from fastfeed.decode.dali_capi import CPipeline

        with extensions_for(gpu=self._device_id is not None):
            return CPipeline(self._serialized, batch_size=self.batch_size, num_threads=self._num_threads,
                             device_id=self._device_id)

    # -- running ---------------------------------------------------------------------------------------------
    def _feed(self, pipe, samples, windows: Windows, pinned: bool = False) -> None:
        """Hand the batch to `pipe`: the encoded bytes in place (`pinned`: they are page-locked, see the module
        docstring), the per-sample parameters copied."""
        pipe.feed_samples("raw", samples, pinned)
        if self.whole_images:
            return
        box = windows.box
        pipe.feed_array("mirror", windows.flip.astype(np.int32))
        if self.chroma == "full":
            x = y = np.zeros(len(box))  # resize's ROI on the whole decoded image
        else:
            x0, y0, x1, y1 = slice_around(windows, self.image_size)
            x, y = x0.astype(np.float64), y0.astype(np.float64)
            pipe.feed_array("anchor", np.stack([x0, y0], axis=1).astype(np.int32))
            pipe.feed_array("shape", np.stack([x1 - x0, y1 - y0], axis=1).astype(np.int32))
        # resize's ROI is relative to what was decoded, in tensor order (H, W).
        pipe.feed_array("roi_start", np.stack([box[:, 1] - y, box[:, 0] - x], axis=1).astype(np.float32))
        pipe.feed_array("roi_end", np.stack([box[:, 3] - y, box[:, 2] - x], axis=1).astype(np.float32))

    def _run(self, samples, windows: Windows, pinned: bool = False):
        """Run one batch; the caller closes the returned Outputs once it has copied them."""
        import torch

        stream = torch.cuda.current_stream(self.device).cuda_stream if self.device.type == "cuda" else None
        pipe = self._pipe
        if pipe is None:
            raise _Closed("decoder is closed")
        try:
            self._feed(pipe, samples, windows, pinned)
            return pipe.run(stream)
        except RuntimeError as exc:
            # DALI marks a pipeline that hit an operator error as "no longer valid"; start from a fresh one, unless
            # the decoder was closed meanwhile (by the Loader, from another thread).
            with self._swap:
                if self._pipe is not pipe:
                    raise _Closed("decoder is closed") from exc
                self._pipe = None
            pipe.close()
            fresh = self._build()  # without the lock: close() need not wait out a build (seconds on a GPU)
            with self._swap:
                closed = self._closed
                if not closed:
                    self._pipe = fresh
            if closed:  # close() ran during the build: the fresh pipeline goes too
                fresh.close()
            raise

    def _find_bad(self, samples, windows: Windows, positions: list[int], bad: dict, err: tuple[str, str]) -> None:
        """Bisect `positions` (whose joint run failed with `err`) down to the records that fail on their own."""
        if len(positions) == 1:
            bad[positions[0]] = err
            return
        half = len(positions) // 2
        for part in (positions[:half], positions[half:]):
            try:
                self._run(*_subset(samples, windows, part)).close()
            except _Closed:
                raise
            except RuntimeError as e:
                self._find_bad(samples, windows, part, bad, (DECODE_ERROR, _short(e)))

    def _to_torch(self, out):
        """The batch in `out` (dali_capi.Outputs) as a tensor that torch alone owns (or, zero_copy, shares)."""
        import torch

        if self.device.type == "cpu":
            # A view of DALI's batch where it is one block (valid until out is closed): the lookup-table kernel or
            # torch copies it out with the GIL released.
            host = out.host_view()
            if host is None:
                host = np.empty(out.shape, out.dtype)
                out.copy_to(host.ctypes.data, gpu=False)
            if self._lut is not None:
                return self._normalize_cpu(host)
            src = torch.from_numpy(host)
            return torch.empty(src.shape, dtype=src.dtype, pin_memory=self._pinned_output).copy_(src)
        if self._zero_copy:
            images = torch.as_tensor(out.as_cuda_array(), device=self.device)
        else:
            images = torch.empty(out.shape, dtype=getattr(torch, out.dtype.name), device=self.device)  # same names
            # On torch's stream, where the outputs are ready (run popped them there). Closing them right after, as
            # __call__ does, leaves the copy in flight: DALI frees the buffers in order on that stream, after it.
            out.copy_to(images.data_ptr(), gpu=True, device_id=self.device.index,
                        stream=torch.cuda.current_stream(self.device).cuda_stream)
        if self._dtype_name == "bfloat16":
            images = images.to(torch.bfloat16)
        return images

    def _normalize_cpu(self, hwc: np.ndarray):
        import torch

        from fastfeed.decode.kernels import emit_chw, emit_hwc
        from fastfeed.decode.lut import numpy_view

        n, S = hwc.shape[0], self.image_size
        images = torch.empty((n, S, S, 3) if self.channels_last else (n, 3, S, S), dtype=self.dtype)
        out = numpy_view(images)
        emit = emit_hwc if self.channels_last else emit_chw
        for i in range(n):
            emit(hwc[i], self._lut, False, out[i])
        return images

    def __call__(self, samples, windows: Windows) -> DecodeResult:
        n = len(samples)
        if n != len(windows):
            raise ValueError(f"{n} samples but {len(windows)} windows")
        if self.whole_images:
            raise ValueError("this decoder decodes whole images: call decode_whole")
        pil = routed(windows.pil)
        contract, bad = self._route.crop(samples, windows, pil)
        out, bad, good, pinned = self._decode_good(samples, windows, pil, bad)
        images = None
        if out is not None:
            with out:
                images = self._to_torch(out)
        if pinned:
            # DALI may still be copying the samples to the GPU when its outputs are handed back; the caller reuses
            # their memory when this returns. The outputs, ready on this stream, come after every read of them.
            _inputs_read(self.device)
        if bad or pil:
            import torch

            S = self.image_size
            full = torch.empty((n, S, S, 3) if self.channels_last else (n, 3, S, S), dtype=self.dtype,
                               device=self.device)
            if images is not None:
                full[good] = images
            if contract is not None:  # the PIL decoder's NCHW view of NHWC memory, when channels_last
                full[pil] = contract.permute(0, 2, 3, 1) if self.channels_last else contract
            images = full
            apply_replacements(images, resolve_errors(bad, n, self.on_error))
        if self.channels_last:
            images = images.permute(0, 3, 1, 2)
        return DecodeResult(images, replaced_list(bad))

    def decode_whole(self, samples, pil=None) -> WholeImages:
        """Each sample decoded as it is (a decoder built with whole_images=True): uint8 HWC RGB images back to back
        in one tensor on the decoder's device, with where each position's starts and its (width, height); the
        positions that failed are in `bad` (offset -1), for the caller's replacement policy. `pil`: bool per
        position, the samples the decode contract's PIL decoder decodes (Windows.pil)."""
        import torch

        if not self.whole_images:
            raise ValueError("this decoder crops and resizes: call it with windows")
        n = len(samples)
        positions = routed(pil)
        # The PNGs every decoder reads go to the CPU's native decode as well: PIL's pixels, 2.4x faster than DALI's
        # CPU PNG decoder, which bounded a PNG data set on a rank's few cores (docs/design/decoders.md#png). (Not
        # one DALI would turn by its EXIF tag: the route hands back pixels as stored.)
        taken = set(positions)
        positions = sorted(taken.union(p for p in range(n) if p not in taken and starts_with_png(samples[p])
                                       and (self.orientation != "exif" or exif_orientation(samples[p]) == 1)))
        contract, bad = self._route.whole(samples, positions)
        out, bad, good, pinned = self._decode_good(samples, None, positions, bad)
        parts, shapes = [], np.zeros((0, 3), np.int64)
        if out is not None:
            with out:
                shapes = out.shapes
                flat = torch.empty(int(shapes.prod(axis=1).sum()), dtype=torch.uint8, device=self.device)
                if self.device.type == "cuda":
                    out.copy_to(flat.data_ptr(), gpu=True, device_id=self.device.index,
                                stream=torch.cuda.current_stream(self.device).cuda_stream)
                else:
                    out.copy_to(flat.data_ptr(), gpu=False)
            parts.append(flat)
        if pinned:
            _inputs_read(self.device)
        if contract:  # after DALI's images, in one copy
            host = torch.from_numpy(np.concatenate([a.reshape(-1) for a in contract.values()]))
            parts.append(host.to(self.device))
            good = good + list(contract)
            shapes = np.concatenate([shapes, np.array([a.shape for a in contract.values()], np.int64)])
        flat = torch.cat(parts) if len(parts) > 1 else parts[0] if parts else torch.empty(0, dtype=torch.uint8,
                                                                                            device=self.device)
        size = np.zeros((n, 2), np.int64)
        off = np.full(n, -1, np.int64)
        per = shapes.prod(axis=1)
        off[good] = np.cumsum(per) - per
        size[good] = shapes[:, [1, 0]]
        return WholeImages(flat, off, size, bad)

    def _contract_decoder(self):
        """The decode contract's PIL decoder (decode/cpu.py), with this decoder's output format."""
        from fastfeed.decode.cpu import PilDecoder

        # batch_size 1: its buffers grow to the routed samples of a batch, a few, not to a whole batch
        return PilDecoder(device=self.device, image_size=self.image_size, dtype=self.dtype,
                          channels_last=self.channels_last, mean=self._mean, std=self._std,
                          num_threads=self._num_threads, on_error="skip", batch_size=1, draft=False,
                          orientation=self.orientation)

    def _decode_good(self, samples, windows: Windows | None, pil=(), bad=None):
        """(DALI's outputs for the positions that decode, or None when DALI decodes none, {position: (code,
        detail)} of those that do not (`bad`: found before, by the PIL decoder), the positions DALI decoded,
        whether the samples were handed over page-locked). The `pil` positions are left to the PIL decoder. Raises
        CorruptSampleError under on_error="raise" or when nothing decodes."""
        if self._pipe is None:
            raise _Closed("decoder is closed")
        n = len(samples)
        if not 0 < n <= self.batch_size:
            raise ValueError(f"batch of {n} samples; this decoder accepts 1..{self.batch_size}")
        skip = set(pil)
        bad = dict(bad or {})
        bad.update({i: (NOT_IMAGE, "unknown file signature") for i in range(n)
                    if i not in skip and not is_image(samples[i])})
        good = [i for i in range(n) if i not in bad and i not in skip]
        if self.orientation == "exif" and windows is not None:
            windows = _clamp_displayed(samples, windows, good)
        # Page-locked samples (the ring's slots) are handed to DALI as such: its decoders then read them in place
        # instead of copying every batch into a page-locked buffer of their own first (NVIDIA/DALI#5003).
        batch = _subset(samples, windows, good)
        pinned = self._pinned_input and _page_locked(batch[0])
        out = None
        if good:
            try:
                out = self._run(*batch, pinned)
            except _Closed:
                raise
            except RuntimeError as e:
                self._find_bad(samples, windows, good, bad, (DECODE_ERROR, _short(e)))
                good = [i for i in good if i not in bad]
                out = None
        resolve_errors(bad, n, self.on_error)  # raises before another run when the batch cannot be used
        if out is None and good:  # a failure was bisected: decode the good records once more
            out = self._run(*_subset(samples, windows, good), pinned)
        return out, bad, good, pinned

    def close(self) -> None:
        with self._swap:
            self._closed = True
            pipe, self._pipe = self._pipe, None
        if pipe is not None:
            pipe.close()
        self._route.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _page_locked(samples) -> bool:
    """Whether the samples are views of one page-locked buffer (a ring slot, pinned by ring.py): the ring hands out a
    batch's samples as views of its slot; a sample read again on its own (assemble.py) is not one."""
    base = samples[0].base if samples else None
    if not isinstance(base, np.ndarray) or any(s.base is not base for s in samples):
        return False
    import torch

    return torch.from_numpy(base).is_pinned()


def _inputs_read(device) -> None:
    """Wait until the work queued on `device`'s current stream, and so DALI's reads of the batch, has finished."""
    import torch

    torch.cuda.current_stream(device).synchronize()


def _subset(samples, windows: Windows | None, positions: list[int]):
    """The samples and windows (None: whole images) at `positions`; the batch itself when that is all of it (the
    usual case: no per-sample copy of the list)."""
    if len(positions) == len(samples):
        return samples, windows
    return [samples[i] for i in positions], None if windows is None else windows.take(positions)


def _clamp_displayed(samples, windows: Windows, positions) -> Windows:
    """The windows clamped to each JPEG/PNG's displayed size (header size, axes swapped for EXIF tags 5..8), so
    that a window computed on a wrong size can never send DALI's ROI decode outside the rotated image."""
    from fastfeed.image.headers import swaps_axes
    from fastfeed.image.jpeg import displayed_size

    # The sizes the windows were drawn on where they came with them: the decoder reads around a window up to them
    # (its filter's neighbours), and a thin image's window is most of it.
    W = windows.x.astype(np.int64) + windows.w if windows.width is None else np.array(windows.width, dtype=np.int64)
    H = windows.y.astype(np.int64) + windows.h if windows.height is None else np.array(windows.height, dtype=np.int64)
    for i in positions:
        # Tags 1-4 keep the stored size, which the windows were computed on; only 5-8 (axes swapped) can put a
        # window outside the rotated image. Reading the tag costs microseconds; the size is read for rotated ones only.
        tag = exif_orientation(samples[i])
        size = displayed_size(samples[i], tag) if swaps_axes(tag) else None
        if size is not None:
            W[i], H[i] = size
    return windows.clamped(W, H)


def _short(e: Exception) -> str:
    """The informative line of a DALI error (the one after 'encountered:'), not the traceback around it."""
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    msg = lines[0] if lines else repr(e)
    if "encountered:" in lines:
        rest = lines[lines.index("encountered:") + 1:]
        msg = " ".join(ln for ln in rest[:2] if "no longer valid" not in ln) or msg
    return f"DALI: {msg[:300]}"
