// Pushes large enough to travel in chunks on one gRPC stream (rpc/chunked_message.h), through a
// real ps over 127.0.0.1: the same result, bit for bit, as the same pushes sent as unary calls,
// and still all or nothing — a NaN in the last chunk (or the first) refuses the whole push, with
// nothing applied and the step unmoved.
#include <limits>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "ps/tests/ps_test_util.h"
#include "rpc/chunked_message.h"

namespace psflow::ps {
namespace {

using testing::Adam;
using testing::ExpectEqualTensors;
using testing::ExpectSameSnapshot;
using testing::Filled;
using ::testing::HasSubstr;
using testing::Plan;
using testing::Sgd;
using testing::TestCluster;

// 6 MiB of floats on one ps: a push of it is over rpc::kChunkedMinBytes.
const Shape kShape = {1536, 1024};
static_assert(1536 * 1024 * 4 >= rpc::kChunkedMinBytes);

Tensor Gradient(int k) {
  Tensor g(kShape);
  for (int64_t i = 0; i < g.size(); ++i) g[i] = static_cast<float>((i * (k + 3)) % 1001) * 1e-3f - 0.5f;
  return g;
}

// The same pushes, to a ps that receives them in chunks and to one that receives them as unary
// calls (the client cuts them into 1 MiB parts, each a call of its own below kChunkedMinBytes,
// applied as one update; rpc_grpc_chunked_test shows which calls go in chunks),
// leave the same values, Adam slots and update count, bit for bit.
TEST(ChunkedPushTest, SameBitsAsUnaryPushes) {
  const dist::PlacementPlan plan = Plan({{"w", kShape}}, 1);
  const Tensor w = Filled(kShape, -1.0f, 1e-6f);
  std::vector<ModelSnapshot> snapshots;
  for (int64_t part_bytes : {int64_t{-1}, int64_t{1} << 20}) {
    auto cluster = TestCluster::Start(1, 1);
    ASSERT_NE(cluster, nullptr);
    auto client = cluster->Client(plan, 0, {}, nullptr, part_bytes);
    PSFLOW_ASSERT_OK(client->Connect());
    PSFLOW_ASSERT_OK(client->Initialize({{"w", &w}}, Adam(0.01f)));
    for (int k = 0; k < 3; ++k) {
      const Tensor g = Gradient(k);
      auto pushed = client->Push({{"w", &g, nullptr}}, k);
      ASSERT_TRUE(pushed.ok()) << pushed.status();
      EXPECT_EQ(pushed->global_step, k + 1);
    }
    auto snapshot = client->PullState();
    ASSERT_TRUE(snapshot.ok()) << snapshot.status();
    snapshots.push_back(*std::move(snapshot));
    EXPECT_EQ(snapshots.back().variables.at(0).updates, 3);
  }
  ExpectSameSnapshot(snapshots[0], snapshots[1], /*num_slots=*/2);
}

// A NaN or Inf in the push's last float (its last chunk) or its first refuses the whole push:
// the values stay as they were, the step does not move; a finite push then applies exactly.
TEST(ChunkedPushTest, ANanInTheLastChunkRefusesTheWholePush) {
  const dist::PlacementPlan plan = Plan({{"w", kShape}}, 1);
  auto cluster = TestCluster::Start(1, 1);
  ASSERT_NE(cluster, nullptr);
  auto client = cluster->Client(plan, 0);
  PSFLOW_ASSERT_OK(client->Connect());
  const Tensor w = Filled(kShape, 1.0f, 1e-6f);
  PSFLOW_ASSERT_OK(client->Initialize({{"w", &w}}, Sgd(0.5f)));
  Tensor g = Gradient(0);
  const int64_t last = g.size() - 1;
  for (int64_t at : {last, int64_t{0}}) {
    const float kept = g[at];
    g[at] = at == 0 ? std::numeric_limits<float>::infinity() : std::numeric_limits<float>::quiet_NaN();
    auto refused = client->Push({{"w", &g, nullptr}}, 0);
    EXPECT_TRUE(absl::IsInvalidArgument(refused.status())) << refused.status();
    EXPECT_THAT(std::string(refused.status().message()), HasSubstr(absl::StrCat("NaN or Inf at element ", at)));
    g[at] = kept;
    Tensor got(kShape);
    auto step = client->Pull({{"w", &got}});
    ASSERT_TRUE(step.ok()) << step.status();
    EXPECT_EQ(*step, 0);
    ExpectEqualTensors(got, w, "after the refused push");
  }
  auto pushed = client->Push({{"w", &g, nullptr}}, 0);
  ASSERT_TRUE(pushed.ok()) << pushed.status();
  EXPECT_EQ(pushed->global_step, 1);
  Tensor got(kShape);
  ASSERT_TRUE(client->Pull({{"w", &got}}).ok());
  int64_t wrong = 0;
  for (int64_t i = 0; i < w.size(); ++i) wrong += got[i] != w[i] - 0.5f * g[i];
  EXPECT_EQ(wrong, 0);
  EXPECT_EQ(cluster->servers[0]->Stats().pushes_refused, 2);
}

}  // namespace
}  // namespace psflow::ps
