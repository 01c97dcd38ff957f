// ps/delayed_runner.h — runs callbacks after a delay on one thread of its own: the timers of the
// client's retries (a transport completion callback must not sleep, so a retry is scheduled here).
//
// Thread-safe. Destroying the runner drops callbacks that have not run yet (their owners must
// not be waiting on them: the PsClient must outlive its calls).
#ifndef PSFLOW_PS_DELAYED_RUNNER_H_
#define PSFLOW_PS_DELAYED_RUNNER_H_

#include <functional>
#include <map>
#include <thread>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace psflow::ps {

class DelayedRunner {
 public:
  DelayedRunner() = default;
  ~DelayedRunner();
  DelayedRunner(const DelayedRunner&) = delete;
  DelayedRunner& operator=(const DelayedRunner&) = delete;

  // Runs `fn` on the runner's thread once `delay_secs` passed (started on first use).
  void RunAfter(double delay_secs, std::function<void()> fn);

 private:
  void Loop();
  bool HasWork() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_ || !pending_.empty(); }
  bool StopOrEarlier() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return stop_ || pending_.begin()->first < waiting_until_;
  }

  absl::Mutex mu_;
  std::multimap<absl::Time, std::function<void()>> pending_ ABSL_GUARDED_BY(mu_);
  absl::Time waiting_until_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  bool started_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace psflow::ps

#endif  // PSFLOW_PS_DELAYED_RUNNER_H_
