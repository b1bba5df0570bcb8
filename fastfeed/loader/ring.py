"""Python face of the native prefetch ring (csrc/ring.h has NOTE [ Prefetch ring protocol ]).

    ring = PrefetchRing(ds.extents(), batch_size=256)
    ring.start(order)                       # one epoch: int64 sample indices, batches are consecutive chunks
    while (b := ring.next_batch()) is not None:
        with b:                             # release() on exit: the slot goes back to the producers
            decode(b.samples())             # zero-copy uint8 views into the slot, invalid after release
    ring.extend(next_order)                 # (any time after start) the next epoch, read on without a gap

Memory is reserved at construction: `num_slots` slots of `slot_bytes` in one page-aligned allocation, faulted in by
the reader threads as they first fill each slot. When CUDA is available each slot is page-locked with
`cudaHostRegister` (through torch's cudart) the first time one of its batches is handed out, so host-to-device copies
read it directly; a failure to pin warns (`RingPinWarning`) and that slot and the later ones stay pageable
(`RingBatch.pinned` says which). Lazily, because the arena is sized by the data (~12 GB for 12-MP photos): touching
and pinning all of it up front would hold back the first batch by seconds (docs/design/ring.md#lazy-pinning).
A batch bigger than a slot still works: that slot grows a private, unpinned overflow buffer (kept for the ring's
lifetime; `stats()` counts it).

Digests: `PrefetchRing(..., digests=True)` has the reader threads compute every sample's xxh3_64 (seed 0: the pack's
per-sample checksum, = `xxhash.xxh3_64_intdigest`) right after its read, without the GIL; `RingBatch.digests` holds
them (uint64, None when off), for `formats.integrity.bad_checksums(..., digests=)`.

Errors: a failed or short read raises `RingReadError` (an OSError naming file and offset; also `.offset`, `.length`,
`.sample_index`, `.batch_index`) from the `next_batch()` call of the batch that hit it; the failed batch is released
and the next call returns the following batch. (Below this file the binding returns a `RingStatus` enum and a
`RingReadFailure` with named fields; see csrc/ring_bindings.cpp.)

Shutdown: `close()` (idempotent; also via `with`, garbage collection and interpreter exit) stops and joins the
producer threads, wakes a consumer blocked in `next_batch()` in another thread (it raises `RingClosedError`), and
frees the memory once no batch or view of it is left. `next_batch()` waits in short steps, so Ctrl-C interrupts it.

Fork: a ring belongs to the process that created it. In a forked child every method raises `RingClosedError`
(and its threads, which do not exist there, are never joined); create a new ring in the child instead.
"""
from __future__ import annotations

import os
import threading
import warnings
import weakref

import numpy as np

from fastfeed import _native

__all__ = ["PrefetchRing", "RingBatch", "RingReadError", "RingClosedError", "RingPinWarning", "auto_slot_bytes"]

_PAGE = 4096
_Status = _native.RingStatus


class RingReadError(OSError):
    """A sample of the batch could not be read (missing file, truncated shard, I/O error).

    `errno`, `strerror` (the message) and `filename` as for any OSError, plus `offset` and `length` of the sample's
    bytes in that file, `sample_index` (dataset index) and `batch_index` (position in the epoch). The sample is the
    lowest failing one of its batch.
    """

    def __init__(self, errno_: int, message: str, filename: str, offset: int, sample_index: int, batch_index: int,
                 length: int = -1):
        super().__init__(errno_, message, filename)
        self.offset = offset
        self.length = length
        self.sample_index = sample_index
        self.batch_index = batch_index

    @classmethod
    def from_failure(cls, failure, batch_index: int) -> "RingReadError":
        """From the native core's `RingReadFailure` (named fields, see csrc/ring.h `ReadError`)."""
        return cls(failure.errno, failure.message, failure.path, failure.offset, failure.sample_index, batch_index,
                   failure.length)


class RingClosedError(RuntimeError):
    """The ring was closed (or belongs to the parent of this forked process)."""


class RingPinWarning(RuntimeWarning):
    """The ring's memory could not be page-locked; host-to-device copies will be slower."""


def auto_slot_bytes(sizes: np.ndarray, batch_size: int, headroom: float = 1.25) -> int:
    """batch_size x mean sample size x headroom, plus one largest sample, rounded up to a page."""
    sizes = np.asarray(sizes)
    mean = float(sizes.mean()) if sizes.size else 0.0
    largest = int(sizes.max()) if sizes.size else 0
    n = int(batch_size * mean * headroom) + largest
    return max(_PAGE, -(-n // _PAGE) * _PAGE)


class RingBatch:
    """One batch in a slot. `indices`, `offsets` and `sizes` are int64 arrays (offsets into `data`); `digests` the
    samples' xxh3_64 (uint64) when the ring computes them, else None."""

    __slots__ = ("_handle", "_data", "indices", "offsets", "sizes", "digests", "position", "pinned")

    def __init__(self, handle, pinner: "_SlotPinner | None"):
        self._handle = handle
        # The views' base chain is view -> memoryview -> handle -> native ring: memory outlives every view, and a
        # handle dropped without release() gives its slot back when its last view dies.
        self._data = np.frombuffer(handle, dtype=np.uint8)
        self.indices = handle.indices
        self.offsets = handle.offsets
        self.sizes = handle.sizes
        self.digests = handle.digests
        self.position = handle.batch
        self.pinned = pinner is not None and handle.in_arena and pinner.pin(self._data.ctypes.data)

    def __len__(self) -> int:
        return len(self.indices)

    @property
    def data(self) -> np.ndarray:
        """The slot's bytes as one uint8 view (the samples back to back)."""
        if self._data is None:
            raise ValueError("the batch was released; its views are invalid")
        return self._data

    def samples(self) -> list[np.ndarray]:
        data = self.data
        return [data[o : o + s] for o, s in zip(self.offsets.tolist(), self.sizes.tolist())]

    def release(self) -> None:
        """Give the slot back to the producers; views of this batch must not be used afterwards."""
        self._data = None
        self._handle.release()

    def __enter__(self) -> "RingBatch":
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def _order(order) -> np.ndarray:
    order = np.asarray(order)
    if order.ndim != 1 or (order.size and not np.issubdtype(order.dtype, np.integer)):
        raise ValueError(f"order must be a 1-D integer array, got dtype {order.dtype} shape {order.shape}")
    return order.astype(np.int64, copy=False)


def _stop(native, pid: int) -> None:
    if os.getpid() == pid:
        native.stop()


class PrefetchRing:
    """Ordered, bounded prefetch of sample bytes by native threads.

    Args:
        extents: object with `.paths` (list of str), `.file_index` (int32[N]), `.offset` / `.size` (int64[N]):
            sample i is `size[i]` bytes at `offset[i]` of `paths[file_index[i]]`.
        batch_size: samples per batch (the last batch of an epoch may be short).
        num_threads: producer threads; each has one pread in flight (use many for cold/network storage).
        num_slots: batches held at once (being filled, ready, or in use by the consumer).
        slot_bytes: bytes per slot; None sizes it with `auto_slot_bytes(extents.size, batch_size)`.
        pin_memory: None pins when CUDA is available; True pins or warns; False never pins.
        digests: the reader threads also compute each sample's xxh3_64 (`RingBatch.digests`); costs them a little
            CPU per byte read, and the GIL nothing (docs/design/ring.md#checksums).
        digest_window: None (each digest covers its whole read), or (at, size) int64[N]: sample i's digest covers
            bytes [at[i], at[i] + size[i]) of its read (an image member inside a read that spans its sample's
            other members too).
    """

    def __init__(self, extents, batch_size: int, num_threads: int = 4, num_slots: int = 4,
                 slot_bytes: int | None = None, pin_memory: bool | None = None, digests: bool = False,
                 digest_window=None):
        for name, value in (("batch_size", batch_size), ("num_threads", num_threads), ("num_slots", num_slots)):
            if not isinstance(value, (int, np.integer)) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        paths = [os.fspath(p) for p in extents.paths]
        file_index = _int_array(extents.file_index, "file_index", np.int32)
        offset = _int_array(extents.offset, "offset", np.int64)
        size = _int_array(extents.size, "size", np.int64)
        if slot_bytes is None:
            slot_bytes = auto_slot_bytes(size, batch_size)
        elif not isinstance(slot_bytes, (int, np.integer)) or slot_bytes < 1:
            raise ValueError(f"slot_bytes must be a positive integer, got {slot_bytes!r}")
        self._pid = os.getpid()
        self._closed = False
        window = {}
        if digest_window is not None:
            at, length = digest_window
            window = dict(digest_at=_int_array(at, "digest_window at", np.int64),
                          digest_size=_int_array(length, "digest_window size", np.int64))
        self._native = _native.Ring(paths, file_index, offset, size, int(batch_size), int(num_threads),
                                    int(num_slots), int(slot_bytes), digests=bool(digests), **window)
        self._finalizer = weakref.finalize(self, _stop, self._native, self._pid)
        self._last_stats: dict = {}
        self.batch_size = int(batch_size)
        self.num_threads = int(num_threads)
        self.digests = bool(digests)
        self._pinner = _SlotPinner.create(self._native, pin_memory)
        self.pinned = self._pinner is not None  # pinning is on: slots are page-locked as they are first used

    def start(self, order) -> None:
        """Queue one epoch; abandons whatever is left of the previous one."""
        self._live().start(_order(order))

    def extend(self, order) -> None:
        """Queue the next epoch behind the ones queued: its batches follow theirs (`next_batch` goes on into it
        without returning None in between), read ahead as slots free up; nothing queued is dropped. Its batches'
        `position` counts from 0 again. Needs `start` first."""
        self._live().extend(_order(order))

    def next_batch(self, timeout: float | None = None) -> RingBatch | None:
        """The next batch of the epoch, strictly in order; None at the end of the epoch."""
        native = self._live()
        status, handle = native.next(-1.0 if timeout is None else max(0.0, float(timeout)))
        if status == _Status.ok:
            failure = handle.error
            if failure is not None:
                handle.release()  # before any view of the batch exists: its unread bytes are never seen
                raise RingReadError.from_failure(failure, handle.batch)
            return RingBatch(handle, self._pinner)
        if status == _Status.end_of_epoch:
            return None
        if status == _Status.timeout:
            raise TimeoutError(f"no batch ready within {timeout} s")
        if status == _Status.closed:
            raise RingClosedError("the ring was closed")
        if status == _Status.not_started:
            raise RuntimeError("call start(order) before next_batch()")
        if status == _Status.all_slots_held:
            raise RuntimeError(
                f"all {native.num_slots} slots hold batches that were not released; release() the batches you "
                "are done with (or use more slots)")
        raise RuntimeError(f"unexpected ring status {status!r}")

    def stats(self) -> dict:
        native = self._native
        out = dict(native.stats()) if native is not None and not self._closed else dict(self._last_stats)
        out.update(slots=self.num_slots, slot_bytes=self.slot_bytes, pinned=self.pinned, digests=self.digests)
        return out

    @property
    def num_slots(self) -> int:
        return self._num_slots if self._native is None else self._native.num_slots

    @property
    def slot_bytes(self) -> int:
        return self._slot_bytes if self._native is None else self._native.slot_bytes

    def close(self) -> None:
        if self._closed:
            return
        native = self._native
        if os.getpid() == self._pid:
            self._last_stats = dict(native.stats())
        self._num_slots, self._slot_bytes = native.num_slots, native.slot_bytes
        self._closed = True
        self._finalizer()
        # Batches still alive keep the native object (and the memory) until they are gone.
        self._native = None

    def __enter__(self) -> "PrefetchRing":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _live(self):
        if os.getpid() != self._pid:
            raise RingClosedError(
                f"this PrefetchRing was created in process {self._pid}; it cannot be used in forked child "
                f"{os.getpid()} (create a new ring there)")
        native = self._native
        if native is None:
            raise RingClosedError("the ring was closed")
        return native


def _int_array(values, name: str, dtype) -> np.ndarray:
    a = np.asarray(values)
    if a.ndim != 1 or (a.size and not np.issubdtype(a.dtype, np.integer)):
        raise ValueError(f"extents.{name} must be a 1-D integer array, got dtype {a.dtype} shape {a.shape}")
    return np.ascontiguousarray(a, dtype=dtype)


class _SlotPinner:
    """Page-locks the ring's arena one slot at a time, when a batch of that slot is first handed out (see the module
    docstring for why not all at once). By then the readers have faulted the slot in, so registering it only locks
    pages that exist, the cheap part (docs/design/ring.md#lazy-pinning). Unregistered, every slot at once, when the
    native ring frees the arena (after the producers stopped and the last view is gone)."""

    def __init__(self, native, cudart):
        self._cudart = cudart
        self._arena = native.arena_address
        self._arena_bytes = native.arena_bytes
        self._slot_bytes = native.slot_bytes
        self._lock = threading.Lock()
        self._pinned: set[int] = set()
        self._failed = False
        native.set_free_hook(self._unregister_all)

    @classmethod
    def create(cls, native, pin_memory: bool | None) -> "_SlotPinner | None":
        """A pinner when pinning is asked for (True) or possible (None) and CUDA is usable; else None (with a
        RingPinWarning when it was asked for)."""
        if pin_memory is False:
            return None
        try:
            import torch
        except ImportError:
            torch = None
        if torch is None or not torch.cuda.is_available():
            if pin_memory:
                warnings.warn("pin_memory=True but CUDA is not available: the ring's memory is not pinned",
                              RingPinWarning, stacklevel=3)
            return None
        try:
            cudart = torch.cuda.cudart()  # initialises CUDA: raises e.g. in a child forked from a CUDA process
        except Exception as e:  # noqa: BLE001 - any failure must become the warning below, not pass silently
            warnings.warn(f"CUDA's runtime is not usable here ({e!r}): the ring's memory is not pinned",
                          RingPinWarning, stacklevel=3)
            return None
        return cls(native, cudart)

    def pin(self, address: int) -> bool:
        """Page-lock the slot holding `address` (an arena address) if not yet; whether it is page-locked."""
        slot = (address - self._arena) // self._slot_bytes
        if not 0 <= address - self._arena < self._arena_bytes:
            return False
        with self._lock:
            if slot in self._pinned:
                return True
            if self._failed:
                return False
            start = self._arena + slot * self._slot_bytes
            try:
                err = int(self._cudart.cudaHostRegister(start, self._slot_bytes, 0))
            except Exception as e:  # noqa: BLE001 - becomes the warning below
                err, detail = -1, repr(e)
            else:
                detail = f"cudaError {err}"
            if err != 0:
                self._failed = True  # one warning; the slots pinned so far stay pinned
                warnings.warn(f"cudaHostRegister of a ring slot ({self._slot_bytes} bytes) failed ({detail}): "
                              "this slot and the ones not yet used stay pageable", RingPinWarning, stacklevel=4)
                return False
            self._pinned.add(slot)
            return True

    def _unregister_all(self) -> None:
        # The native free hook: runs when the last batch/view and the ring are gone, after the producers stopped,
        # before the arena is freed.
        with self._lock:
            slots, self._pinned = sorted(self._pinned), set()
        for slot in slots:
            err = int(self._cudart.cudaHostUnregister(self._arena + slot * self._slot_bytes))
            if err != 0:
                warnings.warn(f"cudaHostUnregister failed (cudaError {err})", RingPinWarning, stacklevel=1)
