// The ustar member header fastfeed writes, byte for byte what fastfeed/pack/writers.py's _put_header writes:
// mode 0644, uid/gid 0, mtime 0 (fixed, so shards are reproducible), typeflag '0', magic "ustar\0" version "00",
// checksum as "%06o\0 ". Format only: no I/O, no threads.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>

namespace fastfeed {
namespace ustar {

constexpr size_t kBlock = 512;
constexpr uint64_t kMaxSize = (uint64_t{1} << 33) - 1;  // 11 octal digits in the size field

// `h` has kBlock bytes; `name` is at most 100 bytes (the caller validates) and `size` at most kMaxSize.
inline void put_header(uint8_t* h, const std::string& name, uint64_t size) {
    std::memset(h, 0, kBlock);
    std::memcpy(h, name.data(), std::min(name.size(), size_t{100}));
    std::memcpy(h + 100, "0000644", 8);  // mode, uid, gid: 7 octal digits + NUL
    std::memcpy(h + 108, "0000000", 8);
    std::memcpy(h + 116, "0000000", 8);
    char field[24];
    std::snprintf(field, sizeof field, "%011llo", static_cast<unsigned long long>(size));
    std::memcpy(h + 124, field, 12);  // 11 digits + NUL
    std::memcpy(h + 136, "00000000000", 12);  // mtime 0
    std::memset(h + 148, ' ', 8);             // the checksum counts its own field as spaces
    h[156] = '0';
    std::memcpy(h + 257, "ustar", 6);
    h[263] = '0';
    h[264] = '0';
    unsigned sum = 0;
    for (size_t i = 0; i < kBlock; ++i) sum += h[i];
    std::snprintf(field, sizeof field, "%06o", sum);
    std::memcpy(h + 148, field, 6);
    h[154] = 0;
    h[155] = ' ';
}

}  // namespace ustar
}  // namespace fastfeed
