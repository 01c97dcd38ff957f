// A push sent as backward goes (PushStream, psflow/ps/ps_client.h) through real gRPC: in sync mode
// the parts count with the push's last part only — the step's mean is the same bits as with whole
// pushes, and the parts of a push that ends up dropped (a late backup) add nothing; in async mode
// each part is applied on arrival and the global step advances once per push.
#include <thread>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "ps/tests/ps_test_util.h"

namespace psflow::ps {
namespace {

using testing::Filled;
using testing::Plan;
using testing::Sgd;
using testing::TestCluster;

TrainingConfig SyncSgd(float lr, int r, int t) {
  TrainingConfig c = Sgd(lr);
  c.sync = true;
  c.replicas_to_aggregate = r;
  c.total_num_replicas = t;
  c.sync_timeout_secs = 60;
  return c;
}

// Two variables, each split over two ps tasks; two workers.
struct StreamFixture {
  std::unique_ptr<TestCluster> cluster;
  std::vector<std::unique_ptr<PsClient>> workers;
  dist::PlacementPlan plan;
  Tensor w, b;

  explicit StreamFixture(const TrainingConfig& config)
      : plan(Plan({{"w", {4, 3}}, {"b", {6}}}, 2, 2)), w(Filled({4, 3}, 1.0f, 0.25f)), b(Filled({6}, -1.0f, 0.5f)) {
    cluster = TestCluster::Start(2, 2);
    for (int i = 0; i < 2; ++i) {
      workers.push_back(cluster->Client(plan, i));
      EXPECT_TRUE(workers.back()->Connect().ok());
    }
    EXPECT_TRUE(workers[0]->Initialize({{"w", &w}, {"b", &b}}, config).ok());
    EXPECT_TRUE(workers[1]->WaitForInitialization(10).ok());
  }
  std::pair<Tensor, Tensor> Values() {
    Tensor vw({4, 3}), vb({6});
    EXPECT_TRUE(workers[0]->Pull({{"w", &vw}, {"b", &vb}}).ok());
    return {vw, vb};
  }
};

// The gradients' mean as the ps computes it (sum in worker order, times 1/2), applied by SGD lr 1.
float SgdMean(float value, float g0, float g1) { return value - (g0 + g1) * (1.0f / 2.0f); }

TEST(PushStreamTest, SyncPartsCountWithTheLastPartAndGiveTheWholePushesMean) {
  StreamFixture f(SyncSgd(1.0f, 2, 2));
  const Tensor gw0 = Filled({4, 3}, 0.1f, 0.3f), gb0 = Filled({6}, 2.0f, -0.7f);
  const Tensor gw1 = Filled({4, 3}, -0.2f, 0.1f), gb1 = Filled({6}, 0.3f, 0.9f);
  Tensor v0w({4, 3}), v0b({6});
  absl::StatusOr<PushResult> r0;
  std::thread t([&] {
    // Worker 0: w as an early part, b with the last part (which pulls).
    std::unique_ptr<PushStream> stream = f.workers[0]->StartPush(0);
    stream->Send({{"w", &gw0, nullptr}});
    EXPECT_TRUE(stream->WaitForParts().ok());
    r0 = stream->Finish({{"b", &gb0, nullptr}}, {{"w", &v0w}, {"b", &v0b}});
    EXPECT_EQ(stream->parts_sent(), 1);
  });
  // Worker 1 pushes whole, after worker 0's part is in: the step must wait for worker 0's last
  // part, not complete with its early one.
  absl::SleepFor(absl::Milliseconds(100));
  auto r1 = f.workers[1]->Push({{"w", &gw1, nullptr}, {"b", &gb1, nullptr}}, 0);
  t.join();
  ASSERT_TRUE(r0.ok()) << r0.status();
  ASSERT_TRUE(r1.ok()) << r1.status();
  EXPECT_EQ(r0->global_step, 1);
  EXPECT_EQ(r1->global_step, 1);
  auto [vw, vb] = f.Values();
  for (int64_t i = 0; i < vw.size(); ++i) {
    EXPECT_EQ(vw[i], SgdMean(f.w[i], gw0[i], gw1[i])) << i;
    EXPECT_EQ(v0w[i], vw[i]) << i;
  }
  for (int64_t i = 0; i < vb.size(); ++i) {
    EXPECT_EQ(vb[i], SgdMean(f.b[i], gb0[i], gb1[i])) << i;
    EXPECT_EQ(v0b[i], vb[i]) << i;
  }
  for (const auto& server : f.cluster->servers) EXPECT_EQ(server->Stats().global_step, 1);
}

TEST(PushStreamTest, SyncPartsOfAPushDroppedAsLateAddNothing) {
  StreamFixture f(SyncSgd(1.0f, 1, 2));  // R = 1, T = 2: the first whole push completes the step
  const Tensor g0 = Filled({4, 3}, 1.0f, 0.0f), gb0 = Filled({6}, 1.0f, 0.0f);
  const Tensor g1 = Filled({4, 3}, 100.0f, 0.0f), gb1 = Filled({6}, 100.0f, 0.0f);
  // Worker 1's early part (computed at step 0) arrives first...
  std::unique_ptr<PushStream> late = f.workers[1]->StartPush(0);
  late->Send({{"w", &g1, nullptr}});
  ASSERT_TRUE(late->WaitForParts().ok());
  // ...worker 0's whole push completes step 0 alone...
  auto r0 = f.workers[0]->Push({{"w", &g0, nullptr}, {"b", &gb0, nullptr}}, 0);
  ASSERT_TRUE(r0.ok()) << r0.status();
  EXPECT_EQ(r0->global_step, 1);
  // ...so worker 1's push is late: dropped with its part.
  Tensor vw({4, 3}), vb({6});
  auto r1 = late->Finish({{"b", &gb1, nullptr}}, {{"w", &vw}, {"b", &vb}});
  ASSERT_TRUE(r1.ok()) << r1.status();
  EXPECT_TRUE(r1->stale);
  for (int64_t i = 0; i < vw.size(); ++i) EXPECT_EQ(vw[i], f.w[i] - g0[i]) << i;
  for (int64_t i = 0; i < vb.size(); ++i) EXPECT_EQ(vb[i], f.b[i] - gb0[i]) << i;
  // The next step counts worker 1's next push alone, without the dropped part.
  const Tensor g2 = Filled({4, 3}, 2.0f, 0.0f);
  std::unique_ptr<PushStream> next = f.workers[1]->StartPush(1);
  next->Send({{"w", &g2, nullptr}});
  auto r2 = next->Finish({}, {});
  ASSERT_TRUE(r2.ok()) << r2.status();
  EXPECT_FALSE(r2->stale);
  EXPECT_EQ(r2->global_step, 2);
  auto [after_w, after_b] = f.Values();
  for (int64_t i = 0; i < after_w.size(); ++i) EXPECT_EQ(after_w[i], f.w[i] - g0[i] - g2[i]) << i;
  for (int64_t i = 0; i < after_b.size(); ++i) EXPECT_EQ(after_b[i], f.b[i] - gb0[i]) << i;
}

TEST(PushStreamTest, AsyncPartsApplyOnArrivalAndTheStepAdvancesOncePerPush) {
  StreamFixture f(Sgd(1.0f));
  const Tensor gw = Filled({4, 3}, 1.0f, 0.5f), gb = Filled({6}, 0.5f, 0.25f);
  std::unique_ptr<PushStream> stream = f.workers[0]->StartPush(0);
  stream->Send({{"w", &gw, nullptr}});
  ASSERT_TRUE(stream->WaitForParts().ok());
  for (const auto& server : f.cluster->servers) EXPECT_EQ(server->Stats().global_step, 0);
  auto [mid_w, mid_b] = f.Values();
  for (int64_t i = 0; i < mid_w.size(); ++i) EXPECT_EQ(mid_w[i], f.w[i] - gw[i]) << i;  // applied already
  Tensor vb({6});
  auto r = stream->Finish({{"b", &gb, nullptr}}, {{"b", &vb}});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->global_step, 1);
  for (int64_t i = 0; i < vb.size(); ++i) EXPECT_EQ(vb[i], f.b[i] - gb[i]) << i;
}

TEST(PushStreamTest, AnEarlyPartsErrorIsReportedByFinishAndTheLastPartIsNotSent) {
  StreamFixture f(Sgd(1.0f));
  const Tensor wrong = Filled({2, 2}, 1.0f, 0.0f);  // not w's shape
  std::unique_ptr<PushStream> stream = f.workers[0]->StartPush(0);
  stream->Send({{"w", &wrong, nullptr}});
  const Tensor gb = Filled({6}, 1.0f, 0.0f);
  auto r = stream->Finish({{"b", &gb, nullptr}}, {});
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(std::string(r.status().message()), ::testing::HasSubstr("'w'"));
  for (const auto& server : f.cluster->servers) EXPECT_EQ(server->Stats().global_step, 0);
  auto [vw, vb] = f.Values();
  for (int64_t i = 0; i < vb.size(); ++i) EXPECT_EQ(vb[i], f.b[i]) << i;
}

}  // namespace
}  // namespace psflow::ps
