// Regression test, found by fuzz/fuzz_tf_config: NumShards rounded up with (a + b - 1) / b, a
// signed overflow (undefined behaviour) when the flag gives a MIN_SLICE_BYTES near INT64_MAX. Under
// gcc's usual wrapping the result happened to be right, so this test fails only in builds that trap
// on signed overflow (-fsanitize=undefined, -ftrapv) — as the fuzz build does.
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>

#include "psflow/dist/partition.h"

namespace psflow::dist {
namespace {

TEST(PartitionerCeilDivOverflowTest, HugeMinSliceBytesGiveOneShard) {
  for (const char* flag :
       {"min_max:1:9223372036854775807", "min_max:8:9223372036854775807", "min_max:8:9007199254740991K"}) {
    auto spec = ParsePartitioner(flag);
    ASSERT_TRUE(spec.ok()) << flag << ": " << spec.status();
    EXPECT_EQ(NumShards(*spec, {10, 784}), 1) << flag;
    EXPECT_EQ(NumShards(*spec, {int64_t{1} << 30, 64}), 1) << flag;
  }
}

TEST(PartitionerCeilDivOverflowTest, HugeMaxShardBytesGiveOneShard) {
  auto spec = ParsePartitioner("axis_size:9223372036854775807");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(NumShards(*spec, {int64_t{1} << 30, 1}), 1);
}

TEST(PartitionerCeilDivOverflowTest, ExactAndInexactDivisionStillRoundUp) {
  // 1000 x 100 floats = 400000 bytes: 400000 / 100000 = 4 exactly, / 300000 rounds up to 2.
  auto exact = ParsePartitioner("min_max:16:100000");
  auto inexact = ParsePartitioner("min_max:16:300000");
  ASSERT_TRUE(exact.ok() && inexact.ok());
  EXPECT_EQ(NumShards(*exact, {1000, 100}), 4);
  EXPECT_EQ(NumShards(*inexact, {1000, 100}), 2);
}

}  // namespace
}  // namespace psflow::dist
