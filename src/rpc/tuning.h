// psflow/rpc/tuning.h — process-wide settings for moving large tensors quickly.
#ifndef PSFLOW_RPC_TUNING_H_
#define PSFLOW_RPC_TUNING_H_

namespace psflow::rpc {

// Sets the C allocator so large message buffers are not returned to the kernel on every free
// (an mmap/munmap and page faults per 16 MiB RPC cost more than the copy itself). Call once at
// process start, before threads exist; idempotent.
void TuneAllocatorForLargeMessages();

}  // namespace psflow::rpc

#endif  // PSFLOW_RPC_TUNING_H_
