#include "ps/delayed_runner.h"

namespace psflow::ps {

DelayedRunner::~DelayedRunner() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

void DelayedRunner::RunAfter(double delay_secs, std::function<void()> fn) {
  absl::MutexLock lock(&mu_);
  pending_.emplace(absl::Now() + absl::Seconds(delay_secs), std::move(fn));
  if (!started_) {
    started_ = true;
    thread_ = std::thread([this] { Loop(); });
  }
}

void DelayedRunner::Loop() {
  absl::MutexLock lock(&mu_);
  for (;;) {
    mu_.Await(absl::Condition(this, &DelayedRunner::HasWork));
    if (stop_) return;
    const absl::Time due = pending_.begin()->first;
    if (absl::Now() < due) {
      // Wakes early on stop or when an earlier callback is added; then starts over.
      waiting_until_ = due;
      mu_.AwaitWithDeadline(absl::Condition(this, &DelayedRunner::StopOrEarlier), due);
      continue;
    }
    std::function<void()> fn = std::move(pending_.begin()->second);
    pending_.erase(pending_.begin());
    mu_.Unlock();
    fn();
    mu_.Lock();
  }
}

}  // namespace psflow::ps
