// psflow rpc/call_responder.h (internal) — the Responder::Impl of both servers: the gRPC server's
// ServerCall (grpc_server.cc) and the shared-memory server's (shm_server.cc). It shares
// ownership of the call, so an answer given late — from another thread, after a sync quorum or
// initialization — still finds the call alive; answering is the call's own Respond.
#ifndef PSFLOW_RPC_CALL_RESPONDER_H_
#define PSFLOW_RPC_CALL_RESPONDER_H_

#include <memory>
#include <utility>

#include "absl/status/statusor.h"
#include "rpc/transport.h"

namespace psflow::rpc {

// `Call` has `void Respond(absl::StatusOr<OutgoingMessage>)`, safe to call from any thread once.
template <typename Call>
class CallResponder final : public Responder::Impl {
 public:
  explicit CallResponder(std::shared_ptr<Call> call) : call_(std::move(call)) {}
  void Respond(absl::StatusOr<OutgoingMessage> response) override { call_->Respond(std::move(response)); }

 private:
  std::shared_ptr<Call> call_;
};

}  // namespace psflow::rpc

#endif  // PSFLOW_RPC_CALL_RESPONDER_H_
