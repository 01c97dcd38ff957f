// A shard's push path on gradients as the transport hands them over: received bytes in pieces of
// any length at any alignment (TCP reads), read in place. Every dense rule, on one thread and on
// several (shards from 1 MiB on are checked and updated by the intra-op threads), must give the
// bits of the plain rule applied to a contiguous copy; a NaN or Inf anywhere refuses the push.
#include "ps/server/shard.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "psflow/core/threading.h"
#include "psflow/optim/optimizer.h"

namespace psflow::ps {
namespace {

using ::testing::HasSubstr;

// Below, at and above the size from which several threads share the work (1 MiB of floats).
constexpr int64_t kSizes[] = {37, (int64_t{1} << 18) + 1001};

// `values` received as one dense tensor of shape {n}: pieces of 1 byte to 64 KiB, each in its own
// buffer at a random offset, so floats sit at every alignment and some are split across pieces.
rpc::IncomingMessage Received(const FloatBuffer& values, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<size_t> piece(1, 65536);
  std::uniform_int_distribution<size_t> shift(0, 7);
  auto buffers = std::make_shared<std::vector<std::unique_ptr<char[]>>>();
  std::vector<rpc::IncomingMessage::Segment> segments;
  const char* bytes = reinterpret_cast<const char*>(values.data());
  const size_t total = values.size() * sizeof(float);
  for (size_t at = 0; at < total;) {
    const size_t take = std::min(total - at, piece(rng));
    const size_t offset = shift(rng);
    buffers->push_back(std::make_unique<char[]>(take + offset));
    char* p = buffers->back().get() + offset;
    std::memcpy(p, bytes + at, take);
    segments.push_back({p, take});
    at += take;
  }
  wire::TensorList list;
  wire::TensorMeta* meta = list.add_tensors();
  meta->set_name("w");
  meta->add_shape(static_cast<int64_t>(values.size()));
  absl::StatusOr<rpc::IncomingMessage> message =
      rpc::IncomingMessage::Make("", std::move(list), std::move(segments), buffers, static_cast<int64_t>(total));
  EXPECT_TRUE(message.ok()) << message.status();
  return *std::move(message);
}

std::vector<optim::OptimizerConfig> EveryDenseRule() {
  std::vector<optim::OptimizerConfig> configs;
  for (const char* name : {"sgd", "momentum", "adagrad", "adam", "adamw", "rmsprop"}) {
    for (const char* convention : {"tensorflow", "torch"}) {
      optim::OptimizerConfig c;
      c.name = name;
      c.convention = convention;
      c.learning_rate = 0.05f;
      c.rms_momentum = 0.5f;
      c.weight_decay = std::string(name) == "adamw" ? 0.01f : 0.0f;
      configs.push_back(c);
    }
  }
  optim::OptimizerConfig nesterov;
  nesterov.name = "momentum";
  nesterov.nesterov = true;
  nesterov.learning_rate = 0.05f;
  configs.push_back(nesterov);
  optim::OptimizerConfig l2;  // L2 decay reads the gradient through an aligned chunk
  l2.name = "adam";
  l2.learning_rate = 0.05f;
  l2.weight_decay = 0.01f;
  configs.push_back(l2);
  return configs;
}

FloatBuffer Pattern(int64_t n, int step) {
  FloatBuffer v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[i] = static_cast<float>(std::sin(0.37 * static_cast<double>(i) + 1.3 * step));
  return v;
}

template <typename A, typename B>
bool SameBits(const A& a, const B& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

class ShardPushTest : public ::testing::TestWithParam<int> {  // the intra-op thread count
 protected:
  void SetUp() override { SetIntraOpThreads(GetParam()); }
  void TearDown() override { SetIntraOpThreads(0); }
};

// Async: three pushes through the shard equal ApplyDense on the same gradients, bit for bit,
// values and slots alike.
TEST_P(ShardPushTest, ReceivedPiecesUpdateLikeThePlainRuleForEveryRule) {
  for (const optim::OptimizerConfig& config : EveryDenseRule()) {
    for (int64_t n : kSizes) {
      SCOPED_TRACE(testing::Message() << config.name << " " << config.convention << " nesterov " << config.nesterov
                                      << " wd " << config.weight_decay << " n " << n);
      std::unique_ptr<optim::Optimizer> rule = std::move(optim::MakeOptimizer(config)).value();
      FloatBuffer plain = Pattern(n, 0);
      Shard shard("w", Shape{n}, plain, rule->NewState(n));
      optim::SlotState plain_state = rule->NewState(n);
      for (int step = 1; step <= 3; ++step) {
        const FloatBuffer g = Pattern(n, step);
        const rpc::IncomingMessage message = Received(g, static_cast<uint32_t>(step * 7 + n));
        ShardGradient decoded;
        ASSERT_TRUE(shard.DecodeGradient(message, 0, &decoded).ok());
        shard.Apply(decoded, *rule, 0.05f);
        rule->ApplyDense(plain.data(), g.data(), n, plain_state, 0.05f);
      }
      optim::SlotState state;
      std::shared_ptr<const FloatBuffer> values = shard.SnapshotWithState(&state);
      EXPECT_TRUE(SameBits(*values, plain));
      EXPECT_EQ(state.updates, 3);
      ASSERT_EQ(state.slots.size(), plain_state.slots.size());
      for (size_t k = 0; k < state.slots.size(); ++k) EXPECT_TRUE(SameBits(state.slots[k], plain_state.slots[k])) << k;
    }
  }
}

// Sync: a worker's first gradient is copied from the received pieces, a second one of the same
// worker added to it; the step applies the mean of the workers' sums, in worker order.
TEST_P(ShardPushTest, ReceivedPiecesAccumulateLikeTheirSum) {
  for (int64_t n : kSizes) {
    SCOPED_TRACE(testing::Message() << "n " << n);
    optim::OptimizerConfig config;
    config.name = "adam";
    std::unique_ptr<optim::Optimizer> rule = std::move(optim::MakeOptimizer(config)).value();
    FloatBuffer plain = Pattern(n, 0);
    Shard shard("w", Shape{n}, plain, rule->NewState(n));
    const FloatBuffer a = Pattern(n, 1), b = Pattern(n, 2), c = Pattern(n, 3);
    const rpc::IncomingMessage ma = Received(a, 1), mb = Received(b, 2), mc = Received(c, 3);
    for (const auto& [message, worker] : {std::pair{&ma, 0}, {&mb, 0}, {&mc, 1}}) {
      ShardGradient decoded;
      ASSERT_TRUE(shard.DecodeGradient(*message, 0, &decoded).ok());
      decoded.worker = worker;
      shard.Accumulate(decoded);
    }
    shard.ApplyAccumulated(2, *rule, 0.05f);
    FloatBuffer mean(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) mean[i] = (0.0f + (a[i] + b[i]) + c[i]) * 0.5f;
    optim::SlotState plain_state = rule->NewState(n);
    rule->ApplyDense(plain.data(), mean.data(), n, plain_state, 0.05f);
    EXPECT_TRUE(SameBits(*shard.Snapshot(), plain));
  }
}

// All or nothing: a NaN or Inf in the last element, or in the middle, of a push is found whatever
// thread checks that part, and the push is refused before anything is applied.
TEST_P(ShardPushTest, ANonFiniteValueAnywhereRefusesThePush) {
  for (int64_t n : kSizes) {
    for (int64_t bad : {n - 1, n / 2, int64_t{0}}) {
      SCOPED_TRACE(testing::Message() << "n " << n << " bad " << bad);
      FloatBuffer g = Pattern(n, 1);
      g[bad] = bad % 2 == 0 ? std::numeric_limits<float>::quiet_NaN() : -std::numeric_limits<float>::infinity();
      optim::OptimizerConfig config;
      std::unique_ptr<optim::Optimizer> rule = std::move(optim::MakeOptimizer(config)).value();
      Shard shard("w", Shape{n}, Pattern(n, 0), rule->NewState(n));
      const rpc::IncomingMessage message = Received(g, static_cast<uint32_t>(bad));
      ShardGradient decoded;
      const absl::Status s = shard.DecodeGradient(message, 0, &decoded);
      EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
      EXPECT_THAT(std::string(s.message()), HasSubstr(absl::StrCat("element ", bad)));
      EXPECT_TRUE(SameBits(*shard.Snapshot(), Pattern(n, 0)));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Threads, ShardPushTest, ::testing::Values(1, 2));

}  // namespace
}  // namespace psflow::ps
