#include "psflow/core/init.h"

#include <gtest/gtest.h>

#include <cmath>

#include "psflow/core/random.h"

namespace psflow {
namespace {

struct Moments {
  double mean, stddev, max_abs;
};

Moments Measure(const Tensor& t) {
  double sum = 0, sum_sq = 0, max_abs = 0;
  for (float v : t.span()) {
    sum += v;
    sum_sq += static_cast<double>(v) * v;
    max_abs = std::max(max_abs, std::abs(static_cast<double>(v)));
  }
  const double mean = sum / t.size();
  return {mean, std::sqrt(sum_sq / t.size() - mean * mean), max_abs};
}

TEST(RngTest, SameSeedSameStreamAndNormalMoments) {
  Rng a(5), b(5);
  for (int i = 0; i < 100; ++i) ASSERT_EQ(a.NextU64(), b.NextU64());
  Rng r(11);
  double sum = 0, sum_sq = 0;
  const int n = 200000;
  for (int i = 0; i < n; ++i) {
    const double z = r.Normal();
    sum += z;
    sum_sq += z * z;
  }
  EXPECT_NEAR(sum / n, 0.0, 0.01);
  EXPECT_NEAR(sum_sq / n, 1.0, 0.01);
}

TEST(RngTest, MixGivesDistinctStreams) {
  EXPECT_NE(Rng::Mix(1, 0), Rng::Mix(1, 1));
  EXPECT_NE(Rng::Mix(1, 0), Rng::Mix(2, 0));
  EXPECT_NE(Rng::Mix(0, 1), Rng::Mix(1, 0));
  EXPECT_EQ(Rng::Mix(3, 4), Rng::Mix(3, 4));
}

TEST(InitTest, TruncatedNormalStaysWithinTwoStddevWithTheTruncatedStd) {
  Rng rng(1);
  const float stddev = 0.1f;
  const Tensor t = init::TruncatedNormal({400, 500}, stddev, rng);
  const Moments m = Measure(t);
  EXPECT_LE(m.max_abs, 2.0 * stddev * (1 + 1e-6));
  EXPECT_GT(m.max_abs, 1.99 * stddev);
  EXPECT_NEAR(m.mean, 0.0, 0.001);
  // A standard normal truncated to [-2, 2] has std sqrt(1 - 4 phi(2) / (2 Phi(2) - 1)) = 0.8796.
  EXPECT_NEAR(m.stddev, 0.8796 * stddev, 0.002 * stddev);
}

TEST(InitTest, GlorotUniformBoundsFromTensorFlowFans) {
  Rng rng(2);
  // Conv filter: fans 5*5*32 = 800 and 5*5*64 = 1600, limit sqrt(6 / 2400) = 0.05.
  const Tensor conv = init::GlorotUniform({5, 5, 32, 64}, rng);
  const Moments mc = Measure(conv);
  EXPECT_LE(mc.max_abs, 0.05);
  EXPECT_GT(mc.max_abs, 0.0499);
  EXPECT_NEAR(mc.stddev, 0.05 / std::sqrt(3.0), 0.0005);
  // Dense: fans 784 and 100.
  const Tensor dense = init::GlorotUniform({784, 100}, rng);
  const double limit = std::sqrt(6.0 / 884.0);
  const Moments md = Measure(dense);
  EXPECT_LE(md.max_abs, limit);
  EXPECT_GT(md.max_abs, 0.999 * limit);
}

TEST(InitTest, ZerosAndConstant) {
  const Tensor z = init::Zeros({3, 2});
  const Tensor c = init::Constant({4}, 0.1f);
  for (float v : z.span()) EXPECT_EQ(v, 0.0f);
  for (float v : c.span()) EXPECT_EQ(v, 0.1f);
  EXPECT_EQ(c.shape(), (Shape{4}));
}

}  // namespace
}  // namespace psflow
