// See xxh3.h. The only translation unit that includes the xxHash implementation.
#include "xxh3.h"

#define XXH_INLINE_ALL
#include "third_party/xxhash/xxhash.h"

namespace fastfeed {

uint64_t xxh3_64(const uint8_t* data, size_t size) { return XXH3_64bits(data, size); }

}  // namespace fastfeed
