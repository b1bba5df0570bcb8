// Lossless JPEG re-coding through libjpeg's coefficient API (what `jpegtran -copy all` does): the quantized DCT
// coefficients are read and written back unchanged, only the entropy coding changes, so decoded pixels are
// bit-identical. The packer uses it to turn progressive and arithmetic-coded JPEGs into baseline Huffman JPEGs,
// the only kind the GPU's hardware JPEG decoder accepts.
//
// No Python headers here; bindings.cpp owns the GIL policy. Every function is thread-safe (each call owns its
// libjpeg objects). Corrupt input raises JpegError; libjpeg's error_exit never aborts the process.
//
// Built only when libjpeg's headers were found (setup.py defines FASTFEED_HAVE_LIBJPEG); otherwise every function
// throws JpegUnavailable and have_libjpeg() is false.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "byte_span.h"

namespace fastfeed {

struct TranscodeOptions {
    bool progressive = false;      // false: single-scan sequential (baseline when 8-bit Huffman)
    bool arithmetic = false;       // false: Huffman (the hardware decoder rejects arithmetic coding)
    bool optimize_coding = true;   // per-image Huffman tables: smaller output, about one extra pass in memory
    bool copy_markers = true;      // keep APPn (ICC, Exif, Adobe, XMP) and COM markers
    bool strict = true;            // libjpeg warnings (corrupt data it would paper over) are errors
    int max_scans = 500;           // progressive files with more scans are rejected (decode-time DoS guard)
    std::size_t max_memory = std::size_t(1) << 30;  // coefficient buffer limit per image, bytes
};

class JpegError : public std::runtime_error {
  public:
    using std::runtime_error::runtime_error;
};

class JpegUnavailable : public std::runtime_error {
  public:
    using std::runtime_error::runtime_error;
};

struct TranscodeResult {
    bool ok = false;
    std::vector<std::uint8_t> data;  // when ok
    std::string error;               // when !ok
};

bool have_libjpeg() noexcept;

// The scan check: every entropy-coded scan of a JPEG decoded to its DCT coefficients (jpeg_read_coefficients: the
// Huffman/arithmetic pass, no IDCT, no output), with the warnings that mean "some pixels are not coded in the file"
// treated as errors: premature end of the data or file (a frame header that claims more rows than the scans hold),
// a bad Huffman/arithmetic code, lost restart markers, bogus progression. Decoders fill such gaps differently
// (libjpeg/PIL with grey, nvJPEG with other values), so a file that trips one would give different pixels per
// decoder. Warnings that leave every pixel coded (extraneous bytes before a marker, an unknown JFIF revision or
// Adobe transform, a bad ICC marker) are ignored. Returns "" when clean, else libjpeg's message (fatal errors such
// as an unsupported or malformed header included). Never throws for bad input.
struct ScanCheckOptions {
    int max_scans = 500;                            // as TranscodeOptions: more scans is an error
    std::size_t max_memory = std::size_t(1) << 30;  // coefficient memory per image; beyond it: an error message
    // How: jpeg_entropy.h's walk, then libjpeg where it proves nothing (the default); libjpeg alone; or the walk
    // alone, where "not proven" is an answer (the last two for the tests, which compare them).
    enum class Method { walk_then_libjpeg, libjpeg, walk } method = Method::walk_then_libjpeg;
};
// The walk-alone method's answer for a file it does not prove.
inline constexpr const char* kNotProven = "not proven by the walk";
// The answer (and the transcode's refusal) for a progressive file whose scans leave coefficients uncoded: every
// pixel is coded, but libjpeg estimates the missing frequencies and other decoders do not.
inline constexpr const char* kUncodedCoefficients =
    "progressive scans that leave coefficients uncoded (decoders estimate them differently)";
std::string check_jpeg_scans(ByteSpan input, const ScanCheckOptions& options = {});

// check_jpeg_scans over many inputs on up to `num_threads` threads (0: hardware concurrency); one entry per input.
std::vector<std::string> check_jpeg_scans_many(const std::vector<ByteSpan>& inputs, int num_threads,
                                               const ScanCheckOptions& options = {});

// The RGB pixels of a window of a JPEG, decoded without the rest of the image (the CPU decoder's crops): rows above
// the window are skipped (entropy-decoded only, jpeg_skip_scanlines), rows below are never read, and columns are
// cropped (jpeg_crop_scanline, which widens the window to whole iMCU columns: `x` and `width` say where the pixels
// really start). Only YCbCr, RGB and greyscale JPEGs (grey comes as R = G = B); libjpeg's default decode settings
// (the ones PIL uses); pixels as RGBX (a pad byte, as PIL holds RGB). Any libjpeg warning about corrupt data is an
// error, so that the caller can fall back to a full decode and its rules. Never throws for bad input. Needs
// libjpeg-turbo 2.0 or later (an error otherwise). The pixels go into `out` when it holds them (a caller recycling
// its memory: fresh pages fault on first write), else into memory of their own, left uninitialised (every byte is
// written). scale_denom 2, 4 or 8 decodes at that DCT scale (what PIL's `draft` asks of libjpeg): the window is then
// in the scaled image's pixels, whose size is the full one divided by it, rounded up; image_width and image_height
// stay the full image's.
struct RegionResult {
    bool ok = false;
    std::uint8_t* pixels = nullptr;          // height rows of width RGBX pixels: in `out`, or owned.get()
    std::unique_ptr<std::uint8_t[]> owned;
    int x = 0, y = 0, width = 0, height = 0, image_width = 0, image_height = 0;
    std::string error;  // when !ok
    bool in_out() const { return pixels != nullptr && pixels != owned.get(); }
};
RegionResult decode_jpeg_region(ByteSpan input, int x0, int y0, int x1, int y1,
                                std::size_t max_memory = std::size_t(1) << 30, MutableByteSpan out = {},
                                int scale_denom = 1);

// Throws JpegError on corrupt input or input libjpeg cannot re-code (lossless/hierarchical/12-bit JPEGs).
std::vector<std::uint8_t> transcode_jpeg(ByteSpan input, const TranscodeOptions& options = {});

// Transcodes every input on up to `num_threads` threads (0: hardware concurrency). Never throws for a bad
// input: its result carries the error. The spans must stay valid until the call returns.
std::vector<TranscodeResult> transcode_jpeg_many(const std::vector<ByteSpan>& inputs, int num_threads,
                                                 const TranscodeOptions& options = {});

}  // namespace fastfeed
