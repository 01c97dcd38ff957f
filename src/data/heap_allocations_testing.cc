// Counts heap allocations (heap_allocations_testing.h) by replacing the global operator new.
#include "data/heap_allocations_testing.h"

#include <atomic>
#include <cstdlib>
#include <new>

namespace {
std::atomic<int64_t> g_allocations{0};
}  // namespace

// GCC 12 flags free() on what this operator new returns once both are inlined; they are a matched pair.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
void* operator new(size_t size) {
  g_allocations.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(size == 0 ? 1 : size)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, size_t) noexcept { std::free(p); }
#pragma GCC diagnostic pop

namespace psflow::data::testing {

int64_t HeapAllocations() { return g_allocations.load(); }

}  // namespace psflow::data::testing
