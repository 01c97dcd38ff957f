// SessionTables' groups (train/session_tables.h Group; WorkerSession::GroupTables) without a ps:
// grouped tables' rows land in one buffer, each table's at its offset (the pulls write there); a
// Lookup the prefetch served hands the prefetch's buffer over without a copy, one it served in part
// copies those rows in and pulls the rest; a pull ahead writes the next buffer too; misuse refused.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "train/session_tables.h"

namespace psflow::train {
namespace {

// a, b: dim 2 (b dynamic), c: dim 3.
SessionTables ThreeTables() {
  dist::TableSpec a, b, c;
  a.name = "a";
  a.dim = 2;
  b.name = "b";
  b.dim = 2;
  b.kind = dist::TableKind::kDynamic;
  c.name = "c";
  c.dim = 3;
  return SessionTables({a, b, c});
}

std::vector<std::string> Names(const std::vector<ps::TableRowsRef>& refs) {
  std::vector<std::string> names;
  for (const ps::TableRowsRef& r : refs) names.push_back(r.table);
  return names;
}

// Writes `value` + row into every row an answer would fill (what the ps's answer does).
void Answer(const ps::TableStep& step, float value) {
  for (const ps::TableRowsRef& r : step.pulls) {
    const int64_t n = static_cast<int64_t>(r.ids->size());
    float* dest = r.rows != nullptr ? r.rows->data() : r.row_values.data();
    const int64_t dim = static_cast<int64_t>(r.rows != nullptr ? r.rows->dim(1) : r.row_values.size() / n);
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t d = 0; d < dim; ++d) dest[i * dim + d] = value + static_cast<float>((*r.ids)[i]);
    }
  }
}

TEST(SessionTablesGroupTest, RefusesWhatIsNotAGroup) {
  SessionTables tables = ThreeTables();
  EXPECT_TRUE(absl::IsInvalidArgument(tables.Group(1, 2).status()));  // dims 2 and 3
  EXPECT_NE(tables.Group(1, 2).status().message().find("dim 3"), std::string::npos);
  EXPECT_TRUE(absl::IsInvalidArgument(tables.Group(2, 2).status()));  // past the end
  EXPECT_TRUE(absl::IsInvalidArgument(tables.Group(0, 0).status()));
  ASSERT_EQ(*tables.Group(0, 2), 0);
  EXPECT_TRUE(absl::IsInvalidArgument(tables.Group(1, 1).status()));  // b is in group 0
  ps::TableStep step;
  tables.StartLookup({std::vector<int64_t>{1}, std::vector<int64_t>{2}, std::vector<int64_t>{3}}, &step);
  EXPECT_TRUE(absl::IsFailedPrecondition(tables.Group(2, 1).status()));
}

TEST(SessionTablesGroupTest, ALookupPullsEachTableIntoItsPlaceInOneBuffer) {
  SessionTables tables = ThreeTables();
  ASSERT_EQ(*tables.Group(0, 2), 0);
  ps::TableStep step;
  tables.StartLookup({std::vector<int64_t>{4, 1, 4}, std::vector<int64_t>{-7, 8, 9}, std::vector<int64_t>{5}}, &step);
  ASSERT_EQ(Names(step.pulls), (std::vector<std::string>{"c", "a", "b"}));
  const TableGroupBatch& g = tables.group(0);
  EXPECT_EQ(g.offsets, (std::vector<int64_t>{0, 2, 5}));
  ASSERT_EQ(g.rows.shape(), (Shape{5, 2}));
  EXPECT_EQ(step.pulls[1].rows, nullptr);
  EXPECT_EQ(step.pulls[1].row_values.data(), g.rows.data());
  EXPECT_EQ(step.pulls[1].row_values.size(), 4u);
  EXPECT_EQ(step.pulls[2].row_values.data(), g.rows.data() + 4);
  EXPECT_EQ(step.pulls[2].row_values.size(), 6u);
  ASSERT_TRUE(g.has_index);  // 3 ids each: [3, 2], example i's row of a and of b
  EXPECT_EQ(g.index, (std::vector<int64_t>{0, 2, 1, 3, 0, 4}));
  EXPECT_TRUE(tables.batch(0).rows.empty());  // grouped: the rows are the group's
  EXPECT_EQ(tables.batch(0).ids, (std::vector<int64_t>{4, 1}));
  EXPECT_EQ(tables.batch(0).index, (std::vector<int64_t>{0, 1, 0}));
  EXPECT_EQ(tables.batch(2).rows.shape(), (Shape{1, 3}));  // not grouped
  Answer(step, 0.0f);
  EXPECT_EQ(g.rows.data()[2], 1.0f);   // a's id 1
  EXPECT_EQ(g.rows.data()[4], -7.0f);  // b's id -7
}

TEST(SessionTablesGroupTest, APrefetchServingTheWholeGroupHandsItsBufferOver) {
  SessionTables tables = ThreeTables();
  ASSERT_EQ(*tables.Group(0, 2), 0);
  ps::TableStep lookup;
  tables.StartLookup({std::vector<int64_t>{1}, std::vector<int64_t>{2}, std::vector<int64_t>{3}}, &lookup);
  const std::vector<int64_t> a = {6, 6, 5}, b = {7, 8, 7}, c = {1};
  tables.Prefetch({a, b, c});
  const ps::TableStep call = tables.StepCall();
  ASSERT_EQ(Names(call.pulls), (std::vector<std::string>{"a", "b", "c"}));
  const float* prefetched = call.pulls[0].row_values.data();
  EXPECT_EQ(call.pulls[1].row_values.data(), prefetched + 4);  // a's 2 unique rows first
  Answer(call, 100.0f);
  tables.EndStep(/*call_ok=*/true);
  ps::TableStep next;
  tables.StartLookup({a, b, c}, &next);
  EXPECT_TRUE(next.pulls.empty());
  const TableGroupBatch& g = tables.group(0);
  EXPECT_EQ(g.rows.data(), prefetched);  // no copy
  EXPECT_EQ(g.offsets, (std::vector<int64_t>{0, 2, 4}));
  ASSERT_TRUE(g.has_index);  // (made with the prefetch's deduplication)
  EXPECT_EQ(g.index, (std::vector<int64_t>{0, 2, 0, 3, 1, 2}));
  EXPECT_EQ(g.rows.data()[0], 106.0f);
  EXPECT_EQ(g.rows.data()[6], 108.0f);
}

TEST(SessionTablesGroupTest, APrefetchServingPartOfTheGroupIsCopiedAndTheRestPulled) {
  SessionTables tables = ThreeTables();
  ASSERT_EQ(*tables.Group(0, 2), 0);
  ps::TableStep lookup;
  tables.StartLookup({std::vector<int64_t>{1}, std::vector<int64_t>{2}, std::vector<int64_t>{3}}, &lookup);
  const std::vector<int64_t> a = {6, 5}, b = {7, 8, 9}, c = {1};
  tables.Prefetch({a, b, c});
  Answer(tables.StepCall(), 100.0f);
  tables.EndStep(/*call_ok=*/true);
  ps::TableStep next;  // a as prefetched, b other ids
  tables.StartLookup({a, std::vector<int64_t>{3}, c}, &next);
  ASSERT_EQ(Names(next.pulls), (std::vector<std::string>{"b"}));
  const TableGroupBatch& g = tables.group(0);
  ASSERT_EQ(g.rows.shape(), (Shape{3, 2}));
  EXPECT_EQ(next.pulls[0].row_values.data(), g.rows.data() + 4);
  EXPECT_FALSE(g.has_index);  // 2 ids of a, 1 of b
  Answer(next, 0.0f);
  EXPECT_EQ((std::vector<float>(g.rows.data(), g.rows.data() + 6)), (std::vector<float>{106, 106, 105, 105, 3, 3}));
}

TEST(SessionTablesGroupTest, APullAheadFillsTheGroupsNextBuffer) {
  SessionTables tables = ThreeTables();
  ASSERT_EQ(*tables.Group(0, 2), 0);
  ps::TableStep lookup;
  tables.StartLookup({std::vector<int64_t>{1}, std::vector<int64_t>{2}, std::vector<int64_t>{3}}, &lookup);
  const std::vector<int64_t> a = {6}, b = {}, c = {1};
  tables.Prefetch({a, b, c});
  const ps::TableStep ahead = tables.AheadCall();
  ASSERT_EQ(Names(ahead.pulls), (std::vector<std::string>{"a", "c"}));  // b has no ids
  Answer(ahead, 50.0f);
  EXPECT_TRUE(tables.StepCall().pulls.empty());  // pulled already
  tables.EndStep(/*call_ok=*/true);
  tables.EndAhead(/*ok=*/true);  // (the session settles the pull ahead before the next Lookup)
  ps::TableStep next;
  tables.StartLookup({a, b, c}, &next);
  EXPECT_TRUE(next.pulls.empty());
  EXPECT_EQ(tables.group(0).offsets, (std::vector<int64_t>{0, 1, 1}));
  EXPECT_FALSE(tables.group(0).has_index);  // 1 id of a, none of b
  EXPECT_EQ(tables.group(0).rows.data()[1], 56.0f);
}

}  // namespace
}  // namespace psflow::train
