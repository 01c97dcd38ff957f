// core/block_cache.h — what the large-block cache of the tensor allocator (tensor.cc; the public
// entry points are psflow::internal::AllocateAlignedBlock/FreeAlignedBlock/ReleaseCachedBlocks)
// holds now, for tests and diagnostics. Blocks of 256 KiB or more are recycled by size class: the
// size rounded up to 1/16 of its power of two, so buffers whose size varies a little from step to
// step (a table's per-ps rows) share a few blocks instead of caching one per size they ever had.
#ifndef PSFLOW_CORE_BLOCK_CACHE_H_
#define PSFLOW_CORE_BLOCK_CACHE_H_

#include <cstddef>

namespace psflow::internal {

// Bytes of the blocks cached for reuse now. Thread-safe.
std::size_t CachedBlockBytes();

}  // namespace psflow::internal

#endif  // PSFLOW_CORE_BLOCK_CACHE_H_
