// A dynamic row's life cycle with a manual clock of global steps: admission by count, removal by
// age (steps_to_live) and by count (max_rows, least recently updated first, ties lower id), passes
// only every evict_every steps, an evicted id starting again from its initial value. Removal
// selection also checked against a brute-force sort.
#include "ps/server/table/accessor.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>
#include <set>
#include <vector>

#include "ps/server/table/row_init.h"
#include "ps/server/table/table_test_util.h"

namespace psflow::ps::table {
namespace {

using testing::GatherOne;

std::vector<float> Initial(const TableConfig& c, int64_t id) {
  std::vector<float> v(c.spec.dim);
  RowInitializer(c.spec.initializer, c.spec.initializer.seed).Fill(id, v.data(), c.spec.dim);
  return v;
}

// Pushes gradient 1.0 rows for `ids` at `step` (sgd lr 1: an applied row drops by 1 per push).
void Push(TableShard& shard, std::vector<int64_t> ids, int64_t step) {
  std::vector<float> g(ids.size() * shard.config().spec.dim, 1.0f);
  ASSERT_TRUE(shard.Apply(ids, g, step).ok());
}

std::set<int64_t> StoredIds(const TableShard& shard) {
  std::set<int64_t> ids;
  auto scan = shard.Scan();
  RowsPart part;
  while (scan->Next(100, &part)) ids.insert(part.ids.begin(), part.ids.end());
  return ids;
}

TEST(AccessorTest, AdmitAfterCountsPushesAndDropsGradientsUntilTheKth) {
  TableConfig c = testing::DynamicConfig(2);
  c.spec.lifecycle.admit_after = 3;
  std::vector<std::unique_ptr<TableShard>> t;
  t.push_back(testing::MakeOrDie(c, testing::Rule("adam", 0.5f), 0, 1));
  const std::vector<float> init = Initial(c, 42);
  Push(*t[0], {42}, 1);
  Push(*t[0], {42, 7}, 2);
  EXPECT_EQ(GatherOne(t, 42), init);  // two pushes counted, both dropped
  EXPECT_EQ(t[0]->stats().rows, 0);
  EXPECT_EQ(t[0]->stats().pending_ids, 2);
  EXPECT_EQ(t[0]->stats().rows_dropped, 3);
  Push(*t[0], {42}, 3);  // the third: admitted and applied, as adam's first update (t = 1)
  const std::vector<float> after = GatherOne(t, 42);
  // Lazy adam's first step moves each element by lr * sign(g) (up to epsilon): 0.5 down.
  EXPECT_NEAR(after[0], init[0] - 0.5f, 1e-5);
  EXPECT_NEAR(after[1], init[1] - 0.5f, 1e-5);
  const TableStats st = t[0]->stats();
  EXPECT_EQ(st.rows, 1);
  EXPECT_EQ(st.admissions, 1);
  EXPECT_EQ(st.pending_ids, 1);  // id 7 still waits
  auto scan = t[0]->Scan();
  RowsPart part;
  ASSERT_TRUE(scan->Next(10, &part));
  EXPECT_EQ(part.count, (std::vector<int64_t>{3}));
  EXPECT_EQ(part.last_step, (std::vector<int64_t>{3}));
}

TEST(AccessorTest, StepsToLiveRemovesRowsAndPendingCountsNotUpdatedInTheLastSSteps) {
  TableConfig c = testing::DynamicConfig(2);
  c.spec.lifecycle.steps_to_live = 5;
  c.spec.lifecycle.admit_after = 2;
  c.spec.lifecycle.evict_every = 1;
  std::vector<std::unique_ptr<TableShard>> t;
  t.push_back(testing::MakeOrDie(c, testing::Rule("sgd", 1.0f), 0, 1));
  Push(*t[0], {1, 2}, 1);
  Push(*t[0], {1}, 2);     // id 1 admitted at step 2
  Push(*t[0], {3}, 4);     // id 3 pending since step 4
  Push(*t[0], {3, 4}, 5);  // id 3 admitted at 5, id 4 pending
  for (int64_t step = 3; step <= 6; ++step) EXPECT_EQ(t[0]->MaybeRemove(step), step == 6 ? 1 : 0) << step;
  // At 6: id 2's pending count (step 1) expired: 6 - 1 >= 5. Row 1 (step 2) lives until 7.
  EXPECT_EQ(StoredIds(*t[0]), (std::set<int64_t>{1, 3}));
  EXPECT_EQ(t[0]->MaybeRemove(7), 1);
  EXPECT_EQ(StoredIds(*t[0]), (std::set<int64_t>{3}));
  EXPECT_EQ(t[0]->stats().pending_ids, 1);  // id 4
  EXPECT_EQ(t[0]->MaybeRemove(10), 2);      // row 3 (step 5) and pending id 4 (step 5)
  EXPECT_EQ(t[0]->stats().rows, 0);
  EXPECT_EQ(t[0]->stats().evictions, 4);
  // An evicted id starts again: its count from 0, its value from the initial one.
  Push(*t[0], {1}, 11);
  EXPECT_EQ(GatherOne(t, 1), Initial(c, 1));
  Push(*t[0], {1}, 12);
  const std::vector<float> init = Initial(c, 1);
  EXPECT_EQ(GatherOne(t, 1), (std::vector<float>{init[0] - 1, init[1] - 1}));
}

TEST(AccessorTest, MaxRowsKeepsTheMostRecentlyUpdatedDownToNinetyPercentEveryEvictEverySteps) {
  TableConfig c = testing::DynamicConfig(1);
  c.spec.lifecycle.max_rows = 40;  // over 2 ps: 20 each, down to 18
  c.spec.lifecycle.evict_every = 10;
  auto ps0 = testing::MakeOrDie(c, testing::Rule("sgd"), 0, 2);
  std::vector<int64_t> mine;  // ids owned by ps 0, ascending
  for (int64_t id = 0; mine.size() < 25; ++id) {
    if (dist::RouteDynamicId(id, 2) == 0) mine.push_back(id);
  }
  // 24 rows: mine[i] last updated at step 1 + i / 2 (pairs share a step: ties).
  for (size_t i = 0; i < 24; ++i) Push(*ps0, {mine[i]}, 1 + static_cast<int64_t>(i) / 2);
  EXPECT_EQ(ps0->stats().rows, 24);
  EXPECT_EQ(ps0->MaybeRemove(15), 0);  // not a multiple of evict_every
  EXPECT_EQ(ps0->MaybeRemove(20), 6);  // 24 -> 18: the six oldest
  std::set<int64_t> expected(mine.begin() + 6, mine.begin() + 24);
  EXPECT_EQ(StoredIds(*ps0), expected);
  // Ties by step go lower id first.
  Push(*ps0, {mine[24]}, 21);
  ASSERT_EQ(ps0->stats().rows, 19);
  EXPECT_EQ(ps0->RemoveNow(21), 0);  // 19 <= 20: no pass needed
  Push(*ps0, {mine[0]}, 22);         // back from its initial value: 20 rows
  Push(*ps0, {mine[1]}, 22);         // 21 rows > 20 -> 18: remove mine[6..8] (steps 4, 4, 5)
  EXPECT_EQ(ps0->RemoveNow(22), 3);
  expected = std::set<int64_t>(mine.begin() + 9, mine.end());
  expected.insert(mine[0]);
  expected.insert(mine[1]);
  EXPECT_EQ(StoredIds(*ps0), expected);
  // A push with more unique ids than the ps may keep is refused naming the table.
  std::vector<int64_t> many(mine.begin(), mine.begin() + 21);
  std::vector<float> g(21, 1.0f);
  absl::Status s = ps0->Apply(many, g, 23);
  EXPECT_NE(s.message().find("dyn"), std::string_view::npos) << s;
  EXPECT_NE(s.message().find("max_rows"), std::string_view::npos) << s;
}

TEST(AccessorTest, SelectRemovalsMatchesSortingByAgeThenId) {
  TableConfig c = testing::DynamicConfig(1);
  c.spec.lifecycle.max_rows = 301;  // P = 3: cap 101, down to 90
  c.spec.lifecycle.steps_to_live = 50;
  const RowAccessor accessor(c, 3);
  ASSERT_EQ(accessor.row_cap(), 101);
  std::mt19937_64 rng(5);
  for (int trial = 0; trial < 20; ++trial) {
    std::vector<RowAge> rows;
    std::set<int64_t> used;
    const int n = 50 + trial * 10;
    while (static_cast<int>(rows.size()) < n) {
      const int64_t id = static_cast<int64_t>(rng() % 100000) - 50000;
      if (used.insert(id).second) rows.push_back(RowAge{id, static_cast<int64_t>(rng() % 60)});
    }
    const int64_t now = 70;
    // Brute force: drop expired; sort the rest by (last_step, id); drop the first ones to 90.
    std::vector<size_t> expected, live;
    for (size_t i = 0; i < rows.size(); ++i) {
      (now - rows[i].last_step >= 50 ? expected : live).push_back(i);
    }
    std::sort(live.begin(), live.end(), [&](size_t a, size_t b) {
      return std::tie(rows[a].last_step, rows[a].id) < std::tie(rows[b].last_step, rows[b].id);
    });
    if (live.size() > 101) expected.insert(expected.end(), live.begin(), live.end() - 90);
    std::sort(expected.begin(), expected.end());
    EXPECT_EQ(accessor.SelectRemovals(rows, now), expected) << "trial " << trial;
  }
}

// The pass over a large table (a cut from the rows per last step) removes exactly the rows of the
// brute force above, with and without steps_to_live.
TEST(AccessorTest, CutForRemovesTheRowsSelectRemovalsDoes) {
  std::mt19937_64 rng(11);
  for (int64_t steps_to_live : {0, 50}) {
    TableConfig c = testing::DynamicConfig(1);
    c.spec.lifecycle.max_rows = 301;  // P = 3: cap 101, down to 90
    c.spec.lifecycle.steps_to_live = steps_to_live;
    const RowAccessor accessor(c, 3);
    for (int trial = 0; trial < 40; ++trial) {
      std::vector<RowAge> rows;
      std::set<int64_t> used;
      const int n = 20 + trial * 5;
      while (static_cast<int>(rows.size()) < n) {
        const int64_t id = static_cast<int64_t>(rng() % 100000) - 50000;
        if (used.insert(id).second) rows.push_back(RowAge{id, static_cast<int64_t>(rng() % (trial % 2 ? 60 : 4))});
      }
      const int64_t now = 70;
      std::map<int64_t, int64_t> per_step;
      for (const RowAge& r : rows) ++per_step[r.last_step];
      const RowAccessor::Cut cut = accessor.CutFor({per_step.begin(), per_step.end()}, now);
      // The cut's rows: every row older than before_step, and the lowest `ties` ids at it.
      std::vector<int64_t> tied;
      std::vector<size_t> by_cut;
      for (size_t i = 0; i < rows.size(); ++i) {
        if (rows[i].last_step < cut.before_step) by_cut.push_back(i);
        if (rows[i].last_step == cut.before_step) tied.push_back(rows[i].id);
      }
      std::sort(tied.begin(), tied.end());
      ASSERT_LE(cut.ties, static_cast<int64_t>(tied.size()));
      for (size_t i = 0; i < rows.size(); ++i) {
        if (rows[i].last_step == cut.before_step &&
            std::find(tied.begin(), tied.begin() + cut.ties, rows[i].id) != tied.begin() + cut.ties) {
          by_cut.push_back(i);
        }
      }
      std::sort(by_cut.begin(), by_cut.end());
      EXPECT_EQ(by_cut, accessor.SelectRemovals(rows, now)) << "steps_to_live " << steps_to_live << " trial " << trial;
      EXPECT_EQ(cut.count, static_cast<int64_t>(by_cut.size()));
      EXPECT_EQ(accessor.MayRemove(n), steps_to_live > 0 || n > 101);
    }
  }
}

}  // namespace
}  // namespace psflow::ps::table
