// Sync mode (SyncReplicasOptimizer semantics) through real gRPC: the quorum's mean applied once,
// waiting pushes released together, stale and backup gradients dropped, the timeout for a dead
// worker, and row-sparse accumulation.
#include <thread>

#include "absl/synchronization/notification.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "ps/tests/ps_test_util.h"

namespace psflow::ps {
namespace {

using testing::Filled;
using ::testing::HasSubstr;
using testing::Plan;
using testing::Sgd;
using testing::TestCluster;

TrainingConfig SyncSgd(float lr, int r, int t, double timeout_secs = 60) {
  TrainingConfig c = Sgd(lr);
  c.sync = true;
  c.replicas_to_aggregate = r;
  c.total_num_replicas = t;
  c.sync_timeout_secs = timeout_secs;
  return c;
}

struct SyncFixture {
  std::unique_ptr<TestCluster> cluster;
  std::vector<std::unique_ptr<PsClient>> workers;
  dist::PlacementPlan plan;
  Tensor w;

  SyncFixture(int num_workers, const TrainingConfig& config, int num_ps = 2, int64_t max_part_bytes = -1)
      : plan(Plan({{"w", {4, 2}}}, num_ps, num_ps)), w(Filled({4, 2}, 1.0f, 0.5f)) {
    cluster = TestCluster::Start(num_ps, num_workers);
    for (int i = 0; i < num_workers; ++i) {
      workers.push_back(cluster->Client(plan, i, {}, nullptr, max_part_bytes));
      EXPECT_TRUE(workers.back()->Connect().ok());
    }
    EXPECT_TRUE(workers[0]->Initialize({{"w", &w}}, config).ok());
    for (int i = 1; i < num_workers; ++i) EXPECT_TRUE(workers[i]->WaitForInitialization(10).ok());
  }

  Tensor Values() {
    Tensor got({4, 2});
    EXPECT_TRUE(workers[0]->Pull({{"w", &got}}).ok());
    return got;
  }
};

TEST(SyncTest, TwoPushersGetTheMeanAppliedOnceAndAreReleasedTogether) {
  SyncFixture f(2, SyncSgd(1.0f, 2, 2));
  const Tensor g0 = Filled({4, 2}, 1.0f, 1.0f), g1 = Filled({4, 2}, 3.0f, -1.0f);
  absl::Notification first_done;
  absl::StatusOr<PushResult> first;
  f.workers[0]->PushAsync({{"w", &g0, nullptr}}, 0, [&](absl::StatusOr<PushResult> r) {
    first = std::move(r);
    first_done.Notify();
  });
  // The first push waits for the second: the quorum is 2.
  EXPECT_FALSE(first_done.WaitForNotificationWithTimeout(absl::Milliseconds(200)));
  auto second = f.workers[1]->Push({{"w", &g1, nullptr}}, 0);
  ASSERT_TRUE(second.ok()) << second.status();
  ASSERT_TRUE(first_done.WaitForNotificationWithTimeout(absl::Seconds(20)));
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->global_step, 1);
  EXPECT_EQ(second->global_step, 1);
  EXPECT_FALSE(first->stale);
  EXPECT_FALSE(second->stale);
  const Tensor got = f.Values();
  for (int64_t i = 0; i < got.size(); ++i) EXPECT_FLOAT_EQ(got[i], f.w[i] - 1.0f * (g0[i] + g1[i]) / 2) << i;
  // Each ps advanced exactly once.
  for (const auto& server : f.cluster->servers) EXPECT_EQ(server->Stats().global_step, 1);
}

// `max_part_bytes`: the workers' part size (the pull of each 4-float shard in parts of 2 floats,
// after the whole push, when 8), or -1 for the default.
void PushAndPullReleasesBothWorkersWithTheStepsValues(int64_t max_part_bytes) {
  SyncFixture f(2, SyncSgd(1.0f, 2, 2), 2, max_part_bytes);
  const Tensor g0 = Filled({4, 2}, 1.0f, 1.0f), g1 = Filled({4, 2}, 3.0f, -1.0f);
  Tensor v0({4, 2}), v1({4, 2});
  absl::StatusOr<PushResult> r0;
  std::thread t([&] { r0 = f.workers[0]->PushAndPull({{"w", &g0, nullptr}}, 0, {{"w", &v0}}); });
  auto r1 = f.workers[1]->PushAndPull({{"w", &g1, nullptr}}, 0, {{"w", &v1}});
  t.join();
  ASSERT_TRUE(r0.ok() && r1.ok()) << r0.status() << r1.status();
  EXPECT_EQ(r0->global_step, 1);
  EXPECT_EQ(r1->global_step, 1);
  for (int64_t i = 0; i < v0.size(); ++i) {
    EXPECT_FLOAT_EQ(v0[i], f.w[i] - (g0[i] + g1[i]) / 2) << i;
    EXPECT_EQ(v1[i], v0[i]) << i;
  }
  // A stale push-and-pull is dropped and answered with the current values.
  Tensor v2({4, 2});
  auto stale = f.workers[1]->PushAndPull({{"w", &g1, nullptr}}, 0, {{"w", &v2}});
  ASSERT_TRUE(stale.ok());
  EXPECT_TRUE(stale->stale);
  for (int64_t i = 0; i < v2.size(); ++i) EXPECT_EQ(v2[i], v0[i]) << i;
}

TEST(SyncTest, PushAndPullReleasesBothWorkersWithTheStepsValues) {
  PushAndPullReleasesBothWorkersWithTheStepsValues(-1);
}

TEST(SyncTest, PushAndPullWithThePullInPartsGivesTheSameValues) { PushAndPullReleasesBothWorkersWithTheStepsValues(8); }

TEST(SyncTest, StalePushIsDroppedCountedAndAnsweredAtOnce) {
  SyncFixture f(2, SyncSgd(1.0f, 1, 2));  // R = 1: every push completes a step
  const Tensor g = Filled({4, 2}, 1.0f, 0.0f);
  auto a = f.workers[0]->Push({{"w", &g, nullptr}}, 0);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->global_step, 1);
  const Tensor before = f.Values();
  auto stale = f.workers[1]->Push({{"w", &g, nullptr}}, 0);  // computed at step 0, now 1
  ASSERT_TRUE(stale.ok()) << stale.status();
  EXPECT_TRUE(stale->stale);
  EXPECT_EQ(stale->global_step, 1);
  const Tensor after = f.Values();
  for (int64_t i = 0; i < after.size(); ++i) EXPECT_EQ(after[i], before[i]);
  for (const auto& server : f.cluster->servers) EXPECT_EQ(server->Stats().stale_gradients_dropped, 1);
}

TEST(SyncTest, BackupWorkerIsDroppedWhenTheQuorumIsComplete) {
  SyncFixture f(3, SyncSgd(0.5f, 2, 3));
  const Tensor g0 = Filled({4, 2}, 1.0f, 0.0f), g1 = Filled({4, 2}, 0.0f, 1.0f), g2 = Filled({4, 2}, 100.0f, 0.0f);
  absl::StatusOr<PushResult> r0;
  std::thread t0([&] { r0 = f.workers[0]->Push({{"w", &g0, nullptr}}, 0); });
  auto r1 = f.workers[1]->Push({{"w", &g1, nullptr}}, 0);
  t0.join();
  ASSERT_TRUE(r0.ok() && r1.ok());
  EXPECT_EQ(r0->global_step, 1);
  EXPECT_EQ(r1->global_step, 1);
  auto late = f.workers[2]->Push({{"w", &g2, nullptr}}, 0);
  ASSERT_TRUE(late.ok());
  EXPECT_TRUE(late->stale);
  const Tensor got = f.Values();
  for (int64_t i = 0; i < got.size(); ++i) EXPECT_FLOAT_EQ(got[i], f.w[i] - 0.5f * (g0[i] + g1[i]) / 2) << i;
}

TEST(SyncTest, TimeoutAppliesWhatArrivedAndLogsTheMissingWorker) {
  SyncFixture f(2, SyncSgd(1.0f, 2, 2, /*timeout_secs=*/0.3));
  const Tensor g = Filled({4, 2}, 2.0f, 0.0f);
  auto r = f.workers[0]->Push({{"w", &g, nullptr}}, 0);  // worker 1 never pushes
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->global_step, 1);
  const Tensor got = f.Values();
  for (int64_t i = 0; i < got.size(); ++i) EXPECT_FLOAT_EQ(got[i], f.w[i] - 2.0f) << i;
  EXPECT_THAT(f.cluster->LogText(), HasSubstr("missing worker(s) 1"));
  // Worker 1 is out of the quorum now: worker 0 alone completes the next step at once.
  auto next = f.workers[0]->Push({{"w", &g, nullptr}}, 1);
  ASSERT_TRUE(next.ok());
  EXPECT_EQ(next->global_step, 2);
  // Worker 1 rejoins when it pushes again (stale now, but counted back into the quorum).
  auto back = f.workers[1]->Push({{"w", &g, nullptr}}, 0);
  ASSERT_TRUE(back.ok());
  EXPECT_TRUE(back->stale);
}

TEST(SyncTest, SparseGradientsAccumulateByRowsAndAverageOverTheQuorum) {
  TrainingConfig config = SyncSgd(1.0f, 2, 2);
  SyncFixture f(2, config);
  RowSparse a{{0, 3}, Tensor({2, 2}, {1.0f, 2.0f, 3.0f, 4.0f})};
  RowSparse b{{3}, Tensor({1, 2}, {10.0f, 20.0f})};
  absl::StatusOr<PushResult> ra;
  std::thread t([&] { ra = f.workers[0]->Push({{"w", nullptr, &a}}, 0); });
  auto rb = f.workers[1]->Push({{"w", nullptr, &b}}, 0);
  t.join();
  ASSERT_TRUE(ra.ok() && rb.ok()) << ra.status() << rb.status();
  const Tensor got = f.Values();
  Tensor expected = f.w;
  expected[0] -= 1.0f / 2;
  expected[1] -= 2.0f / 2;
  expected[6] -= (3.0f + 10.0f) / 2;
  expected[7] -= (4.0f + 20.0f) / 2;
  for (int64_t i = 0; i < got.size(); ++i) EXPECT_FLOAT_EQ(got[i], expected[i]) << i;
}

TEST(SyncTest, LargeShardsAverageExactly) {
  const Shape shape = {600, 1000};  // two shards of 300,000 floats
  const dist::PlacementPlan plan = Plan({{"w", shape}}, 2, 2);
  auto cluster = TestCluster::Start(2, 2);
  auto w0 = cluster->Client(plan, 0), w1 = cluster->Client(plan, 1);
  PSFLOW_ASSERT_OK(w0->Connect());
  PSFLOW_ASSERT_OK(w1->Connect());
  const Tensor w = Filled(shape, 1.0f, 1e-6f);
  PSFLOW_ASSERT_OK(w0->Initialize({{"w", &w}}, SyncSgd(0.5f, 2, 2)));
  PSFLOW_ASSERT_OK(w1->WaitForInitialization(10));
  const Tensor g0 = Filled(shape, 0.25f, 1e-6f), g1 = Filled(shape, -1.0f, 3e-6f);
  absl::StatusOr<PushResult> r0;
  std::thread t([&] { r0 = w0->Push({{"w", &g0, nullptr}}, 0); });
  auto r1 = w1->Push({{"w", &g1, nullptr}}, 0);
  t.join();
  ASSERT_TRUE(r0.ok() && r1.ok()) << r0.status() << r1.status();
  Tensor got(shape);
  ASSERT_TRUE(w0->Pull({{"w", &got}}).ok());
  int64_t wrong = 0;
  for (int64_t i = 0; i < w.size(); ++i) wrong += got[i] != w[i] - 0.5f * ((g0[i] + g1[i]) * 0.5f);
  EXPECT_EQ(wrong, 0);
}

TEST(SyncTest, EveryPsCountsAWorkerWithoutGradientsForIt) {
  // Two variables on two ps; worker 1 only has a gradient for "a", yet ps 1 (holding "b") must
  // still complete its step.
  const dist::PlacementPlan plan = Plan({{"a", {2}}, {"b", {2}}}, 2);
  auto cluster = TestCluster::Start(2, 2);
  auto w0 = cluster->Client(plan, 0), w1 = cluster->Client(plan, 1);
  PSFLOW_ASSERT_OK(w0->Connect());
  PSFLOW_ASSERT_OK(w1->Connect());
  const Tensor a({2}, 1.0f), b({2}, 1.0f);
  PSFLOW_ASSERT_OK(w0->Initialize({{"a", &a}, {"b", &b}}, SyncSgd(1.0f, 2, 2)));
  ASSERT_TRUE(w1->WaitForInitialization(10).ok());
  const Tensor g({2}, 1.0f);
  absl::StatusOr<PushResult> r0;
  std::thread t([&] { r0 = w0->Push({{"a", &g, nullptr}, {"b", &g, nullptr}}, 0); });
  auto r1 = w1->Push({{"a", &g, nullptr}}, 0);
  t.join();
  ASSERT_TRUE(r0.ok() && r1.ok()) << r0.status() << r1.status();
  Tensor a2({2}), b2({2});
  ASSERT_TRUE(w0->Pull({{"a", &a2}, {"b", &b2}}).ok());
  EXPECT_FLOAT_EQ(a2[0], 0.0f);  // 1 - (1 + 1) / 2
  EXPECT_FLOAT_EQ(b2[0], 0.5f);  // 1 - (1 + 0) / 2: the empty push counts as a zero gradient
  for (const auto& server : cluster->servers) EXPECT_EQ(server->Stats().global_step, 1);
}

}  // namespace
}  // namespace psflow::ps
