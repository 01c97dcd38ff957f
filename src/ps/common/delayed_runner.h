// ps/common/delayed_runner.h — runs callbacks after a delay on one thread of its own: the timers of the
// client's retries (a transport completion callback must not sleep, so a retry is scheduled here).
// A thin front of SystemClock (ps/common/clock.h), the one timer thread implementation.
//
// Thread-safe. Destroying the runner drops callbacks that have not run yet (their owners must
// not be waiting on them: the PsClient must outlive its calls) and waits for a running one.
#ifndef PSFLOW_PS_COMMON_DELAYED_RUNNER_H_
#define PSFLOW_PS_COMMON_DELAYED_RUNNER_H_

#include <functional>

#include "absl/time/time.h"
#include "ps/common/clock.h"

namespace psflow::ps {

class DelayedRunner {
 public:
  DelayedRunner() = default;
  DelayedRunner(const DelayedRunner&) = delete;
  DelayedRunner& operator=(const DelayedRunner&) = delete;

  // Runs `fn` on the runner's thread once `delay_secs` passed (started on first use).
  Clock::TimerId RunAfter(double delay_secs, std::function<void()> fn) {
    return clock_.Schedule(clock_.Now() + absl::Seconds(delay_secs), std::move(fn));
  }
  // Drops a callback that has not run yet (a no-op once it ran).
  void Cancel(Clock::TimerId id) { clock_.Cancel(id); }

 private:
  SystemClock clock_;
};

}  // namespace psflow::ps

#endif  // PSFLOW_PS_COMMON_DELAYED_RUNNER_H_
