// SpinWait's rule (rpc/spin_wait.h) on a simulated clock: when a wait spins, how long, and how
// failed spins space out the next ones.
#include "rpc/spin_wait.h"

#include <gtest/gtest.h>

namespace psflow::rpc {
namespace {

// A clock that moves `step` per reading (plus `jump` once, at reading `jump_at`), and a poll that
// reports an event at its `event_at`-th call (never when negative).
struct Sim {
  absl::Time t = absl::UnixEpoch();
  absl::Duration step = absl::Microseconds(2);
  int readings = 0;
  int jump_at = -1;
  absl::Duration jump;
  int polls = 0;
  int event_at = -1;

  bool Spin(SpinWait& spin) {
    return spin.Spin([this] { return ++polls == event_at; },
                     [this] {
                       t += step;
                       if (readings++ == jump_at) t += jump;
                       return t;
                     });
  }
};

// Waits until the next one that spins; returns how many parked at once before it.
int ParkedBeforeNextSpin(SpinWait& spin) {
  int parked = 0;
  while (spin.Budget() == absl::ZeroDuration()) ++parked;
  return parked;
}

TEST(SpinWaitTest, CatchesAnEventThatComesWithinTheBudget) {
  SpinWait spin;
  Sim sim;
  sim.event_at = 5;
  EXPECT_TRUE(sim.Spin(spin));
  EXPECT_EQ(sim.polls, 5);
  EXPECT_EQ(spin.Budget(), SpinWait::kSpinBudget);  // a caught event keeps the next wait spinning
}

TEST(SpinWaitTest, StopsWhenTheBudgetRanOut) {
  SpinWait spin;
  Sim sim;
  EXPECT_FALSE(sim.Spin(spin));
  // Polled until the budget was spent (2 us per clock reading), not longer.
  EXPECT_GE(sim.t - absl::UnixEpoch(), SpinWait::kSpinBudget);
  EXPECT_LE(sim.t - absl::UnixEpoch(), SpinWait::kSpinBudget + 2 * sim.step);
  EXPECT_EQ(sim.polls, 25);
}

TEST(SpinWaitTest, StopsAtOnceWhenTheThreadLostItsCpu) {
  SpinWait spin;
  Sim sim;
  sim.jump_at = 3;
  sim.jump = SpinWait::kPreemptedGap;
  EXPECT_FALSE(sim.Spin(spin));
  EXPECT_EQ(sim.polls, 3);
  EXPECT_EQ(ParkedBeforeNextSpin(spin), 1);  // a failure, as a spin that ran out
}

TEST(SpinWaitTest, FailedSpinsSpaceOutTheNextOnesUpToTheBound) {
  SpinWait spin;
  int expected = 1;
  for (int failures = 0; failures < 12; ++failures) {
    Sim sim;
    ASSERT_FALSE(sim.Spin(spin));
    EXPECT_EQ(ParkedBeforeNextSpin(spin), expected) << "after " << failures + 1 << " failed spins";
    expected = std::min<int>(expected * 2, SpinWait::kMaxSkippedWaits);
  }
  // An event there at the first poll changes nothing: the next failure still skips the most.
  Sim there;
  there.event_at = 1;
  ASSERT_TRUE(there.Spin(spin));
  Sim failed;
  ASSERT_FALSE(failed.Spin(spin));
  EXPECT_EQ(ParkedBeforeNextSpin(spin), SpinWait::kMaxSkippedWaits);
  // A spin that catches its event makes every wait spin again, and the next failure skips one.
  Sim caught;
  caught.event_at = 2;
  ASSERT_TRUE(caught.Spin(spin));
  EXPECT_EQ(spin.Budget(), SpinWait::kSpinBudget);
  spin.Record(SpinWait::Outcome::kRanOut);
  EXPECT_EQ(ParkedBeforeNextSpin(spin), 1);
}

TEST(SpinWaitTest, AWaitThatParksAtOncePollsNothing) {
  SpinWait spin;
  Sim failed;
  ASSERT_FALSE(failed.Spin(spin));
  Sim skipped;
  skipped.event_at = 2;
  EXPECT_FALSE(skipped.Spin(spin));  // its turn to park at once
  EXPECT_EQ(skipped.polls, 0);
  EXPECT_TRUE(skipped.Spin(spin));  // the next one spins again
  EXPECT_EQ(skipped.polls, 2);
}

}  // namespace
}  // namespace psflow::rpc
