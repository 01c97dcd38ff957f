// Pull and async push through real gRPC: shard assembly, optimizer updates checked against the
// optimizer applied locally, row-sparse routing, and refused pushes.
#include <cmath>
#include <limits>
#include <map>

#include "absl/synchronization/notification.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/psflow.pb.h"
#include "ps/common/wire_config.h"
#include "ps/tests/ps_test_util.h"
#include "psflow/optim/optimizer.h"
#include "rpc/transport.h"

namespace psflow::ps {
namespace {

using testing::ExpectEqualTensors;
using testing::ExpectSameSnapshot;
using testing::Filled;
using ::testing::HasSubstr;
using testing::Plan;
using testing::Sgd;
using testing::TestCluster;

// One ps task holding w [3, 2] = 1..6 (SGD, learning rate 1), a client that initialized it, and
// a raw channel to the ps for messages the client would never send.
struct OnePsWithW {
  dist::PlacementPlan plan = Plan({{"w", {3, 2}}}, 1);
  std::unique_ptr<TestCluster> cluster;
  std::unique_ptr<PsClient> client;
  Tensor w = Filled({3, 2}, 1.0f, 1.0f);
  std::unique_ptr<rpc::ClientChannel> channel;

  void Start() {
    cluster = TestCluster::Start(1, 1);
    ASSERT_NE(cluster, nullptr);
    client = cluster->Client(plan, 0);
    PSFLOW_ASSERT_OK(client->Connect());
    PSFLOW_ASSERT_OK(client->Initialize({{"w", &w}}, Sgd(1.0f)));
    auto made = rpc::MakeGrpcChannel(cluster->cluster.ps()[0], "ps task 0", {});
    ASSERT_TRUE(made.ok()) << made.status();
    channel = *std::move(made);
  }
};

// Sends `method` with `header` and one slice of shard "w" — elements [offset, offset + n) read
// from `data` — straight over a channel, as a peer that bypasses PsClient would.
absl::Status CallWithSliceOfW(rpc::ClientChannel& channel, rpc::Method method, std::string header,
                              const std::vector<float>& data, int64_t offset, int64_t n) {
  rpc::OutgoingMessage m;
  m.header = std::move(header);
  rpc::OutgoingTensor t;
  t.meta.set_name("w");
  t.meta.add_shape(n);
  t.meta.set_slice(true);
  t.meta.set_slice_offset(offset);
  t.data = data.data();
  t.num_floats = n;
  m.tensors.push_back(t);
  rpc::CallOptions o;
  o.timeout_secs = 10;
  return channel.CallBlocking(method, std::move(m), o).status();
}

struct RoundTripCase {
  int num_ps;
  int shards;
  int axis;
};

class RoundTripTest : public ::testing::TestWithParam<RoundTripCase> {};

TEST_P(RoundTripTest, PullAfterInitializeEqualsInitialValues) {
  const RoundTripCase c = GetParam();
  const std::vector<dist::VariableSpec> vars = {{"w", {7, 5}}, {"b", {5}}, {"scale", {}}};
  const dist::PlacementPlan plan = Plan(vars, c.num_ps, c.shards, c.axis);
  auto cluster = TestCluster::Start(c.num_ps, 1);
  ASSERT_NE(cluster, nullptr);
  auto client = cluster->Client(plan, 0);
  PSFLOW_ASSERT_OK(client->Connect());
  const Tensor w = Filled({7, 5}, 0.5f, 0.25f), b = Filled({5}, -1.0f, 0.5f), scale = Tensor::Scalar(3.0f);
  PSFLOW_ASSERT_OK(client->Initialize({{"w", &w}, {"b", &b}, {"scale", &scale}}, Sgd(0.1f)));

  Tensor w2({7, 5}, -9.0f), b2({5}, -9.0f), scale2 = Tensor::Scalar(-9.0f);
  auto step = client->Pull({{"w", &w2}, {"b", &b2}, {"scale", &scale2}});
  ASSERT_TRUE(step.ok()) << step.status();
  EXPECT_EQ(*step, 0);
  ExpectEqualTensors(w2, w);
  ExpectEqualTensors(b2, b);
  ExpectEqualTensors(scale2, scale);

  // The same pull in parts of 2 floats (ps/client/call_parts.h): every shard is cut into runs, which
  // start and end inside rows of a shard split along an inner axis.
  auto in_parts = cluster->Client(plan, 1, {}, nullptr, /*max_part_bytes=*/8);
  PSFLOW_ASSERT_OK(in_parts->Connect());
  Tensor w3({7, 5}, -9.0f), b3({5}, -9.0f), scale3 = Tensor::Scalar(-9.0f);
  step = in_parts->Pull({{"w", &w3}, {"b", &b3}, {"scale", &scale3}});
  ASSERT_TRUE(step.ok()) << step.status();
  EXPECT_EQ(*step, 0);
  ExpectEqualTensors(w3, w);
  ExpectEqualTensors(b3, b);
  ExpectEqualTensors(scale3, scale);

  // Rows, from whichever shards hold them, in the order asked (PullRows is deprecated: kept working
  // for its last release).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
  auto rows = client->PullRows("w", {6, 0, 3, 3});
#pragma GCC diagnostic pop
  ASSERT_TRUE(rows.ok()) << rows.status();
  ASSERT_EQ(rows->shape(), (Shape{4, 5}));
  const int64_t order[] = {6, 0, 3, 3};
  for (int r = 0; r < 4; ++r) {
    for (int j = 0; j < 5; ++j) EXPECT_EQ((*rows)[r * 5 + j], w[order[r] * 5 + j]);
  }

  // The ps tasks hold exactly the model's floats between them.
  auto stats = client->Stats();
  ASSERT_TRUE(stats.ok()) << stats.status();
  int64_t params = 0;
  for (const PsTaskStats& s : *stats) params += s.num_params;
  EXPECT_EQ(params, 7 * 5 + 5 + 1);
}

INSTANTIATE_TEST_SUITE_P(Plans, RoundTripTest,
                         ::testing::Values(RoundTripCase{1, 1, 0}, RoundTripCase{2, 1, 0}, RoundTripCase{2, 3, 0},
                                           RoundTripCase{2, 2, 1}));

TEST(AsyncPushTest, SgdGivesExactlyWMinusLrG) {
  const dist::PlacementPlan plan = Plan({{"w", {6, 4}}, {"b", {4}}}, 2, 2);
  auto cluster = TestCluster::Start(2, 1);
  auto client = cluster->Client(plan, 0);
  PSFLOW_ASSERT_OK(client->Connect());
  const Tensor w = Filled({6, 4}, 1.0f, 0.125f), b = Filled({4}, 0.0f, 1.0f);
  PSFLOW_ASSERT_OK(client->Initialize({{"w", &w}, {"b", &b}}, Sgd(0.5f)));
  const Tensor gw = Filled({6, 4}, -0.3f, 0.0625f), gb = Filled({4}, 2.0f, -0.5f);
  auto pushed = client->Push({{"w", &gw, nullptr}, {"b", &gb, nullptr}}, 0);
  ASSERT_TRUE(pushed.ok()) << pushed.status();
  EXPECT_EQ(pushed->global_step, 1);
  EXPECT_FALSE(pushed->stale);

  Tensor w2({6, 4}), b2({4});
  auto step = client->Pull({{"w", &w2}, {"b", &b2}});
  ASSERT_TRUE(step.ok());
  EXPECT_EQ(*step, 1);
  for (int64_t i = 0; i < w.size(); ++i) EXPECT_EQ(w2[i], w[i] - 0.5f * gw[i]) << i;
  for (int64_t i = 0; i < b.size(); ++i) EXPECT_EQ(b2[i], b[i] - 0.5f * gb[i]) << i;
}

// --staleness_aware_lr: a push tagged with step 0 applied as update s has staleness s - 1 (the
// updates between its pull and its apply) and moves the weights by lr / max(1, s - 1); the ps counts
// every push's staleness (Stats' staleness_counts), with or without the flag.
TEST(AsyncPushTest, StalenessAwareLearningRateDividesByTheStepsSinceThePull) {
  const dist::PlacementPlan plan = Plan({{"w", {3, 2}}}, 1, 1);
  for (bool aware : {false, true}) {
    SCOPED_TRACE(aware);
    auto cluster = TestCluster::Start(1, 1);
    auto client = cluster->Client(plan, 0);
    PSFLOW_ASSERT_OK(client->Connect());
    const Tensor w = Filled({3, 2}, 1.0f, 0.125f), g = Filled({3, 2}, -0.3f, 0.0625f);
    TrainingConfig config = Sgd(0.5f);
    config.staleness_aware_lr = aware;
    PSFLOW_ASSERT_OK(client->Initialize({{"w", &w}}, config));
    Tensor want = w;
    for (int s = 1; s <= 4; ++s) {  // every push computed at step 0
      auto pushed = client->Push({{"w", &g, nullptr}}, 0);
      ASSERT_TRUE(pushed.ok()) << pushed.status();
      EXPECT_EQ(pushed->global_step, s);
      const float lr = aware ? 0.5f / static_cast<float>(std::max(1, s - 1)) : 0.5f;
      for (int64_t i = 0; i < want.size(); ++i) want[i] -= lr * g[i];
    }
    Tensor got({3, 2});
    PSFLOW_ASSERT_OK(client->Pull({{"w", &got}}).status());
    for (int64_t i = 0; i < want.size(); ++i) EXPECT_FLOAT_EQ(got[i], want[i]) << i;
    auto stats = client->Stats();
    ASSERT_TRUE(stats.ok()) << stats.status();
    std::vector<int64_t> counts = (*stats)[0].staleness_counts;
    ASSERT_GE(counts.size(), 5u);
    EXPECT_EQ(std::vector<int64_t>(counts.begin(), counts.begin() + 5), (std::vector<int64_t>{1, 1, 1, 1, 0}));
  }
}

// --wire_dtype=bfloat16 / float16: the ps keeps float32 (an SGD step of the rounded gradient),
// the first pull arrives rounded and later ones as deltas, the rounding of each push is carried
// into the next (error feedback), and a worker whose wire dtype disagrees with the ps's is refused
// in one line naming both.
TEST(AsyncPushTest, SixteenBitWireRoundsPullsAndPushesWithErrorFeedback) {
  for (const std::string dtype_name : {"bfloat16", "float16"}) {
    const rpc::WireDtype dtype = *rpc::ParseWireDtype(dtype_name);
    auto round = [dtype](float x) {
      uint16_t h;
      rpc::EncodeFloats(dtype, &x, 1, &h);
      float back;
      rpc::DecodeFloats(dtype, &h, 1, &back);
      return back;
    };
    const dist::PlacementPlan plan = Plan({{"w", {6, 4}}, {"b", {4}}}, 2, 2);
    auto cluster = TestCluster::Start(2, 2);
    auto client = cluster->Client(plan, 0, {}, nullptr, -1, dtype_name);
    PSFLOW_ASSERT_OK(client->Connect());
    const Tensor w = Filled({6, 4}, 1.0f, 0.1f), b = Filled({4}, 0.0f, 1.0f);
    TrainingConfig config = Sgd(1.0f);
    config.wire_dtype = dtype_name;
    PSFLOW_ASSERT_OK(client->Initialize({{"w", &w}, {"b", &b}}, config));
    // The ps holds the exact initial values; a pull answers their rounding.
    Tensor w2({6, 4}), b2({4});
    ASSERT_TRUE(client->Pull({{"w", &w2}, {"b", &b2}}).ok());
    for (int64_t i = 0; i < w.size(); ++i) EXPECT_EQ(w2[i], round(w[i])) << i;
    // The same gradient pushed K times: the ps's values move by K * g within about one rounding of
    // g plus the ps's own float32 rounding (bfloat16 without feedback would be off by up to
    // K * 3.8e-6 = 2.4e-4 here).
    const Tensor gw = Filled({6, 4}, 1e-3f + 1e-7f, 1e-6f), gb = Filled({4}, 0.0f, 0.0f);
    constexpr int kPushes = 64;
    for (int k = 0; k < kPushes; ++k) ASSERT_TRUE(client->Push({{"w", &gw, nullptr}, {"b", &gb, nullptr}}, k).ok());
    auto state = client->PullState();  // a checkpoint's pull: float32, exact
    ASSERT_TRUE(state.ok()) << state.status();
    const Tensor& got = state->variables[0].name == "w" ? state->variables[0].value : state->variables[1].value;
    for (int64_t i = 0; i < w.size(); ++i) {
      const double moved = static_cast<double>(w[i]) - got[i];
      const double want = static_cast<double>(gw[i]) * kPushes;
      EXPECT_NEAR(moved, want, 1.5e-5) << dtype_name << " " << i;
    }
    // Pulls after the first travel as deltas from what the worker holds (rpc/delta_pull.h): the
    // next one brings the ps's exact values, later ones stay within a rounding of the change.
    ASSERT_TRUE(client->Pull({{"w", &w2}, {"b", &b2}}).ok());
    for (int64_t i = 0; i < w.size(); ++i) EXPECT_EQ(w2[i], got[i]) << dtype_name << " " << i;
    ASSERT_TRUE(client->Push({{"w", &gw, nullptr}, {"b", &gb, nullptr}}, kPushes).ok());
    ASSERT_TRUE(client->Pull({{"w", &w2}, {"b", &b2}}).ok());
    for (int64_t i = 0; i < w.size(); ++i) {
      // (one push rounded with its residual, one delta rounded: ~1e-5; a plain rounding of w ~ 1
      // would be off by up to 2e-3)
      EXPECT_NEAR(w2[i], got[i] - gw[i], 1e-5f) << dtype_name << " " << i;
    }
    // A worker pushing float32 to this ps is refused, naming both dtypes.
    auto other = cluster->Client(plan, 1);
    PSFLOW_ASSERT_OK(other->Connect());
    PSFLOW_ASSERT_OK(other->WaitForInitialization(10));
    auto refused = other->Push({{"w", &gw, nullptr}, {"b", &gb, nullptr}}, 0);
    ASSERT_FALSE(refused.ok());
    EXPECT_TRUE(absl::IsInvalidArgument(refused.status())) << refused.status();
    EXPECT_THAT(std::string(refused.status().message()),
                HasSubstr("is float32 but this ps exchanges " + dtype_name + " (the chief's --wire_dtype)"));
    EXPECT_EQ(std::string(refused.status().message()).find('\n'), std::string::npos);
  }
}

TEST(AsyncPushTest, PushAndPullAnswersWithTheUpdatedValues) {
  // "w" split over both ps, "b" on one: the other ps answers with values for a push it got nothing
  // of... and the other way round.
  const dist::PlacementPlan plan = Plan({{"w", {6, 4}}, {"b", {4}}}, 2, 2);
  auto cluster = TestCluster::Start(2, 1);
  auto client = cluster->Client(plan, 0);
  PSFLOW_ASSERT_OK(client->Connect());
  const Tensor w = Filled({6, 4}, 1.0f, 0.125f), b = Filled({4}, 0.0f, 1.0f);
  PSFLOW_ASSERT_OK(client->Initialize({{"w", &w}, {"b", &b}}, Sgd(0.5f)));
  const Tensor gb = Filled({4}, 2.0f, -0.5f);
  Tensor w2({6, 4}), b2({4});
  auto r = client->PushAndPull({{"b", &gb, nullptr}}, 0, {{"w", &w2}, {"b", &b2}});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->global_step, 1);
  for (int64_t i = 0; i < w.size(); ++i) EXPECT_EQ(w2[i], w[i]) << i;
  for (int64_t i = 0; i < b.size(); ++i) EXPECT_EQ(b2[i], b[i] - 0.5f * gb[i]) << i;
  const Tensor gw = Filled({6, 4}, -0.3f, 0.0625f);
  r = client->PushAndPull({{"w", &gw, nullptr}}, 1, {{"w", &w2}});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->global_step, 2);
  for (int64_t i = 0; i < w.size(); ++i) EXPECT_EQ(w2[i], w[i] - 0.5f * gw[i]) << i;
}

TEST(AsyncPushTest, PushAndPullAsyncCallsBackWithTheUpdatedValues) {
  const dist::PlacementPlan plan = Plan({{"w", {6, 4}}}, 2, 2);
  auto cluster = TestCluster::Start(2, 1);
  auto client = cluster->Client(plan, 0);
  PSFLOW_ASSERT_OK(client->Connect());
  const Tensor w = Filled({6, 4}, 1.0f, 0.125f);
  PSFLOW_ASSERT_OK(client->Initialize({{"w", &w}}, Sgd(0.5f)));
  const Tensor gw = Filled({6, 4}, -0.3f, 0.0625f);
  Tensor w2({6, 4});
  absl::Notification done;
  absl::StatusOr<PushResult> result;
  client->PushAndPullAsync({{"w", &gw, nullptr}}, 0, {{"w", &w2}}, [&](absl::StatusOr<PushResult> r) {
    result = std::move(r);
    done.Notify();
  });
  ASSERT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(30))) << "PushAndPullAsync never called back";
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->global_step, 1);
  for (int64_t i = 0; i < w.size(); ++i) EXPECT_EQ(w2[i], w[i] - 0.5f * gw[i]) << i;
}

TEST(AsyncPushTest, AdamMatchesTheOptimizerAppliedLocallyWithDecayByStepTag) {
  const dist::PlacementPlan plan = Plan({{"w", {5, 3}}}, 2, 2);
  auto cluster = TestCluster::Start(2, 1);
  auto client = cluster->Client(plan, 0);
  PSFLOW_ASSERT_OK(client->Connect());
  TrainingConfig config;
  config.optimizer.name = "adam";
  config.optimizer.learning_rate = 0.01f;
  config.optimizer.decay_steps = 1;
  config.optimizer.decay_rate = 0.5f;
  const Tensor w = Filled({5, 3}, 0.2f, 0.05f);
  PSFLOW_ASSERT_OK(client->Initialize({{"w", &w}}, config));

  // The same updates applied locally, per shard (each shard has its own state).
  auto optimizer = optim::MakeOptimizer(config.optimizer);
  ASSERT_TRUE(optimizer.ok());
  Tensor expected = w;
  std::vector<optim::SlotState> states;
  for (const dist::ShardSpec& s : plan.shards) states.push_back((*optimizer)->NewState(NumElements(s.shape)));
  const int64_t tags[] = {0, 3, 1};
  for (int k = 0; k < 3; ++k) {
    const Tensor g = Filled({5, 3}, 0.1f * (k + 1), -0.03f);
    ASSERT_TRUE(client->Push({{"w", &g, nullptr}}, tags[k]).ok());
    const float lr = optim::LearningRateAt(config.optimizer, tags[k]);
    for (size_t s = 0; s < plan.shards.size(); ++s) {
      const int64_t begin = plan.shards[s].offset * 3, n = NumElements(plan.shards[s].shape);
      (*optimizer)->ApplyDense(expected.data() + begin, g.data() + begin, n, states[s], lr);
    }
  }
  Tensor got({5, 3});
  auto step = client->Pull({{"w", &got}});
  ASSERT_TRUE(step.ok());
  EXPECT_EQ(*step, 3);
  ExpectEqualTensors(got, expected);
}

// A push bigger than a part goes as parts (ps/client/call_parts.h): shards cut into element runs across
// calls, a sparse gradient beside them. Against the optimizer applied locally, one whole update
// per shard and push (one Adam t), and the global step advancing once per push.
TEST(AsyncPushTest, PushInPartsIsOneUpdatePerShardAndOneGlobalStep) {
  const dist::PlacementPlan plan = Plan({{"w", {7, 5}}, {"emb", {6, 2}}}, 2, 2);
  auto cluster = TestCluster::Start(2, 1);
  // Parts of 3 floats: every dense shard (15-20 floats) is cut into runs over several calls.
  auto client = cluster->Client(plan, 0, {}, nullptr, /*max_part_bytes=*/12);
  PSFLOW_ASSERT_OK(client->Connect());
  TrainingConfig config;
  config.optimizer.name = "adam";
  config.optimizer.learning_rate = 0.01f;
  const Tensor w = Filled({7, 5}, 0.2f, 0.05f), emb = Filled({6, 2}, -0.5f, 0.1f);
  PSFLOW_ASSERT_OK(client->Initialize({{"w", &w}, {"emb", &emb}}, config));

  auto optimizer = optim::MakeOptimizer(config.optimizer);
  ASSERT_TRUE(optimizer.ok());
  Tensor expected_w = w, expected_emb = emb;
  std::map<std::string, optim::SlotState> states;
  for (const dist::ShardSpec& s : plan.shards) states[s.name] = (*optimizer)->NewState(NumElements(s.shape));
  Tensor got_w({7, 5}), got_emb({6, 2});
  for (int k = 0; k < 3; ++k) {
    const Tensor g = Filled({7, 5}, 0.1f * (k + 1), -0.03f);
    RowSparse sparse;
    sparse.rows = {1, 4, 1};
    sparse.values = Filled({3, 2}, 1.0f + k, 0.5f);
    auto pushed =
        client->PushAndPull({{"w", &g, nullptr}, {"emb", nullptr, &sparse}}, k, {{"w", &got_w}, {"emb", &got_emb}});
    ASSERT_TRUE(pushed.ok()) << pushed.status();
    EXPECT_EQ(pushed->global_step, k + 1);
    for (const dist::ShardSpec& s : plan.shards) {
      if (s.variable == "w") {
        const int64_t begin = s.offset * 5, n = NumElements(s.shape);
        (*optimizer)->ApplyDense(expected_w.data() + begin, g.data() + begin, n, states[s.name], 0.01f);
      } else {  // emb rows 1 (x2, summed) and 4, in the shard holding each
        std::vector<int64_t> rows;
        std::vector<float> values;
        for (int64_t r : {int64_t{1}, int64_t{4}}) {
          if (r < s.offset || r >= s.offset + s.shape[0]) continue;
          rows.push_back(r - s.offset);
          for (int j = 0; j < 2; ++j) {
            values.push_back(r == 1 ? sparse.values[0 * 2 + j] + sparse.values[2 * 2 + j] : sparse.values[1 * 2 + j]);
          }
        }
        if (rows.empty()) continue;
        (*optimizer)->ApplySparse(expected_emb.data() + s.offset * 2, rows, values.data(), 2, states[s.name], 0.01f);
      }
    }
    ExpectEqualTensors(got_w, expected_w);
    ExpectEqualTensors(got_emb, expected_emb);
  }
  auto stats = cluster->servers[0]->Stats();
  EXPECT_EQ(stats.pushes_refused, 0);
}

// The chief's Initialize in parts (src/ps/server/ps_initialize.cc): a fresh model and a restore with
// Adam's slots and update counts, cut into runs of 3 floats over many calls, arrive exactly as a
// whole Initialize would deliver them (the state pulled back equals what was sent).
TEST(InitializeTest, InPartsInstallsExactlyTheValuesSlotsAndUpdateCounts) {
  const dist::PlacementPlan plan = Plan({{"w", {7, 5}}, {"b", {5}}, {"scale", {}}}, 2, 2);
  TrainingConfig config;
  config.optimizer.name = "adam";
  config.optimizer.learning_rate = 0.01f;
  const Tensor w = Filled({7, 5}, 0.5f, 0.25f), b = Filled({5}, -1.0f, 0.5f), scale = Tensor::Scalar(3.0f);

  auto first = TestCluster::Start(2, 1);
  auto client = first->Client(plan, 0, {}, nullptr, /*max_part_bytes=*/12);
  PSFLOW_ASSERT_OK(client->Connect());
  PSFLOW_ASSERT_OK(client->Initialize({{"w", &w}, {"b", &b}, {"scale", &scale}}, config));
  Tensor w2({7, 5}), b2({5}), scale2 = Tensor::Scalar(0);
  ASSERT_TRUE(client->Pull({{"w", &w2}, {"b", &b2}, {"scale", &scale2}}).ok());
  ExpectEqualTensors(w2, w);
  ExpectEqualTensors(b2, b);
  ExpectEqualTensors(scale2, scale);
  for (int k = 0; k < 2; ++k) {  // some Adam state worth restoring
    const Tensor g = Filled({7, 5}, 0.3f * (k + 1), 0.01f), gb = Filled({5}, -0.2f, 0.1f);
    ASSERT_TRUE(client->Push({{"w", &g, nullptr}, {"b", &gb, nullptr}}, k).ok());
  }
  auto state = client->PullState();
  ASSERT_TRUE(state.ok()) << state.status();
  ASSERT_EQ(state->global_step, 2);
  // Pulled in parts (runs of values with their slots), it equals the state pulled whole.
  auto whole_client = first->Client(plan, 0);
  PSFLOW_ASSERT_OK(whole_client->Connect());
  PSFLOW_ASSERT_OK(whole_client->WaitForInitialization(10));
  auto whole = whole_client->PullState();
  ASSERT_TRUE(whole.ok()) << whole.status();
  EXPECT_EQ(whole->global_step, 2);
  ASSERT_NO_FATAL_FAILURE(ExpectSameSnapshot(*whole, *state, 2));

  // Restored in parts onto a fresh cluster: the same state comes back.
  auto second = TestCluster::Start(2, 1);
  auto restorer = second->Client(plan, 0, {}, nullptr, /*max_part_bytes=*/12);
  PSFLOW_ASSERT_OK(restorer->Connect());
  PSFLOW_ASSERT_OK(restorer->Initialize(*state, config));
  auto back = restorer->PullState();
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->global_step, 2);
  ASSERT_NO_FATAL_FAILURE(ExpectSameSnapshot(*back, *state, 2));
  EXPECT_GT(state->variables[0].updates, 0);
}

TEST(InitializeTest, PartsWithAGapOrNoLastPartInstallNothing) {
  const dist::PlacementPlan plan = Plan({{"w", {3, 2}}}, 1);
  auto cluster = TestCluster::Start(1, 1);
  auto channel = rpc::MakeGrpcChannel(cluster->cluster.ps()[0], "ps task 0", {});
  ASSERT_TRUE(channel.ok());
  const std::vector<float> data(6, 2.0f);
  auto part = [&](uint64_t seq, int64_t offset, int64_t n, bool more) {
    wire::InitializeRequest init;
    *init.mutable_config() = ToWire(Sgd(1.0f));
    wire::ShardInfo* info = init.add_shards();
    info->set_name("w");
    info->set_variable("w");
    info->add_shape(3);
    info->add_shape(2);
    init.set_client_id(5);
    init.set_seq(seq);
    init.set_first_seq(seq <= 12 ? 10 : 13);
    init.set_more_parts(more);
    return CallWithSliceOfW(**channel, rpc::Method::kInitialize, init.SerializeAsString(), data, offset, n);
  };
  PSFLOW_EXPECT_OK(part(10, 0, 2, true));
  PSFLOW_EXPECT_OK(part(10, 0, 2, true));          // a retried part writes the same again
  const absl::Status gap = part(11, 4, 2, false);  // elements 2-3 never came
  EXPECT_TRUE(absl::IsInvalidArgument(gap)) << gap;
  EXPECT_THAT(std::string(gap.message()), HasSubstr("jumps to element 4 before 2 arrived"));
  EXPECT_EQ(cluster->servers[0]->Stats().num_params, 0);  // no model installed
  PSFLOW_EXPECT_OK(part(11, 2, 2, true));
  const absl::Status short_ = part(12, 4, 1, false);  // the last part, one element short
  EXPECT_TRUE(absl::IsInvalidArgument(short_)) << short_;
  EXPECT_THAT(std::string(short_.message()), HasSubstr("has 5 of 6 elements"));
  EXPECT_EQ(cluster->servers[0]->Stats().num_params, 0);
  // All of it, in order: installed.
  PSFLOW_EXPECT_OK(part(13, 0, 4, true));
  PSFLOW_EXPECT_OK(part(14, 4, 2, false));
  EXPECT_EQ(cluster->servers[0]->Stats().num_params, 6);
}

TEST(AsyncPushTest, ServerRefusesSlicesThatDoNotFitOrComeInSyncMode) {
  OnePsWithW ps;
  ASSERT_NO_FATAL_FAILURE(ps.Start());
  auto& [plan, cluster, client, w, channel] = ps;
  const std::vector<float> data(6, 1.0f);
  auto push = [&](int64_t offset, int64_t n, uint64_t client_id) {
    wire::PushRequest header;
    header.set_client_id(client_id);
    header.set_seq(static_cast<uint64_t>((offset + 1) * 10 + n));  // a distinct seq for each part, all > 0
    header.set_more_parts(true);
    return CallWithSliceOfW(*ps.channel, rpc::Method::kPush, header.SerializeAsString(), data, offset, n);
  };
  EXPECT_TRUE(absl::IsInvalidArgument(push(4, 3, 7)));   // past the shard's 6 elements
  EXPECT_TRUE(absl::IsInvalidArgument(push(-1, 2, 7)));  // before it
  EXPECT_TRUE(absl::IsInvalidArgument(push(0, 2, 0)));   // a part without a client id
  EXPECT_TRUE(push(0, 2, 7).ok());
  Tensor got({3, 2});
  auto step = client->Pull({{"w", &got}});
  ASSERT_TRUE(step.ok());
  EXPECT_EQ(*step, 0);  // a part that is not the last leaves the global step alone
  EXPECT_EQ(got[0], 0.0f);
  EXPECT_EQ(got[2], 3.0f);

  // Sync mode counts whole pushes: a part is refused.
  TrainingConfig sync = Sgd(1.0f);
  sync.sync = true;
  PSFLOW_ASSERT_OK(client->Initialize({{"w", &w}}, sync));
  const absl::Status refused = push(0, 2, 8);
  EXPECT_TRUE(absl::IsInvalidArgument(refused)) << refused;
  EXPECT_THAT(std::string(refused.message()), HasSubstr("only async pushes"));
}

// A pull in parts asks for element runs (PullRequest.slices); the ps answers each with its values
// (and, for a checkpoint, its slots) and refuses runs outside the shard or mixed with whole shards.
TEST(PullTest, ServerAnswersRunsOfAShardAndRefusesRunsThatDoNotFit) {
  OnePsWithW ps;
  ASSERT_NO_FATAL_FAILURE(ps.Start());
  auto& [plan, cluster, client, w, channel] = ps;
  auto pull = [&](std::vector<std::pair<int64_t, int64_t>> runs, bool with_slots, bool whole_too = false) {
    wire::PullRequest request;
    request.set_with_slots(with_slots);
    if (whole_too) request.add_shards("w");
    for (auto [offset, count] : runs) {
      wire::ShardSlice* slice = request.add_slices();
      slice->set_shard("w");
      slice->set_offset(offset);
      slice->set_count(count);
    }
    rpc::CallOptions o;
    o.timeout_secs = 10;
    return ps.channel->CallBlocking(rpc::Method::kPull, rpc::OutgoingMessage::Of(request), o);
  };
  auto answer = pull({{1, 2}, {4, 2}}, false);
  ASSERT_TRUE(answer.ok()) << answer.status();
  ASSERT_EQ(answer->num_tensors(), 2);
  const int64_t offsets[] = {1, 4};
  for (int i = 0; i < 2; ++i) {
    EXPECT_TRUE(answer->meta(i).slice());
    EXPECT_EQ(answer->meta(i).slice_offset(), offsets[i]);
    std::vector<float> got(2);
    answer->CopyTo(i, got.data());
    EXPECT_EQ(got, (std::vector<float>{w[offsets[i]], w[offsets[i] + 1]}));
  }
  // A checkpoint's run: the values, then each slot's same run (SGD has none), and the update count.
  const Tensor g = Filled({3, 2}, 0.5f, 0.0f);
  ASSERT_TRUE(client->Push({{"w", &g, nullptr}}, 0).ok());
  answer = pull({{0, 6}}, true);
  ASSERT_TRUE(answer.ok()) << answer.status();
  ASSERT_EQ(answer->num_tensors(), 1);
  wire::PullResponse header;
  PSFLOW_ASSERT_OK(answer->ParseHeader(&header));
  EXPECT_EQ(header.updates_size(), 1);
  EXPECT_EQ(header.updates(0), 1);
  EXPECT_EQ(header.step(), 1);
  std::vector<float> got(6);
  answer->CopyTo(0, got.data());
  for (int i = 0; i < 6; ++i) EXPECT_EQ(got[i], w[i] - 0.5f) << i;

  EXPECT_TRUE(absl::IsInvalidArgument(pull({{5, 2}}, false).status()));   // past the shard's 6 elements
  EXPECT_TRUE(absl::IsInvalidArgument(pull({{-1, 1}}, false).status()));  // before it
  EXPECT_TRUE(absl::IsInvalidArgument(pull({{0, 1}}, false, /*whole_too=*/true).status()));
}

TEST(AsyncPushTest, RowSparsePushUpdatesOnlyTouchedRowsAndSumsDuplicates) {
  const dist::PlacementPlan plan = Plan({{"emb", {6, 2}}}, 2, 2);  // rows 0..2 and 3..5
  auto cluster = TestCluster::Start(2, 1);
  auto client = cluster->Client(plan, 0);
  PSFLOW_ASSERT_OK(client->Connect());
  const Tensor emb = Filled({6, 2}, 1.0f, 1.0f);
  PSFLOW_ASSERT_OK(client->Initialize({{"emb", &emb}}, Sgd(1.0f)));
  RowSparse g;
  g.rows = {4, 1, 4};
  g.values = Tensor({3, 2}, {0.5f, 0.25f, 2.0f, 3.0f, 0.125f, 1.0f});
  ASSERT_TRUE(client->Push({{"emb", nullptr, &g}}, 0).ok());
  Tensor got({6, 2});
  ASSERT_TRUE(client->Pull({{"emb", &got}}).ok());
  Tensor expected = emb;
  expected[1 * 2 + 0] -= 2.0f;
  expected[1 * 2 + 1] -= 3.0f;
  expected[4 * 2 + 0] -= 0.5f + 0.125f;
  expected[4 * 2 + 1] -= 0.25f + 1.0f;
  ExpectEqualTensors(got, expected);
}

TEST(AsyncPushTest, NanPushIsRefusedCountedAndTheServerKeepsServing) {
  const dist::PlacementPlan plan = Plan({{"w", {4}}}, 1);
  auto cluster = TestCluster::Start(1, 1);
  auto client = cluster->Client(plan, 0);
  PSFLOW_ASSERT_OK(client->Connect());
  const Tensor w = Filled({4}, 1.0f, 1.0f);
  PSFLOW_ASSERT_OK(client->Initialize({{"w", &w}}, Sgd(0.5f)));
  Tensor bad = Filled({4}, 1.0f, 0.0f);
  bad[2] = std::numeric_limits<float>::quiet_NaN();
  auto refused = client->Push({{"w", &bad, nullptr}}, 0);
  EXPECT_TRUE(absl::IsInvalidArgument(refused.status())) << refused.status();
  EXPECT_THAT(std::string(refused.status().message()), HasSubstr("NaN or Inf at element 2"));
  EXPECT_THAT(std::string(refused.status().message()), HasSubstr("ps task 0 (127.0.0.1:"));
  bad[2] = std::numeric_limits<float>::infinity();
  EXPECT_TRUE(absl::IsInvalidArgument(client->Push({{"w", &bad, nullptr}}, 0).status()));

  Tensor got({4});
  auto step = client->Pull({{"w", &got}});
  ASSERT_TRUE(step.ok());
  EXPECT_EQ(*step, 0);  // nothing applied, the step did not move
  ExpectEqualTensors(got, w);

  const Tensor good = Filled({4}, 1.0f, 0.0f);
  auto pushed = client->Push({{"w", &good, nullptr}}, 0);
  ASSERT_TRUE(pushed.ok()) << pushed.status();
  EXPECT_EQ(pushed->global_step, 1);
  EXPECT_EQ(cluster->servers[0]->Stats().pushes_refused, 2);
}

// Shards of more than 1 MiB are checked and updated by several threads. A push spanning several
// ps tasks is refused as a whole: no ps applies its part.
TEST(AsyncPushTest, LargeShardsUpdateExactlyAndRefuseANanAnywhere) {
  const Shape shape = {1200, 500};  // two shards of 300,000 floats
  const dist::PlacementPlan plan = Plan({{"w", shape}}, 2, 2);
  auto cluster = TestCluster::Start(2, 1);
  auto client = cluster->Client(plan, 0);
  PSFLOW_ASSERT_OK(client->Connect());
  const Tensor w = Filled(shape, -3.0f, 1e-5f);
  TrainingConfig config = Sgd(0.25f);
  PSFLOW_ASSERT_OK(client->Initialize({{"w", &w}}, config));
  Tensor g = Filled(shape, 1.0f, -2e-6f);
  g[599999] = std::numeric_limits<float>::infinity();  // the last element
  auto refused = client->Push({{"w", &g, nullptr}}, 0);
  EXPECT_TRUE(absl::IsInvalidArgument(refused.status())) << refused.status();
  EXPECT_THAT(std::string(refused.status().message()), HasSubstr("'w'"));
  EXPECT_THAT(std::string(refused.status().message()), HasSubstr("element 599999"));
  g[599999] = 0.5f;
  g[123456] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_TRUE(absl::IsInvalidArgument(client->Push({{"w", &g, nullptr}}, 0).status()));
  g[123456] = 0.5f;
  ASSERT_TRUE(client->Push({{"w", &g, nullptr}}, 0).ok());
  Tensor got(shape);
  ASSERT_TRUE(client->Pull({{"w", &got}}).ok());
  int64_t wrong = 0;
  for (int64_t i = 0; i < w.size(); ++i) wrong += got[i] != w[i] - 0.25f * g[i];
  EXPECT_EQ(wrong, 0);
}

// Pushes the client would never send (it validates first), sent raw to the server.
TEST(AsyncPushTest, ServerRefusesMalformedPushesFromAnyPeer) {
  OnePsWithW ps;
  ASSERT_NO_FATAL_FAILURE(ps.Start());
  auto& [plan, cluster, client, w, channel] = ps;
  const std::vector<float> data(6, 1.0f);
  auto push = [&](const std::string& name, Shape shape, std::vector<int64_t> rows, bool sparse) {
    wire::PushRequest header;
    header.set_step_tag(0);
    rpc::OutgoingMessage m = rpc::OutgoingMessage::Of(header);
    rpc::OutgoingTensor t;
    t.meta.set_name(name);
    for (int64_t d : shape) t.meta.add_shape(d);
    t.meta.set_sparse(sparse);
    for (int64_t r : rows) t.meta.add_rows(r);
    t.data = data.data();
    t.num_floats = NumElements(shape);
    m.tensors.push_back(t);
    rpc::CallOptions o;
    o.timeout_secs = 10;
    return ps.channel->CallBlocking(rpc::Method::kPush, std::move(m), o).status();
  };
  EXPECT_TRUE(absl::IsInvalidArgument(push("nope", {3, 2}, {}, false)));  // unknown shard
  EXPECT_TRUE(absl::IsInvalidArgument(push("w", {2, 3}, {}, false)));     // wrong shape
  EXPECT_TRUE(absl::IsInvalidArgument(push("w", {6}, {}, false)));        // wrong rank
  EXPECT_TRUE(absl::IsInvalidArgument(push("w", {2, 2}, {0, 3}, true)));  // row out of range
  EXPECT_TRUE(absl::IsInvalidArgument(push("w", {2, 3}, {0, 1}, true)));  // wrong row size
  EXPECT_EQ(cluster->servers[0]->Stats().pushes_refused, 5);
  EXPECT_TRUE(push("w", {2, 2}, {0, 2}, true).ok());  // and a good one still works
  Tensor got({3, 2});
  ASSERT_TRUE(client->Pull({{"w", &got}}).ok());
  EXPECT_EQ(got[0], 0.0f);
  EXPECT_EQ(got[2], 3.0f);  // row 1 untouched
  EXPECT_EQ(got[4], 4.0f);
}

TEST(AsyncPushTest, PushesStopAtTrainStepsAndCountTraffic) {
  const dist::PlacementPlan plan = Plan({{"w", {1000}}}, 1);
  auto cluster = TestCluster::Start(1, 1);
  auto client = cluster->Client(plan, 0);
  PSFLOW_ASSERT_OK(client->Connect());
  const Tensor w({1000}, 1.0f);
  TrainingConfig config = Sgd(0.1f);
  config.train_steps = 2;
  PSFLOW_ASSERT_OK(client->Initialize({{"w", &w}}, config));
  const Tensor g({1000}, 1.0f);
  ASSERT_TRUE(client->Push({{"w", &g, nullptr}}, 0).ok());
  ASSERT_TRUE(client->Push({{"w", &g, nullptr}}, 1).ok());
  auto third = client->Push({{"w", &g, nullptr}}, 2);
  EXPECT_TRUE(absl::IsOutOfRange(third.status())) << third.status();
  EXPECT_THAT(std::string(third.status().message()), HasSubstr("training finished at step 2"));
  const PsTaskStats stats = cluster->servers[0]->Stats();
  EXPECT_EQ(stats.global_step, 2);
  EXPECT_EQ(stats.num_params, 1000);
  // Initialize and three pushes carried at least 4 x 4000 bytes in; one pull was not made.
  EXPECT_GE(stats.bytes_in, 4 * 4000);
  EXPECT_LT(stats.bytes_out, 4000);
  Tensor got({1000});
  ASSERT_TRUE(client->Pull({{"w", &got}}).ok());
  EXPECT_GE(cluster->servers[0]->Stats().bytes_out, 4000);
}

TEST(AsyncPushTest, ClientRefusesGradientsThatDoNotFitThePlan) {
  const dist::PlacementPlan plan = Plan({{"w", {3, 2}}}, 1);
  auto cluster = TestCluster::Start(1, 1);
  auto client = cluster->Client(plan, 0);
  PSFLOW_ASSERT_OK(client->Connect());
  const Tensor w({3, 2}, 1.0f);
  PSFLOW_ASSERT_OK(client->Initialize({{"w", &w}}, Sgd(1.0f)));
  const Tensor wrong({2, 3}, 1.0f);
  EXPECT_TRUE(absl::IsInvalidArgument(client->Push({{"w", &wrong, nullptr}}, 0).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(client->Push({{"v", &w, nullptr}}, 0).status()));
  RowSparse out_of_range{{3}, Tensor({1, 2}, 1.0f)};
  EXPECT_TRUE(absl::IsInvalidArgument(client->Push({{"w", nullptr, &out_of_range}}, 0).status()));
  Tensor small({2});
  EXPECT_TRUE(absl::IsInvalidArgument(client->Pull({{"w", &small}}).status()));
}

}  // namespace
}  // namespace psflow::ps
