// pybind11 binding of the native PNG decode (csrc/png_decode.h); bindings.cpp calls bind_png(). The decode runs with
// the GIL released, into the caller's buffer when it holds the pixels.
#include <pybind11/pybind11.h>

#include <optional>

#include "png_decode.h"
#include "py_buffers.h"

namespace py = pybind11;

namespace {

// decode_png's binding: an array of `form`'s pixels, or a str (why not).
py::object decode_png_array(py::handle data, const py::object& out, fastfeed::PngPixels form) {
    pybuf::ReadOnlyBuffer buf(data);
    std::optional<pybuf::WritableBuffer> dest;
    if (!out.is_none()) dest.emplace(out);
    fastfeed::PngResult r;
    {
        py::gil_scoped_release nogil;
        r = fastfeed::decode_png(buf.span(), form, dest ? dest->mutable_span() : fastfeed::MutableByteSpan{});
    }
    if (!r.ok) return py::str(r.error);
    return pybuf::pixel_array(r.pixels, r.owned, r.in_out(), r.height, r.width, out,
                              form == fastfeed::PngPixels::Rgbx ? 4 : form == fastfeed::PngPixels::Rgb ? 3 : 1);
}

}  // namespace

void bind_png(py::module_& m) {
    m.def(
        "decode_png_rgbx",
        [](py::handle data, py::object out) { return decode_png_array(data, out, fastfeed::PngPixels::Rgbx); },
        py::arg("data"), py::arg("out") = py::none(),
        "The pixels of an 8-bit grey, RGB or palette PNG without transparency, interlacing or animation "
        "(csrc/png_decode.h), GIL released: uint8 array [height, width, 4], RGBX, grey as R = G = B; or a str: why "
        "not (another kind of PNG, damaged data), for the caller to decode it with PIL. out: as decode_jpeg_region's.");

    m.def(
        "decode_png_rgb",
        [](py::handle data, py::object out) { return decode_png_array(data, out, fastfeed::PngPixels::Rgb); },
        py::arg("data"), py::arg("out") = py::none(),
        "decode_png_rgbx's pixels as uint8 [height, width, 3] RGB (the layout DALI's whole-image decode hands on); or "
        "a str.");

    m.def(
        "decode_png_samples",
        [](py::handle data, py::object out) { return decode_png_array(data, out, fastfeed::PngPixels::Samples); },
        py::arg("data"), py::arg("out") = py::none(),
        "decode_png_rgbx's PNGs, grey and palette ones only, as their stored samples: uint8 array [height, width] of "
        "grey levels or palette indices (a label image's class ids: numpy's view of PIL's L and P images); or a str.");
}
