// Push and pull pipelined in slices (PsClient::PullBackSlices, --transfer_slice_bytes) through real
// gRPC: an async worker's early part cut into slices, each slice's values pulled back once its
// push is answered, gives the same bits as the same push whole (values, Adam's slots and update
// counts, with a float32 and a bfloat16 wire); a gradient with a NaN in its last slice is refused
// before any slice leaves; a sync push is never sliced.
#include <cmath>
#include <limits>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "ps/tests/ps_test_util.h"

namespace psflow::ps {
namespace {

using testing::Adam;
using testing::ExpectEqualTensors;
using testing::Filled;
using testing::Plan;
using testing::Sgd;
using testing::TestCluster;

// One worker on two ps tasks: w [64, 8] in two shards (one per task; 1 KiB each), b [6].
struct SliceFixture {
  std::unique_ptr<TestCluster> cluster;
  std::unique_ptr<PsClient> client;
  dist::PlacementPlan plan;
  Tensor w, b;

  SliceFixture(const TrainingConfig& config, int64_t slice_bytes, const std::string& wire = "float32")
      : plan(Plan({{"w", {64, 8}}, {"b", {6}}}, 2, 2)), w(Filled({64, 8}, 0.5f, 0.01f)), b(Filled({6}, -1.0f, 0.5f)) {
    cluster = TestCluster::Start(2, 1);
    PsClient::Options o;
    o.cluster = cluster->cluster;
    o.plan = plan;
    o.wire_dtype = wire;
    o.transfer_slice_bytes = slice_bytes;
    o.rpc_timeout_secs = 20;
    o.connect_timeout_secs = 5;
    auto created = PsClient::Create(o);
    EXPECT_TRUE(created.ok()) << created.status();
    client = *std::move(created);
    EXPECT_TRUE(client->Connect().ok());
    TrainingConfig c = config;
    c.wire_dtype = wire;
    EXPECT_TRUE(client->Initialize({{"w", &w}, {"b", &b}}, c).ok());
  }
};

// Step k's gradients: different every step, with signs of both kinds.
Tensor GradW(int k) {
  Tensor g = Filled({64, 8}, 0.3f - 0.1f * k, -0.0013f);
  for (int64_t i = 0; i < g.size(); i += 7) g[i] = -g[i] * 1.7f;
  return g;
}
Tensor GradB(int k) { return Filled({6}, 0.2f * k - 0.4f, 0.25f); }

// Three steps of one worker as --overlap=push_pull drives them: w as an early part during
// backward, b as the last part; w's values come back by its slices (or, whole, with the last part).
// Returns the values the worker held after each step, then the ps's state.
struct Trained {
  std::vector<Tensor> w_seen, b_seen;
  ModelSnapshot state;
  std::vector<std::vector<int>> sliced;  // per step: the variables that came back by slices
};

Trained Train(SliceFixture& f) {
  Trained run;
  Tensor vw({64, 8}), vb({6});
  std::unique_ptr<SlicePulls> slices = f.client->PullBackSlices({{"w", &vw}, {"b", &vb}});
  for (int k = 0; k < 3; ++k) {
    const Tensor gw = GradW(k), gb = GradB(k);
    std::unique_ptr<PushStream> stream = f.client->StartPush(k);
    stream->Send({{"w", &gw, nullptr}});
    const bool by_slices = slices != nullptr;
    std::vector<std::pair<std::string, Tensor*>> out = {{"b", &vb}};
    if (!by_slices) out.push_back({"w", &vw});
    auto r = stream->Finish({{"b", &gb, nullptr}}, out);
    EXPECT_TRUE(r.ok()) << r.status();
    if (r.ok()) {
      EXPECT_EQ(r->global_step, k + 1);
    }
    if (by_slices) {
      run.sliced.push_back(slices->TakeStarted());
      slices->Wait(0);
      EXPECT_TRUE(slices->Settle().ok());
    }
    run.w_seen.push_back(vw);
    run.b_seen.push_back(vb);
  }
  auto state = f.client->PullState();
  EXPECT_TRUE(state.ok()) << state.status();
  if (state.ok()) run.state = *std::move(state);
  return run;
}

void ExpectSameRun(const Trained& sliced, const Trained& whole) {
  ASSERT_EQ(sliced.w_seen.size(), whole.w_seen.size());
  for (size_t k = 0; k < whole.w_seen.size(); ++k) {
    ExpectEqualTensors(sliced.w_seen[k], whole.w_seen[k], absl::StrCat("w after step ", k + 1));
    ExpectEqualTensors(sliced.b_seen[k], whole.b_seen[k], absl::StrCat("b after step ", k + 1));
  }
  testing::ExpectSameSnapshot(sliced.state, whole.state, 2);  // Adam's two slots, update counts
}

TEST(SlicePipeTest, SlicedPushAndPullGiveTheSameBitsAsWhole) {
  SliceFixture whole(Adam(0.01f), 0);
  SliceFixture sliced(Adam(0.01f), 200);  // 50 floats: each 256-float shard in 6 slices (the last short)
  const Trained a = Train(whole);
  const Trained b = Train(sliced);
  ASSERT_EQ(b.sliced.size(), 3u);
  for (const std::vector<int>& s : b.sliced) EXPECT_EQ(s, std::vector<int>{0});  // w, every step
  ExpectSameRun(b, a);
  // The worker's last values are the ps's (round trip exact), and w stepped once per push.
  for (const VariableSnapshot& v : b.state.variables) {
    EXPECT_EQ(v.updates, 3) << v.name;
    if (v.name == "w") ExpectEqualTensors(b.w_seen.back(), v.value, "w");
  }
}

// A 16-bit wire: the ps's state is the same bits (the gradients are rounded with the same error
// feedback per shard, whole or sliced). What a worker holds is the ps's values up to one rounding
// of a step's change (rpc/delta_pull.h), whose history depends on which calls first brought it
// 16-bit tensors (a run of a shard is a key of its own): within one bfloat16 rounding, not the
// same bits.
TEST(SlicePipeTest, SlicedPushAndPullGiveTheSamePsStateOnABfloat16Wire) {
  SliceFixture whole(Adam(0.01f), 0, "bfloat16");
  SliceFixture sliced(Adam(0.01f), 128, "bfloat16");  // 64 elements on the wire a slice
  const Trained a = Train(whole);
  const Trained b = Train(sliced);
  for (const std::vector<int>& s : b.sliced) EXPECT_EQ(s, std::vector<int>{0});
  testing::ExpectSameSnapshot(b.state, a.state, 2);
  for (const VariableSnapshot& v : b.state.variables) {
    const Tensor& seen = v.name == "w" ? b.w_seen.back() : b.b_seen.back();
    for (int64_t i = 0; i < seen.size(); ++i) {
      ASSERT_NEAR(seen[i], v.value[i], std::abs(v.value[i]) / 128 + 1e-6) << v.name << " element " << i;
    }
  }
}

TEST(SlicePipeTest, ANaNInTheLastSliceIsRefusedBeforeAnySliceLeaves) {
  SliceFixture f(Sgd(1.0f), 200);
  Tensor vw({64, 8}), vb({6});
  std::unique_ptr<SlicePulls> slices = f.client->PullBackSlices({{"w", &vw}, {"b", &vb}});
  ASSERT_NE(slices, nullptr);
  Tensor gw = GradW(0);
  gw[gw.size() - 1] = std::numeric_limits<float>::quiet_NaN();  // in the second shard's last slice
  std::unique_ptr<PushStream> stream = f.client->StartPush(0);
  stream->Send({{"w", &gw, nullptr}});
  absl::Status s = stream->WaitForParts();
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_THAT(std::string(s.message()), ::testing::HasSubstr("'w'"));
  EXPECT_TRUE(slices->TakeStarted().empty());  // nothing started coming back
  EXPECT_TRUE(slices->Settle().ok());
  for (const auto& server : f.cluster->servers) {
    EXPECT_EQ(server->Stats().pushes_refused, 0);  // no slice reached a ps to be refused there
  }
  Tensor now_w({64, 8}), now_b({6});
  ASSERT_TRUE(f.client->Pull({{"w", &now_w}, {"b", &now_b}}).ok());
  ExpectEqualTensors(now_w, f.w, "w");  // no slice applied
}

TEST(SlicePipeTest, ASyncPushIsNeverSliced) {
  TrainingConfig sync = Sgd(1.0f);
  sync.sync = true;
  sync.replicas_to_aggregate = 1;
  sync.total_num_replicas = 1;
  sync.sync_timeout_secs = 60;
  SliceFixture f(sync, 200);
  Tensor vw({64, 8}), vb({6});
  std::unique_ptr<SlicePulls> slices = f.client->PullBackSlices({{"w", &vw}, {"b", &vb}});
  const Tensor gw = GradW(0), gb = GradB(0);
  std::unique_ptr<PushStream> stream = f.client->StartPush(0);
  stream->Send({{"w", &gw, nullptr}});
  auto r = stream->Finish({{"b", &gb, nullptr}}, {{"w", &vw}, {"b", &vb}});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->global_step, 1);
  EXPECT_TRUE(slices->TakeStarted().empty());
  for (int64_t i = 0; i < vw.size(); ++i) ASSERT_EQ(vw[i], f.w[i] - gw[i]) << i;
}

// Two big variables sent at once in hundreds of slices each, to one ps task: every slice's seq is
// given as it leaves, so none reaches the ps behind the 64 newer ones it remembers (refused as a
// duplicate), and both pushes apply whole.
TEST(SlicePipeTest, TwoPushesOfManySlicesAtOnceApplyWhole) {
  auto cluster = TestCluster::Start(1, 1);
  const dist::PlacementPlan plan = Plan({{"w", {64, 8}}, {"v", {64, 8}}}, 1);
  PsClient::Options o;
  o.cluster = cluster->cluster;
  o.plan = plan;
  o.transfer_slice_bytes = 8;  // 2 floats: 256 slices a variable
  o.rpc_timeout_secs = 20;
  o.connect_timeout_secs = 5;
  auto client = PsClient::Create(o);
  ASSERT_TRUE(client.ok()) << client.status();
  ASSERT_TRUE((*client)->Connect().ok());
  const Tensor w = Filled({64, 8}, 0.5f, 0.01f), v = Filled({64, 8}, -2.0f, 0.02f);
  ASSERT_TRUE((*client)->Initialize({{"w", &w}, {"v", &v}}, Sgd(1.0f)).ok());
  Tensor vw({64, 8}), vv({64, 8});
  std::unique_ptr<SlicePulls> slices = (*client)->PullBackSlices({{"w", &vw}, {"v", &vv}});
  const Tensor gw = GradW(0), gv = GradW(1);
  std::unique_ptr<PushStream> stream = (*client)->StartPush(0);
  stream->Send({{"w", &gw, nullptr}});
  stream->Send({{"v", &gv, nullptr}});
  auto r = stream->Finish({}, {});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(slices->TakeStarted(), (std::vector<int>{0, 1}));
  ASSERT_TRUE(slices->Settle().ok());
  for (int64_t i = 0; i < w.size(); ++i) {
    ASSERT_EQ(vw[i], w[i] - gw[i]) << i;
    ASSERT_EQ(vv[i], v[i] - gv[i]) << i;
  }
}

TEST(SlicePipeTest, OffWithoutASliceSize) {
  SliceFixture f(Sgd(1.0f), 0);
  Tensor vw({64, 8});
  EXPECT_EQ(f.client->PullBackSlices({{"w", &vw}}), nullptr);
}

}  // namespace
}  // namespace psflow::ps
