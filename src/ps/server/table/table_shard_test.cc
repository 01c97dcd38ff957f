// Table storage: gathers, a wrong size applying nothing, dynamic rows created by gradients only,
// scans in id order and in parts, a save on 1 ps restored on 3 (and back), counters.
#include "ps/server/table/table_shard.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "ps/server/table/row_init.h"
#include "ps/server/table/table_test_util.h"

namespace psflow::ps::table {
namespace {

using testing::AllShards;
using testing::GatherOne;

bool Mentions(const absl::Status& s, const std::string& what) {
  return s.message().find(what) != absl::string_view::npos;
}

TEST(TableShardTest, FixedGatherAnswersItsRows) {
  const TableConfig config = testing::FixedConfig(10, 3, 3, dist::TableStrategy::kDiv);
  auto shard1 = testing::MakeOrDie(config, testing::Rule("sgd"), 1, 3);  // ids 4, 5, 6
  std::vector<float> out(6);
  const int64_t mine[] = {6, 4};
  ASSERT_TRUE(shard1->Gather(mine, absl::MakeSpan(out)).ok());
  const RowInitializer init(config.spec.initializer, config.spec.initializer.seed);
  std::vector<float> six(3), four(3);
  init.Fill(6, six.data(), 3);
  init.Fill(4, four.data(), 3);
  EXPECT_TRUE(std::equal(six.begin(), six.end(), out.begin()));
  EXPECT_TRUE(std::equal(four.begin(), four.end(), out.begin() + 3));

  absl::Status s = shard1->Gather(mine, absl::MakeSpan(out).subspan(0, 5));
  EXPECT_TRUE(Mentions(s, "5 floats for 2 ids of dim 3")) << s;
  EXPECT_EQ(shard1->stats().rows, 3);
  EXPECT_EQ(shard1->stats().rows_gathered, 2);
}

TEST(TableShardTest, AWrongSizeAppliesNothing) {
  for (TableConfig config : {testing::FixedConfig(50, 2, 1, dist::TableStrategy::kMod), testing::DynamicConfig(2)}) {
    auto shard = testing::MakeOrDie(config, testing::Rule("sgd", 1.0f), 0, 1);
    std::vector<std::unique_ptr<TableShard>> one;
    one.push_back(std::move(shard));
    const std::vector<float> a = GatherOne(one, 3), b = GatherOne(one, 4);
    // The ids were checked where they entered the ps (ps/server/ps_tables_test.cc: foreign, out of
    // range, listed twice, NaN or Inf rows); what the shard itself refuses is a wrong size.
    const int64_t ids[] = {3, 4};
    const float g4[] = {1, 1, 1, 1};
    absl::Status s = one[0]->Apply(ids, absl::MakeConstSpan(g4, 3), 1);
    EXPECT_TRUE(Mentions(s, config.spec.name) && Mentions(s, "3 floats")) << s;
    EXPECT_EQ(GatherOne(one, 3), a);
    EXPECT_EQ(GatherOne(one, 4), b);
    EXPECT_EQ(one[0]->stats().rows_pushed, 0);
    if (config.spec.kind == TableKind::kDynamic) {
      EXPECT_EQ(one[0]->stats().rows, 0);
    }
    // A good push then applies: sgd with lr 1 subtracts the gradient.
    const float g[] = {0.5f, -0.5f, 2, 0};
    ASSERT_TRUE(one[0]->Apply(ids, g, 1).ok());
    EXPECT_EQ(GatherOne(one, 3), (std::vector<float>{a[0] - 0.5f, a[1] + 0.5f}));
    EXPECT_EQ(GatherOne(one, 4), (std::vector<float>{b[0] - 2, b[1]}));
    // The next push counts once more.
    ASSERT_TRUE(one[0]->Apply(ids, g, 3).ok());
    EXPECT_EQ(GatherOne(one, 4), (std::vector<float>{b[0] - 4, b[1]}));
    if (config.spec.kind == TableKind::kDynamic) {
      RowsPart part;
      ASSERT_TRUE(one[0]->Scan()->Next(10, &part));
      EXPECT_EQ(part.count, (std::vector<int64_t>{2, 2}));
      EXPECT_EQ(part.last_step, (std::vector<int64_t>{3, 3}));
    }
  }
}

TEST(TableShardTest, DynamicRowsAreCreatedByGradientsNotByReads) {
  auto shards = AllShards(testing::DynamicConfig(4), testing::Rule("adagrad"), 1);
  std::vector<int64_t> ids;
  for (int64_t i = 0; i < 1000; ++i) ids.push_back(i * 1000003 - 77);
  std::vector<float> out(ids.size() * 4);
  ASSERT_TRUE(shards[0]->Gather(ids, absl::MakeSpan(out)).ok());
  EXPECT_EQ(shards[0]->stats().rows, 0);
  std::vector<float> g(ids.size() * 4, 0.1f);
  ASSERT_TRUE(shards[0]->Apply(ids, g, 1).ok());
  const TableStats st = shards[0]->stats();
  EXPECT_EQ(st.rows, 1000);
  EXPECT_EQ(st.admissions, 1000);
  // 1000 records of (1 + 1 slot) * 4 floats at least, in slabs: no more than a slab's worth beyond.
  EXPECT_GE(st.bytes, 1000 * 32);
  EXPECT_LT(st.bytes, 1000 * 32 + (3 << 20));
}

// Rows pushed with some updates, read back by scans in parts of `part_rows`.
std::vector<RowsPart> ScanAll(const TableShard& shard, int64_t part_rows) {
  std::vector<RowsPart> parts;
  auto scan = shard.Scan();
  RowsPart part;
  while (scan->Next(part_rows, &part)) parts.push_back(part);
  return parts;
}

TEST(TableShardTest, ScansReadRowsInIdOrderInPartsAndRestoreOntoAnotherNumberOfPs) {
  for (TableConfig config : {testing::FixedConfig(23, 3, 1, dist::TableStrategy::kDiv),
                             testing::FixedConfig(23, 3, 1, dist::TableStrategy::kMod), testing::DynamicConfig(3)}) {
    SCOPED_TRACE(config.spec.name);
    const SparseRuleConfig rule = testing::Rule("adam");
    auto one = AllShards(config, rule, 1);
    std::vector<int64_t> ids;
    for (int64_t id = 22; id >= 0; id -= 2) ids.push_back(id);
    for (int64_t step = 1; step <= 3; ++step) {
      std::vector<float> g(ids.size() * 3);
      for (size_t i = 0; i < g.size(); ++i) g[i] = static_cast<float>(std::cos(i + step));
      ASSERT_TRUE(one[0]->Apply(ids, g, step).ok());
    }
    const std::vector<RowsPart> parts = ScanAll(*one[0], 5);
    std::vector<int64_t> scanned;
    for (const RowsPart& p : parts) {
      EXPECT_LE(p.ids.size(), 5u);
      scanned.insert(scanned.end(), p.ids.begin(), p.ids.end());
    }
    ASSERT_TRUE(std::is_sorted(scanned.begin(), scanned.end()));
    EXPECT_EQ(scanned.size(), config.spec.kind == TableKind::kFixed ? 23u : ids.size());
    // Restore on 3 ps: each row goes to its owner there; every row, slot and count equal.
    auto three = AllShards(config, rule, 3);
    for (const RowsPart& p : parts) {
      for (int ps = 0; ps < 3; ++ps) {
        RowsPart mine;
        mine.slots.resize(p.slots.size());
        for (size_t i = 0; i < p.ids.size(); ++i) {
          if (testing::Owner(config, 3, p.ids[i]) != ps) continue;
          mine.ids.push_back(p.ids[i]);
          mine.values.insert(mine.values.end(), p.values.begin() + i * 3, p.values.begin() + i * 3 + 3);
          for (size_t k = 0; k < p.slots.size(); ++k) {
            mine.slots[k].insert(mine.slots[k].end(), p.slots[k].begin() + i * 3, p.slots[k].begin() + i * 3 + 3);
          }
          mine.last_step.push_back(p.last_step[i]);
          mine.count.push_back(p.count[i]);
        }
        ASSERT_TRUE(three[ps]->Load(mine).ok());
      }
      // A part routed to the wrong shard is refused by a fixed shard (a single-process trainer loads
      // files without a ps); on a ps both kinds are refused where the rows enter it
      // (ps/server/ps_tables_test.cc).
      if (config.spec.kind == TableKind::kFixed) {
        bool refused = false;
        for (int ps = 0; ps < 3; ++ps) refused |= !three[ps]->Load(p).ok();
        EXPECT_TRUE(refused);
      }
    }
    for (int64_t id = 0; id < 23; ++id) EXPECT_EQ(GatherOne(one, id), GatherOne(three, id)) << id;
    // The same next update on both (adam's per-row counts came along): still equal.
    std::vector<float> g(ids.size() * 3, 0.3f);
    ASSERT_TRUE(one[0]->Apply(ids, g, 4).ok());
    for (int ps = 0; ps < 3; ++ps) {
      std::vector<int64_t> mine;
      for (int64_t id : ids) {
        if (testing::Owner(config, 3, id) == ps) mine.push_back(id);
      }
      ASSERT_TRUE(three[ps]->Apply(mine, absl::MakeConstSpan(g.data(), mine.size() * 3), 4).ok());
    }
    for (int64_t id = 0; id < 23; ++id) EXPECT_EQ(GatherOne(one, id), GatherOne(three, id)) << id;
    // A checkpoint of another dim is refused naming the table.
    RowsPart wrong = parts[0];
    wrong.values.pop_back();
    absl::Status s = one[0]->Load(wrong);
    EXPECT_TRUE(Mentions(s, config.spec.name)) << s;
  }
}

TEST(TableShardTest, BadConfigsAreRefusedNamingTheTable) {
  TableConfig config = testing::DynamicConfig(0);
  EXPECT_TRUE(Mentions(MakeTableShard(config, testing::Rule("sgd"), 0, 1).status(), "dyn"));
  config = testing::FixedConfig(2, 4, 3, dist::TableStrategy::kDiv);  // 3 shards of 2 rows
  EXPECT_TRUE(Mentions(MakeTableShard(config, testing::Rule("sgd"), 0, 3).status(), "emb"));
  config = testing::FixedConfig(20, 4, 2, dist::TableStrategy::kDiv);
  config.spec.lifecycle.max_rows = 5;
  EXPECT_FALSE(MakeTableShard(config, testing::Rule("sgd"), 0, 2).ok());
  config = testing::DynamicConfig(4);
  EXPECT_FALSE(MakeTableShard(config, testing::Rule("sgd"), 2, 2).ok());
}

}  // namespace
}  // namespace psflow::ps::table
