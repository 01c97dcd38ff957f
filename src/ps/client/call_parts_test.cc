// The cutting of pushes and pulls into parts (ps/client/call_parts.h), checked against what it must
// guarantee: every element exactly once and in order, no part over the bound, whole tensors and
// shards left whole when they fit.
#include "ps/client/call_parts.h"

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace psflow::ps {
namespace {

dist::ShardSpec ShardOf(const std::string& name, Shape shape) {
  dist::ShardSpec s;
  s.name = name;
  s.shape = std::move(shape);
  return s;
}

// Cuts shards of `sizes` elements with parts of `max_floats` floats and checks the runs.
void CheckPullParts(const std::vector<int64_t>& sizes, int64_t max_floats, int64_t per_element) {
  std::vector<dist::ShardSpec> shards;
  for (size_t i = 0; i < sizes.size(); ++i) shards.push_back(ShardOf(absl::StrCat("s", i), {sizes[i]}));
  std::vector<SliceTarget> targets;
  for (const dist::ShardSpec& s : shards) targets.push_back({{&s, nullptr}, 0, NumElements(s.shape)});
  const auto parts = SplitPullIntoParts(targets, max_floats * 4, per_element);
  size_t shard = 0;
  int64_t next = 0;  // the element of `shard` the next run must start at
  int64_t total = 0;
  for (const std::vector<SliceTarget>& part : parts) {
    ASSERT_FALSE(part.empty());
    int64_t floats = 0;
    for (const SliceTarget& run : part) {
      if (run.target.shard != &shards[shard]) {  // the next shard, once this one is complete
        ASSERT_EQ(next, sizes[shard]) << "shard " << shard << " left incomplete";
        ++shard;
        next = 0;
        ASSERT_LT(shard, shards.size());
        ASSERT_EQ(run.target.shard, &shards[shard]) << "a shard skipped or out of order";
      }
      EXPECT_EQ(run.offset, next);
      next += run.count;
      floats += run.count * per_element;
      total += run.count;
    }
    EXPECT_LE(floats, std::max(max_floats, per_element)) << "a part over the bound";
  }
  EXPECT_EQ(shard, shards.size() - 1);
  EXPECT_EQ(next, sizes.back());
  int64_t expected = 0;
  for (int64_t n : sizes) expected += n;
  EXPECT_EQ(total, expected);
}

TEST(PullPartsTest, EveryElementOnceInOrderAndNoPartOverTheBound) {
  CheckPullParts({10}, 100, 1);                // fits: one part, one run
  CheckPullParts({10, 7, 300, 1, 99}, 16, 1);  // cut across and within shards
  CheckPullParts({10, 7, 300, 1, 99}, 16, 3);  // a checkpoint's pull: values and 2 slots
  CheckPullParts({5, 0, 5}, 4, 1);             // an empty shard
  CheckPullParts({1000}, 1, 1);                // one element per part
}

TEST(PullPartsTest, ShardsThatFitStayWholeInOnePart) {
  const dist::ShardSpec a = ShardOf("a", {4, 2}), b = ShardOf("b", {3});
  const auto parts = SplitPullIntoParts({{{&a, nullptr}, 0, 8}, {{&b, nullptr}, 0, 3}}, 11 * 4);
  ASSERT_EQ(parts.size(), 1u);
  ASSERT_EQ(parts[0].size(), 2u);
  EXPECT_EQ(parts[0][0].count, 8);
  EXPECT_EQ(parts[0][1].count, 3);
}

TEST(PushPartsTest, DenseTensorsAreCutIntoRunsAndSparseOnesTravelWhole) {
  std::vector<float> dense(10, 1.0f), sparse(6, 2.0f);
  rpc::OutgoingTensor d, s;
  d.meta.set_name("d");
  d.meta.add_shape(10);
  d.data = dense.data();
  d.num_floats = 10;
  s.meta.set_name("s");
  s.meta.set_sparse(true);
  s.data = sparse.data();
  s.num_floats = 6;
  const auto parts = SplitIntoParts({d, s}, 4 * 4);
  // d: runs of 4, 4, 2 (the last sharing its part with nothing: s does not fit beside it), s alone.
  ASSERT_EQ(parts.size(), 4u);
  int64_t offset = 0;
  for (size_t p = 0; p < 3; ++p) {
    ASSERT_EQ(parts[p].size(), 1u);
    EXPECT_TRUE(parts[p][0].meta.slice());
    EXPECT_EQ(parts[p][0].meta.slice_offset(), offset);
    EXPECT_EQ(parts[p][0].data, dense.data() + offset);  // no copy
    offset += parts[p][0].num_floats;
  }
  EXPECT_EQ(offset, 10);
  ASSERT_EQ(parts[3].size(), 1u);
  EXPECT_TRUE(parts[3][0].meta.sparse());
  EXPECT_EQ(parts[3][0].num_floats, 6);
}

}  // namespace
}  // namespace psflow::ps
