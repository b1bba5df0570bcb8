// Views of bytes the native core reads or writes without owning them (a Python buffer, a slot of the ring).
#pragma once

#include <cstddef>
#include <cstdint>

namespace fastfeed {

struct ByteSpan {
    const std::uint8_t* data;
    std::size_t size;
};

struct MutableByteSpan {
    std::uint8_t* data = nullptr;
    std::size_t size = 0;
};

}  // namespace fastfeed
