// XXH3_64bits (seed 0): the per-sample checksum of a packed dataset, the value python-xxhash's xxh3_64_intdigest
// returns. One out-of-line function, so the vendored xxHash implementation is compiled once (xxh3.cpp) for every
// native caller (the tar writer's per-member checksums, the ring's per-sample digests, the binding).
#pragma once

#include <cstddef>
#include <cstdint>

namespace fastfeed {

uint64_t xxh3_64(const uint8_t* data, size_t size);

}  // namespace fastfeed
