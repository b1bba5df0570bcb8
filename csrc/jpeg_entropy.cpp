// See jpeg_entropy.h. Each rule below is the one libjpeg-turbo's Huffman decoder (jdhuff.c) and marker reader
// (jdmarker.c) apply to the same bytes; where this walk is stricter it answers false and libjpeg decides.
#include "jpeg_entropy.h"

#include <cstring>
#include <new>
#include <vector>

namespace fastfeed {

namespace {

constexpr int kDcLookBits = 9;         // DC codes up to this long resolve in one lookup; longer ones bit by bit
constexpr int kAcLookBits = 11;        // AC: the same, and two short symbols in one lookup
constexpr int kMaxBlocksInMcu = 10;    // libjpeg's D_MAX_BLOCKS_IN_MCU: more is an error there
constexpr std::size_t kPadding = 512;  // zeros after a segment: one block reads at most 64 * 31 bits past it

// A lookup entry says what the next symbols cost, never their values (the verdict needs none):
// - bits 0-5: the bits of the first two symbols together (code and value bits), where the second fits in the
//   window too, else those of the first alone; lowest, so that the walk's one serial step (shift the bit buffer
//   by them, look the next entry up) needs no extraction;
// - bits 6-12: the first symbol's k step: r + 1 for a coefficient, 16 for ZRL, 64 for EOB (libjpeg ends the block
//   at any s == 0 symbol but ZRL), so that k >= 64 ends a block either way;
// - bits 13-18 and 19-25: the first symbol's bits (0: its code is longer than the lookup), and the k step of both.
// DC entries hold one symbol.
using Entry = std::uint32_t;
constexpr int kStepEob = 64;
inline int both_bits(Entry e) { return e & 63; }
inline int first_step(Entry e) { return (e >> 6) & 127; }
inline int first_bits(Entry e) { return (e >> 13) & 63; }
inline int both_step(Entry e) { return (e >> 19) & 127; }
inline Entry make(int bits1, int step1, int bits, int step) {
    return Entry(bits) | Entry(step1) << 6 | Entry(bits1) << 13 | Entry(step) << 19;
}

Entry symbol_entry(std::uint8_t symbol, int length, bool dc) {
    const int s = symbol & 15, r = symbol >> 4;
    int bits = length, step = kStepEob;
    if (dc) {  // DC symbols are 0..15: a size, that many value bits follow
        bits += symbol;
        step = 0;
    } else if (s != 0) {
        bits += s;
        step = r + 1;
    } else if (r == 15) {
        step = 16;  // ZRL: sixteen zeros
    }
    return make(bits, step, bits, step);
}

struct Table {
    std::vector<Entry> lookup;  // 1 << look entries
    int look;
    std::int32_t maxcode[18];  // largest code of each length, -1 where none (libjpeg's maxcode, sentinel at 17)
    std::int32_t valoffset[17];
    const std::uint8_t* values;
    bool dc;
};

// libjpeg's jpeg_make_d_derived_tbl, with the same refusals (too many codes, a code space overflow, a DC symbol
// over 15), then the pairs.
bool build(Table& t, const HuffmanSpec& spec, bool dc) {
    if (spec.bits == nullptr || spec.values == nullptr) return false;  // libjpeg may supply default tables: its call
    int count = 0;
    for (int l = 1; l <= 16; ++l) count += spec.bits[l];
    if (count == 0 || count > 256) return false;
    if (dc) {
        for (int i = 0; i < count; ++i)
            if (spec.values[i] > 15) return false;
    }
    const int look = dc ? kDcLookBits : kAcLookBits;
    t.look = look;
    t.lookup.assign(std::size_t(1) << look, 0);
    t.values = spec.values;
    t.dc = dc;
    std::int32_t code = 0;
    int p = 0;
    for (int l = 1; l <= 16; ++l) {
        const int n = spec.bits[l];
        if (n != 0 && code + n >= (std::int32_t(1) << l)) return false;  // the codes overflow their length
        t.maxcode[l] = n == 0 ? -1 : code + n - 1;
        t.valoffset[l] = p - code;
        for (int i = 0; i < n; ++i, ++p, ++code) {
            if (l > look) continue;
            const Entry e = symbol_entry(spec.values[p], l, dc);
            const int first = code << (look - l);
            for (int j = 0; j < (1 << (look - l)); ++j) t.lookup[first + j] = e;
        }
        code <<= 1;
    }
    t.maxcode[17] = 0x7FFFFFFF;
    if (!dc) {
        // Pairs: after a first symbol that leaves the block open, the window's remaining bits may hold a whole second
        // one (its entry reads only its own code's bits, so the window's tail past them does not matter).
        // In place: a pair keeps its first symbol's fields, the only ones read here.
        const int mask = (1 << look) - 1;
        for (int w = 0; w <= mask; ++w) {
            const Entry e = t.lookup[w];
            const int b1 = first_bits(e);
            if (b1 == 0 || b1 >= look || first_step(e) >= kStepEob) continue;
            const Entry e2 = t.lookup[(w << b1) & mask];
            const int b2 = first_bits(e2);
            if (b2 == 0 || b1 + b2 > look) continue;
            t.lookup[w] = make(b1, first_step(e), b1 + b2, first_step(e) + first_step(e2));
        }
    }
    return true;
}

inline std::uint64_t load_be64(const std::uint8_t* p) {
    std::uint64_t v;
    std::memcpy(&v, p, 8);
    return __builtin_bswap64(v);
}

// The bits of one entropy-coded segment, unstuffed, read MSB first (refill as in F. Giesen's "reading bits in far
// too many ways", variant 4: the bytes past the count are the stream's own, so loading them twice is harmless).
struct Bits {
    const std::uint8_t* start;
    const std::uint8_t* p;
    std::uint64_t buf = 0;
    int count = 0;

    explicit Bits(const std::uint8_t* data) : start(data), p(data) {}
    void refill() {
        buf |= load_be64(p) >> count;
        p += (63 - count) >> 3;
        count |= 56;
    }
    std::uint64_t consumed() const { return std::uint64_t(p - start) * 8 - std::uint64_t(count); }
};

// The next entry; a code longer than the lookup is decoded as libjpeg's jpeg_huff_decode does. 0: no code of 16
// bits or fewer matches (libjpeg's "bad Huffman code").
inline Entry next(Bits& b, const Table& t) {
    if (b.count < 32) b.refill();
    const Entry e = t.lookup[b.buf >> (64 - t.look)];
    if (e != 0) return e;
    for (int l = t.look + 1; l <= 16; ++l) {
        const std::int32_t code = static_cast<std::int32_t>(b.buf >> (64 - l));
        if (code <= t.maxcode[l]) return symbol_entry(t.values[code + t.valoffset[l]], l, t.dc);
    }
    return 0;
}

inline void skip(Bits& b, int bits) {
    b.buf <<= bits;
    b.count -= bits;
}

// One block, as libjpeg's decode_mcu loop reads it: k steps by r + 1 or 16 and the block ends at k >= 64 or at an
// s == 0 symbol other than ZRL. A pair is taken whole only when its first symbol leaves the block open.
inline bool block(Bits& b, const Table& dc, const Table& ac) {
    const Entry d = next(b, dc);
    if (d == 0) return false;
    skip(b, both_bits(d));  // a DC entry's one symbol
    for (int k = 1; k < 64;) {
        const Entry e = next(b, ac);
        if (e == 0) return false;
        if (k + first_step(e) >= 64) {
            skip(b, first_bits(e));
            break;
        }
        skip(b, both_bits(e));
        k += both_step(e);
    }
    return true;
}

// Copies the segment that starts at data[pos] into `out` without its stuffing (FF 00, and libjpeg's FF FF... 00, is
// one FF byte), up to the marker that ends it. Returns the marker code and sets pos past it; -1 at the end of the
// data (libjpeg would report a premature end).
int unstuff(const std::uint8_t* data, std::size_t size, std::size_t& pos, std::vector<std::uint8_t>& out) {
    out.clear();
    while (pos < size) {
        const auto* ff = static_cast<const std::uint8_t*>(std::memchr(data + pos, 0xFF, size - pos));
        const std::size_t run = ff == nullptr ? size - pos : static_cast<std::size_t>(ff - (data + pos));
        out.insert(out.end(), data + pos, data + pos + run);
        pos += run;
        if (ff == nullptr) return -1;
        do {
            ++pos;
        } while (pos < size && data[pos] == 0xFF);
        if (pos >= size) return -1;
        const int c = data[pos++];
        if (c != 0) return c;
        out.push_back(0xFF);
    }
    return -1;
}

bool walk(const ScanLayout& s, ByteSpan entropy, std::vector<std::uint8_t>& segment) {
    const int n = s.num_components;
    if (n < 1 || n > 4 || s.width <= 0 || s.height <= 0) return false;
    int max_h = 1, max_v = 1;
    for (int i = 0; i < n; ++i) {
        const ScanComponent& c = s.components[i];
        if (c.h < 1 || c.h > 4 || c.v < 1 || c.v > 4 || c.dc_table < 0 || c.dc_table > 3 || c.ac_table < 0 ||
            c.ac_table > 3)
            return false;
        max_h = c.h > max_h ? c.h : max_h;
        max_v = c.v > max_v ? c.v : max_v;
    }
    // The blocks of one MCU, in order, each with its tables. A one-component scan is not interleaved: an MCU is one
    // block, and the blocks cover that component alone (libjpeg's per_scan_setup).
    thread_local Table tables[8];  // their lookups' memory is kept between calls
    bool built[8] = {};
    const Table* dc_of[kMaxBlocksInMcu];
    const Table* ac_of[kMaxBlocksInMcu];
    int blocks = 0;
    std::uint64_t mcus_per_row, mcu_rows;
    for (int i = 0; i < n; ++i) {
        const ScanComponent& c = s.components[i];
        const int dc = c.dc_table, ac = 4 + c.ac_table;
        if (!built[dc] && !(built[dc] = build(tables[dc], s.dc[c.dc_table], true))) return false;
        if (!built[ac] && !(built[ac] = build(tables[ac], s.ac[c.ac_table], false))) return false;
        const int count = n == 1 ? 1 : c.h * c.v;
        if (blocks + count > kMaxBlocksInMcu) return false;
        for (int j = 0; j < count; ++j, ++blocks) {
            dc_of[blocks] = &tables[dc];
            ac_of[blocks] = &tables[ac];
        }
    }
    if (n == 1) {
        mcus_per_row = (std::uint64_t(s.width) + 7) / 8;
        mcu_rows = (std::uint64_t(s.height) + 7) / 8;
    } else {
        mcus_per_row = (std::uint64_t(s.width) + 8 * max_h - 1) / (8 * max_h);
        mcu_rows = (std::uint64_t(s.height) + 8 * max_v - 1) / (8 * max_v);
    }
    std::uint64_t left = mcus_per_row * mcu_rows;
    std::size_t pos = 0;
    unsigned restarts = 0;
    while (left > 0) {
        const std::uint64_t interval =
            s.restart_interval != 0 && s.restart_interval < left ? s.restart_interval : left;
        const int marker = unstuff(entropy.data, entropy.size, pos, segment);
        if (marker < 0) return false;
        const std::uint64_t limit = std::uint64_t(segment.size()) * 8;
        segment.resize(segment.size() + kPadding, 0);
        Bits bits(segment.data());
        for (std::uint64_t m = 0; m < interval; ++m) {
            for (int k = 0; k < blocks; ++k) {
                if (!block(bits, *dc_of[k], *ac_of[k]) || bits.consumed() > limit) return false;
            }
        }
        left -= interval;
        // After an interval, the next RSTn; after the last MCU, EOI (a stray RSTn or any other marker: libjpeg's call).
        const int expected = left > 0 ? 0xD0 + int(restarts++ & 7) : 0xD9;
        if (marker != expected) return false;
    }
    return true;
}

}  // namespace

bool baseline_scan_complete(const ScanLayout& layout, ByteSpan entropy) {
    thread_local std::vector<std::uint8_t> segment;
    try {
        const bool ok = walk(layout, entropy, segment);
        if (segment.capacity() > (std::size_t(16) << 20)) std::vector<std::uint8_t>().swap(segment);
        return ok;
    } catch (const std::bad_alloc&) {
        std::vector<std::uint8_t>().swap(segment);
        return false;
    }
}

}  // namespace fastfeed
