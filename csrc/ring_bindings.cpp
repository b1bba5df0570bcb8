// pybind11 binding of the native prefetch ring (csrc/ring.h); the rest of the native core is bound in
// bindings.cpp, which calls bind_ring(). Same GIL policy as there: ring.h never includes pybind11, and every call
// that can block runs with the GIL released.
#include <pybind11/pybind11.h>
#include <pybind11/numpy.h>
#include <pybind11/stl.h>

namespace py = pybind11;

// ---- ring bindings (owner: ring) -------------------------------------------------------------------------
// GIL: the constructor starts threads that never touch Python; start(), extend(), next() and the destructor's join run
// with the GIL released; next() waits in short steps so Ctrl-C (PyErr_CheckSignals) reaches the caller.
// Lifetime: every NativeBatch keeps its ring object alive, and numpy views made from a NativeBatch keep the
// batch alive, so the slot memory outlives all views and a batch dropped without release() is released on GC.
#include "ring.h"

#include <algorithm>
#include <optional>
#include <chrono>
#include <cstring>

namespace ring_bindings {

struct PyRing {
    std::unique_ptr<fastfeed::Ring> core;
    py::object free_hook;  // called (GIL held) after the threads stop, just before the memory is freed

    ~PyRing() {
        if (!core) return;
        if (!core->owned_by_this_process()) {
            (void)core.release();  // forked child: see "Fork" in NOTE [ Prefetch ring protocol ]
            return;
        }
        {
            py::gil_scoped_release nogil;
            core->stop();
        }
        if (free_hook && !free_hook.is_none()) {
            py::error_scope keep_pending_error;
            try {
                free_hook();
            } catch (py::error_already_set& e) {
                e.discard_as_unraisable("fastfeed ring: free hook");
            }
        }
        core.reset();
    }
};

struct NativeBatch {
    py::object owner;  // the PyRing
    fastfeed::Ring* core = nullptr;
    fastfeed::BatchView view;
    bool released = false;

    void release() {
        if (released) return;
        released = true;
        if (core->owned_by_this_process()) core->release(view.slot, view.ticket);
    }
    ~NativeBatch() {
        if (core) release();
    }
};

template <typename T>
std::vector<T> to_vector(py::array_t<T, py::array::c_style | py::array::forcecast> a, const char* name) {
    if (a.ndim() != 1) throw py::value_error(std::string(name) + " must be one-dimensional");
    return std::vector<T>(a.data(), a.data() + a.size());
}

template <typename T>
py::array_t<T> copy_array(const T* p, size_t n) {
    py::array_t<T> out(static_cast<py::ssize_t>(n));
    if (n) std::memcpy(out.mutable_data(), p, n * sizeof(T));
    return out;
}

}  // namespace ring_bindings

void bind_ring(py::module_& m) {
    using namespace ring_bindings;
    // next()'s outcome as a typed value: ring.py compares members, so a renamed or added state is a Python
    // AttributeError at import/first use rather than a string that silently matches nothing.
    py::enum_<fastfeed::NextStatus>(m, "RingStatus")
        .value("ok", fastfeed::NextStatus::Ok)
        .value("end_of_epoch", fastfeed::NextStatus::EndOfEpoch)
        .value("timeout", fastfeed::NextStatus::Timeout)
        .value("closed", fastfeed::NextStatus::Closed)
        .value("not_started", fastfeed::NextStatus::NotStarted)
        .value("all_slots_held", fastfeed::NextStatus::AllSlotsHeld);

    // Why a batch failed, with named fields (ring.py turns it into RingReadError).
    py::class_<fastfeed::ReadError>(m, "RingReadFailure")
        .def_readonly("sample_index", &fastfeed::ReadError::sample)
        .def_readonly("path", &fastfeed::ReadError::path)
        .def_readonly("offset", &fastfeed::ReadError::offset)
        .def_readonly("length", &fastfeed::ReadError::length)
        .def_readonly("errno", &fastfeed::ReadError::err)
        .def_readonly("message", &fastfeed::ReadError::message)
        .def("__repr__", [](const fastfeed::ReadError& e) {
            return "RingReadFailure(sample_index=" + std::to_string(e.sample) + ", path='" + e.path +
                   "', offset=" + std::to_string(e.offset) + ", length=" + std::to_string(e.length) +
                   ", errno=" + std::to_string(e.err) + ", message='" + e.message + "')";
        });

    py::class_<NativeBatch>(m, "RingBatchHandle", py::buffer_protocol())
        .def_buffer([](NativeBatch& b) {
            if (b.released) throw py::value_error("the batch was released; its views are invalid");
            return py::buffer_info(b.view.data, 1, py::format_descriptor<uint8_t>::format(), 1,
                                   {static_cast<py::ssize_t>(b.view.nbytes)}, {1}, false);
        })
        .def("release", &NativeBatch::release)
        .def_property_readonly("released", [](const NativeBatch& b) { return b.released; })
        .def_property_readonly("batch", [](const NativeBatch& b) { return b.view.batch; })
        .def_property_readonly("nbytes", [](const NativeBatch& b) { return b.view.nbytes; })
        .def_property_readonly("in_arena", [](const NativeBatch& b) { return b.view.in_arena; })
        .def_property_readonly("indices", [](const NativeBatch& b) { return copy_array(b.view.indices, b.view.count); })
        .def_property_readonly("offsets", [](const NativeBatch& b) { return copy_array(b.view.offsets, b.view.count); })
        .def_property_readonly("sizes", [](const NativeBatch& b) { return copy_array(b.view.sizes, b.view.count); })
        // uint64 XXH3_64bits per sample (see "Digests" in the NOTE), None when the ring computes none.
        .def_property_readonly("digests", [](const NativeBatch& b) -> py::object {
            if (!b.view.digests) return py::none();
            return copy_array(b.view.digests, b.view.count);
        })
        .def_property_readonly("error", [](const NativeBatch& b) -> py::object {
            if (!b.view.failed) return py::none();
            return py::cast(b.view.error);
        });

    py::class_<PyRing>(m, "Ring")
        .def(py::init([](std::vector<std::string> paths,
                         py::array_t<int32_t, py::array::c_style | py::array::forcecast> file_index,
                         py::array_t<int64_t, py::array::c_style | py::array::forcecast> offset,
                         py::array_t<int64_t, py::array::c_style | py::array::forcecast> size, size_t batch_size,
                         size_t num_threads, size_t num_slots, size_t slot_bytes, bool digests,
                         std::optional<py::array_t<int64_t, py::array::c_style | py::array::forcecast>> digest_at,
                         std::optional<py::array_t<int64_t, py::array::c_style | py::array::forcecast>> digest_size) {
                 fastfeed::RingConfig cfg;
                 cfg.batch_size = batch_size;
                 cfg.num_threads = num_threads;
                 cfg.num_slots = num_slots;
                 cfg.slot_bytes = slot_bytes;
                 cfg.digests = digests;
                 auto fi = to_vector(file_index, "file_index");
                 auto off = to_vector(offset, "offset");
                 auto sz = to_vector(size, "size");
                 if (digest_at.has_value() != digest_size.has_value())
                     throw std::invalid_argument("digest_at and digest_size go together");
                 std::vector<int64_t> dat, dsz;
                 if (digest_at) {
                     dat = to_vector(*digest_at, "digest_at");
                     dsz = to_vector(*digest_size, "digest_size");
                 }
                 auto r = std::make_unique<PyRing>();
                 {
                     // Allocating the arena (GBs for big batches) must not stall Python threads.
                     py::gil_scoped_release nogil;
                     r->core = std::make_unique<fastfeed::Ring>(std::move(paths), std::move(fi), std::move(off),
                                                                std::move(sz), cfg, std::move(dat),
                                                                std::move(dsz));
                 }
                 return r;
             }),
             py::arg("paths"), py::arg("file_index"), py::arg("offset"), py::arg("size"), py::arg("batch_size"),
             py::arg("num_threads"), py::arg("num_slots"), py::arg("slot_bytes"), py::kw_only(),
             py::arg("digests") = false, py::arg("digest_at") = py::none(), py::arg("digest_size") = py::none())
        .def("start",
             [](PyRing& r, py::array_t<int64_t, py::array::c_style | py::array::forcecast> order) {
                 auto v = to_vector(order, "order");
                 py::gil_scoped_release nogil;
                 r.core->start(std::move(v));
             })
        .def("extend",
             [](PyRing& r, py::array_t<int64_t, py::array::c_style | py::array::forcecast> order) {
                 auto v = to_vector(order, "order");
                 py::gil_scoped_release nogil;
                 r.core->extend(std::move(v));
             })
        // Returns (RingStatus, handle); handle is None unless the status is RingStatus.ok.
        .def("next",
             [](py::object self, double timeout) -> py::tuple {
                 PyRing& r = self.cast<PyRing&>();
                 using Clock = std::chrono::steady_clock;
                 const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                                          std::chrono::duration<double>(timeout < 0 ? 0 : timeout));
                 auto b = std::make_unique<NativeBatch>();
                 fastfeed::NextStatus st;
                 while (true) {
                     double step = 0.05;
                     if (timeout >= 0) {
                         step = std::min(step, std::chrono::duration<double>(deadline - Clock::now()).count());
                         step = std::max(step, 0.0);
                     }
                     {
                         py::gil_scoped_release nogil;
                         st = r.core->next(b->view, step);
                     }
                     if (st != fastfeed::NextStatus::Timeout) break;
                     if (PyErr_CheckSignals() != 0) throw py::error_already_set();
                     if (timeout >= 0 && Clock::now() >= deadline) break;
                 }
                 if (st != fastfeed::NextStatus::Ok) return py::make_tuple(st, py::none());
                 b->owner = self;
                 b->core = r.core.get();
                 return py::make_tuple(st, py::cast(std::move(b)));
             },
             py::arg("timeout"))
        .def("stop",
             [](PyRing& r) {
                 py::gil_scoped_release nogil;
                 r.core->stop();
             })
        .def("set_free_hook", [](PyRing& r, py::object hook) { r.free_hook = std::move(hook); })
        .def_property_readonly("arena_address",
                               [](const PyRing& r) { return reinterpret_cast<uintptr_t>(r.core->arena()); })
        .def_property_readonly("arena_bytes", [](const PyRing& r) { return r.core->arena_bytes(); })
        .def_property_readonly("slot_bytes", [](const PyRing& r) { return r.core->slot_bytes(); })
        .def_property_readonly("num_slots", [](const PyRing& r) { return r.core->num_slots(); })
        .def("stats", [](const PyRing& r) {
            fastfeed::RingStats s = r.core->stats();
            py::dict d;
            d["bytes_read"] = s.bytes_read;
            d["read_seconds"] = s.read_seconds;
            d["digest_seconds"] = s.digest_seconds;
            d["batches"] = s.batches;
            d["wait_seconds"] = s.wait_seconds;
            d["overflow_batches"] = s.overflow_batches;
            d["overflow_bytes"] = s.overflow_bytes;
            return d;
        });
}
