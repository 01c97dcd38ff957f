// src/core/threading_internal.h — hooks of threading.cc used by psflow's kernels only.
#ifndef PSFLOW_SRC_CORE_THREADING_INTERNAL_H_
#define PSFLOW_SRC_CORE_THREADING_INTERNAL_H_

namespace psflow::internal {

// OpenMP keeps its thread count per calling thread, so a thread that did not call
// SetIntraOpThreads itself (a replica thread, a gRPC handler) would run oneDNN with OpenMP's
// default team. Kernels that enter oneDNN call this first; it is a no-op after the first call
// per thread until the count changes.
void ApplyIntraOpThreadsToOpenMp();

}  // namespace psflow::internal

#endif  // PSFLOW_SRC_CORE_THREADING_INTERNAL_H_
