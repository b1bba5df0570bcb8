"""Bench-only variant for issue 14: ONE DALI pipeline with DALI's own asynchronous prefetch (prefetch_queue_depth=N,
exec_dynamic) fed from fastfeed's native ring, instead of the Loader's N synchronous pipelines side by side.

Same pixels as `fastfeed.Loader(train=True)` (the same crop windows and the same decode graph as
fastfeed/decode/dali.py), float16, channels_last (NCHW view of NHWC memory), labels int64 on the GPU.
Differences from the Loader, on purpose, to isolate the one question: the ring's bytes are copied into DALI
(no_copy=False) so a slot is released as soon as DALI has taken the batch, and DALI itself runs the next
`depth - 1` iterations while the training step runs; the Python callback that DALI calls (ring -> windows) runs
in the consumer's thread inside `run()`.
"""
from __future__ import annotations

import numpy as np
import torch

from fastfeed import IMAGENET_MEAN, IMAGENET_STD
from fastfeed.decode import crop_windows
from fastfeed.decode.dali import DaliDecoder
from fastfeed.formats import open_dataset
from fastfeed.ring import PrefetchRing


class _Fed:
    """Takes what DaliDecoder._feed hands a pipeline, as a decoder whose pipeline decodes windows (plain chroma, as
    this pipeline does): one place builds the per-sample inputs."""
    chroma = "plain"

    def __init__(self):
        self.fed = {}

    def feed_samples(self, name, samples, pinned=False):
        self.fed[name] = samples

    def feed_array(self, name, batch):
        self.fed[name] = batch


class RingDaliPrefetch:
    def __init__(self, path, *, batch_size=256, num_threads=2, hw_decoder_load=1.0, depth=2, image_size=224,
                 seed=0, device_id=0):
        from nvidia.dali import fn, pipeline_def, types

        self.ds = open_dataset(path)
        self.bs, self.S, self.seed, self.device_id = batch_size, image_size, seed, device_id
        self.widths, self.heights = np.asarray(self.ds.widths), np.asarray(self.ds.heights)
        self.labels = torch.from_numpy(np.ascontiguousarray(self.ds.labels, dtype=np.int64))
        self.ring = PrefetchRing(self.ds.extents(), batch_size, num_threads=4, num_slots=depth + 4)
        self.epoch = -1
        self._pending_labels: list[torch.Tensor] = []
        self._new_epoch()
        mean = [m * 255.0 for m in IMAGENET_MEAN]
        std = [s * 255.0 for s in IMAGENET_STD]

        @pipeline_def(batch_size=batch_size, num_threads=num_threads, device_id=device_id,
                      prefetch_queue_depth=depth, exec_dynamic=True)
        def pipe():
            raw, anchor, shape, roi_start, roi_end, mirror = fn.external_source(
                source=self._next, num_outputs=6, batch=True,
                dtype=[types.UINT8, types.INT32, types.INT32, types.FLOAT, types.FLOAT, types.INT32])
            gpu = {"hw_decoder_load": float(hw_decoder_load)} if device_id is not None else {}
            img = fn.decoders.image_slice(raw, anchor, shape, device="mixed" if gpu else "cpu",
                                          output_type=types.RGB, axis_names="WH", jpeg_fancy_upsampling=False, **gpu)
            img = fn.resize(img, size=[image_size, image_size], roi_start=roi_start, roi_end=roi_end,
                            interp_type=types.INTERP_LINEAR, antialias=True)
            return fn.crop_mirror_normalize(img, dtype=types.FLOAT16, output_layout="HWC", mean=mean, std=std,
                                            mirror=mirror)

        self.pipe = pipe()
        self.pipe.build()

    def _new_epoch(self):
        self.epoch += 1
        order = np.random.default_rng([self.seed, self.epoch]).permutation(len(self.ds))
        self.ring.start(order[: len(order) // self.bs * self.bs])

    def _next(self):
        rb = self.ring.next_batch()
        if rb is None:
            self._new_epoch()
            rb = self.ring.next_batch()
        try:
            idx = np.asarray(rb.indices, dtype=np.int64)
            samples = [np.array(s) for s in rb.samples()]  # copies: the slot goes back to the ring at once
        finally:
            rb.release()
        w = crop_windows(self.widths[idx], self.heights[idx], idx, seed=self.seed, epoch=self.epoch, train=True,
                         image_size=self.S)
        f = _Fed()
        DaliDecoder._feed(f, f, samples, w)
        f = f.fed
        self._pending_labels.append(self.labels[torch.from_numpy(idx)])
        return (f["raw"], f["anchor"], f["shape"], f["roi_start"], f["roi_end"], f["mirror"])

    def __iter__(self):
        from nvidia.dali.plugin.pytorch import feed_ndarray

        dev = torch.device("cpu") if self.device_id is None else torch.device("cuda", self.device_id)
        while True:
            stream = torch.cuda.current_stream(dev) if dev.type == "cuda" else None
            (out,) = self.pipe.run() if stream is None else self.pipe.run(stream)
            t = out.as_tensor()
            images = torch.empty(tuple(t.shape()), dtype=torch.float16, device=dev)
            feed_ndarray(t, images, cuda_stream=stream)
            labels = self._pending_labels.pop(0)
            labels = labels if stream is None else labels.pin_memory().to(dev, non_blocking=True)
            yield images.permute(0, 3, 1, 2), labels

    def close(self):
        self.pipe = None
        self.ring.close()
        self.ds.close()
