// rpc/spin_wait.h (internal) — how long a gRPC poller thread polls without blocking before it
// parks in epoll_wait (grpc_transport.cc, NextEvent).
//
// Why: on a virtual machine a thread parked on an idle virtual CPU is woken by an interrupt to a
// halted CPU, which costs tens of microseconds; a 4 KiB round trip has a wake-up on each side. A
// thread that keeps polling for a short while after its last event catches the next one without
// being woken: measured on loopback with each side on its own core, a 4 KiB call took 22 us
// instead of 34 us, with no context switch, for about 10 us more CPU per call. But a spinning
// thread holds a core its peer may need: with a third busy process on the two cores, fixed spins
// of 50 us made the same call take 80-134 us. So the spin adapts: a spin that caught its event
// (after the first poll: an event already there says nothing) keeps the full budget; one that
// ran out, or lost its CPU while spinning (a gap between two polls
// far longer than a poll takes), is followed by waits that park at once, 1, 2, 4, ... up to
// kMaxSkippedWaits of them, before the next spin tries again. Where spins keep failing (a ps whose
// next call comes milliseconds later, large messages, a crowded machine) they cost at most
// kSpinBudget every kMaxSkippedWaits waits.
//
// One SpinWait per polling thread (not thread-safe); it holds no clock of its own, so tests drive
// it with any times.
#ifndef PSFLOW_RPC_SPIN_WAIT_H_
#define PSFLOW_RPC_SPIN_WAIT_H_

#include <algorithm>
#include <cstdint>

#include "absl/time/time.h"

namespace psflow::rpc {

class SpinWait {
 public:
  static constexpr absl::Duration kSpinBudget = absl::Microseconds(50);
  // Two polls further apart than this: the thread lost its CPU meanwhile.
  static constexpr absl::Duration kPreemptedGap = absl::Microseconds(20);
  static constexpr int64_t kMaxSkippedWaits = 256;

  enum class Outcome { kCaught, kRanOut, kPreempted };

  // How long the coming wait may spin (zero: park at once).
  absl::Duration Budget() {
    if (skip_ > 0) {
      --skip_;
      return absl::ZeroDuration();
    }
    return kSpinBudget;
  }
  // How a wait that spun (Budget() > 0) ended.
  void Record(Outcome outcome) {
    if (outcome == Outcome::kCaught) {
      next_skip_ = 1;
      return;
    }
    skip_ = next_skip_;
    next_skip_ = std::min(next_skip_ * 2, kMaxSkippedWaits);
  }

  // The spin of one wait: poll(now) until it reports an event, or until the budget ran out or a
  // gap between polls shows the thread lost its CPU. `poll` returns true on an event (or when
  // polling must stop, e.g. the queue shut down: the caller tells them apart); `now` reads the
  // clock. Returns true when `poll` did.
  template <typename Poll, typename Now>
  bool Spin(Poll&& poll, Now&& now) {
    const absl::Duration budget = Budget();
    if (budget <= absl::ZeroDuration()) return false;
    const absl::Time start = now();
    absl::Time last = start;
    for (bool first = true;; first = false) {
      if (poll()) {
        // An event that was there at the first poll would not have parked the thread either:
        // it says nothing about whether spinning pays.
        if (!first) Record(Outcome::kCaught);
        return true;
      }
      const absl::Time t = now();
      if (t - last > kPreemptedGap) {
        Record(Outcome::kPreempted);
        return false;
      }
      if (t - start >= budget) {
        Record(Outcome::kRanOut);
        return false;
      }
      last = t;
    }
  }

 private:
  int64_t skip_ = 0;       // waits left that park at once
  int64_t next_skip_ = 1;  // how many the next failed spin skips
};

}  // namespace psflow::rpc

#endif  // PSFLOW_RPC_SPIN_WAIT_H_
