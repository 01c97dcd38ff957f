// Tests of table routing against independent computations: TF's shard ranges enumerated from the
// fixed_size_partitioner sizes (dist::ShardRows), round-robin enumeration for mod, splitmix64's
// published outputs for Mix64.
#include "psflow/dist/table_routing.h"

#include <gtest/gtest.h>

#include <limits>
#include <map>
#include <vector>

#include "psflow/dist/partition.h"

namespace psflow::dist {
namespace {

// Brute force: shard p of a div table holds the contiguous range of ids after shards 0..p-1, with
// sizes from the partitioner (the first N % P one longer); shard p of a mod table holds p, p+P, ...
std::vector<RowLocation> BruteForce(int64_t n, int p, TableStrategy strategy) {
  std::vector<RowLocation> where(static_cast<size_t>(n), RowLocation{-1, -1});
  const std::vector<int64_t> sizes = ShardRows(n, p);
  if (strategy == TableStrategy::kDiv) {
    int64_t id = 0;
    for (int s = 0; s < p; ++s) {
      for (int64_t r = 0; r < sizes[s]; ++r) where[id++] = RowLocation{s, r};
    }
  } else {
    std::vector<int64_t> next_row(p, 0);
    for (int64_t id = 0; id < n; ++id) {
      const int s = static_cast<int>(id % p);
      where[id] = RowLocation{s, next_row[s]++};
    }
    for (int s = 0; s < p; ++s) EXPECT_EQ(next_row[s], sizes[s]) << "mod shard sizes differ from partitioner's";
  }
  return where;
}

TEST(TableRoutingTest, FixedMatchesBruteForceForEveryIdWhenNIsNotDivisibleByP) {
  for (TableStrategy strategy : {TableStrategy::kDiv, TableStrategy::kMod}) {
    for (int64_t n : {1, 2, 7, 10, 11, 97, 100, 1000, 1003}) {
      for (int p = 1; p <= 9 && p <= n; ++p) {
        const FixedTableLayout layout{n, p, strategy};
        ASSERT_TRUE(ValidateFixedLayout("t", layout).ok());
        const std::vector<RowLocation> expected = BruteForce(n, p, strategy);
        const std::vector<int64_t> sizes = ShardRows(n, p);
        for (int s = 0; s < p; ++s) EXPECT_EQ(FixedShardRows(layout, s), sizes[s]);
        const FixedShardRouter router(layout);
        for (int64_t id = 0; id < n; ++id) {
          auto got = RouteFixedId("t", layout, id);
          ASSERT_TRUE(got.ok()) << got.status();
          ASSERT_EQ(*got, expected[id]) << TableStrategyName(strategy) << " n=" << n << " p=" << p << " id=" << id;
          EXPECT_EQ(FixedRowId(layout, got->shard, got->row), id);
          ASSERT_EQ(router.ShardOf(id), expected[id].shard) << " n=" << n << " p=" << p << " id=" << id;
        }
        for (int64_t outside :
             {int64_t{-1}, n, n + 1, std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max()}) {
          EXPECT_EQ(router.ShardOf(outside), -1) << outside;
          EXPECT_FALSE(RouteFixedId("t", layout, outside).ok()) << outside;
        }
      }
    }
  }
}

TEST(TableRoutingTest, DivExampleFromTheDesign) {
  // 10 rows over 3 shards: sizes 4, 3, 3 -> ids 0-3, 4-6, 7-9.
  const FixedTableLayout layout{10, 3, TableStrategy::kDiv};
  EXPECT_EQ(*RouteFixedId("t", layout, 3), (RowLocation{0, 3}));
  EXPECT_EQ(*RouteFixedId("t", layout, 4), (RowLocation{1, 0}));
  EXPECT_EQ(*RouteFixedId("t", layout, 9), (RowLocation{2, 2}));
  const FixedTableLayout mod{10, 3, TableStrategy::kMod};
  EXPECT_EQ(*RouteFixedId("t", mod, 9), (RowLocation{0, 3}));
  EXPECT_EQ(*RouteFixedId("t", mod, 5), (RowLocation{2, 1}));
}

TEST(TableRoutingTest, IdsOutsideTheVocabularyAreRefusedNamingTableAndId) {
  const FixedTableLayout layout{100, 3, TableStrategy::kDiv};
  for (int64_t id : {int64_t{-1}, int64_t{100}, int64_t{1} << 40}) {
    auto got = RouteFixedId("user_emb", layout, id);
    ASSERT_FALSE(got.ok());
    EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(got.status().message().find("user_emb"), std::string_view::npos);
    EXPECT_NE(got.status().message().find(std::to_string(id)), std::string_view::npos);
  }
}

TEST(TableRoutingTest, LayoutsWithMoreShardsThanRowsAreRefused) {
  EXPECT_FALSE(ValidateFixedLayout("t", {3, 4, TableStrategy::kDiv}).ok());
  EXPECT_FALSE(ValidateFixedLayout("t", {0, 1, TableStrategy::kMod}).ok());
  EXPECT_FALSE(ValidateFixedLayout("t", {5, 0, TableStrategy::kMod}).ok());
}

TEST(TableRoutingTest, ParseStrategy) {
  EXPECT_EQ(*ParseTableStrategy("div"), TableStrategy::kDiv);
  EXPECT_EQ(*ParseTableStrategy("mod"), TableStrategy::kMod);
  EXPECT_FALSE(ParseTableStrategy("hash").ok());
}

TEST(TableRoutingTest, Mix64IsSplitMix64sFinalizer) {
  // splitmix64 seeded with 0 outputs Mix64(k * 0x9e3779b97f4a7c15) for k = 1, 2, 3 (Vigna's
  // splitmix64.c; the reference values of its published test vectors).
  constexpr uint64_t kGolden = 0x9e3779b97f4a7c15ull;
  EXPECT_EQ(Mix64(kGolden), 0xe220a8397b1dcdafull);
  EXPECT_EQ(Mix64(2 * kGolden), 0x6e789e6aa1b965f4ull);
  EXPECT_EQ(Mix64(3 * kGolden), 0x06c45d188009454full);
  EXPECT_EQ(Mix64(0), 0u);
}

TEST(TableRoutingTest, DynamicRoutingIsMix64ModPAndSpreadsIds) {
  for (int p : {1, 2, 3, 7}) {
    std::map<int, int64_t> counts;
    for (int64_t id = -5000; id < 25000; ++id) {
      const int ps = RouteDynamicId(id, p);
      ASSERT_EQ(ps, static_cast<int>(Mix64(static_cast<uint64_t>(id)) % static_cast<uint64_t>(p)));
      ++counts[ps];
    }
    ASSERT_EQ(static_cast<int>(counts.size()), p);
    for (const auto& [ps, c] : counts) {
      EXPECT_NEAR(static_cast<double>(c), 30000.0 / p, 0.05 * 30000.0 / p) << "ps " << ps;
    }
  }
}

}  // namespace
}  // namespace psflow::dist
