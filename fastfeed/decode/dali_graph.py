"""The DALI pipeline a `DaliDecoder` runs (decode/dali.py), defined with DALI's Python API and serialized: what it
decodes and how (`graph`), the region a cropped decode reads (`slice_around`), and the chroma rule that keeps 4:2:0
JPEGs equal to libjpeg-turbo's on every path (`chroma_mode`). DALI is imported only when a graph is made."""
from __future__ import annotations

import numpy as np

from fastfeed.decode.crop import Windows

__all__ = ["graph", "slice_around", "chroma_mode", "CHROMA_MODES"]


def graph(batch_size, num_threads, device_id, image_size, dtype_name, channels_last, mean, std, hw_decoder_load,
           adjust_orientation, chroma, preallocate=None, whole=False) -> bytes:
    """The pipeline, serialized (DALI's protobuf): defined here with DALI's Python API, built by dali_capi. `whole`:
    the decoded images as they are (uint8 HWC RGB, each its own size), for the detection renderer."""
    from nvidia.dali import fn, pipeline_def, types

    dali_dtype = {"float16": types.FLOAT16, "bfloat16": types.FLOAT16, "float32": types.FLOAT,
                  "uint8": types.UINT8}[dtype_name]
    if dtype_name == "uint8":
        mean, std = (0.0, 0.0, 0.0), (1.0, 1.0, 1.0)
    else:
        mean, std = [m * 255.0 for m in mean], [s * 255.0 for s in std]
    gpu = device_id is not None

    @pipeline_def(batch_size=batch_size, num_threads=num_threads, device_id=device_id,
                  prefetch_queue_depth=1, exec_dynamic=True)
    def pipe():
        raw = fn.external_source(name="raw", no_copy=True, dtype=types.UINT8, ndim=1)
        common = dict(device="mixed" if gpu else "cpu", output_type=types.RGB,
                      adjust_orientation=bool(adjust_orientation),
                      # Interpolated ("fancy") chroma upsampling is what libjpeg-turbo, and so PIL and torchvision,
                      # do by default; without it 4:2:0 JPEGs differ by up to ~2.6/255 on sharp colour edges.
                      jpeg_fancy_upsampling=chroma != "plain")
        if gpu:
            common["hw_decoder_load"] = float(hw_decoder_load)
            if preallocate is not None:  # the hardware decoder's buffers for a batch this large, at the build
                common["preallocate_width_hint"], common["preallocate_height_hint"] = (int(v) for v in preallocate)
        if whole:
            return fn.decoders.image(raw, **common)
        roi_start = fn.external_source(name="roi_start", dtype=types.FLOAT, ndim=1)
        roi_end = fn.external_source(name="roi_end", dtype=types.FLOAT, ndim=1)
        mirror = fn.external_source(name="mirror", dtype=types.INT32, ndim=0)
        if chroma == "full":
            # The whole image decoded, the crop taken by resize's ROI (then in absolute coordinates): exact chroma
            # on the GPU, where nvJPEG may refuse ROI decodes with interpolated upsampling (see chroma_mode).
            img = fn.decoders.image(raw, **common)
        else:
            anchor = fn.external_source(name="anchor", dtype=types.INT32, ndim=1)
            shape = fn.external_source(name="shape", dtype=types.INT32, ndim=1)
            img = fn.decoders.image_slice(raw, anchor, shape, axis_names="WH", **common)
        img = fn.resize(img, size=[image_size, image_size], roi_start=roi_start, roi_end=roi_end,
                        interp_type=types.INTERP_LINEAR, antialias=True)
        return fn.crop_mirror_normalize(img, dtype=dali_dtype, output_layout="HWC" if channels_last else "CHW",
                                        mean=mean, std=std, mirror=mirror)

    return pipe().serialize()


def slice_around(windows: Windows, image_size: int):
    """The region a cropped decode reads, (x0, y0, x1, y1) int64 arrays: each window plus what the resize's filter
    reads around it (the downscale factor, at least a pixel) and two pixels more (a cropped decode's outer columns
    are upsampled without their neighbours), within the image. The resize then samples what PIL's would, also in a
    window under a pixel wide. Windows without their image sizes are decoded as they are."""
    x, y = windows.x.astype(np.int64), windows.y.astype(np.int64)
    x1, y1 = x + windows.w, y + windows.h
    if windows.width is None or windows.height is None:
        return x, y, x1, y1
    box = windows.box
    mx = np.ceil(np.maximum((box[:, 2] - box[:, 0]) / image_size, 1.0)).astype(np.int64) + 2
    my = np.ceil(np.maximum((box[:, 3] - box[:, 1]) / image_size, 1.0)).astype(np.int64) + 2
    return (np.maximum(x - mx, 0), np.maximum(y - my, 0), np.minimum(x1 + mx, windows.width),
            np.minimum(y1 + my, windows.height))


CHROMA_MODES = ("full", "roi", "plain")


def chroma_mode(gpu: bool) -> str:
    """How the pipeline decodes JPEGs so that 4:2:0 chroma matches libjpeg-turbo's (PIL's, torchvision's):
      "full"  the whole image decoded with interpolated ("fancy") chroma upsampling, the window cut by the resize:
              the GPU. nvJPEG before 13.2 refuses cropped (ROI) decodes with interpolated upsampling (DALI then
              decodes those images on the CPU, far slower), and a training script usually loads an older one first:
              torchvision's bundled nvJPEG, which DALI's decoders then get. Whole-image decodes train as fast.
              docs/design/decoders.md#chroma
      "roi"   only the window decoded, interpolated upsampling: DALI's CPU backend (libjpeg-turbo does it exactly).
      "plain" ROI decode with plain (replicated) chroma: off the CPU path, outside the decode contract
              (docs/decode-contract.md); only through FASTFEED_DALI_CHROMA, for measurements.
    FASTFEED_DALI_CHROMA=full|roi|plain overrides the choice (the benchmarks compare them)."""
    import os

    forced = os.environ.get("FASTFEED_DALI_CHROMA")
    if forced:
        if forced not in CHROMA_MODES:
            raise ValueError(f"FASTFEED_DALI_CHROMA must be one of {CHROMA_MODES}, got {forced!r}")
        return forced
    return "full" if gpu else "roi"
