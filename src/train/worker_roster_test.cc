// WorkerRoster (train/worker_roster.h): which workers the chief says are missing, when, and how
// many it counts as having taken part, from hand-made ps Stats answers.
#include "train/worker_roster.h"

#include "gtest/gtest.h"

namespace psflow::train {
namespace {

ps::PsTaskStats Task(std::vector<int32_t> connected, std::vector<int32_t> pushed) {
  ps::PsTaskStats s;
  s.connected_workers = static_cast<int64_t>(connected.size());
  s.connected_worker_indices = std::move(connected);
  s.pushed_worker_indices = std::move(pushed);
  return s;
}

TEST(WorkerRosterTest, SaysWhoIsMissingAfterTheGraceThenOnChangeOrOncePerRepeat) {
  WorkerRoster roster(3, /*self=*/0, /*grace_secs=*/10, /*repeat_secs=*/60);
  // Within the grace period: counted, not said.
  EXPECT_EQ(roster.Update({Task({0}, {})}, 2), "");
  EXPECT_EQ(roster.connected(), 1);
  EXPECT_EQ(roster.Update({Task({0}, {0})}, 10),
            "chief: workers 1, 2 have not connected (1 of 3 workers connected, 10 s after the start); training goes "
            "on without them");
  // The same set again: not before the repeat period.
  EXPECT_EQ(roster.Update({Task({0}, {0})}, 30), "");
  EXPECT_EQ(roster.Update({Task({0}, {0})}, 70),
            "chief: workers 1, 2 have not connected (1 of 3 workers connected, 70 s after the start); training goes "
            "on without them");
  // Worker 2 arrives (on one ps task of two is enough): the set changed, said at once.
  EXPECT_EQ(roster.Update({Task({0}, {0}), Task({0, 2}, {0})}, 75),
            "chief: worker 1 has not connected (2 of 3 workers connected, 75 s after the start); training goes on "
            "without it");
  EXPECT_EQ(roster.connected(), 2);
  EXPECT_EQ(roster.Update({Task({0, 1, 2, 2}, {0})}, 80), "chief: all 3 workers connected");
  EXPECT_EQ(roster.connected(), 3);
  EXPECT_EQ(roster.Update({Task({0, 1, 2}, {0})}, 200), "");
}

TEST(WorkerRosterTest, AllConnectedFromTheStartSaysNothing) {
  WorkerRoster roster(2);
  EXPECT_EQ(roster.Update({Task({0, 1}, {})}, 100), "");
  EXPECT_EQ(roster.connected(), 2);
  // The chief counts itself even before a ps task has seen its Hello.
  WorkerRoster alone(1);
  EXPECT_EQ(alone.Update({Task({}, {})}, 100), "");
  EXPECT_EQ(alone.connected(), 1);
}

// Issue 29: psflow_connected_workers read 0 on worker 1 (only the chief kept a roster) and 1 on
// the chief while 2 ran. Every worker counts, itself included.
TEST(WorkerRosterTest, ANonChiefWorkerCountsItselfAndTheOthers) {
  WorkerRoster worker1(2, /*self=*/1);
  EXPECT_EQ(worker1.Update({Task({}, {})}, 1), "");
  EXPECT_EQ(worker1.connected(), 1);
  EXPECT_EQ(worker1.Update({Task({0}, {})}, 2), "");
  EXPECT_EQ(worker1.connected(), 2);
}

TEST(WorkerRosterTest, CountsTheWorkersThatPushedOnAnyPsTask) {
  const std::vector<ps::PsTaskStats> stats = {Task({0, 1}, {0}), Task({0, 1}, {0, 2})};
  EXPECT_EQ(WorkerRoster::PushedWorkers(stats), 2);
  EXPECT_EQ(WorkerRoster::NeverPushed(stats, 4), "workers 1, 3");
  EXPECT_EQ(WorkerRoster::NeverPushed(stats, 3), "worker 1");
  EXPECT_EQ(WorkerRoster::NeverPushed({Task({0}, {0, 1})}, 2), "");
}

}  // namespace
}  // namespace psflow::train
