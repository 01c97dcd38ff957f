// ps/client/fan_out.h — the client's calls to several ps tasks at once: one call per task in parallel,
// each answer handled as it arrives, every attempt with a deadline sized to the bytes it moves,
// and (with a Retrier) an attempt that missed its deadline or whose connection broke
// (DeadlineExceeded, Unavailable) started again with back-off until the call's budget passed —
// only that task's call, so what the other tasks applied is not applied twice, and pushes carry
// ids the ps deduplicates (ps/client/call_deadline.h has the whole design, ps/server/push_dedup.h the ps's
// side). Silent tasks are logged at once and every 10 s, naming the task and the call. A "not
// initialized" answer becomes the status IsPsRestarted recognizes. Thread-safe.
#ifndef PSFLOW_PS_CLIENT_FAN_OUT_H_
#define PSFLOW_PS_CLIENT_FAN_OUT_H_

#include <functional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "ps/common/delayed_runner.h"
#include "ps/common/retry.h"
#include "rpc/transport.h"

namespace psflow::ps {

// Retries of calls to silent ps tasks under the one retry policy (ps/common/retry.h): their
// timers, and which tasks are being waited for (so a silence is logged when it starts and every
// 10 s, not once per call).
class Retrier {
 public:
  Retrier(std::vector<const rpc::ClientChannel*> channels, double give_up_secs,
          std::function<void(const std::string&)> log)
      : channels_(std::move(channels)), give_up_secs_(give_up_secs), silences_(std::move(log)) {}

  double give_up_secs() const { return give_up_secs_; }
  Clock::TimerId RunAfter(double secs, std::function<void()> fn) { return runner_.RunAfter(secs, std::move(fn)); }
  void Cancel(Clock::TimerId id) { runner_.Cancel(id); }
  int TaskOf(const rpc::ClientChannel* channel) const {
    return static_cast<int>(std::find(channels_.begin(), channels_.end(), channel) - channels_.begin());
  }

  // Logs "waiting for ps task 1 (...), silent for 12 s: ...; retrying Push for up to 120 s in all
  // (--ps_timeout_secs)" when the task's silence starts and every 10 s while it lasts.
  void NoteSilent(const rpc::ClientChannel* channel, rpc::Method method, const absl::Status& status,
                  double elapsed_secs, double budget_secs);
  // The task answered: logs how long it was silent, if it was.
  void NoteReached(const rpc::ClientChannel* channel) { silences_.NoteReached(channel->peer_name()); }
  // The log of silences, for the client's blocking waits (connecting).
  SilenceLog* silences() { return &silences_; }

 private:
  const std::vector<const rpc::ClientChannel*> channels_;
  const double give_up_secs_;
  SilenceLog silences_;
  DelayedRunner runner_;  // last: destroyed (its thread joined) before what its callbacks use
};

// One call per channel, in parallel; `on_response` runs on each success (on a transport thread,
// concurrently for different tasks) and may fail it; `on_all` runs once with every call's status.
// Each attempt's deadline is AttemptDeadlineSecs(options.timeout_secs, request bytes +
// answer_bytes[k]) (answer_bytes: the expected answer's tensor bytes per call, or empty).
// With a retrier, a call failing DeadlineExceeded or Unavailable is repeated (that call alone,
// under the policy of ps/common/retry.h) until it gets through or its budget passed — budget_secs, or the
// retrier's give_up_secs when negative; the first attempt always runs its whole deadline — then
// it fails with the last code, naming the task, the call and the flags that raise the bounds.
void CallAll(const std::vector<rpc::ClientChannel*>& channels, rpc::Method method,
             std::vector<rpc::OutgoingMessage> requests, const rpc::CallOptions& options,
             std::function<absl::Status(int, const rpc::IncomingMessage&)> on_response,
             std::function<void(std::vector<absl::Status>&)> on_all, Retrier* retrier = nullptr,
             std::vector<int64_t> answer_bytes = {}, double budget_secs = -1);

// Bytes of a message's tensors and header.
int64_t MessageBytes(const rpc::OutgoingMessage& message);

// The first error, preferring OutOfRange (training finished), then a restarted ps task, so callers
// recognize them.
absl::Status Combine(const std::vector<absl::Status>& statuses);

}  // namespace psflow::ps

#endif  // PSFLOW_PS_CLIENT_FAN_OUT_H_
