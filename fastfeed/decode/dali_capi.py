"""A DALI pipeline built, fed and run through libdali's C API (`dali/dali.h`, DALI's "C API 2.0"), called with ctypes.

Why not DALI's Python binding: `Pipeline.build()` holds the GIL for the whole build (a large fraction of a second
beside training: docs/design/dali-capi.md), and `feed_input`/`run` do per-sample work in Python. A decode worker
lives in the training process, so every millisecond it holds the GIL is a millisecond in which the training thread
cannot launch its next kernels. Called through ctypes, the build, the run, the wait for its outputs
and the copy out release the GIL (the microsecond calls keep it: _SIGNATURES says why), so they happen beside the
training thread instead of in front of it.

The graph itself is still written with DALI's Python API (decode/dali.py) and handed over serialized: DALI's own
protobuf, which `Pipeline.serialize()` writes without building anything. Nothing here parses data from a dataset.

Ownership: a `CPipeline` owns its handle (destroyed by close() or when collected); an `Outputs` owns one iteration's
outputs and must be closed after its data was copied out (the context manager does it); a GPU output handed over
without a copy (`as_cuda_array`) keeps DALI's buffer alive for as long as torch uses it.
"""
from __future__ import annotations

import ctypes as C
import functools
import os
import threading

import numpy as np

__all__ = ["CPipeline", "Outputs", "DaliCError"]

# dali/core/dali_data_type.h
DALI_UINT8, DALI_INT32, DALI_FLOAT16, DALI_FLOAT = 0, 6, 8, 9
DTYPES = {DALI_UINT8: np.uint8, DALI_INT32: np.int32, DALI_FLOAT16: np.float16, DALI_FLOAT: np.float32}
_CODES = {np.dtype(v): k for k, v in DTYPES.items()}
_SUCCESS, _NO_DATA = 0, 1
_EXEC_DYNAMIC = 1 | 2 | 8  # DALI_EXEC_IS_PIPELINED | IS_ASYNC | IS_DYNAMIC: Python's exec_dynamic=True
_FEED_FORCE_COPY, _FEED_NO_COPY = 2, 4
_STORAGE_CPU, _STORAGE_GPU = 0, 1

_handle = C.c_void_p
# An empty layout, not NULL: DALI 2.4's AttachSamples builds a TensorLayout from the pointer without the NULL check
# its header promises, and crashed on NULL (gdb: dali::TensorLayout::TensorLayout(char const*)).
_NO_LAYOUT = b""
_int64_p = C.POINTER(C.c_int64)


class _Params(C.Structure):
    """daliPipelineParams_t: a 64-bit word of `*_present` bits (in declaration order), then the values."""
    _fields_ = [("present", C.c_uint64), ("max_batch_size", C.c_int), ("num_threads", C.c_int),
                ("device_id", C.c_int), ("seed", C.c_int64), ("exec_type", C.c_int), ("exec_flags", C.c_int),
                ("prefetch_cpu", C.c_int), ("prefetch_gpu", C.c_int), ("enable_checkpointing", C.c_uint8),
                ("enable_memory_stats", C.c_uint8), ("bytes_per_sample_hint", C.c_size_t)]


# The order of the `present` bits in daliPipelineParams_t.
_MAX_BATCH, _THREADS, _DEVICE, _SEED, _EXEC_TYPE, _EXEC_FLAGS, _PREFETCH = (1 << i for i in range(7))


class _Placement(C.Structure):
    _fields_ = [("device_type", C.c_int), ("device_id", C.c_int), ("pinned", C.c_uint8)]


class _TensorDesc(C.Structure):
    _fields_ = [("ndim", C.c_int), ("shape", _int64_p), ("dtype", C.c_int), ("layout", C.c_char_p),
                ("data", C.c_void_p)]


# _TensorDesc as a numpy record (x86-64 / aarch64 layout: 8-byte pointers, ints padded to 8), filled vectorised.
_DESC_RECORD = np.dtype({"names": ["ndim", "shape", "dtype", "layout", "data"],
                         "formats": ["<i4", "<u8", "<i4", "<u8", "<u8"], "offsets": [0, 8, 16, 24, 32],
                         "itemsize": 40})
assert _DESC_RECORD.itemsize == C.sizeof(_TensorDesc)


class _Deleter(C.Structure):
    _fields_ = [("ctx", C.c_void_p), ("destroy_context", C.c_void_p), ("delete_buffer", C.c_void_p)]


class DaliCError(RuntimeError):
    """A DALI C API call failed; the message is DALI's own (for a failed run: the operator's error)."""


# name: (restype, argtypes, blocking). Only the blocking calls (the build, the run and the wait for its outputs, the
# copy out, the teardown) release the GIL. Releasing it around a call of a microsecond costs more than it saves: the
# thread must then win the GIL back from whichever thread took it, which can hold it for the interpreter's whole
# switch interval (5 ms). docs/design/dali-capi.md#gil
_SIGNATURES = {
    "daliGetLastErrorMessage": (C.c_char_p, [], False),
    "daliPipelineDeserialize": (C.c_int, [C.POINTER(_handle), C.c_char_p, C.c_size_t, C.POINTER(_Params)], True),
    "daliPipelineBuild": (C.c_int, [_handle], True),
    "daliPipelineDestroy": (C.c_int, [_handle], True),
    "daliPipelineFeedInput": (C.c_int, [_handle, C.c_char_p, _handle, C.c_char_p, C.c_int, C.c_void_p], False),
    "daliPipelineRun": (C.c_int, [_handle], True),
    "daliPipelinePopOutputs": (C.c_int, [_handle, C.POINTER(_handle)], True),
    "daliPipelinePopOutputsAsync": (C.c_int, [_handle, C.POINTER(_handle), C.c_void_p], True),
    "daliPipelineOutputsGet": (C.c_int, [_handle, C.POINTER(_handle), C.c_int], False),
    "daliPipelineOutputsDestroy": (C.c_int, [_handle], False),
    "daliTensorListCreate": (C.c_int, [C.POINTER(_handle), _Placement], False),
    "daliTensorListAttachBuffer": (C.c_int, [_handle, C.c_int, C.c_int, _int64_p, C.c_int, C.c_char_p, C.c_void_p,
                                             C.c_void_p, _Deleter], False),
    "daliTensorListAttachSamples": (C.c_int, [_handle, C.c_int, C.c_int, C.c_int, C.c_char_p,
                                              C.POINTER(_TensorDesc), C.c_void_p], False),
    "daliTensorListDecRef": (C.c_int, [_handle, C.c_void_p], False),
    "daliTensorListGetShape": (C.c_int, [_handle, C.POINTER(C.c_int), C.POINTER(C.c_int), C.POINTER(_int64_p)],
                               False),
    "daliTensorListGetDType": (C.c_int, [_handle, C.POINTER(C.c_int)], False),
    "daliTensorListGetTensorDesc": (C.c_int, [_handle, C.POINTER(_TensorDesc), C.c_int], False),
    "daliTensorListCopyOut": (C.c_int, [_handle, C.c_void_p, _Placement, C.c_void_p, C.c_int], True),
    "daliTensorListViewAsTensor": (C.c_int, [_handle, C.POINTER(_handle)], False),
    "daliTensorGetDesc": (C.c_int, [_handle, C.POINTER(_TensorDesc)], False),
    "daliTensorDecRef": (C.c_int, [_handle, C.c_void_p], False),
}


@functools.lru_cache(maxsize=None)
def _functions() -> dict:
    """The functions of libdali.so of the installed nvidia-dali (the library its Python binding loaded: one DALI per
    process), each from a CDLL (releases the GIL) or a PyDLL (keeps it) as _SIGNATURES says."""
    import nvidia.dali

    path = os.path.join(os.path.dirname(nvidia.dali.__file__), "libdali.so")
    releasing, holding = C.CDLL(path), C.PyDLL(path)
    out = {}
    for name, (restype, argtypes, blocking) in _SIGNATURES.items():
        fn = getattr(releasing if blocking else holding, name)
        fn.restype, fn.argtypes = restype, argtypes
        out[name] = fn
    return out


def _call(name: str, *args) -> int:
    fns = _functions()
    rc = fns[name](*args)
    if rc not in (_SUCCESS, _NO_DATA):
        # The last error is per thread, and this thread made the failing call.
        msg = fns["daliGetLastErrorMessage"]()
        raise DaliCError(msg.decode(errors="replace") if msg else f"{name} failed with DALI error {rc:#x}")
    return rc


def _stream_arg(stream: int | None):
    """`const cudaStream_t *` argument: NULL, or a pointer to the handle."""
    return None if stream is None else C.byref(C.c_void_p(stream))


class CPipeline:
    """A pipeline deserialized from `serialized` (Pipeline.serialize()) and built, with the GIL released. device_id
    None: DALI's CPU backend. Executor: the dynamic one, one iteration in flight (as decode/dali.py's Python
    pipelines were: prefetch_queue_depth=1, exec_dynamic=True).

    Lifetime: each call holds the pipeline's lock, so close() from another thread (a Loader closing while a worker
    that did not stop still decodes) waits for the call in flight instead of destroying the pipeline under it, and
    later calls raise RuntimeError. Outputs and zero-copy views count as dependents: DALI 2.4 crashed destroying
    outputs after their pipeline (tests/test_dali_capi.py), so a closed pipeline is destroyed with its last one."""

    def __init__(self, serialized: bytes, *, batch_size: int, num_threads: int, device_id: int | None):
        self.device_id = device_id
        p = _Params()
        p.present = _MAX_BATCH | _THREADS | _EXEC_TYPE | _PREFETCH
        p.max_batch_size, p.num_threads = int(batch_size), int(num_threads)
        if device_id is not None:  # absent means no GPU: DALI rejects any device id without CUDA, even -99999
            p.present |= _DEVICE
            p.device_id = int(device_id)
        p.exec_type, p.prefetch_cpu, p.prefetch_gpu = _EXEC_DYNAMIC, 1, 1
        h = _handle()
        self._lock = threading.RLock()  # reentrant: an orphaned Outputs collected inside a call releases under it
        self._dependents, self._closing = 0, None
        _call("daliPipelineDeserialize", C.byref(h), serialized, len(serialized), C.byref(p))
        self._h = h
        try:
            _call("daliPipelineBuild", h)
        except BaseException:
            self.close()
            raise

    def feed_samples(self, name: str, samples, pinned: bool = False) -> None:
        """Feed contiguous 1-D uint8 samples in place (no copy): they must stay valid until this iteration's outputs
        are popped. `pinned`: the samples are page-locked host memory (DALI's GPU decoders then read them directly).
        The descriptors are built as one numpy record array: a ctypes structure per sample costs microseconds of GIL
        each."""
        n = len(samples)
        shapes = np.fromiter(map(len, samples), np.int64, n)
        descs = np.zeros(n, _DESC_RECORD)
        descs["ndim"] = 1
        descs["shape"] = shapes.ctypes.data + 8 * np.arange(n, dtype=np.uint64)
        descs["data"] = [s.ctypes.data for s in samples]  # dtype DALI_UINT8 = 0, layout NULL: as zeroed
        self._feed(name, pinned, lambda tl: _call("daliTensorListAttachSamples", tl, n, 1, DALI_UINT8, _NO_LAYOUT,
                                                   descs.ctypes.data_as(C.POINTER(_TensorDesc)), None),
                   _FEED_NO_COPY)

    def feed_array(self, name: str, batch: np.ndarray) -> None:
        """Feed a dense batch (axis 0 = samples); DALI copies it, so it may be reused at once."""
        batch = np.ascontiguousarray(batch)
        n, ndim = batch.shape[0], batch.ndim - 1
        shapes = np.tile(np.asarray(batch.shape[1:], np.int64), n) if ndim else np.zeros(1, np.int64)
        code = _CODES[batch.dtype]
        self._feed(name, False, lambda tl: _call("daliTensorListAttachBuffer", tl, n, ndim,
                                                  shapes.ctypes.data_as(_int64_p), code, _NO_LAYOUT, batch.ctypes.data,
                                                  None, _Deleter()), _FEED_FORCE_COPY)

    def _feed(self, name, pinned, attach, flags) -> None:
        tl = _handle()
        _call("daliTensorListCreate", C.byref(tl), _Placement(_STORAGE_CPU, max(self.device_id or 0, 0), pinned))
        try:
            attach(tl)
            with self._lock:
                _call("daliPipelineFeedInput", self._live(), name.encode(), tl, None, flags, None)
        finally:
            _call("daliTensorListDecRef", tl, None)  # the pipeline holds its own reference

    def run(self, stream: int | None = None) -> "Outputs":
        """Run one iteration on what was fed and wait for its outputs (GPU outputs: ready on `stream`, a CUDA
        stream handle). A failed operator raises DaliCError with DALI's message."""
        out = _handle()
        with self._lock:
            h = self._live()
            _call("daliPipelineRun", h)
            if stream is None:
                _call("daliPipelinePopOutputs", h, C.byref(out))
            else:
                _call("daliPipelinePopOutputsAsync", h, C.byref(out), C.c_void_p(stream))
            self._dependents += 1
        return Outputs(out, self)

    def _drop(self, release) -> None:
        """Run `release` (a DALI call that frees one dependent: outputs or a view) under the lock; a closed pipeline
        goes with its last dependent."""
        with self._lock:
            try:
                release()
            finally:
                self._dependents -= 1
                if self._closing is not None and self._dependents == 0:
                    h, self._closing = self._closing, None
                    _call("daliPipelineDestroy", h)

    def _live(self):
        if getattr(self, "_h", None) is None:  # closed, or the constructor failed before the handle was set
            raise RuntimeError("DALI pipeline is closed")
        return self._h

    def close(self) -> None:
        with self._lock:
            h, self._h = getattr(self, "_h", None), None
            if h is None:
                return
            if self._dependents:
                self._closing = h  # destroyed by _drop, with the last dependent
            else:
                _call("daliPipelineDestroy", h)

    def __del__(self):
        if getattr(self, "_lock", None) is None:  # the constructor failed before anything was created
            return
        try:
            self.close()
        except Exception:  # interpreter shutdown: the library may already be gone
            pass


class Outputs:
    """One iteration's outputs (a dependent of `pipeline`, counted by its run()); only output 0 is used (decode/
    dali.py's pipelines have one)."""

    def __init__(self, handle, pipeline: CPipeline):
        self._h = handle
        self._pipeline = pipeline
        self._tl = _handle()
        try:
            _call("daliPipelineOutputsGet", handle, C.byref(self._tl), 0)
            ns, nd, sh, dt = C.c_int(), C.c_int(), _int64_p(), C.c_int()
            _call("daliTensorListGetShape", self._tl, C.byref(ns), C.byref(nd), C.byref(sh))
            _call("daliTensorListGetDType", self._tl, C.byref(dt))
        except BaseException:
            self.close()
            raise
        self.num_samples, ndim = ns.value, nd.value
        shapes = np.ctypeslib.as_array(sh, (self.num_samples * ndim,)).reshape(self.num_samples, ndim) \
            if self.num_samples and ndim else np.zeros((self.num_samples, ndim), np.int64)
        self.shapes = shapes.copy()  # DALI's array lives only as long as the outputs
        self.uniform = bool(self.num_samples == 0 or (shapes == shapes[0]).all())
        self.sample_shape = tuple(int(x) for x in shapes[0]) if self.num_samples else ()
        self.dtype = np.dtype(DTYPES[dt.value])

    @property
    def shape(self) -> tuple:
        if not self.uniform:
            raise ValueError("the outputs' samples differ in shape")
        return (self.num_samples,) + self.sample_shape

    def copy_to(self, ptr: int, *, gpu: bool, device_id: int = 0, pinned: bool = False,
                stream: int | None = None) -> None:
        """Copy the whole batch, densely (samples back to back, in order, whatever their shapes), to `ptr` (GPU memory of `device_id`, or host memory), on `stream`."""
        place = _Placement(_STORAGE_GPU if gpu else _STORAGE_CPU, device_id, pinned)
        _call("daliTensorListCopyOut", self._tl, C.c_void_p(ptr), place, _stream_arg(stream), 0)

    def host_view(self) -> np.ndarray | None:
        """The CPU batch as one array without a copy, or None when DALI's samples are not one dense block. Valid
        until close()."""
        if not self.num_samples:
            return None
        first, last = _TensorDesc(), _TensorDesc()
        _call("daliTensorListGetTensorDesc", self._tl, C.byref(first), 0)
        _call("daliTensorListGetTensorDesc", self._tl, C.byref(last), self.num_samples - 1)
        per = int(np.prod(self.sample_shape)) * self.dtype.itemsize
        if not self.uniform or (last.data or 0) - (first.data or 0) != per * (self.num_samples - 1):
            return None
        buf = (C.c_char * (per * self.num_samples)).from_address(first.data)
        return np.frombuffer(buf, self.dtype).reshape(self.shape)

    def as_cuda_array(self) -> "_CudaArray":
        """The GPU batch without a copy, for torch.as_tensor: DALI's buffer stays alive until torch drops it. The
        outputs are already ready on the stream they were popped on (run's `stream`)."""
        t = _handle()
        with self._pipeline._lock:
            _call("daliTensorListViewAsTensor", self._tl, C.byref(t))
            self._pipeline._dependents += 1
        return _CudaArray(t, self.shape, self.dtype, self._pipeline)

    def close(self) -> None:
        tl, self._tl = self._tl, None
        h, self._h = self._h, None
        if h:
            def release():
                if tl:
                    _call("daliTensorListDecRef", tl, None)
                _call("daliPipelineOutputsDestroy", h)

            self._pipeline._drop(release)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):  # an exception between run() and close() must not keep DALI's buffers
        try:
            self.close()
        except Exception:
            pass


class _CudaArray:
    """__cuda_array_interface__ over a DALI tensor; torch keeps this object, and so the tensor, alive."""

    def __init__(self, handle, shape, dtype, pipeline: CPipeline):
        self._t = handle
        self._pipeline = pipeline
        d = _TensorDesc()
        _call("daliTensorGetDesc", handle, C.byref(d))
        self.__cuda_array_interface__ = {"shape": tuple(shape), "typestr": np.dtype(dtype).str,
                                         "data": (d.data, False), "version": 2}

    def __del__(self):
        t, self._t = self._t, None
        if t:
            try:
                self._pipeline._drop(lambda: _call("daliTensorDecRef", t, None))
            except Exception:
                pass
