// PushStream (psflow/ps/ps_client.h): a step's push in parts, sent while backward runs. Each
// Send is a push of its own through PsClient::Impl::PushAsync marked as an early part (every call
// says more parts follow; only the ps tasks holding the part's shards are called); Finish waits
// for them and sends the push's last part, which counts (the global step, the sync quorum) and
// carries the pull and the tables.
#include <utility>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "core/check.h"
#include "ps/client/ps_client_impl.h"

namespace psflow::ps {

struct PushStream::State {
  absl::Mutex mu;
  int in_flight ABSL_GUARDED_BY(mu) = 0;
  absl::Status status ABSL_GUARDED_BY(mu);  // the first failure of a part
};

PushStream::PushStream(PsClient::Impl* client, int64_t step_tag)
    : client_(client), step_tag_(step_tag), state_(std::make_shared<State>()) {}

PushStream::~PushStream() { (void)WaitForParts(); }

std::unique_ptr<PushStream> PsClient::StartPush(int64_t step_tag) {
  return std::unique_ptr<PushStream>(new PushStream(impl_.get(), step_tag));
}

std::shared_ptr<void> PsClient::KeepAlive() {
  std::shared_ptr<WaitHeartbeat> heartbeat = impl_->StartPartsHeartbeat();
  if (heartbeat == nullptr) return nullptr;
  WaitHeartbeat* raw = heartbeat.get();
  return std::shared_ptr<void>(raw, [heartbeat = std::move(heartbeat)](void*) { heartbeat->Stop(); });
}

void PushStream::Send(const std::vector<Gradient>& grads) {
  if (grads.empty()) return;
  ++parts_sent_;
  {
    absl::MutexLock lock(&state_->mu);
    ++state_->in_flight;
  }
  auto on_done = [state = state_](absl::StatusOr<PushResult> r) {
    absl::MutexLock lock(&state->mu);
    if (!r.ok() && state->status.ok()) state->status = r.status();
    --state->in_flight;
  };
  // Slices with their values pulled back (PsClient::PullBackSlices), or the part as one push.
  if (client_->SlicesFor(grads)) return client_->PushSlicesAsync(grads, step_tag_, std::move(on_done));
  client_->PushAsync(grads, step_tag_, nullptr, nullptr, std::move(on_done), /*early_part=*/true);
}

absl::Status PushStream::WaitForParts() {
  CHECK(!rpc::OnTransportThread()) << "PushStream: waiting from an async completion callback would deadlock";
  absl::MutexLock lock(&state_->mu);
  state_->mu.Await(absl::Condition(
      +[](State* s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s->mu) { return s->in_flight == 0; }, state_.get()));
  return state_->status;
}

void PushStream::FinishAsync(const std::vector<Gradient>& grads,
                             const std::vector<std::pair<std::string, Tensor*>>& out, const TableStep& tables,
                             std::function<void(absl::StatusOr<PushResult>)> done) {
  // Sync: the ps tasks that have all their parts hear that this worker is alive while another
  // (stalled) holds one, so that they do not drop it from the step's quorum meanwhile.
  std::shared_ptr<WaitHeartbeat> heartbeat = client_->StartPartsHeartbeat();
  absl::Status parts = WaitForParts();
  if (heartbeat != nullptr) heartbeat->Stop();
  if (!parts.ok()) return done(parts);
  client_->PushAsync(grads, step_tag_, &out, &tables, std::move(done));
}

absl::StatusOr<PushResult> PushStream::Finish(const std::vector<Gradient>& grads,
                                              const std::vector<std::pair<std::string, Tensor*>>& out,
                                              const TableStep& tables) {
  absl::Notification done;
  absl::StatusOr<PushResult> result;
  FinishAsync(grads, out, tables, [&](absl::StatusOr<PushResult> r) {
    result = std::move(r);
    done.Notify();
  });
  done.WaitForNotification();
  return result;
}

}  // namespace psflow::ps
