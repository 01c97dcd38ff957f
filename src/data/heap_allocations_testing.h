// data/heap_allocations_testing.h (tests only) — how many heap allocations the program has made,
// every thread, so that a test checks a loop allocates nothing per example. The count comes from a
// replacement of the global operator new in heap_allocations_testing.cc: a test that includes this
// header lists that file among its SOURCES (one replacement per program).
#ifndef PSFLOW_DATA_HEAP_ALLOCATIONS_TESTING_H_
#define PSFLOW_DATA_HEAP_ALLOCATIONS_TESTING_H_

#include <cstdint>

namespace psflow::data::testing {

// Heap allocations (operator new) so far; thread-safe.
int64_t HeapAllocations();

}  // namespace psflow::data::testing

#endif  // PSFLOW_DATA_HEAP_ALLOCATIONS_TESTING_H_
