// rpc/test_handler.h — test-only Handler shared by the transport tests (gRPC and shared memory):
// answers every call at once with the request's tensors doubled, except calls of `held_method`,
// which it holds until ReleaseHeld() (a late answer from another thread, like a sync quorum).
// Thread-safe.
#ifndef PSFLOW_RPC_TEST_HANDLER_H_
#define PSFLOW_RPC_TEST_HANDLER_H_

#include <memory>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "rpc/transport.h"

namespace psflow::rpc::testing {

class DoublingHandler : public Handler {
 public:
  explicit DoublingHandler(Method held_method) : held_method_(held_method) {}

  void Handle(Method method, IncomingMessage request, Responder responder) override {
    if (method == held_method_) {
      absl::MutexLock lock(&mu_);
      held_.push_back(std::move(responder));
      return;
    }
    OutgoingMessage response;
    response.header = request.header();
    for (int i = 0; i < request.num_tensors(); ++i) {
      auto values = std::make_shared<std::vector<float>>(static_cast<size_t>(request.num_floats(i)));
      request.CopyTo(i, values->data());
      for (float& v : *values) v *= 2;
      OutgoingTensor t;
      t.meta = request.meta(i);
      t.data = values->data();
      t.num_floats = static_cast<int64_t>(values->size());
      t.owner = std::move(values);
      response.tensors.push_back(std::move(t));
    }
    responder.Respond(std::move(response));
  }

  void ReleaseHeld() {
    std::vector<Responder> held;
    {
      absl::MutexLock lock(&mu_);
      held.swap(held_);
    }
    for (Responder& r : held) r.Respond(OutgoingMessage::Of(wire::Empty()));
  }
  size_t held() {
    absl::MutexLock lock(&mu_);
    return held_.size();
  }
  // Waits (up to 10 s) until `n` calls are held.
  bool WaitHeld(size_t n) {
    absl::MutexLock lock(&mu_);
    auto enough = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return held_.size() >= n; };
    return mu_.AwaitWithTimeout(absl::Condition(&enough), absl::Seconds(10));
  }

 private:
  const Method held_method_;
  absl::Mutex mu_;
  std::vector<Responder> held_ ABSL_GUARDED_BY(mu_);
};

}  // namespace psflow::rpc::testing

#endif  // PSFLOW_RPC_TEST_HANDLER_H_
