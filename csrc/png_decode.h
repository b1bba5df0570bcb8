// The PNGs every decoder reads as stored (8-bit grey, RGB or palette, not interlaced, no transparency, not animated:
// fastfeed/pack/validate.py), decoded natively for the CPU paths. Inflating the pixel data is most of a PNG's decode
// time, and libdeflate (vendored: csrc/third_party/libdeflate) inflates a whole stream about 2.5x faster than zlib,
// which PIL and OpenCV use. The pixels are the file's, exactly: PNG is lossless, so any correct decoder gives PIL's.
//
// Anything else — another bit depth or colour type, interlacing, transparency, APNG chunks, a second IHDR, a wrong
// checksum before the pixel data (PIL refuses those files), pixel data that does not inflate to exactly the rows the
// header promises, a palette index past the palette — is refused with the reason, and the caller decodes the file
// with PIL, by the decode contract's rules. The bytes the Loader hands it passed pack's checks (PIL opened them, zlib
// inflated their pixel data: fastfeed/pack/validate.py), and on those a success means PIL's pixels. On arbitrary
// bytes it may decode a few PIL refuses (a malformed ancillary chunk PIL parses, a deflate stream zlib is stricter
// about): callers that validate use PIL.
//
// No Python headers here; bindings.cpp owns the GIL policy. Thread-safe: each call owns its decompressor.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "byte_span.h"

namespace fastfeed {

// What a pixel becomes: RGBX (X = 255, PIL's layout for RGB), RGB, or the stored sample itself (grey level, palette
// index: a label image's class id, as numpy reads PIL's L and P images) for grey and palette PNGs (RGB ones are
// refused).
enum class PngPixels { Rgbx, Rgb, Samples };

struct PngResult {
    bool ok = false;
    std::uint8_t* pixels = nullptr;  // height rows of width pixels (4, 3 or 1 bytes each): in `out`, or owned
    std::unique_ptr<std::uint8_t[]> owned;
    int width = 0, height = 0;
    std::string error;  // when !ok: why not
    bool in_out() const { return pixels != nullptr && pixels != owned.get(); }
};

// As colour, grey comes as R = G = B and a palette through its colours, as PIL converts them to RGB. The pixels go into
// `out` when it holds them, else into memory of their own. Images of more than `max_pixels` are refused (the
// caller's decoder applies its own limit). Never throws for bad input.
PngResult decode_png(ByteSpan input, PngPixels form, MutableByteSpan out = {},
                     std::size_t max_pixels = std::size_t(1) << 28);

}  // namespace fastfeed
