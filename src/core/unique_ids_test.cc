// The dedup of a batch column (psflow/core/unique_ids.h): first-appearance order, each example's
// index, a strided column, an empty batch, and the buffers reused.
#include "psflow/core/unique_ids.h"

#include <gtest/gtest.h>

#include <vector>

namespace psflow {
namespace {

TEST(DedupIdsTest, FirstAppearanceOrderAndIndex) {
  // A [5, 2] batch; column 1 is 7, 3, 7, 9, 3.
  const std::vector<int64_t> batch = {0, 7, 1, 3, 2, 7, 3, 9, 4, 3};
  UniqueIds u;
  DedupIds(batch.data() + 1, 5, 2, &u);
  EXPECT_EQ(u.ids, (std::vector<int64_t>{7, 3, 9}));
  EXPECT_EQ(u.index, (std::vector<int64_t>{0, 1, 0, 2, 1}));
  for (size_t i = 0; i < u.index.size(); ++i) EXPECT_EQ(u.ids[u.index[i]], batch[2 * i + 1]);
}

TEST(DedupIdsTest, ReusedBuffersHoldOnlyTheLastBatch) {
  UniqueIds u;
  const std::vector<int64_t> first = {5, 5, -1, 1LL << 40};
  DedupIds(first.data(), 4, 1, &u);
  EXPECT_EQ(u.ids, (std::vector<int64_t>{5, -1, 1LL << 40}));
  const std::vector<int64_t> second = {2};
  DedupIds(second.data(), 1, 1, &u);
  EXPECT_EQ(u.ids, (std::vector<int64_t>{2}));
  EXPECT_EQ(u.index, (std::vector<int64_t>{0}));
  DedupIds(second.data(), 0, 1, &u);
  EXPECT_TRUE(u.ids.empty());
  EXPECT_TRUE(u.index.empty());
}

}  // namespace
}  // namespace psflow
