// See jpeg_transcode.h. Error handling design:
//
// libjpeg reports fatal errors through error_exit, which must not return. Throwing a C++ exception through
// libjpeg's C frames is undefined behaviour, so error_exit longjmps back to the run_* function of the operation
// (run_libjpeg for the transcoder, run_scan_check, run_region), the only functions that call setjmp (once each; the
// transcoder's decompressor and compressor share its jmp_buf). They and every libjpeg callback keep only trivially
// destructible locals, so the longjmp skips no destructor. The libjpeg objects themselves live in RAII holders one
// frame up (transcode_jpeg, check_jpeg_scans, decode_jpeg_region), which destroy them on every path.
#include "jpeg_transcode.h"

#include "jpeg_entropy.h"

#include <algorithm>
#include <atomic>
#include <exception>
#include <system_error>
#include <thread>

#ifdef FASTFEED_HAVE_LIBJPEG
#include <csetjmp>
#include <cstdio>  // jpeglib.h needs FILE
#include <cstring>
#include <jpeglib.h>
#include <jerror.h>
#endif

namespace fastfeed {

#ifdef FASTFEED_HAVE_LIBJPEG

namespace {

// Where a failure of either libjpeg object goes.
struct Failure {
    std::jmp_buf jump;
    char message[JMSG_LENGTH_MAX];
};

struct ErrorManager {
    jpeg_error_mgr pub;  // first member: libjpeg sees a jpeg_error_mgr*
    Failure* failure;
    bool strict;
    bool ignore_benign = false;  // the scan check: warnings that leave every pixel coded are not errors
};

// Warnings after which every pixel is still coded in the file and decoded identically (see check_jpeg_scans).
bool is_benign_warning(int code) {
    return code == JWRN_EXTRANEOUS_DATA || code == JWRN_ADOBE_XFORM || code == JWRN_JFIF_MAJOR ||
           code == JWRN_BOGUS_ICC || code == JWRN_TOO_MUCH_DATA;
}

void on_error_exit(j_common_ptr cinfo) {
    auto* err = reinterpret_cast<ErrorManager*>(cinfo->err);
    if (cinfo->err->msg_code == JERR_NO_BACKING_STORE) {
        // libjpeg asks for a temp file once the coefficient buffers exceed max_memory_to_use.
        std::snprintf(err->failure->message, sizeof(err->failure->message),
                      "image too large: needs more than %ld bytes of coefficient memory",
                      cinfo->mem->max_memory_to_use);
    } else {
        (*cinfo->err->format_message)(cinfo, err->failure->message);
    }
    std::longjmp(err->failure->jump, 1);
}

void on_emit_message(j_common_ptr cinfo, int level) {
    // level < 0: a warning about corrupt data that libjpeg would otherwise silently fill with zeros.
    if (level >= 0) return;
    auto* err = reinterpret_cast<ErrorManager*>(cinfo->err);
    cinfo->err->num_warnings++;
    if (err->ignore_benign && is_benign_warning(cinfo->err->msg_code)) return;
    if (err->strict) on_error_exit(cinfo);
}

void init_error_manager(ErrorManager& err, Failure* failure, bool strict, bool ignore_benign) {
    jpeg_std_error(&err.pub);
    err.pub.error_exit = on_error_exit;
    err.pub.emit_message = on_emit_message;
    err.failure = failure;
    err.strict = strict;
    err.ignore_benign = ignore_benign;
}

struct ScanLimit {
    jpeg_progress_mgr pub;
    int max_scans;
};

void on_progress(j_common_ptr cinfo) {
    auto* limit = reinterpret_cast<ScanLimit*>(cinfo->progress);
    if (cinfo->is_decompressor &&
        reinterpret_cast<j_decompress_ptr>(cinfo)->input_scan_number > limit->max_scans) {
        Failure* failure = reinterpret_cast<ErrorManager*>(cinfo->err)->failure;
        std::snprintf(failure->message, sizeof(failure->message), "more than %d scans (progressive scan bomb?)",
                      limit->max_scans);
        std::longjmp(failure->jump, 1);
    }
}

// Destination manager appending to a std::vector. libjpeg's own jpeg_mem_dest leaves its output pointer dangling
// when an error interrupts a buffer growth, hence this one.
struct VectorDestination {
    jpeg_destination_mgr pub;
    std::vector<std::uint8_t>* out;
    bool out_of_memory;
};

constexpr std::size_t kInitialOutput = 64 * 1024;

void dest_init(j_compress_ptr cinfo) {
    auto* dest = reinterpret_cast<VectorDestination*>(cinfo->dest);
    dest->pub.next_output_byte = dest->out->data();
    dest->pub.free_in_buffer = dest->out->size();
}

boolean dest_empty(j_compress_ptr cinfo) {
    auto* dest = reinterpret_cast<VectorDestination*>(cinfo->dest);
    // libjpeg's contract: the whole buffer is full when this is called.
    const std::size_t used = dest->out->size();
    try {
        dest->out->resize(used * 2);
    } catch (const std::bad_alloc&) {  // must not cross libjpeg's C frames as an exception
        dest->out_of_memory = true;
        ERREXIT1(cinfo, JERR_OUT_OF_MEMORY, 10);
    }
    dest->pub.next_output_byte = dest->out->data() + used;
    dest->pub.free_in_buffer = dest->out->size() - used;
    return TRUE;
}

void dest_term(j_compress_ptr cinfo) {
    auto* dest = reinterpret_cast<VectorDestination*>(cinfo->dest);
    dest->out->resize(dest->out->size() - dest->pub.free_in_buffer);
}

// Value-initialised so that destroying after a failed create is safe (libjpeg checks cinfo.mem for NULL).
struct Decompressor {
    jpeg_decompress_struct cinfo{};
    ErrorManager err;
    ScanLimit scans;
    bool created = false;
    ~Decompressor() {
        if (created) jpeg_destroy_decompress(&cinfo);
    }
};

struct Compressor {
    jpeg_compress_struct cinfo{};
    ErrorManager err;
    VectorDestination dest;
    bool created = false;
    ~Compressor() {
        if (created) jpeg_destroy_compress(&cinfo);
    }
};

bool is_jfif_marker(const jpeg_saved_marker_ptr m) {
    return m->marker == JPEG_APP0 && m->data_length >= 5 && std::memcmp(m->data, "JFIF\0", 5) == 0;
}

bool is_adobe_marker(const jpeg_saved_marker_ptr m) {
    return m->marker == JPEG_APP0 + 14 && m->data_length >= 5 && std::memcmp(m->data, "Adobe", 5) == 0;
}

// Creates the decompressor over `input` with the memory and scan limits. Call only under the caller's setjmp (its
// libjpeg calls may longjmp through this frame, which holds nothing to destroy).
void open_decompressor(Decompressor& d, ByteSpan input, std::size_t max_memory, int max_scans) {
    d.created = true;
    jpeg_create_decompress(&d.cinfo);
    d.cinfo.mem->max_memory_to_use = static_cast<long>(max_memory);
    d.scans.pub.progress_monitor = on_progress;
    d.scans.max_scans = max_scans;
    d.cinfo.progress = &d.scans.pub;
    jpeg_mem_src(&d.cinfo, input.data, static_cast<unsigned long>(input.size));
}

// Whether the scans coded every coefficient of every component to its last bit; call between jpeg_read_coefficients
// and jpeg_finish_decompress (which frees the progression state). Where a progressive file's scans stop short (DC only, no refinement), libjpeg estimates the
// missing low frequencies (block smoothing) and other decoders do not, so its pixels depend on the decoder, and a
// baseline copy of its coefficients would decode like the latter.
bool all_coefficients_coded(const jpeg_decompress_struct& c) {
    if (!c.progressive_mode) return true;
    if (c.coef_bits == nullptr) return false;
    for (int ci = 0; ci < c.num_components; ++ci)
        for (int k = 0; k < DCTSIZE2; ++k)
            if (c.coef_bits[ci][k] != 0) return false;
    return true;
}

// All libjpeg calls happen here, under one setjmp. Returns false on error, with the message in failure and the
// stage in *stage. Keep every local trivially destructible (see the top of this file).
bool run_libjpeg(Decompressor& d, Compressor& c, Failure& failure, ByteSpan input, const TranscodeOptions& options,
                 const char** stage) {
    *stage = "reading";
    if (setjmp(failure.jump)) return false;
    open_decompressor(d, input, options.max_memory, options.max_scans);
    if (options.copy_markers) {
        jpeg_save_markers(&d.cinfo, JPEG_COM, 0xFFFF);
        for (int i = 0; i < 16; ++i) jpeg_save_markers(&d.cinfo, JPEG_APP0 + i, 0xFFFF);
    }
    jpeg_read_header(&d.cinfo, TRUE);
    jvirt_barray_ptr* coefficients = jpeg_read_coefficients(&d.cinfo);
    if (!all_coefficients_coded(d.cinfo)) {  // a copy would not decode to the source's pixels: not lossless
        std::snprintf(failure.message, sizeof(failure.message), "%s", kUncodedCoefficients);
        return false;
    }

    *stage = "writing";
    c.created = true;
    jpeg_create_compress(&c.cinfo);
    jpeg_copy_critical_parameters(&d.cinfo, &c.cinfo);
    // Huffman table optimisation means nothing to arithmetic coding, and libjpeg rejects the combination.
    c.cinfo.optimize_coding = options.optimize_coding && !options.arithmetic ? TRUE : FALSE;
    c.cinfo.arith_code = options.arithmetic ? TRUE : FALSE;
    if (options.progressive) jpeg_simple_progression(&c.cinfo);
    c.dest.pub.init_destination = dest_init;
    c.dest.pub.empty_output_buffer = dest_empty;
    c.dest.pub.term_destination = dest_term;
    c.cinfo.dest = &c.dest.pub;
    jpeg_write_coefficients(&c.cinfo, coefficients);
    if (options.copy_markers) {
        // Like jpegtran's jcopy_markers_execute: libjpeg already wrote its own JFIF/Adobe marker.
        for (jpeg_saved_marker_ptr m = d.cinfo.marker_list; m != nullptr; m = m->next) {
            if (c.cinfo.write_JFIF_header && is_jfif_marker(m)) continue;
            if (c.cinfo.write_Adobe_marker && is_adobe_marker(m)) continue;
            jpeg_write_marker(&c.cinfo, m->marker, m->data, m->data_length);
        }
    }
    jpeg_finish_compress(&c.cinfo);
    jpeg_finish_decompress(&d.cinfo);
    return true;
}

// The common file's scan check without libjpeg's decode (jpeg_entropy.h): true only when the walk proves what
// libjpeg's pass would find. Reads the headers libjpeg parsed; calls no libjpeg function.
bool scan_proven_complete(const jpeg_decompress_struct& c, std::size_t max_memory) {
    if (c.progressive_mode || c.arith_code || c.data_precision != 8 || c.unread_marker != 0 ||
        c.comps_in_scan != c.num_components || c.num_components > 4 || c.Ss != 0 || c.Se != DCTSIZE2 - 1 ||
        c.Ah != 0 || c.Al != 0 || c.src == nullptr)
        return false;
    ScanLayout layout;
    layout.width = static_cast<int>(c.image_width);
    layout.height = static_cast<int>(c.image_height);
    layout.num_components = c.comps_in_scan;
    layout.restart_interval = c.restart_interval;
    std::uint64_t blocks = 0;  // libjpeg's coefficient buffers hold every block: its memory limit applies here too
    for (int i = 0; i < c.comps_in_scan; ++i) {
        const jpeg_component_info* comp = c.cur_comp_info[i];
        // libjpeg latches each component's quantisation table as the scan starts: one not defined is its error.
        if (comp == nullptr || comp->quant_tbl_no < 0 || comp->quant_tbl_no >= NUM_QUANT_TBLS ||
            c.quant_tbl_ptrs[comp->quant_tbl_no] == nullptr)
            return false;
        layout.components[i] = {comp->h_samp_factor, comp->v_samp_factor, comp->dc_tbl_no, comp->ac_tbl_no};
        blocks += (std::uint64_t(c.image_width) / 8 + 4) * (std::uint64_t(c.image_height) / 8 + 4);  // at most
    }
    if (blocks * sizeof(JBLOCK) > max_memory / 2) return false;  // near the limit: libjpeg decides
    for (int t = 0; t < NUM_HUFF_TBLS; ++t) {
        if (const JHUFF_TBL* h = c.dc_huff_tbl_ptrs[t]) layout.dc[t] = {h->bits, h->huffval};
        if (const JHUFF_TBL* h = c.ac_huff_tbl_ptrs[t]) layout.ac[t] = {h->bits, h->huffval};
    }
    return baseline_scan_complete(layout, {c.src->next_input_byte, c.src->bytes_in_buffer});
}

// The scan check's libjpeg calls, under their own setjmp (same rules as run_libjpeg).
bool run_scan_check(Decompressor& d, Failure& failure, ByteSpan input, const ScanCheckOptions& options) {
    if (setjmp(failure.jump)) return false;
    open_decompressor(d, input, options.max_memory, options.max_scans);
    jpeg_read_header(&d.cinfo, TRUE);
    using Method = ScanCheckOptions::Method;
    if (options.method != Method::libjpeg && scan_proven_complete(d.cinfo, options.max_memory)) return true;
    if (options.method == Method::walk) {
        std::snprintf(failure.message, sizeof(failure.message), "%s", kNotProven);
        return false;
    }
    jpeg_read_coefficients(&d.cinfo);  // every scan, entropy-decoded into the coefficient buffers
    const bool coded = all_coefficients_coded(d.cinfo);  // before finish_decompress frees the image's state
    jpeg_finish_decompress(&d.cinfo);                    // up to the EOI marker
    if (!coded) {
        std::snprintf(failure.message, sizeof(failure.message), "%s", kUncodedCoefficients);
        return false;
    }
    return true;
}

// The window decode needs libjpeg-turbo's jpeg_crop_scanline (1.5, 2016; its version number macro since 2.0) and its
// RGBX output (extended colour spaces).
#if defined(JCS_EXTENSIONS) && defined(LIBJPEG_TURBO_VERSION_NUMBER)
#define FASTFEED_HAVE_JPEG_REGION 1
#endif

#ifdef FASTFEED_HAVE_JPEG_REGION
// decode_jpeg_region's libjpeg calls, under their own setjmp (same rules as run_libjpeg; `r` lives one frame up).
bool run_region(Decompressor& d, Failure& failure, ByteSpan input, int x0, int y0, int x1, int y1,
                std::size_t max_memory, MutableByteSpan out, int scale_denom, RegionResult& r) {
    if (setjmp(failure.jump)) return false;
    open_decompressor(d, input, max_memory, TranscodeOptions{}.max_scans);
    jpeg_read_header(&d.cinfo, TRUE);
    const bool colour = d.cinfo.num_components == 3 &&
                        (d.cinfo.jpeg_color_space == JCS_YCbCr || d.cinfo.jpeg_color_space == JCS_RGB);
    const bool grey = d.cinfo.num_components == 1 && d.cinfo.jpeg_color_space == JCS_GRAYSCALE;
    if (!colour && !grey) {
        std::snprintf(failure.message, sizeof(failure.message), "not a YCbCr, RGB or greyscale JPEG");
        return false;
    }
    // RGB with a pad byte: PIL holds RGB images as 4 bytes per pixel, so it can wrap these rows without a copy. Grey
    // is replicated into R, G and B (libjpeg-turbo's conversion), which is PIL's L -> RGB to the bit. Every other
    // setting stays libjpeg's default, as in PIL's decoder (whose draft sets the scale alone).
    d.cinfo.out_color_space = JCS_EXT_RGBX;
    d.cinfo.scale_num = 1;
    d.cinfo.scale_denom = static_cast<unsigned int>(scale_denom);
    jpeg_start_decompress(&d.cinfo);
    const int W = static_cast<int>(d.cinfo.output_width);
    const int H = static_cast<int>(d.cinfo.output_height);
    // (new names, not the parameters: nothing live at the setjmp is modified after it)
    const int left = std::clamp(x0, 0, W), right = std::clamp(x1, 0, W);
    const int top = std::clamp(y0, 0, H), bottom = std::clamp(y1, 0, H);
    if (right <= left || bottom <= top) {
        std::snprintf(failure.message, sizeof(failure.message), "empty window");
        return false;
    }
    JDIMENSION xoffset = static_cast<JDIMENSION>(left);
    JDIMENSION width = static_cast<JDIMENSION>(right - left);
    if (width < d.cinfo.output_width) jpeg_crop_scanline(&d.cinfo, &xoffset, &width);  // widened to iMCUs
    if (top > 0) jpeg_skip_scanlines(&d.cinfo, static_cast<JDIMENSION>(top));
    const std::size_t stride = std::size_t(d.cinfo.output_width) * 4;
    const std::size_t bytes = stride * static_cast<std::size_t>(bottom - top);
    if (out.data != nullptr && out.size >= bytes) {
        r.pixels = out.data;
    } else {
        r.owned.reset(new std::uint8_t[bytes]);  // default-initialised: no zero fill
        r.pixels = r.owned.get();
    }
    while (d.cinfo.output_scanline < static_cast<JDIMENSION>(bottom)) {
        JSAMPROW row = r.pixels + stride * (d.cinfo.output_scanline - static_cast<JDIMENSION>(top));
        jpeg_read_scanlines(&d.cinfo, &row, 1);
    }
    r.x = static_cast<int>(xoffset);
    r.width = static_cast<int>(d.cinfo.output_width);
    r.y = top;
    r.height = bottom - top;
    r.image_width = static_cast<int>(d.cinfo.image_width);
    r.image_height = static_cast<int>(d.cinfo.image_height);
    jpeg_abort_decompress(&d.cinfo);  // the rows below the window are never read
    return true;
}
#endif

}  // namespace

bool have_libjpeg() noexcept { return true; }

RegionResult decode_jpeg_region(ByteSpan input, int x0, int y0, int x1, int y1, std::size_t max_memory,
                                MutableByteSpan out, int scale_denom) {
    RegionResult r;
#ifndef FASTFEED_HAVE_JPEG_REGION
    (void)input, (void)x0, (void)y0, (void)x1, (void)y1, (void)max_memory, (void)out, (void)scale_denom;
    r.error = "fastfeed._native was built against a libjpeg without libjpeg-turbo's cropping (2.0 or later)";
    return r;
#else
    if (input.size == 0 || input.size > (std::size_t(1) << 31)) {
        r.error = input.size == 0 ? "empty input" : "input larger than 2 GiB";
        return r;
    }
    if (scale_denom != 1 && scale_denom != 2 && scale_denom != 4 && scale_denom != 8) {
        r.error = "scale_denom must be 1, 2, 4 or 8";
        return r;
    }
    Failure failure;
    failure.message[0] = '\0';
    Decompressor d;
    init_error_manager(d.err, &failure, /*strict=*/true, /*ignore_benign=*/true);
    d.cinfo.err = &d.err.pub;
    r.ok = run_region(d, failure, input, x0, y0, x1, y1, max_memory, out, scale_denom, r);
    if (!r.ok) {
        r.pixels = nullptr;
        r.owned.reset();
        r.error = failure.message[0] ? std::string(failure.message) : std::string("libjpeg failed");
    }
    return r;
#endif
}

std::string check_jpeg_scans(ByteSpan input, const ScanCheckOptions& options) {
    if (input.size == 0) return "empty input";
    if (input.size > (std::size_t(1) << 31)) return "input larger than 2 GiB";
    Failure failure;
    failure.message[0] = '\0';
    Decompressor d;
    init_error_manager(d.err, &failure, /*strict=*/true, /*ignore_benign=*/true);
    d.cinfo.err = &d.err.pub;
    if (run_scan_check(d, failure, input, options)) return std::string();
    return failure.message[0] ? std::string(failure.message) : std::string("libjpeg failed");
}

std::vector<std::uint8_t> transcode_jpeg(ByteSpan input, const TranscodeOptions& options) {
    if (input.size == 0) throw JpegError("empty input");
    if (input.size > (std::size_t(1) << 31)) throw JpegError("input larger than 2 GiB");
    std::vector<std::uint8_t> out(std::max(kInitialOutput, input.size + input.size / 8));
    Failure failure;
    failure.message[0] = '\0';
    Decompressor d;
    Compressor c;
    init_error_manager(d.err, &failure, options.strict, /*ignore_benign=*/false);
    init_error_manager(c.err, &failure, options.strict, /*ignore_benign=*/false);
    d.cinfo.err = &d.err.pub;
    c.cinfo.err = &c.err.pub;
    c.dest.out = &out;
    c.dest.out_of_memory = false;
    const char* stage = "";
    if (!run_libjpeg(d, c, failure, input, options, &stage)) {
        if (c.dest.out_of_memory) throw std::bad_alloc();
        throw JpegError(std::string("JPEG ") + stage + " failed: " + failure.message);
    }
    out.shrink_to_fit();
    return out;
}

#else  // !FASTFEED_HAVE_LIBJPEG

bool have_libjpeg() noexcept { return false; }

std::vector<std::uint8_t> transcode_jpeg(ByteSpan, const TranscodeOptions&) {
    throw JpegUnavailable("fastfeed._native was built without libjpeg: JPEG transcoding is unavailable");
}

std::string check_jpeg_scans(ByteSpan, const ScanCheckOptions&) {
    throw JpegUnavailable("fastfeed._native was built without libjpeg: the JPEG scan check is unavailable");
}

RegionResult decode_jpeg_region(ByteSpan, int, int, int, int, std::size_t, MutableByteSpan, int) {
    RegionResult r;
    r.error = "fastfeed._native was built without libjpeg";
    return r;
}

#endif

namespace {

// Runs fn(i) for i in [0, n) on up to num_threads threads (0: hardware concurrency), this one included; fn must not
// throw. Returns when every index is done.
template <typename Fn>
void parallel_for(std::size_t n, int num_threads, Fn fn) {
    std::atomic<std::size_t> next{0};
    auto worker = [&]() {
        for (std::size_t i = next++; i < n; i = next++) fn(i);
    };
    std::size_t threads = num_threads > 0 ? static_cast<std::size_t>(num_threads)
                                          : std::max(1u, std::thread::hardware_concurrency());
    threads = std::min(threads, n);
    std::vector<std::thread> pool;
    if (threads > 1) pool.reserve(threads - 1);
    try {
        for (std::size_t t = 1; t < threads; ++t) pool.emplace_back(worker);
    } catch (const std::system_error&) {
        // Could not start more threads: the ones running (and this one) still finish the work.
    }
    worker();
    for (auto& t : pool) t.join();
}

}  // namespace

std::vector<std::string> check_jpeg_scans_many(const std::vector<ByteSpan>& inputs, int num_threads,
                                               const ScanCheckOptions& options) {
    if (!have_libjpeg()) check_jpeg_scans(ByteSpan{nullptr, 0}, options);  // throws JpegUnavailable
    std::vector<std::string> results(inputs.size());
    parallel_for(inputs.size(), num_threads, [&](std::size_t i) {
        try {
            results[i] = check_jpeg_scans(inputs[i], options);
        } catch (const std::bad_alloc&) {
            results[i] = "out of memory";
        }
    });
    return results;
}

std::vector<TranscodeResult> transcode_jpeg_many(const std::vector<ByteSpan>& inputs, int num_threads,
                                                 const TranscodeOptions& options) {
    if (!have_libjpeg()) transcode_jpeg(ByteSpan{nullptr, 0}, options);  // throws JpegUnavailable
    std::vector<TranscodeResult> results(inputs.size());
    std::atomic<std::size_t> next{0};
    auto worker = [&]() {
        for (std::size_t i = next++; i < inputs.size(); i = next++) {
            TranscodeResult& r = results[i];
            try {
                r.data = transcode_jpeg(inputs[i], options);
                r.ok = true;
            } catch (const std::exception& e) {
                r.error = e.what();
            }
        }
    };
    std::size_t threads = num_threads > 0 ? static_cast<std::size_t>(num_threads)
                                          : std::max(1u, std::thread::hardware_concurrency());
    threads = std::min(threads, inputs.size());
    if (threads <= 1) {
        worker();
        return results;
    }
    std::vector<std::thread> pool;
    pool.reserve(threads - 1);
    try {
        for (std::size_t t = 1; t < threads; ++t) pool.emplace_back(worker);
    } catch (const std::system_error&) {
        // Could not start more threads: the ones running (and this one) still finish the work.
    }
    worker();
    for (auto& t : pool) t.join();
    return results;
}

}  // namespace fastfeed
