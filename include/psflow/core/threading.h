// psflow/core/threading.h — intra-op parallelism. SetIntraOpThreads(n) sets the thread count for
// OpenBLAS, oneDNN (OpenMP) and psflow's own element-wise kernels (ParallelFor). Process-wide;
// all functions are thread-safe.
//
// Denormal floats: like TensorFlow, psflow runs its kernels with flush-to-zero and
// denormals-are-zero set (subnormal values make SIMD float kernels an order of magnitude slower
// and carry no useful training signal). Ops set the mode on the thread they run on; code outside
// the ops (an optimizer loop, say) can call FlushDenormalsOnThisThread() itself.
#ifndef PSFLOW_CORE_THREADING_H_
#define PSFLOW_CORE_THREADING_H_

#include <cstdint>
#include <functional>

namespace psflow {

// n <= 0 means the machine's number of cores (also the default before any call).
void SetIntraOpThreads(int n);
int IntraOpThreads();

// Sets flush-to-zero and denormals-are-zero on the calling thread (x86 MXCSR; no-op elsewhere).
void FlushDenormalsOnThisThread();

// Splits [0, n) into contiguous blocks and runs fn(begin, end) on them using the intra-op
// threads; runs inline when n < min_block or there is one thread. Blocks are a deterministic
// function of n and the thread count.
void ParallelFor(int64_t n, int64_t min_block, const std::function<void(int64_t, int64_t)>& fn);

}  // namespace psflow

#endif  // PSFLOW_CORE_THREADING_H_
