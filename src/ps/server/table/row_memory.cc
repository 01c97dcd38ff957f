// Memory for table rows (row_memory.h).
#include "ps/server/table/row_memory.h"

#include <sys/mman.h>

#include <algorithm>

#include "core/check.h"

namespace psflow::ps::table {

void* AllocateRowMemory(size_t bytes) {
  constexpr size_t kHugePage = size_t{2} << 20;
  const size_t align = bytes >= kHugePage / 2 ? kHugePage : 64;
  const size_t rounded = (std::max<size_t>(bytes, 1) + align - 1) / align * align;
  void* p = std::aligned_alloc(align, rounded);
  CHECK(p != nullptr) << "out of memory allocating " << rounded << " bytes of table rows";
  // Advice only: without THP the rows stay on 4 KiB pages, correct and slower.
  if (align == kHugePage) (void)madvise(p, rounded, MADV_HUGEPAGE);
  return p;
}

}  // namespace psflow::ps::table
