// ps/common/retry.h — the one retry policy of every wait on another task (docs/failures.md):
// an attempt that failed Unavailable or DeadlineExceeded (the peer is down, silent or not up yet)
// is started again after a back-off of 50 ms doubling to 2 s, until the wait's budget passed;
// the silence is logged when it starts and every 10 s while it lasts, naming the peer and what is
// retried. Any other error ends the wait at once: waiting would not change the answer.
//
// Two fronts over the same policy: RetryBlocking for a thread that may sleep (connecting, the
// chief's initialization, a worker waiting for the chief), and the asynchronous Retrier
// (ps/client/fan_out.h) for calls whose completion runs on a transport thread, which uses Backoff
// and SilenceLog from here. A call path retries in one layer only.
#ifndef PSFLOW_PS_COMMON_RETRY_H_
#define PSFLOW_PS_COMMON_RETRY_H_

#include <algorithm>
#include <functional>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace psflow::ps {

inline constexpr double kFirstBackoffSecs = 0.05;
inline constexpr double kMaxBackoffSecs = 2.0;
inline constexpr double kSilenceLogEverySecs = 10.0;

// Whether a failed attempt is worth repeating: the peer was unreachable or did not answer in time.
inline bool IsRetryable(const absl::Status& s) { return absl::IsUnavailable(s) || absl::IsDeadlineExceeded(s); }

// The delays between attempts: 50 ms doubling to 2 s. Not thread-safe (one per waiting call).
class Backoff {
 public:
  double Next() {
    const double delay = next_secs_;
    next_secs_ = std::min(next_secs_ * 2, kMaxBackoffSecs);
    return delay;
  }

 private:
  double next_secs_ = kFirstBackoffSecs;
};

// Silences being waited out, one entry per peer: logged when a silence starts and every 10 s,
// and once more when the peer answers again. Thread-safe.
class SilenceLog {
 public:
  explicit SilenceLog(std::function<void(const std::string&)> log) : log_(std::move(log)) {}

  // "waiting for <peer>, silent for 12 s: <why>; retrying <what> for up to 120 s in all (<flag>)",
  // at the silence's start and every 10 s after.
  void NoteSilent(const std::string& peer, const std::string& what, const std::string& why, double elapsed_secs,
                  double budget_secs, const std::string& flag);
  // The peer answered: logs how long it was silent, if it was.
  void NoteReached(const std::string& peer);

 private:
  void Log(const std::string& line) const;

  const std::function<void(const std::string&)> log_;  // null: standard error
  struct Silence {
    absl::Time since;
    absl::Time last_log;
  };
  absl::Mutex mu_;
  absl::flat_hash_map<std::string, Silence> silent_ ABSL_GUARDED_BY(mu_);
};

// A blocking wait on one peer under the policy above.
struct RetryOptions {
  std::string peer;           // "ps task 0 (127.0.0.1:2222)": named in the log and the error
  std::string what;           // what is retried: "Hello", "the chief's initialization", ...
  double budget_secs = 0;     // retry while the wait is younger than this
  std::string budget_flag;    // the flag that sets the budget, named in the log and the error
  SilenceLog* log = nullptr;  // borrowed; null: a silent wait
  double quiet_secs = 0;      // not logged before this (a peer that comes up at once is no news)
  // The error when the budget passed, from the last attempt's (its peer prefix removed); null:
  // the message below.
  std::function<absl::Status(const std::string& why, const absl::Status& last)> give_up;
  // Which failures are retried; null: IsRetryable.
  std::function<bool(const absl::Status&)> retryable;
};

// Runs `attempt(seconds_left)` until it returns a non-retryable status (returned as it is) or the
// budget passed; then DeadlineExceeded "gave up on <peer> after N s: <what>: <last error>; raise
// <flag> to wait longer". `seconds_left` (> 0) is what remains of the budget, for the attempt's
// own deadline. The first attempt always runs, however small the budget.
absl::Status RetryBlocking(const RetryOptions& options, const std::function<absl::Status(double)>& attempt);

}  // namespace psflow::ps

#endif  // PSFLOW_PS_COMMON_RETRY_H_
