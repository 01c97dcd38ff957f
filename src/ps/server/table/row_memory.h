// ps/server/table/row_memory.h — memory for a table's rows, and copying one row. Internal to the
// table shards (fixed_table.h, dynamic_table.h, row_index.h).
//
// Rows are read and written at random, a few thousand per call, so beside the cache misses each
// row costs a TLB miss on 4 KiB pages (a 64 MiB table spans 16384 of them). Blocks of 1 MiB and
// more are therefore rounded up to whole 2 MiB pages, 2 MiB-aligned and advised to the kernel as
// transparent huge pages (MADV_HUGEPAGE; a no-op where THP is off: then correct, only slower);
// smaller ones are 64-byte aligned (cache lines). CopyRow copies dim floats without a call into
// the C library per row. Pure functions; thread-safe.
#ifndef PSFLOW_PS_SERVER_TABLE_ROW_MEMORY_H_
#define PSFLOW_PS_SERVER_TABLE_ROW_MEMORY_H_

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>

namespace psflow::ps::table {

struct FreeRowMemory {
  void operator()(void* p) const { std::free(p); }
};
// An array in row memory, released with std::free.
template <typename T>
using RowArray = std::unique_ptr<T[], FreeRowMemory>;

// Uninitialized memory for `bytes` (aligned as above; CHECK-fails when out of memory).
void* AllocateRowMemory(size_t bytes);

// An uninitialized array of n trivially copyable T in row memory.
template <typename T>
RowArray<T> AllocateRows(size_t n) {
  return RowArray<T>(static_cast<T*>(AllocateRowMemory(n * sizeof(T))));
}

// dst[0, dim) = src[0, dim): whole 64-byte blocks as fixed-size copies (inlined as vector moves),
// then the remaining floats.
inline void CopyRow(float* __restrict dst, const float* __restrict src, int64_t dim) {
  int64_t k = 0;
  for (; k + 16 <= dim; k += 16) std::memcpy(dst + k, src + k, 64);
  for (; k + 4 <= dim; k += 4) std::memcpy(dst + k, src + k, 16);
  for (; k < dim; ++k) dst[k] = src[k];
}

}  // namespace psflow::ps::table

#endif  // PSFLOW_PS_SERVER_TABLE_ROW_MEMORY_H_
