// src/core/threading_internal.h — hooks of threading.cc used by psflow's kernels only.
#ifndef PSFLOW_SRC_CORE_THREADING_INTERNAL_H_
#define PSFLOW_SRC_CORE_THREADING_INTERNAL_H_

namespace psflow::internal {

// Every op calls this first. It makes the calling thread ready for psflow's kernels:
//  - flush-to-zero / denormals-are-zero on this thread and on OpenMP's workers;
//  - OpenMP's thread count: OpenMP keeps it per calling thread, so a thread that did not call
//    SetIntraOpThreads itself (a replica thread, a gRPC handler) would otherwise run oneDNN with
//    OpenMP's default team.
// A thread-local check makes it free after the first call per thread (until the count changes).
void PrepareThreadForKernels();

}  // namespace psflow::internal

#endif  // PSFLOW_SRC_CORE_THREADING_INTERNAL_H_
