// Initial values: a function of (seed, id) only; the distributions' moments; equality of every
// row's initial value on 1 and 3 shards / ps tasks, for fixed (div, mod) and dynamic tables.
#include "ps/server/table/row_init.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "ps/server/table/table_test_util.h"

namespace psflow::ps::table {
namespace {

using testing::AllShards;
using testing::GatherOne;

struct Moments {
  double mean = 0, stddev = 0, min = 1e30, max = -1e30;
};

Moments Measure(const InitializerSpec& spec, uint64_t seed, int64_t rows, int64_t dim) {
  const RowInitializer init(spec, seed);
  std::vector<float> row(dim);
  double sum = 0, sq = 0;
  Moments m;
  for (int64_t id = 0; id < rows; ++id) {
    init.Fill(id * 7919 - 1000, row.data(), dim);
    for (float v : row) {
      sum += v;
      sq += static_cast<double>(v) * v;
      m.min = std::min<double>(m.min, v);
      m.max = std::max<double>(m.max, v);
    }
  }
  const double n = static_cast<double>(rows * dim);
  m.mean = sum / n;
  m.stddev = std::sqrt(sq / n - m.mean * m.mean);
  return m;
}

TEST(RowInitTest, DistributionsHaveTheirMoments) {
  InitializerSpec normal;
  normal.kind = InitKind::kNormal;
  normal.mean = 0.5f;
  normal.stddev = 2.0f;
  Moments m = Measure(normal, 1, 20000, 16);  // 320k draws: standard error of the mean 0.0035
  EXPECT_NEAR(m.mean, 0.5, 0.02);
  EXPECT_NEAR(m.stddev, 2.0, 0.02);
  EXPECT_LT(m.min, 0.5 - 4 * 2.0);  // tails exist

  InitializerSpec truncated;
  truncated.kind = InitKind::kTruncatedNormal;
  truncated.stddev = 1.0f;
  m = Measure(truncated, 2, 20000, 16);
  EXPECT_NEAR(m.mean, 0.0, 0.01);
  EXPECT_NEAR(m.stddev, 0.87962566, 0.01);  // sd of N(0,1) truncated to [-2, 2]
  EXPECT_GE(m.min, -2.0);
  EXPECT_LE(m.max, 2.0);

  InitializerSpec uniform;
  uniform.kind = InitKind::kUniform;
  uniform.minval = -3.0f;
  uniform.maxval = 1.0f;
  m = Measure(uniform, 3, 20000, 16);
  EXPECT_NEAR(m.mean, -1.0, 0.01);
  EXPECT_NEAR(m.stddev, 4.0 / std::sqrt(12.0), 0.01);
  EXPECT_GE(m.min, -3.0);
  EXPECT_LT(m.max, 1.0);

  InitializerSpec constant;
  constant.kind = InitKind::kConstant;
  constant.value = 0.25f;
  m = Measure(constant, 4, 10, 8);
  EXPECT_EQ(m.min, 0.25);
  EXPECT_EQ(m.max, 0.25);
  m = Measure(InitializerSpec{.kind = InitKind::kZeros}, 4, 10, 8);
  EXPECT_EQ(m.min, 0.0);
  EXPECT_EQ(m.max, 0.0);
}

TEST(RowInitTest, ValueDependsOnSeedAndIdOnly) {
  InitializerSpec spec;
  spec.kind = InitKind::kNormal;
  const RowInitializer a(spec, 11), b(spec, 11), other_seed(spec, 12);
  std::vector<float> x(8), y(8), z(8), w(8);
  a.Fill(123456789012345, x.data(), 8);
  a.Fill(-5, z.data(), 8);  // another row in between changes nothing
  b.Fill(123456789012345, y.data(), 8);
  EXPECT_EQ(x, y);
  other_seed.Fill(123456789012345, w.data(), 8);
  EXPECT_NE(x, w);
  a.Fill(123456789012346, w.data(), 8);
  EXPECT_NE(x, w);
  // A longer row starts with the shorter one's values (each element is the stream's next draw).
  std::vector<float> longer(16);
  a.Fill(123456789012345, longer.data(), 16);
  EXPECT_TRUE(std::equal(x.begin(), x.end(), longer.begin()));
}

TEST(RowInitTest, ParseInitializer) {
  auto spec = ParseInitializer("truncated_normal:0:0.05");
  ASSERT_TRUE(spec.ok());
  EXPECT_EQ(spec->kind, InitKind::kTruncatedNormal);
  EXPECT_FLOAT_EQ(spec->stddev, 0.05f);
  spec = ParseInitializer("uniform:-1:1");
  ASSERT_TRUE(spec.ok());
  EXPECT_EQ(spec->minval, -1.0f);
  EXPECT_TRUE(ParseInitializer("zeros").ok());
  EXPECT_EQ(ParseInitializer("constant:2")->value, 2.0f);
  for (const char* bad : {"gaussian", "uniform:1:-1", "normal:0", "normal:0:-1", "zeros:1", "constant:nan"}) {
    EXPECT_FALSE(ParseInitializer(bad).ok()) << bad;
  }
}

// The same row values from a table on 1 and on 3 shards (ps tasks): initial values never depend
// on the partitioning, for div, mod and dynamic tables alike, and whichever rows were read before.
TEST(RowInitTest, EqualOnOneAndThreePartitions) {
  const SparseRuleConfig rule = testing::Rule("adagrad");
  for (TableConfig config : {testing::FixedConfig(101, 8, 1, dist::TableStrategy::kDiv),
                             testing::FixedConfig(101, 8, 1, dist::TableStrategy::kMod), testing::DynamicConfig(8)}) {
    auto one = AllShards(config, rule, 1);
    auto three = AllShards(config, rule, 3);
    const RowInitializer init(config.spec.initializer, config.spec.initializer.seed);
    std::vector<float> expected(8);
    for (int64_t id = 100; id >= 0; --id) {  // three reads ids in the opposite order
      init.Fill(id, expected.data(), 8);
      EXPECT_EQ(GatherOne(three, id), expected) << "id " << id;
    }
    for (int64_t id = 0; id <= 100; ++id) EXPECT_EQ(GatherOne(one, id), GatherOne(three, id));
  }
  // A dynamic table's ids may be anything: hashed values, negatives.
  auto one = AllShards(testing::DynamicConfig(4), rule, 1);
  auto three = AllShards(testing::DynamicConfig(4), rule, 3);
  for (int64_t id : {int64_t{-1}, int64_t{1} << 62, int64_t{-7777777777}}) {
    EXPECT_EQ(GatherOne(one, id), GatherOne(three, id));
  }
}

}  // namespace
}  // namespace psflow::ps::table
