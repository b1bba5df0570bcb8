// See image_probe.h: every branch below has its twin in fastfeed/image/jpeg.py `_probe_jpeg`, fastfeed/image/headers.py
// `tiff_orientation` or fastfeed/pack/validate.py `_tail`; change them together.
#include "image_probe.h"

#include <cstring>

namespace fastfeed {
namespace {

bool is_standalone(int m) { return m == 0x01 || (m >= 0xD0 && m <= 0xD7); }

bool is_sof(int m) {
    return (m >= 0xC0 && m <= 0xC3) || (m >= 0xC5 && m <= 0xC7) || (m >= 0xC9 && m <= 0xCB) || (m >= 0xCD && m <= 0xCF);
}

std::uint32_t rd16(const std::uint8_t* p, bool le) {
    return le ? (p[0] | (p[1] << 8)) : ((p[0] << 8) | p[1]);
}

std::uint32_t rd32(const std::uint8_t* p, bool le) {
    return le ? (std::uint32_t(p[0]) | (std::uint32_t(p[1]) << 8) | (std::uint32_t(p[2]) << 16) |
                 (std::uint32_t(p[3]) << 24))
              : ((std::uint32_t(p[0]) << 24) | (std::uint32_t(p[1]) << 16) | (std::uint32_t(p[2]) << 8) |
                 std::uint32_t(p[3]));
}

bool is_pad(std::uint8_t b) { return b == 0x00 || b == '\r' || b == '\n' || b == ' '; }

// validate.py `_tail(data).endswith(b"\xff\xd9")`: the last 512 bytes without trailing padding (the whole file
// when those 512 are all padding) end in FF D9.
bool ends_with_eoi(const std::uint8_t* d, std::size_t n) {
    constexpr std::size_t kTail = 512;
    const std::size_t window = n > kTail ? n - kTail : 0;  // first byte of the last-512 window
    std::size_t end = n;
    while (end > window && is_pad(d[end - 1])) --end;
    std::size_t lo = window;
    if (end == window && n > kTail) {  // all padding: Python strips the whole file
        while (end > 0 && is_pad(d[end - 1])) --end;
        lo = 0;
    }
    return end >= lo + 2 && d[end - 2] == 0xFF && d[end - 1] == 0xD9;
}

}  // namespace

int tiff_orientation(const std::uint8_t* t, std::size_t n) {
    if (n < 8) return 1;
    const bool le = std::memcmp(t, "II*\0", 4) == 0;
    if (!le && std::memcmp(t, "MM\0*", 4) != 0) return 1;
    const std::uint64_t ifd = rd32(t + 4, le);
    if (ifd + 2 > n) return 1;
    const std::uint32_t count = rd16(t + ifd, le);
    for (std::uint32_t k = 0; k < count; ++k) {
        const std::uint64_t at = ifd + 2 + 12 * std::uint64_t(k);
        if (at + 12 > n) return 1;
        const std::uint32_t tag = rd16(t + at, le), typ = rd16(t + at + 2, le), cnt = rd32(t + at + 4, le);
        if (tag == 0x0112) {
            if (typ != 3 || cnt < 1) return 1;
            const std::uint32_t v = rd16(t + at + 8, le);
            return v >= 1 && v <= 8 ? static_cast<int>(v) : 1;
        }
    }
    return 1;
}

namespace {

// jpeg.py `_pil_refuses`: a header segment PIL's JPEG reader fails on where libjpeg goes on.
bool pil_refuses(int marker, const std::uint8_t* seg, std::size_t len, bool before_sof) {
    const bool jfif = marker == 0xE0 && len >= 4 && std::memcmp(seg, "JFIF", 4) == 0;
    const bool adobe = marker == 0xEE && len >= 5 && std::memcmp(seg, "Adobe", 5) == 0;
    if ((jfif || adobe) && len < 7) return true;
    if (marker == 0xE2 && before_sof && len >= 12 && std::memcmp(seg, "ICC_PROFILE\0", 12) == 0 && len < 14)
        return true;
    if (marker == 0xDB) {
        for (std::size_t at = 0; at < len;) {
            const std::size_t table = 1 + 64 * ((seg[at] >> 4) ? 2 : 1);
            if (len - at < table) return true;
            at += table;
        }
    }
    return false;
}

}  // namespace

bool probe_jpeg(const std::uint8_t* d, std::size_t n, JpegFacts& out) {
    out = JpegFacts{};
    if (n < 3 || d[0] != 0xFF || d[1] != 0xD8 || d[2] != 0xFF) return false;
    std::size_t pos = 2;
    bool have_sof = false;
    while (true) {
        if (pos >= n || d[pos] != 0xFF) return false;
        while (pos < n && d[pos] == 0xFF) ++pos;
        if (pos >= n) return false;
        const int marker = d[pos++];
        if (is_standalone(marker)) return false;  // RSTn or TEM in the header (jpeg.py says why)
        if (marker == 0xD9 || marker == 0x00 || marker == 0xD8) return false;
        if (pos + 2 > n) return false;
        const std::size_t length = (std::size_t(d[pos]) << 8) | d[pos + 1];
        if (length < 2 || pos + length > n) return false;
        const std::uint8_t* seg = d + pos + 2;
        const std::size_t seg_len = length - 2;
        pos += length;
        if (pil_refuses(marker, seg, seg_len, !have_sof)) return false;
        if (marker == 0xE0 && seg_len >= 5 && std::memcmp(seg, "JFIF\0", 5) == 0) {
            out.jfif = true;
        } else if (marker == 0xE1 && seg_len >= 6 && std::memcmp(seg, "Exif\0\0", 6) == 0 && out.orientation == 1) {
            out.orientation = tiff_orientation(seg + 6, seg_len - 6);
        } else if (marker == 0xEE && seg_len >= 12 && std::memcmp(seg, "Adobe", 5) == 0) {
            out.adobe_transform = seg[11];
        } else if (is_sof(marker)) {
            if (have_sof) return false;  // more than one frame header
            have_sof = true;
            out.sof_marker = marker;
            out.sof_segment.assign(reinterpret_cast<const char*>(seg), seg_len);
        } else if (marker == 0xDA) {
            break;
        }
    }
    if (!have_sof) return false;
    out.ends_with_eoi = ends_with_eoi(d, n);
    return true;
}

bool png_structure_ok(const std::uint8_t* d, std::size_t n) {
    auto be32 = [d](std::size_t at) {
        return (std::uint32_t{d[at]} << 24) | (std::uint32_t{d[at + 1]} << 16) | (std::uint32_t{d[at + 2]} << 8) |
               std::uint32_t{d[at + 3]};
    };
    std::size_t pos = 8;
    bool have_ihdr = false, have_idat = false;
    while (pos + 8 <= n) {
        const std::uint64_t length = be32(pos);
        const std::uint8_t* kind = d + pos + 4;
        const std::size_t body = pos + 8;
        const std::uint64_t next = body + length + 4;  // 64-bit: a 4 GB length cannot wrap
        if (next > n) return false;  // a chunk runs past the end
        if (!have_ihdr) {
            if (std::memcmp(kind, "IHDR", 4) != 0 || length != 13) return false;
            const std::uint32_t width = be32(body), height = be32(body + 4);
            const int ctype = d[body + 9];
            if (width == 0 || height == 0 || !(ctype == 0 || ctype == 2 || ctype == 3 || ctype == 4 || ctype == 6))
                return false;
            have_ihdr = true;
        } else if (std::memcmp(kind, "IDAT", 4) == 0) {
            have_idat = true;
        } else if (std::memcmp(kind, "IEND", 4) == 0) {
            return have_idat;
        }
        pos = static_cast<std::size_t>(next);
    }
    return false;  // no IEND
}

namespace {

// What jpeg.py's `jpeg_info` raises on in a frame header (SOF payload): too short, no or too few components, a zero
// size, a sampling factor outside 1..4. The rest of its classification decides, it does not refuse.
bool frame_header_ok(const std::string& seg) {
    if (seg.size() < 6) return false;
    const auto* b = reinterpret_cast<const std::uint8_t*>(seg.data());
    const int height = (b[1] << 8) | b[2], width = (b[3] << 8) | b[4], ncomp = b[5];
    if (ncomp == 0 || seg.size() < 6 + 3 * static_cast<std::size_t>(ncomp) || width == 0 || height == 0) return false;
    for (int c = 0; c < ncomp; ++c) {
        const int h = b[7 + 3 * c] >> 4, v = b[7 + 3 * c] & 15;
        if (h < 1 || h > 4 || v < 1 || v > 4) return false;
    }
    return true;
}

}  // namespace

bool sample_header_ok(const std::uint8_t* d, std::size_t n) {
    static const std::uint8_t png_signature[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n'};
    if (n >= 2 && d[0] == 0xFF && d[1] == 0xD8) {
        JpegFacts facts;
        return probe_jpeg(d, n, facts) && frame_header_ok(facts.sof_segment) && facts.ends_with_eoi;
    }
    if (n >= 8 && std::memcmp(d, png_signature, 8) == 0) return png_structure_ok(d, n);
    return true;
}

}  // namespace fastfeed
