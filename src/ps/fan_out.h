// ps/fan_out.h — the client's calls to several ps tasks at once: one call per task in parallel,
// each answer handled as it arrives, and (with a Retrier) calls to an unreachable task
// (Unavailable) repeated with exponential back-off for a bounded time, only that task's call, so
// that what the other tasks applied is not applied twice. A "not initialized" answer becomes the
// status IsPsRestarted recognizes. Thread-safe.
#ifndef PSFLOW_PS_FAN_OUT_H_
#define PSFLOW_PS_FAN_OUT_H_

#include <functional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "ps/delayed_runner.h"
#include "rpc/transport.h"

namespace psflow::ps {

// Retries of calls to unreachable ps tasks: their timers, and which tasks are being waited for
// (so the wait is logged once per outage, not once per call).
class Retrier {
 public:
  Retrier(std::vector<const rpc::ClientChannel*> channels, double give_up_secs,
          std::function<void(const std::string&)> log)
      : channels_(std::move(channels)), give_up_secs_(give_up_secs), log_(std::move(log)) {}

  double give_up_secs() const { return give_up_secs_; }
  void RunAfter(double secs, std::function<void()> fn) { runner_.RunAfter(secs, std::move(fn)); }
  int TaskOf(const rpc::ClientChannel* channel) const {
    return static_cast<int>(std::find(channels_.begin(), channels_.end(), channel) - channels_.begin());
  }

  // Logs "waiting for ps task 1 (...): ...; retrying for up to 120 s" once per outage.
  void NoteUnreachable(const rpc::ClientChannel* channel, const absl::Status& status);
  void NoteReached(const rpc::ClientChannel* channel) {
    absl::MutexLock lock(&mu_);
    waiting_.erase(channel);
  }

 private:
  const std::vector<const rpc::ClientChannel*> channels_;
  const double give_up_secs_;
  const std::function<void(const std::string&)> log_;
  absl::Mutex mu_;
  absl::flat_hash_set<const rpc::ClientChannel*> waiting_ ABSL_GUARDED_BY(mu_);
  DelayedRunner runner_;  // last: destroyed (its thread joined) before what its callbacks use
};

// One call per channel, in parallel; `on_response` runs on each success (on a transport thread,
// concurrently for different tasks) and may fail it; `on_all` runs once with every call's status.
// With a retrier, a call failing with Unavailable is repeated (that call alone, 50 ms doubling to
// 2 s apart) until it gets through or the retrier's bound passed (then Unavailable naming the task).
void CallAll(const std::vector<rpc::ClientChannel*>& channels, rpc::Method method,
             std::vector<rpc::OutgoingMessage> requests, const rpc::CallOptions& options,
             std::function<absl::Status(int, const rpc::IncomingMessage&)> on_response,
             std::function<void(std::vector<absl::Status>&)> on_all, Retrier* retrier = nullptr);

// The first error, preferring OutOfRange (training finished), then a restarted ps task, so callers
// recognize them.
absl::Status Combine(const std::vector<absl::Status>& statuses);

}  // namespace psflow::ps

#endif  // PSFLOW_PS_FAN_OUT_H_
