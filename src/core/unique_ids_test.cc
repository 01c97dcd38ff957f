// The dedup of a batch column (psflow/core/unique_ids.h): first-appearance order, each example's
// index, a strided column, an empty batch, and the buffers reused.
#include "psflow/core/unique_ids.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <set>
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

TEST(DedupIdsTest, AgreesWithASortedDedupOnManyBatchesOfEverySize) {
  // Many collisions (ids from a small range), spread ids, negative ids, and sizes that grow and
  // shrink the reused table between calls.
  uint64_t x = 12345;
  auto next = [&x] { return x = x * 6364136223846793005ULL + 1442695040888963407ULL; };
  UniqueIds u;
  for (int64_t count : {0, 1, 7, 1024, 3, 5000, 64, 1024, 20000, 2}) {
    for (const int64_t range : {int64_t{5}, int64_t{1000}, int64_t{1} << 62}) {
      std::vector<int64_t> ids(static_cast<size_t>(count));
      for (int64_t& id : ids) id = static_cast<int64_t>(next() % static_cast<uint64_t>(range)) - range / 2;
      DedupIds(ids.data(), count, 1, &u);
      std::set<int64_t> seen;
      std::vector<int64_t> expected;  // in order of first appearance
      for (int64_t id : ids) {
        if (seen.insert(id).second) expected.push_back(id);
      }
      ASSERT_EQ(u.ids, expected) << count << " ids of range " << range;
      ASSERT_EQ(u.index.size(), ids.size());
      for (size_t i = 0; i < ids.size(); ++i) ASSERT_EQ(u.ids[static_cast<size_t>(u.index[i])], ids[i]);
    }
  }
}

}  // namespace
}  // namespace psflow
