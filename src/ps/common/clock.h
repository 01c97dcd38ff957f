// ps/common/clock.h — time and timers behind an interface, so code that waits (the sync step's timeout in
// ps/server/sync_accumulator.h, the client's retry timers in ps/common/delayed_runner.h) can be driven by a test
// without sleeping.
//
//   Clock        the interface: Now(), Schedule(when, fn) and Cancel(id).
//   SystemClock  absl::Now(); callbacks run on one thread of its own (started on first use).
//   ManualClock  a test's clock: time stands still until Advance(), which runs the callbacks that
//                fell due, in order, on the caller's thread.
//
// Thread-safe. Destroying a clock drops the callbacks that have not run yet and waits for a
// running one to finish, so an object that owns its clock (declared last, destroyed first) never
// sees a callback after its own destruction began.
#ifndef PSFLOW_PS_COMMON_CLOCK_H_
#define PSFLOW_PS_COMMON_CLOCK_H_

#include <cstdint>
#include <map>
#include <thread>
#include <utility>

#include "absl/functional/any_invocable.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace psflow::ps {

class Clock {
 public:
  using TimerId = uint64_t;
  virtual ~Clock() = default;

  virtual absl::Time Now() const = 0;
  // Runs `fn` once, when Now() reaches `when` (at once if it has). Never runs it inside Schedule.
  virtual TimerId Schedule(absl::Time when, absl::AnyInvocable<void()> fn) = 0;
  // Drops a callback that has not started; returns at once (one already running finishes).
  virtual void Cancel(TimerId id) = 0;
};

// The pending callbacks of a clock, ordered by due time (then by scheduling order).
class TimerQueue {
 public:
  Clock::TimerId Add(absl::Time when, absl::AnyInvocable<void()> fn);
  void Remove(Clock::TimerId id);
  bool empty() const { return pending_.empty(); }
  int size() const { return static_cast<int>(pending_.size()); }
  absl::Time next_due() const { return pending_.begin()->first.first; }
  // Removes and returns the earliest callback.
  absl::AnyInvocable<void()> PopFirst();
  void Clear() { pending_.clear(); }

 private:
  std::map<std::pair<absl::Time, Clock::TimerId>, absl::AnyInvocable<void()>> pending_;
  std::map<Clock::TimerId, absl::Time> due_;
  Clock::TimerId next_id_ = 1;
};

class SystemClock final : public Clock {
 public:
  SystemClock() = default;
  ~SystemClock() override;
  SystemClock(const SystemClock&) = delete;
  SystemClock& operator=(const SystemClock&) = delete;

  absl::Time Now() const override { return absl::Now(); }
  TimerId Schedule(absl::Time when, absl::AnyInvocable<void()> fn) override;
  void Cancel(TimerId id) override;

 private:
  void Loop();
  // Waits (mu_ held) until a callback is due or the clock stops; returns it, or nullptr on stop.
  absl::AnyInvocable<void()> NextDue() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool StopOrWork() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_ || !queue_.empty(); }
  bool StopOrEarlier() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return stop_ || (!queue_.empty() && queue_.next_due() < waiting_until_);
  }

  absl::Mutex mu_;
  TimerQueue queue_ ABSL_GUARDED_BY(mu_);
  absl::Time waiting_until_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  bool started_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;  // started under mu_ on first Schedule; joined by the destructor
};

class ManualClock final : public Clock {
 public:
  explicit ManualClock(absl::Time start = absl::UnixEpoch() + absl::Hours(24)) : now_(start) {}

  absl::Time Now() const override;
  TimerId Schedule(absl::Time when, absl::AnyInvocable<void()> fn) override;
  void Cancel(TimerId id) override;

  // Moves time forward by `d`, running every callback due by then (in due order; time reads as
  // each one's due time while it runs).
  void Advance(absl::Duration d);
  // Moves time forward by `d` without running anything, as for a process that was frozen
  // (SIGSTOP, a paused VM): the callbacks that fell due run late, at the next Advance.
  void Jump(absl::Duration d);
  // Callbacks not yet run.
  int pending() const;

 private:
  mutable absl::Mutex mu_;
  absl::Time now_ ABSL_GUARDED_BY(mu_);
  TimerQueue queue_ ABSL_GUARDED_BY(mu_);
};

}  // namespace psflow::ps

#endif  // PSFLOW_PS_COMMON_CLOCK_H_
