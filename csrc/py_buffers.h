// Python buffers as the native bindings use them (bindings.cpp, png_bindings.cpp): views of bytes-like objects the
// native code reads or writes with the GIL released, and the numpy arrays of pixels a native decode made. Needs
// pybind11: only binding files include it.
#pragma once

#include <pybind11/pybind11.h>
#include <pybind11/numpy.h>

#include <cstdint>
#include <memory>

#include "byte_span.h"

namespace pybuf {

namespace py = pybind11;

// A contiguous read-only view of any bytes-like object (bytes, bytearray, memoryview, uint8 numpy array).
// Acquired and released with the GIL held; while held, the exporter cannot resize or free the memory, so the
// view may be read with the GIL released.
class ReadOnlyBuffer {
  public:
    explicit ReadOnlyBuffer(py::handle obj) : ReadOnlyBuffer(obj, PyBUF_SIMPLE) {}
    ReadOnlyBuffer(ReadOnlyBuffer&& other) noexcept : view_(other.view_), held_(other.held_) { other.held_ = false; }
    ReadOnlyBuffer(const ReadOnlyBuffer&) = delete;
    ReadOnlyBuffer& operator=(const ReadOnlyBuffer&) = delete;
    ReadOnlyBuffer& operator=(ReadOnlyBuffer&&) = delete;
    ~ReadOnlyBuffer() {
        if (held_) PyBuffer_Release(&view_);
    }
    fastfeed::ByteSpan span() const {
        return {static_cast<const std::uint8_t*>(view_.buf), static_cast<std::size_t>(view_.len)};
    }

  protected:
    ReadOnlyBuffer(py::handle obj, int flags) {
        if (PyObject_GetBuffer(obj.ptr(), &view_, flags) != 0) throw py::error_already_set();
        held_ = true;
    }
    Py_buffer view_{};

  private:
    bool held_ = false;
};

// The same of a writable buffer (a uint8 numpy array, a bytearray); it refuses a read-only one (bytes).
class WritableBuffer : public ReadOnlyBuffer {
  public:
    explicit WritableBuffer(py::handle obj) : ReadOnlyBuffer(obj, PyBUF_WRITABLE) {}
    fastfeed::MutableByteSpan mutable_span() const {
        return {static_cast<std::uint8_t*>(view_.buf), static_cast<std::size_t>(view_.len)};
    }
};

// The array of `height` rows of `width` pixels (`channels` bytes each) a native decode made: a view of `out` that
// keeps a memoryview of it (an export: a bytearray cannot be resized under it), or the owner of `owned` through a
// capsule.
inline py::array_t<std::uint8_t> pixel_array(std::uint8_t* pixels, std::unique_ptr<std::uint8_t[]>& owned, bool in_out,
                                      int height, int width, const py::object& out, int channels = 4) {
    py::object owner;
    if (in_out) {
        owner = py::memoryview(out);
    } else {
        owner = py::capsule(owned.get(), [](void* p) { delete[] static_cast<std::uint8_t*>(p); });
        owned.release();  // the capsule frees them now
    }
    if (channels == 1) return py::array_t<std::uint8_t>({height, width}, pixels, owner);
    return py::array_t<std::uint8_t>({height, width, channels}, pixels, owner);
}

}  // namespace pybuf
