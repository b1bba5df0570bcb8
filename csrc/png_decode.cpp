#include "png_decode.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <new>
#include <vector>

#include "third_party/libdeflate/libdeflate.h"

// The colour rows are written as 32-bit words (R, G, B, X in memory order).
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "png_decode.cpp assumes a little-endian machine");

namespace fastfeed {
namespace {

constexpr std::uint8_t kSignature[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n'};

std::uint32_t be32(const std::uint8_t* p) {
    return std::uint32_t(p[0]) << 24 | std::uint32_t(p[1]) << 16 | std::uint32_t(p[2]) << 8 | p[3];
}

bool is(const std::uint8_t* kind, const char* name) { return std::memcmp(kind, name, 4) == 0; }

// A chunk type for a message: printable ASCII as it is, other bytes as \xNN (a damaged type is not text).
std::string chunk_name(const std::uint8_t* kind) {
    std::string name;
    for (int i = 0; i < 4; ++i) {
        if (kind[i] >= 0x20 && kind[i] < 0x7F) {
            name += char(kind[i]);
        } else {
            char hex[5];
            std::snprintf(hex, sizeof(hex), "\\x%02X", kind[i]);
            name += hex;
        }
    }
    return name;
}

struct DecompressorDeleter {
    void operator()(libdeflate_decompressor* d) const { libdeflate_free_decompressor(d); }
};

// libdeflate picks its CPU-specific routines on first use, writing globals; one call before any thread's use keeps
// that from racing (and TSan quiet).
void warm_up_libdeflate() {
    static std::once_flag once;
    std::call_once(once, [] {
        const std::uint8_t empty_stream[] = {0x78, 0x9C, 0x03, 0x00, 0x00, 0x00, 0x00, 0x01};  // zlib of ""
        std::uint8_t sink[1];
        if (libdeflate_decompressor* d = libdeflate_alloc_decompressor()) {
            std::size_t n = 0;
            libdeflate_zlib_decompress(d, empty_stream, sizeof(empty_stream), sink, sizeof(sink), &n);
            libdeflate_free_decompressor(d);
        }
        libdeflate_crc32(0, sink, 0);
    });
}

std::uint8_t paeth(int a, int b, int c) {
    const int pa = std::abs(b - c), pb = std::abs(a - c), pc = std::abs(a + b - 2 * c);
    return std::uint8_t(pa <= pb && pa <= pc ? a : pb <= pc ? b : c);
}

// Undoes one row's filter in place (PNG spec 9): `prev` is the row above, already unfiltered (zeros for the first).
template <int BPP>
bool unfilter(int type, std::uint8_t* cur, const std::uint8_t* prev, std::size_t n) {
    switch (type) {
        case 0:
            return true;
        case 1:
            for (std::size_t i = BPP; i < n; ++i) cur[i] = std::uint8_t(cur[i] + cur[i - BPP]);
            return true;
        case 2:
            for (std::size_t i = 0; i < n; ++i) cur[i] = std::uint8_t(cur[i] + prev[i]);
            return true;
        case 3:
            for (std::size_t i = 0; i < BPP && i < n; ++i) cur[i] = std::uint8_t(cur[i] + (prev[i] >> 1));
            for (std::size_t i = BPP; i < n; ++i) cur[i] = std::uint8_t(cur[i] + ((cur[i - BPP] + prev[i]) >> 1));
            return true;
        case 4:
            for (std::size_t i = 0; i < BPP && i < n; ++i) cur[i] = std::uint8_t(cur[i] + prev[i]);
            for (std::size_t i = BPP; i < n; ++i)
                cur[i] = std::uint8_t(cur[i] + paeth(cur[i - BPP], prev[i], prev[i - BPP]));
            return true;
        default:
            return false;
    }
}

struct Header {
    std::uint32_t width = 0, height = 0;
    int channels = 0;  // bytes a pixel in the filtered rows: 1 (grey, palette) or 3 (RGB)
    int colour_type = 0;
    std::uint32_t palette[256] = {};  // RGBX words
    int palette_size = 0;
    std::vector<ByteSpan> idat;
};

// The chunk walk: IHDR first, the chunks before the pixel data checked as PIL checks them (their CRC), the run of
// IDAT chunks collected. "" or why not.
std::string read_chunks(ByteSpan in, Header& h, std::size_t max_pixels) {
    if (in.size < 8 + 25 || std::memcmp(in.data, kSignature, 8) != 0) return "not a PNG";
    std::size_t pos = 8;
    bool have_header = false;
    while (true) {
        if (in.size - pos < 12) return "truncated PNG (a chunk runs past the end of the file)";
        const std::uint32_t length = be32(in.data + pos);
        const std::uint8_t* kind = in.data + pos + 4;
        const std::uint8_t* body = kind + 4;
        if (length > in.size - pos - 12) return "truncated PNG (a chunk runs past the end of the file)";
        const bool pixel_data = is(kind, "IDAT");
        if (!pixel_data && !h.idat.empty()) return "";  // PIL reads the pixel data's run and stops there
        if (!pixel_data && libdeflate_crc32(0, kind, length + 4) != be32(body + length))
            return "the CRC of its " + chunk_name(kind) + " chunk is wrong";
        if (!have_header) {
            if (!is(kind, "IHDR") || length != 13) return "PNG does not start with IHDR";
            h.width = be32(body);
            h.height = be32(body + 4);
            const int depth = body[8];
            h.colour_type = body[9];
            if (h.width == 0 || h.height == 0 || h.width > 0x7FFFFFFFu || h.height > 0x7FFFFFFFu)
                return "bad image size";
            if (std::uint64_t(h.width) * h.height > max_pixels) return "more pixels than the native decode takes";
            if (depth != 8) return "not 8 bits a sample";
            if (h.colour_type != 0 && h.colour_type != 2 && h.colour_type != 3) return "a colour type with alpha";
            if (body[10] != 0 || body[11] != 0) return "unknown compression or filter method";
            if (body[12] != 0) return "interlaced";
            h.channels = h.colour_type == 2 ? 3 : 1;
            have_header = true;
        } else if (pixel_data) {
            h.idat.push_back({body, length});
        } else if (is(kind, "PLTE")) {
            if (h.palette_size != 0 || length == 0 || length % 3 != 0 || length > 768) return "a malformed palette";
            h.palette_size = int(length / 3);
            for (int i = 0; i < h.palette_size; ++i)
                h.palette[i] = std::uint32_t(body[3 * i]) | std::uint32_t(body[3 * i + 1]) << 8 |
                               std::uint32_t(body[3 * i + 2]) << 16 | 0xFF000000u;
        } else if (is(kind, "tRNS")) {
            return "transparency";
        } else if (is(kind, "acTL") || is(kind, "fcTL") || is(kind, "fdAT")) {
            return "APNG chunks (PIL reads a frame's rectangle)";
        } else if (is(kind, "IHDR")) {
            return "a second IHDR (PIL takes the last)";
        } else if (is(kind, "IEND")) {
            return "no pixel data";
        } else if (kind[0] >= 'A' && kind[0] <= 'Z') {
            return "an unknown critical chunk";
        }
        pos += std::size_t(length) + 12;
    }
}

// One unfiltered row of `channels`-byte pixels as RGBX words, or RGB when `rgb` (the palette holds RGBX words).
template <bool RGB>
void to_colour(const Header& h, const std::uint8_t* row, std::uint8_t* out, int& max_index) {
    constexpr std::size_t n = RGB ? 3 : 4;
    const std::size_t w = h.width;
    if (h.colour_type == 2) {
        if (RGB) {
            std::memcpy(out, row, 3 * w);
            return;
        }
        for (std::size_t x = 0; x < w; ++x) {
            out[4 * x] = row[3 * x];
            out[4 * x + 1] = row[3 * x + 1];
            out[4 * x + 2] = row[3 * x + 2];
            out[4 * x + 3] = 0xFF;
        }
    } else if (h.colour_type == 0) {
        for (std::size_t x = 0; x < w; ++x) {
            const std::uint32_t v = std::uint32_t(row[x]) * 0x010101u | 0xFF000000u;
            std::memcpy(out + n * x, &v, n);  // (little-endian: R, G, B, then X)
        }
    } else {
        int top = 0;
        for (std::size_t x = 0; x < w; ++x) {
            top = row[x] > top ? row[x] : top;
            std::memcpy(out + n * x, &h.palette[row[x]], n);
        }
        max_index = top > max_index ? top : max_index;
    }
}

}  // namespace

PngResult decode_png(ByteSpan input, PngPixels form, MutableByteSpan out, std::size_t max_pixels) {
    PngResult r;
    try {
        warm_up_libdeflate();
        Header h;
        r.error = read_chunks(input, h, max_pixels);
        if (!r.error.empty()) return r;
        if (h.idat.empty()) {
            r.error = "no pixel data";
            return r;
        }
        if (h.colour_type == 3 && h.palette_size == 0) {
            r.error = "a palette image without its palette";
            return r;
        }
        const bool colour = form != PngPixels::Samples;
        if (!colour && h.colour_type == 2) {
            r.error = "an RGB image (one sample a pixel asked for)";
            return r;
        }
        const std::size_t row_bytes = std::size_t(h.width) * h.channels;
        const std::size_t raw_size = std::size_t(h.height) * (row_bytes + 1);

        // the run of IDAT chunks is one zlib stream; most files hold it in a chunk or a few
        std::vector<std::uint8_t> joined;
        ByteSpan stream = h.idat.front();
        if (h.idat.size() > 1) {
            std::size_t total = 0;
            for (const ByteSpan& s : h.idat) total += s.size;
            joined.resize(total);
            std::size_t at = 0;
            for (const ByteSpan& s : h.idat) {
                if (s.size) std::memcpy(joined.data() + at, s.data, s.size);
                at += s.size;
            }
            stream = {joined.data(), joined.size()};
        }
        std::unique_ptr<std::uint8_t[]> raw(new std::uint8_t[raw_size]);
        std::unique_ptr<libdeflate_decompressor, DecompressorDeleter> inflater(libdeflate_alloc_decompressor());
        if (!inflater) {
            r.error = "out of memory";
            return r;
        }
        // exactly the rows the header promises, the stream's Adler-32 checked
        const libdeflate_result got =
            libdeflate_zlib_decompress(inflater.get(), stream.data, stream.size, raw.get(), raw_size, nullptr);
        if (got != LIBDEFLATE_SUCCESS) {
            r.error = got == LIBDEFLATE_SHORT_OUTPUT          ? "fewer pixel rows than the header says"
                      : got == LIBDEFLATE_INSUFFICIENT_SPACE ? "more pixel data than the header says"
                                                             : "corrupt compressed pixel data";
            return r;
        }

        const std::size_t pixel_bytes = form == PngPixels::Rgbx ? 4 : form == PngPixels::Rgb ? 3 : 1;
        const std::size_t out_bytes = std::size_t(h.width) * h.height * pixel_bytes;
        if (out.data != nullptr && out.size >= out_bytes) {
            r.pixels = out.data;
        } else {
            r.owned.reset(new std::uint8_t[out_bytes]);
            r.pixels = r.owned.get();
        }
        const std::vector<std::uint8_t> zeros(row_bytes, 0);
        const std::uint8_t* prev = zeros.data();
        int max_index = 0;
        for (std::size_t y = 0; y < h.height; ++y) {
            std::uint8_t* row = raw.get() + y * (row_bytes + 1);
            const bool ok = h.channels == 3 ? unfilter<3>(row[0], row + 1, prev, row_bytes)
                                            : unfilter<1>(row[0], row + 1, prev, row_bytes);
            if (!ok) {
                r.error = "unknown filter type " + std::to_string(row[0]) + " in row " + std::to_string(y);
                r.owned.reset();
                r.pixels = nullptr;
                return r;
            }
            std::uint8_t* dst = r.pixels + y * h.width * pixel_bytes;
            if (form == PngPixels::Rgbx) {
                to_colour<false>(h, row + 1, dst, max_index);
            } else if (form == PngPixels::Rgb) {
                to_colour<true>(h, row + 1, dst, max_index);
            } else {
                std::memcpy(dst, row + 1, row_bytes);
            }
            prev = row + 1;
        }
        if (colour && h.colour_type == 3 && max_index >= h.palette_size) {  // (an id needs no colour)
            r.error = "a palette index past the palette";
            r.owned.reset();
            r.pixels = nullptr;
            return r;
        }
        r.width = int(h.width);
        r.height = int(h.height);
        r.ok = true;
    } catch (const std::bad_alloc&) {
        r = PngResult{};
        r.error = "out of memory";
    }
    return r;
}

}  // namespace fastfeed
