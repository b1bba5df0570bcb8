"""The baseline for DaliDecoder's C API pipelines (fastfeed/decode/dali_capi.py): the same serialized graph built, fed
and run through DALI's Python binding, as DaliDecoder did until 2026-12-01 (raw bytes fed as one TensorListCPU of
views, the run on torch's stream, DALI's copy_to_external into the caller's buffer). Benchmarks only: put a
`BindingDecoder` beside a `DaliDecoder` to see what the binding costs the calling thread and the GIL.
"""
from __future__ import annotations

import ctypes

from fastfeed.decode.dali import DaliDecoder


class BindingPipeline:
    """dali_capi.CPipeline's interface over nvidia.dali.Pipeline (built with the GIL held, as DALI's binding does)."""

    def __init__(self, serialized: bytes, *, batch_size: int, num_threads: int, device_id):
        from nvidia.dali import Pipeline

        self.pipe = Pipeline.deserialize(serialized_pipeline=serialized, batch_size=batch_size,
                                         num_threads=num_threads, device_id=device_id, prefetch_queue_depth=1,
                                         exec_dynamic=True)
        self.pipe.build()

    def feed_samples(self, name, samples, pinned=False):
        from nvidia.dali.tensors import TensorCPU, TensorListCPU

        self.pipe.feed_input(name, TensorListCPU([TensorCPU(s, "", pinned) for s in samples], "", False))

    def feed_array(self, name, batch):
        self.pipe.feed_input(name, batch)

    def run(self, stream=None):
        (out,) = self.pipe.run() if stream is None else self.pipe.run(stream)
        return BindingOutputs(out.as_tensor())

    def close(self):
        self.pipe = None


class BindingOutputs:
    def __init__(self, tensor):
        import numpy as np

        self.tensor = tensor
        self.shape = tuple(tensor.shape())
        self.dtype = np.dtype({"UINT8": "uint8", "FLOAT16": "float16", "FLOAT": "float32"}[tensor.dtype.name])

    def host_view(self):
        import numpy as np

        return np.asarray(self.tensor)

    def copy_to(self, ptr, *, gpu, device_id=0, pinned=False, stream=None):
        kw = {} if stream is None else {"cuda_stream": ctypes.c_void_p(stream), "non_blocking": True}
        self.tensor.copy_to_external(ctypes.c_void_p(ptr), **kw)

    def close(self):
        self.tensor = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class BindingDecoder(DaliDecoder):
    """DaliDecoder whose pipelines go through DALI's Python binding instead of its C API."""

    def _build(self):
        return BindingPipeline(self._serialized, batch_size=self.batch_size, num_threads=self._num_threads,
                               device_id=self._device_id)
