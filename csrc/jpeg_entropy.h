// A fast proof that a baseline JPEG's scan codes every pixel: the scan check's common case without libjpeg.
//
// The scan check (jpeg_transcode.h, check_jpeg_scans) entropy-decodes every scan with libjpeg into a coefficient
// buffer, which is most of `fastfeed index`'s and pack's CPU time. For the usual file (baseline Huffman, one scan
// holding every component) the verdict only needs the Huffman codes walked: no coefficient is stored, an AC code
// and its value bits are skipped in one table lookup. The walk answers "complete" only when it is certain libjpeg
// would find nothing either (every code valid, every MCU inside its data segment, the expected RSTn after each
// interval, EOI after the last MCU); anything else, however harmless, is "ask libjpeg", so the check's answers are
// libjpeg's on every file.
#pragma once

#include <cstdint>

#include "byte_span.h"

namespace fastfeed {

// One Huffman table as a DHT segment gives it: code counts by length (bits[1..16]) and the symbols in code order.
struct HuffmanSpec {
    const std::uint8_t* bits = nullptr;    // 17 entries, bits[0] unused (libjpeg's JHUFF_TBL layout); null: absent
    const std::uint8_t* values = nullptr;  // 256 entries
};

struct ScanComponent {
    int h = 1, v = 1;            // sampling factors
    int dc_table = 0, ac_table = 0;  // 0..3
};

// What a sequential scan's entropy-coded data depends on, from the frame and scan headers.
struct ScanLayout {
    int width = 0, height = 0;
    int num_components = 0;  // in the frame; the scan must hold all of them
    ScanComponent components[4];
    unsigned restart_interval = 0;  // MCUs per interval, 0: none
    HuffmanSpec dc[4], ac[4];
};

// True when `entropy` (the bytes right after the SOS segment, to the end of the file) codes every MCU of `layout`
// as above and is followed by EOI; false means "not proven", never "corrupt". Thread-safe, no allocation beyond a
// per-thread scratch buffer.
bool baseline_scan_complete(const ScanLayout& layout, ByteSpan entropy);

}  // namespace fastfeed
