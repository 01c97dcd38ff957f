// rpc/grpc_common.h (internal) — what the gRPC client (grpc_transport.cc) and server
// (grpc_server.cc) share.
#ifndef PSFLOW_RPC_GRPC_COMMON_H_
#define PSFLOW_RPC_GRPC_COMMON_H_

#include <grpcpp/completion_queue.h>

#include <chrono>

namespace psflow::rpc::grpc_internal {

// The path of a Push sent in chunks on one stream (rpc/chunked_message.h).
inline constexpr char kChunkedPushPath[] = "/psflow.wire.Ps/PushChunks";

// The next event of `cq` (false: the queue is shut down and drained). The calling thread first
// polls without blocking for a while (rpc/spin_wait.h, adaptive per thread), then parks.
bool NextEvent(grpc::CompletionQueue* cq, void** tag, bool* ok);

// Now + `secs` (clamped to [0, 1e7] s, so "effectively forever" does not overflow the clock).
std::chrono::system_clock::time_point DeadlineAfter(double secs);

}  // namespace psflow::rpc::grpc_internal

#endif  // PSFLOW_RPC_GRPC_COMMON_H_
