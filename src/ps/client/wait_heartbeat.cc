// Heartbeats of a sync worker waiting on a stalled ps task (ps/client/wait_heartbeat.h).
#include "ps/client/wait_heartbeat.h"

namespace psflow::ps {

WaitHeartbeat::WaitHeartbeat(std::vector<rpc::ClientChannel*> channels, wire::HelloRequest hello, double every_secs,
                             double rpc_timeout_secs, Retrier* runner)
    : channels_(std::move(channels)),
      hello_(std::move(hello)),
      every_secs_(every_secs),
      rpc_timeout_secs_(rpc_timeout_secs),
      runner_(runner),
      answered_(channels_.size(), false) {}

std::shared_ptr<WaitHeartbeat> WaitHeartbeat::Start(std::vector<rpc::ClientChannel*> channels, wire::HelloRequest hello,
                                                    double every_secs, double rpc_timeout_secs, Retrier* runner) {
  auto beat =
      std::make_shared<WaitHeartbeat>(std::move(channels), std::move(hello), every_secs, rpc_timeout_secs, runner);
  absl::MutexLock lock(&beat->mu_);
  beat->next_beat_ = runner->RunAfter(every_secs, [beat] { beat->Beat(); });
  return beat;
}

void WaitHeartbeat::Answered(int i) {
  absl::MutexLock lock(&mu_);
  answered_[i] = true;
}

void WaitHeartbeat::Stop() {
  absl::MutexLock lock(&mu_);
  stopped_ = true;
  runner_->Cancel(next_beat_);
}

void WaitHeartbeat::Beat() {
  std::vector<rpc::ClientChannel*> to;
  {
    absl::MutexLock lock(&mu_);
    if (stopped_) return;
    for (size_t i = 0; i < channels_.size(); ++i) {
      if (answered_[i]) to.push_back(channels_[i]);
    }
  }
  rpc::CallOptions options;
  options.timeout_secs = rpc_timeout_secs_;
  for (rpc::ClientChannel* channel : to) {
    // Fire and forget: a lost heartbeat is made up by the next one.
    channel->Call(rpc::Method::kHello, rpc::OutgoingMessage::Of(hello_), options,
                  [](absl::StatusOr<rpc::IncomingMessage>) {});
  }
  absl::MutexLock lock(&mu_);
  if (!stopped_) next_beat_ = runner_->RunAfter(every_secs_, [self = shared_from_this()] { self->Beat(); });
}

}  // namespace psflow::ps
