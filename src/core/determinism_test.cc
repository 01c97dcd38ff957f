// A small conv net, forward and backward: bit-identical when run twice with the same seed and
// thread count, and within float tolerance between 1 and 2 intra-op threads.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <thread>
#include <vector>

#include "psflow/core/init.h"
#include "psflow/core/ops.h"
#include "psflow/core/threading.h"

namespace psflow {
namespace {

struct Result {
  float loss = 0;
  std::vector<Tensor> grads;
};

Result RunSmallConvNet(uint64_t seed) {
  Rng rng(seed);
  const int64_t batch = 16;
  Var x = Constant(init::TruncatedNormal({batch, 12, 12, 3}, 1.0f, rng));
  std::vector<int32_t> labels;
  for (int64_t i = 0; i < batch; ++i) labels.push_back(static_cast<int32_t>(rng.UniformInt(10)));
  const std::vector<Var> params = {
      MakeParameter("conv1/w", init::TruncatedNormal({3, 3, 3, 8}, 0.1f, rng)),
      MakeParameter("conv1/b", init::Constant({8}, 0.1f)),
      MakeParameter("conv2/w", init::GlorotUniform({3, 3, 8, 16}, rng)),
      MakeParameter("fc/w", init::GlorotUniform({64, 10}, rng)),
      MakeParameter("fc/b", init::Zeros({10})),
  };
  Var h = ops::Relu(ops::BiasAdd(ops::Conv2D(x, params[0], 1, 1, ops::Padding::kSame), params[1]));  // 12x12x8
  h = ops::MaxPool(h, 2, 2, 2, 2, ops::Padding::kSame);                                              // 6x6x8
  h = ops::Relu(ops::Conv2D(h, params[2], 2, 2, ops::Padding::kValid));                              // 2x2x16
  h = ops::MaxPool(h, 2, 2, 1, 1, ops::Padding::kSame);                                              // 2x2x16
  h = ops::BiasAdd(ops::MatMul(ops::Flatten(h), params[3]), params[4]);                              // 10
  h = ops::Dropout(h, 0.3f, /*training=*/true, rng);
  Var loss = ops::SoftmaxCrossEntropy(h, labels);
  Backward(loss);
  Result r;
  r.loss = loss->value[0];
  for (const Var& p : params) r.grads.push_back(p->grad);
  return r;
}

bool BitIdentical(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && std::memcmp(a.data(), b.data(), a.bytes()) == 0;
}

class DeterminismTest : public ::testing::Test {
 protected:
  void TearDown() override { SetIntraOpThreads(saved_); }
  int saved_ = IntraOpThreads();
};

TEST_F(DeterminismTest, SameSeedAndThreadsGiveBitIdenticalResults) {
  for (int threads : {1, 2}) {
    SetIntraOpThreads(threads);
    const Result first = RunSmallConvNet(123);
    const Result second = RunSmallConvNet(123);
    EXPECT_EQ(std::memcmp(&first.loss, &second.loss, sizeof(float)), 0) << threads << " threads";
    ASSERT_EQ(first.grads.size(), second.grads.size());
    for (size_t i = 0; i < first.grads.size(); ++i) {
      ASSERT_FALSE(first.grads[i].empty());
      EXPECT_TRUE(BitIdentical(first.grads[i], second.grads[i])) << "param " << i << ", " << threads << " threads";
    }
  }
}

TEST_F(DeterminismTest, OneAndTwoThreadsAgree) {
  SetIntraOpThreads(1);
  const Result one = RunSmallConvNet(99);
  SetIntraOpThreads(2);
  const Result two = RunSmallConvNet(99);
  EXPECT_NEAR(one.loss, two.loss, 1e-5f * (1 + std::abs(one.loss)));
  for (size_t i = 0; i < one.grads.size(); ++i) {
    ASSERT_EQ(one.grads[i].shape(), two.grads[i].shape());
    for (int64_t j = 0; j < one.grads[i].size(); ++j) {
      ASSERT_NEAR(one.grads[i][j], two.grads[i][j], 1e-5f * (1 + std::abs(one.grads[i][j])))
          << "param " << i << "[" << j << "]";
    }
  }
}

TEST_F(DeterminismTest, ConcurrentReplicasMatchSequentialRuns) {
  // Replicas build separate graphs on separate threads (local_replicas); the shared pieces
  // (primitive cache, thread pool, BLAS) must not mix them up.
  SetIntraOpThreads(2);
  const Result want_a = RunSmallConvNet(5);
  const Result want_b = RunSmallConvNet(6);
  for (int round = 0; round < 3; ++round) {
    Result got_a, got_b;
    std::thread ta([&] { got_a = RunSmallConvNet(5); });
    std::thread tb([&] { got_b = RunSmallConvNet(6); });
    ta.join();
    tb.join();
    for (size_t i = 0; i < want_a.grads.size(); ++i) {
      EXPECT_TRUE(BitIdentical(got_a.grads[i], want_a.grads[i])) << "round " << round << ", param " << i;
      EXPECT_TRUE(BitIdentical(got_b.grads[i], want_b.grads[i])) << "round " << round << ", param " << i;
    }
  }
}

TEST_F(DeterminismTest, DifferentSeedsDiffer) {
  SetIntraOpThreads(1);
  EXPECT_NE(RunSmallConvNet(1).loss, RunSmallConvNet(2).loss);
}

}  // namespace
}  // namespace psflow
