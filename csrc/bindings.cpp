// The pybind11 module of the native core (with ring_bindings.cpp and png_bindings.cpp, the ring's and the PNG
// decode's parts, and py_buffers.h, the only pybind11 files). The C++ they bind (ring.h, jpeg_transcode.h,
// png_decode.h, tar_writer.h, image_probe.h) never includes pybind11; the GIL policy
// lives here and there: every call that can block (waiting for a slot, reading files, transcoding) runs under
// py::gil_scoped_release, and so do destructors that join threads, so shutdown cannot deadlock against a worker
// that needs the GIL (none do: workers never touch Python objects).
#include <pybind11/pybind11.h>
#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <memory>
#include <optional>

namespace py = pybind11;

void bind_ring(py::module_& m);  // csrc/ring_bindings.cpp
void bind_png(py::module_& m);   // csrc/png_bindings.cpp

// ---- jpeg bindings (owner: jpeg) -------------------------------------------------------------------------
#include "jpeg_transcode.h"
#include "py_buffers.h"

namespace {

py::bytes to_bytes(const std::vector<std::uint8_t>& v) {
    return py::bytes(reinterpret_cast<const char*>(v.data()), v.size());
}

fastfeed::TranscodeOptions make_options(bool progressive, bool arithmetic, bool optimize_coding, bool copy_markers,
                                        bool strict) {
    fastfeed::TranscodeOptions o;
    o.progressive = progressive;
    o.arithmetic = arithmetic;
    o.optimize_coding = optimize_coding;
    o.copy_markers = copy_markers;
    o.strict = strict;
    return o;
}

}  // namespace

static void bind_jpeg(py::module_& m) {
    m.attr("HAVE_LIBJPEG") = fastfeed::have_libjpeg();
    m.attr("UNCODED_COEFFICIENTS") = fastfeed::kUncodedCoefficients;
    py::register_exception<fastfeed::JpegError>(m, "JpegError", PyExc_ValueError);
    py::register_exception<fastfeed::JpegUnavailable>(m, "JpegUnavailable", PyExc_RuntimeError);

    m.def(
        "transcode",
        [](py::handle data, bool progressive, bool arithmetic, bool optimize_coding, bool copy_markers, bool strict) {
            pybuf::ReadOnlyBuffer buf(data);
            const auto options = make_options(progressive, arithmetic, optimize_coding, copy_markers, strict);
            std::vector<std::uint8_t> out;
            {
                py::gil_scoped_release nogil;
                out = fastfeed::transcode_jpeg(buf.span(), options);
            }
            return to_bytes(out);
        },
        py::arg("data"), py::kw_only(), py::arg("progressive") = false, py::arg("arithmetic") = false,
        py::arg("optimize_coding") = true, py::arg("copy_markers") = true, py::arg("strict") = true,
        "Losslessly re-code a JPEG's entropy coding (DCT coefficients copied). Raises JpegError on bad input.");

    m.def(
        "decode_jpeg_region",
        [](py::handle data, int x0, int y0, int x1, int y1, py::object out, int scale) -> py::object {
            pybuf::ReadOnlyBuffer buf(data);
            std::optional<pybuf::WritableBuffer> dest;
            if (!out.is_none()) dest.emplace(out);
            fastfeed::RegionResult r;
            {
                py::gil_scoped_release nogil;
                r = fastfeed::decode_jpeg_region(buf.span(), x0, y0, x1, y1, std::size_t(1) << 30,
                                                 dest ? dest->mutable_span() : fastfeed::MutableByteSpan{}, scale);
            }
            if (!r.ok) return py::str(r.error);
            return py::make_tuple(pybuf::pixel_array(r.pixels, r.owned, r.in_out(), r.height, r.width, out), r.x,
                                  r.y, r.image_width, r.image_height);
        },
        py::arg("data"), py::arg("x0"), py::arg("y0"), py::arg("x1"), py::arg("y1"), py::arg("out") = py::none(),
        py::arg("scale") = 1,
        "RGB pixels of the window [x0, x1) x [y0, y1) of a YCbCr, RGB or grey JPEG, the rest not decoded "
        "(csrc/jpeg_transcode.h decode_jpeg_region), GIL released. Returns (uint8 array [height, width, 4]: RGBX, "
        "x, y, image width, image height) with x <= x0 (columns widen to whole iMCUs), or a str: why not (corrupt "
        "data, another colour space). "
        "out: a writable buffer the pixels go into, from its start, when they fit (the array is then a view of it); "
        "else the array has memory of its own. scale: 2, 4 or 8 decodes at that DCT scale (PIL's draft), the window "
        "in the scaled image's pixels; the image size returned stays the full one.");

    m.def(
        "transcode_to_baseline",
        [](py::handle data) {
            pybuf::ReadOnlyBuffer buf(data);
            std::vector<std::uint8_t> out;
            {
                py::gil_scoped_release nogil;
                out = fastfeed::transcode_jpeg(buf.span(), fastfeed::TranscodeOptions{});
            }
            return to_bytes(out);
        },
        py::arg("data"),
        "Baseline Huffman, optimized tables, all markers kept, libjpeg warnings are errors (JpegError).");

    m.def(
        "transcode_many",
        [](py::iterable items, int num_threads) {
            std::vector<pybuf::ReadOnlyBuffer> buffers;
            for (py::handle item : items) buffers.emplace_back(item);
            std::vector<fastfeed::ByteSpan> spans;
            spans.reserve(buffers.size());
            for (const auto& b : buffers) spans.push_back(b.span());
            std::vector<fastfeed::TranscodeResult> results;
            {
                py::gil_scoped_release nogil;
                results = fastfeed::transcode_jpeg_many(spans, num_threads, fastfeed::TranscodeOptions{});
            }
            py::list out(results.size());
            for (std::size_t i = 0; i < results.size(); ++i) {
                if (results[i].ok)
                    out[i] = to_bytes(results[i].data);
                else
                    out[i] = py::str(results[i].error);
                results[i].data = {};  // free as we go: peak memory stays near one copy of the outputs
            }
            return out;
        },
        py::arg("items"), py::arg("num_threads") = 0,
        "transcode_to_baseline over many inputs on native threads (0: one per CPU), GIL released. Returns one "
        "entry per input: bytes on success, str (the error message) on failure.");

    m.def(
        "check_jpegs",
        [](py::iterable items, int num_threads, const std::string& method) {
            if (num_threads < 0) throw py::value_error("num_threads must be >= 0");
            using Method = fastfeed::ScanCheckOptions::Method;
            fastfeed::ScanCheckOptions options;
            if (method == "libjpeg")
                options.method = Method::libjpeg;
            else if (method == "walk")
                options.method = Method::walk;
            else if (method != "default")
                throw py::value_error("method must be 'default', 'libjpeg' or 'walk', got '" + method + "'");
            std::vector<pybuf::ReadOnlyBuffer> buffers;
            for (py::handle item : items) buffers.emplace_back(item);
            std::vector<fastfeed::ByteSpan> spans;
            spans.reserve(buffers.size());
            for (const auto& b : buffers) spans.push_back(b.span());
            std::vector<std::string> results;
            {
                py::gil_scoped_release nogil;
                results = fastfeed::check_jpeg_scans_many(spans, num_threads, options);
            }
            py::list out(results.size());
            for (std::size_t i = 0; i < results.size(); ++i) {
                if (results[i].empty())
                    out[i] = py::none();
                else
                    out[i] = py::str(results[i]);
            }
            return out;
        },
        py::arg("items"), py::arg("num_threads") = 0, py::arg("method") = "default",
        "The scan check (csrc/jpeg_transcode.h check_jpeg_scans) over many JPEGs on native threads (0: one per "
        "CPU), GIL released, no output. One entry per input: None when every pixel is coded, else libjpeg's "
        "message. method 'libjpeg' (libjpeg's pass alone) and 'walk' (csrc/jpeg_entropy.h's walk alone, 'not "
        "proven by the walk' where it proves nothing) are for the tests. Raises JpegUnavailable when built "
        "without libjpeg.");
}

// ---- tar writer bindings (owner: pack) ---------------------------------------------------------------------
// GIL: arguments are converted (names validated, paths encoded, bytes pinned as buffer views) with the GIL held;
// add(), finish() and the destructor (which joins the threads) run with it released. One call at a time per
// writer: a second thread calling in while one is inside gets a RuntimeError rather than interleaved records.
#include "tar_writer.h"
#include "xxh3.h"

#include <deque>
#include <mutex>
#include <system_error>

namespace tar_bindings {

struct PyTarWriter {
    std::unique_ptr<fastfeed::TarWriter> core;
    std::mutex busy;

    ~PyTarWriter() {
        if (!core) return;
        py::gil_scoped_release nogil;
        core.reset();
    }
    fastfeed::TarWriter& live() {
        if (!core) throw py::value_error("the tar writer is closed");
        return *core;
    }
};

// The first member's bytes as a read-only buffer for a check function; holding the shared buffer keeps the memory
// alive (and out of the writer's pool) for as long as any view of it exists.
struct TarData {
    fastfeed::SharedBytes buf;
    size_t offset = 0, size = 0;
};

struct PyCheckFailed {};  // the check raised; its Python error was restored on this thread

struct Busy {
    std::unique_lock<std::mutex> lock;
    explicit Busy(PyTarWriter& w) : lock(w.busy, std::try_to_lock) {
        if (!lock.owns_lock()) throw std::runtime_error("TarWriter used from two threads at once");
    }
};

std::string member_name(py::handle name) {
    if (!py::isinstance<py::str>(name)) throw py::type_error("a tar member name must be a str");
    std::string s = name.cast<std::string>();
    if (s.empty() || s.size() > 100 || s.find('\0') != std::string::npos)
        throw py::value_error("tar member name must be 1..100 UTF-8 bytes without NUL: " +
                              py::repr(name).cast<std::string>());
    return s;
}

// SampleProbe as the Python check receives it (see the add() docstring).
py::object probe_facts(const fastfeed::SampleProbe& p) {
    if (!p.jpeg) return py::none();
    const auto& f = p.facts;
    py::object scan = p.scan == fastfeed::SampleProbe::Unchecked ? py::object(py::none())
                      : p.scan == fastfeed::SampleProbe::Clean ? py::object(py::str(""))
                                                               : py::object(py::str(p.scan_error));
    return py::make_tuple(f.sof_marker, py::bytes(f.sof_segment), f.jfif,
                          f.adobe_transform < 0 ? py::object(py::none()) : py::object(py::int_(f.adobe_transform)),
                          f.orientation, f.ends_with_eoi, scan);
}

}  // namespace tar_bindings

static void bind_tar(py::module_& m) {
    using namespace tar_bindings;
    m.attr("HAVE_TAR_WRITER") = fastfeed::have_tar_writer();
    // A failed create/write/fsync (std::system_error) is an OSError with its errno, as from Python's own I/O.
    py::register_exception_translator([](std::exception_ptr p) {
        try {
            if (p) std::rethrow_exception(p);
        } catch (const std::system_error& e) {
            py::object err = py::reinterpret_steal<py::object>(
                PyObject_CallFunction(PyExc_OSError, "is", e.code().value(), e.what()));
            if (err) PyErr_SetObject(PyExc_OSError, err.ptr());
        }
    });
    py::class_<TarData>(m, "TarMemberData", py::buffer_protocol()).def_buffer([](TarData& d) {
        return py::buffer_info(d.buf.get() + d.offset, 1, py::format_descriptor<uint8_t>::format(), 1,
                               {static_cast<py::ssize_t>(d.size)}, {1}, /*readonly=*/true);
    });
    py::class_<PyTarWriter>(m, "TarWriter")
        .def(py::init([](const std::string& path, size_t num_threads) {
                 auto w = std::make_unique<PyTarWriter>();
                 py::gil_scoped_release nogil;
                 w->core = std::make_unique<fastfeed::TarWriter>(path, num_threads);
                 return w;
             }),
             py::arg("path"), py::arg("num_threads") = 0)
        .def(
            "add",
            [](PyTarWriter& w, py::iterable samples, py::object check, bool probe, bool scan_check) {
                Busy busy(w);
                fastfeed::TarWriter& core = w.live();
                std::vector<fastfeed::TarSample> in;
                std::deque<pybuf::ReadOnlyBuffer> held;  // keeps every stored bytes object's memory put while unlocked
                for (py::handle sample : samples) {
                    fastfeed::TarSample ts;
                    for (py::handle member : py::reinterpret_borrow<py::iterable>(sample)) {
                        auto pair = py::reinterpret_borrow<py::sequence>(member);
                        if (pair.size() != 2) throw py::value_error("a tar member is (name, source)");
                        fastfeed::TarMember tm;
                        tm.name = member_name(pair[0]);
                        py::object src = pair[1];
                        if (py::hasattr(src, "__fspath__")) src = py::module_::import("os").attr("fspath")(src);
                        if (py::isinstance<py::str>(src)) {
                            // the filesystem encoding with surrogateescape, as os.fsencode: any name os.listdir gave
                            py::object enc = py::reinterpret_steal<py::object>(PyUnicode_EncodeFSDefault(src.ptr()));
                            if (!enc) throw py::error_already_set();
                            tm.path = enc.cast<std::string>();
                            if (tm.path.empty()) throw py::value_error("empty source path for " + tm.name);
                        } else {
                            held.emplace_back(src);
                            const auto span = held.back().span();
                            tm.data = span.data;
                            tm.size = span.size;
                        }
                        ts.members.push_back(std::move(tm));
                    }
                    in.push_back(std::move(ts));
                }
                fastfeed::TarCheckFn hook;
                if (!check.is_none()) {
                    hook = [&check](size_t j, const fastfeed::SharedBytes& buf, size_t off, size_t size,
                                    const fastfeed::SampleProbe* probe, fastfeed::TarCheck& c) {
                        py::gil_scoped_acquire gil;
                        try {
                            py::object data = py::cast(TarData{buf, off, size});
                            py::object view = py::reinterpret_steal<py::object>(PyMemoryView_FromObject(data.ptr()));
                            if (!view) throw py::error_already_set();
                            py::object res = probe ? check(j, view, probe_facts(*probe)) : check(j, view);
                            if (res.is_none()) {
                                c.kind = fastfeed::TarCheck::Keep;
                            } else if (py::isinstance<py::str>(res)) {
                                c.kind = fastfeed::TarCheck::Drop;
                                c.reason = res.cast<std::string>();
                            } else {
                                auto t = py::reinterpret_borrow<py::sequence>(res);
                                if (!py::isinstance<py::tuple>(res) || t.size() != 2)
                                    throw py::type_error("check must return None, a reason (str) or (name, bytes)");
                                c.kind = fastfeed::TarCheck::Replace;
                                c.name = member_name(t[0]);
                                pybuf::ReadOnlyBuffer rb(t[1]);
                                const auto sp = rb.span();
                                c.data.assign(sp.data, sp.data + sp.size);
                            }
                        } catch (py::error_already_set& e) {
                            e.restore();
                            throw PyCheckFailed{};
                        }
                    };
                }
                std::vector<fastfeed::TarSampleResult> res;
                fastfeed::TarProbe tp;
                tp.enabled = probe;
                tp.scan_check = scan_check;
                try {
                    py::gil_scoped_release nogil;
                    res = core.add(in, hook, tp);
                } catch (PyCheckFailed&) {
                    throw py::error_already_set();
                }
                py::list out(res.size());
                for (size_t i = 0; i < res.size(); ++i) {
                    const auto& r = res[i];
                    if (!r.ok) {
                        out[i] = py::make_tuple(py::none(), r.error, r.err);
                        continue;
                    }
                    py::list members(r.members.size());
                    for (size_t k = 0; k < r.members.size(); ++k)
                        members[k] = py::make_tuple(r.members[k].offset, r.members[k].size, r.members[k].xxh3);
                    out[i] = py::make_tuple(members, py::none(), 0);
                }
                return out;
            },
            py::arg("samples"), py::arg("check") = py::none(), py::kw_only(), py::arg("probe") = false,
            py::arg("scan_check") = false,
            "Append samples, each a list of (name, source) members; source is a str/PathLike (a file read whole) "
            "or bytes-like (stored as is). Returns per sample (members, None, 0) with members = [(data offset, "
            "size, xxh3_64)], or (None, error message, errno) for a sample that was not written (errno 0: the "
            "check rejected it). check(index, memoryview of the first member's bytes) runs in order before each "
            "readable sample is written and returns None (keep), a reason str (drop the sample) or (name, bytes) "
            "(store these as the first member instead); the view stays valid as long as it is referenced. With "
            "probe=True the reader threads probe the first member (csrc/image_probe.h; with scan_check also the "
            "JPEG scan check) and check is called as check(index, view, facts): facts None when it is not a JPEG "
            "whose header walk succeeds, else (sof_marker, sof_segment bytes, jfif, adobe_transform or None, "
            "orientation, ends_with_eoi, scan) with scan None (not checked), '' (clean) or libjpeg's message.")
        .def(
            "finish",
            [](PyTarWriter& w, bool sync) {
                Busy busy(w);
                fastfeed::TarWriter& core = w.live();
                py::gil_scoped_release nogil;
                return core.finish(sync);
            },
            py::arg("sync") = true, "End marker, sha256 (hex), fsync when sync, close.")
        .def("abort",
             [](PyTarWriter& w) {
                 Busy busy(w);
                 if (!w.core) return;
                 py::gil_scoped_release nogil;
                 w.core->abort();
             })
        .def_property_readonly("bytes_written", [](PyTarWriter& w) { return w.live().bytes_written(); })
        .def_property_readonly("num_threads", [](PyTarWriter& w) { return w.live().num_threads(); });

    m.def(
        "probe_jpeg",
        [](py::handle data) {
            pybuf::ReadOnlyBuffer buf(data);
            const auto span = buf.span();
            fastfeed::SampleProbe p;
            {
                py::gil_scoped_release nogil;
                p.jpeg = fastfeed::probe_jpeg(span.data, span.size, p.facts);
            }
            return probe_facts(p);
        },
        py::arg("data"),
        "The tar writer's probe (csrc/image_probe.h) on one buffer: the facts tuple of TarWriter.add's check "
        "(scan None), or None where jpeg.py's header walk would fail.");

    m.def(
        "header_failures",
        [](py::iterable samples) {
            std::vector<pybuf::ReadOnlyBuffer> buffers;
            for (py::handle item : samples) buffers.emplace_back(item);
            std::vector<std::size_t> failing;
            {
                // One release for the batch: per sample the walk takes well under a microsecond, less than winning
                // the GIL back would cost (decode/dali_capi.py says the same of DALI's quick calls).
                py::gil_scoped_release nogil;
                for (std::size_t i = 0; i < buffers.size(); ++i) {
                    const auto span = buffers[i].span();
                    if (!fastfeed::sample_header_ok(span.data, span.size)) failing.push_back(i);
                }
            }
            return failing;
        },
        py::arg("samples"),
        "Positions of the JPEGs (FF D8) and PNGs among `samples` that pack would refuse as they are: a JPEG whose "
        "header walk up to the first scan fails (csrc/image_probe.h) or whose frame header is malformed (where "
        "jpeg.py's `probe` raises), or that does not end in EOI (padding aside); a PNG whose chunk walk fails "
        "(headers.py `png_facts`). Other samples are not looked at. One call per batch, GIL released.");

    m.def(
        "xxh3_64",
        [](py::handle data) {
            pybuf::ReadOnlyBuffer buf(data);
            const auto span = buf.span();
            py::gil_scoped_release nogil;
            return fastfeed::xxh3_64(span.data, span.size);
        },
        py::arg("data"), "XXH3_64bits (seed 0) of a bytes-like object: equals xxhash.xxh3_64_intdigest.");
}

PYBIND11_MODULE(_native, m) {
    m.doc() = "fastfeed native core: prefetch ring, JPEG transcoder, PNG decode, tar shard writer";
    bind_ring(m);
    bind_jpeg(m);
    bind_png(m);
    bind_tar(m);
}
