// psflow/core/threading.h — intra-op parallelism. SetIntraOpThreads(n) sets the thread count for
// OpenBLAS, oneDNN (OpenMP) and psflow's own element-wise kernels (ParallelFor). Process-wide.
#ifndef PSFLOW_CORE_THREADING_H_
#define PSFLOW_CORE_THREADING_H_

#include <cstdint>
#include <functional>

namespace psflow {

void SetIntraOpThreads(int n);
int IntraOpThreads();

// Splits [0, n) into contiguous blocks and runs fn(begin, end) on them using the intra-op
// threads; runs inline when n < min_block or there is one thread. Blocks are a deterministic
// function of n and the thread count.
void ParallelFor(int64_t n, int64_t min_block, const std::function<void(int64_t, int64_t)>& fn);

}  // namespace psflow

#endif  // PSFLOW_CORE_THREADING_H_
