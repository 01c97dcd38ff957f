// SessionTables (train/session_tables.h) without a ps: what a Lookup still has to pull, what a Step
// carries, and when the rows a Step prefetched are used — the same ids after a successful call —
// or pulled again (a failed call, other ids, no Prefetch); a prefetch pulled ahead (async).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "train/session_tables.h"

namespace psflow::train {
namespace {

SessionTables TwoTables() {
  dist::TableSpec a, b;
  a.name = "a";
  a.dim = 2;
  b.name = "b";
  b.dim = 3;
  b.kind = dist::TableKind::kDynamic;
  return SessionTables({a, b});
}

std::vector<std::string> Names(const std::vector<ps::TableRowsRef>& refs) {
  std::vector<std::string> names;
  for (const ps::TableRowsRef& r : refs) names.push_back(r.table);
  return names;
}

TEST(SessionTablesUnitTest, LookupDedupsAndPullsEveryTableWithIds) {
  SessionTables tables = TwoTables();
  const std::vector<int64_t> a = {4, 1, 4}, b = {};
  ps::TableStep step;
  tables.StartLookup({a, b}, &step);
  EXPECT_EQ(Names(step.pulls), (std::vector<std::string>{"a"}));  // b has no ids: nothing to pull
  EXPECT_EQ(tables.batch(0).ids, (std::vector<int64_t>{4, 1}));
  EXPECT_EQ(tables.batch(0).index, (std::vector<int64_t>{0, 1, 0}));
  EXPECT_EQ(tables.batch(0).rows.shape(), (Shape{2, 2}));
  EXPECT_EQ(step.pulls[0].rows, &tables.batch(0).rows);
  EXPECT_EQ(tables.batch(1).rows.shape(), (Shape{0, 3}));
}

TEST(SessionTablesUnitTest, PrefetchedRowsAreUsedForTheSameIdsAfterASuccessfulStep) {
  SessionTables tables = TwoTables();
  const std::vector<int64_t> a = {7, 8}, b = {-5};
  ps::TableStep lookup;
  tables.StartLookup({a, b}, &lookup);
  tables.batch(0).grads = Tensor({2, 2}, 1.0f);  // table a pushes; b does not
  tables.Prefetch({std::vector<int64_t>{8, 8, 9}, b});
  ps::TableStep call = tables.StepCall();
  EXPECT_EQ(Names(call.pushes), (std::vector<std::string>{"a"}));
  ASSERT_EQ(Names(call.pulls), (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(*call.pulls[0].ids, (std::vector<int64_t>{8, 9}));
  call.pulls[0].rows->data()[0] = 42.0f;  // the answer fills the prefetch's rows
  tables.EndStep(/*call_ok=*/true);
  EXPECT_TRUE(tables.batch(0).grads.empty());  // consumed

  ps::TableStep next;
  tables.StartLookup({std::vector<int64_t>{8, 9, 9}, std::vector<int64_t>{-5, 6}}, &next);
  EXPECT_EQ(Names(next.pulls), (std::vector<std::string>{"b"}));  // a's rows came with the step; b's ids differ
  EXPECT_EQ(tables.batch(0).rows.data()[0], 42.0f);
  // A prefetch is used once.
  ps::TableStep again;
  tables.StartLookup({std::vector<int64_t>{8, 9}, b}, &again);
  EXPECT_EQ(Names(again.pulls), (std::vector<std::string>{"a", "b"}));
}

TEST(SessionTablesUnitTest, ALookupWithThePrefetchedIdsTakesTheirDedupAndRows) {
  SessionTables tables = TwoTables();
  const std::vector<int64_t> a = {1}, b = {2};
  ps::TableStep lookup;
  tables.StartLookup({a, b}, &lookup);
  const std::vector<int64_t> next_a = {5, 3, 5, 5, 2}, next_b = {9, 9};
  tables.Prefetch({next_a, next_b});
  ps::TableStep call = tables.StepCall();
  ASSERT_EQ(call.pulls.size(), 2u);
  call.pulls[0].rows->data()[4] = 7.0f;  // row of id 2 (unique ids 5, 3, 2), first value
  tables.EndStep(/*call_ok=*/true);
  ps::TableStep next;
  tables.StartLookup({next_a, next_b}, &next);
  EXPECT_TRUE(next.pulls.empty());
  EXPECT_EQ(tables.batch(0).ids, (std::vector<int64_t>{5, 3, 2}));
  EXPECT_EQ(tables.batch(0).index, (std::vector<int64_t>{0, 1, 0, 0, 2}));
  EXPECT_EQ(tables.batch(0).rows.data()[4], 7.0f);
  EXPECT_EQ(tables.batch(1).ids, (std::vector<int64_t>{9}));
  EXPECT_EQ(tables.batch(1).index, (std::vector<int64_t>{0, 0}));
  // Used once: the same ids again are deduped and pulled.
  ps::TableStep again;
  tables.StartLookup({next_a, next_b}, &again);
  EXPECT_EQ(Names(again.pulls), (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(tables.batch(0).index, (std::vector<int64_t>{0, 1, 0, 0, 2}));
}

// The batch given to Prefetch, given again to Lookup element for element, keeps the prefetch's
// deduplication; the same unique ids in another order of examples are deduplicated again (their
// index differs) and still take the prefetched rows.
TEST(SessionTablesUnitTest, LookupOfThePrefetchedBatchKeepsItsDeduplication) {
  SessionTables tables = TwoTables();
  const std::vector<int64_t> a = {3, 3}, b = {1};
  ps::TableStep lookup;
  tables.StartLookup({a, b}, &lookup);
  const std::vector<int64_t> next_a = {6, 5, 6, 7}, next_b = {2, 2};
  tables.Prefetch({next_a, next_b});
  tables.StepCall().pulls[0].rows->data()[0] = 11.0f;
  tables.EndStep(/*call_ok=*/true);
  ps::TableStep next;
  tables.StartLookup({next_a, std::vector<int64_t>{2, 2}}, &next);
  EXPECT_TRUE(next.pulls.empty());
  EXPECT_EQ(tables.batch(0).ids, (std::vector<int64_t>{6, 5, 7}));
  EXPECT_EQ(tables.batch(0).index, (std::vector<int64_t>{0, 1, 0, 2}));
  EXPECT_EQ(tables.batch(0).rows.data()[0], 11.0f);
  EXPECT_EQ(tables.batch(1).ids, (std::vector<int64_t>{2}));
  EXPECT_EQ(tables.batch(1).index, (std::vector<int64_t>{0, 0}));

  // Prefetch again, then look up the same unique ids with the examples in another order.
  tables.Prefetch({next_a, next_b});
  tables.EndStep(/*call_ok=*/true);
  ps::TableStep reordered;
  tables.StartLookup({std::vector<int64_t>{6, 6, 5, 7}, next_b}, &reordered);
  EXPECT_TRUE(reordered.pulls.empty());
  EXPECT_EQ(tables.batch(0).ids, (std::vector<int64_t>{6, 5, 7}));
  EXPECT_EQ(tables.batch(0).index, (std::vector<int64_t>{0, 0, 1, 2}));

  // Other unique ids: deduplicated and pulled.
  tables.Prefetch({next_a, next_b});
  tables.EndStep(/*call_ok=*/true);
  ps::TableStep other;
  tables.StartLookup({std::vector<int64_t>{6, 5, 6, 8}, next_b}, &other);
  EXPECT_EQ(Names(other.pulls), (std::vector<std::string>{"a"}));
  EXPECT_EQ(tables.batch(0).ids, (std::vector<int64_t>{6, 5, 8}));
}

// Prefetch with the caller's deduplication: taken over when it is the ids' DedupIds, refused
// (naming the table, nothing prefetched) when it is not.
TEST(SessionTablesUnitTest, PrefetchTakesTheCallersDeduplicationAfterCheckingIt) {
  SessionTables tables = TwoTables();
  const std::vector<int64_t> a = {9, 4, 9}, b = {5};
  ps::TableStep lookup;
  tables.StartLookup({a, b}, &lookup);
  std::vector<UniqueIds> unique(2);
  DedupIds(a.data(), 3, 1, &unique[0]);
  DedupIds(b.data(), 1, 1, &unique[1]);
  ASSERT_TRUE(tables.Prefetch({a, b}, &unique).ok());
  ps::TableStep call = tables.StepCall();
  ASSERT_EQ(Names(call.pulls), (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(*call.pulls[0].ids, (std::vector<int64_t>{9, 4}));
  tables.EndStep(/*call_ok=*/true);
  ps::TableStep next;
  tables.StartLookup({a, b}, &next);
  EXPECT_TRUE(next.pulls.empty());
  EXPECT_EQ(tables.batch(0).index, (std::vector<int64_t>{0, 1, 0}));

  auto refused = [&](UniqueIds bad) {
    std::vector<UniqueIds> given(2);
    given[0] = std::move(bad);
    DedupIds(b.data(), 1, 1, &given[1]);
    return tables.Prefetch({a, b}, &given);
  };
  const std::vector<UniqueIds> wrong = {
      {{9, 4}, {0, 1}},        // an index too short
      {{4, 9}, {1, 0, 1}},     // not in order of first appearance
      {{9, 4}, {0, 1, 1}},     // example 2's id is not 4
      {{9, 4, 7}, {0, 1, 0}},  // a unique id no example holds
      {{9, 4}, {0, 2, 0}},     // an index out of range
  };
  for (const UniqueIds& w : wrong) {
    absl::Status s = refused(w);
    EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
    EXPECT_NE(s.message().find("table 'a'"), std::string::npos) << s;
  }
  EXPECT_TRUE(tables.StepCall().pulls.empty());  // nothing prefetched by the refused calls
  std::vector<UniqueIds> one(1);
  EXPECT_TRUE(absl::IsInvalidArgument(tables.Prefetch({a, b}, &one)));
}

TEST(SessionTablesUnitTest, AFailedStepLeavesNoPrefetchedRows) {
  SessionTables tables = TwoTables();
  const std::vector<int64_t> a = {1}, b = {2};
  ps::TableStep lookup;
  tables.StartLookup({a, b}, &lookup);
  tables.Prefetch({a, b});
  tables.EndStep(/*call_ok=*/false);
  ps::TableStep next;
  tables.StartLookup({a, b}, &next);
  EXPECT_EQ(Names(next.pulls), (std::vector<std::string>{"a", "b"}));
  EXPECT_TRUE(tables.StepCall().pulls.empty());  // nothing asked any more
}

// Async pull ahead: the prefetch goes in a call of its own (AheadCall), not on the step's call;
// its rows are used when that call succeeded (EndAhead), whatever the step's call did.
TEST(SessionTablesUnitTest, APrefetchPulledAheadLeavesTheStepsCallAndIsValidWhenItsOwnCallWas) {
  for (bool ahead_ok : {true, false}) {
    SessionTables tables = TwoTables();
    const std::vector<int64_t> a = {1, 2}, b = {};
    ps::TableStep lookup;
    tables.StartLookup({a, b}, &lookup);
    tables.batch(0).grads = Tensor({2, 2}, 1.0f);
    tables.Prefetch({std::vector<int64_t>{2, 5, 2}, b});
    ps::TableStep ahead = tables.AheadCall();
    ASSERT_EQ(Names(ahead.pulls), (std::vector<std::string>{"a"}));  // b asked for no ids
    EXPECT_EQ(*ahead.pulls[0].ids, (std::vector<int64_t>{2, 5}));
    EXPECT_TRUE(ahead.pushes.empty());
    EXPECT_TRUE(tables.AheadCall().pulls.empty());  // asked once
    ps::TableStep call = tables.StepCall();
    EXPECT_EQ(Names(call.pushes), (std::vector<std::string>{"a"}));
    EXPECT_TRUE(call.pulls.empty());  // the prefetch is not on the step's call
    ahead.pulls[0].rows->data()[0] = 9.0f;
    tables.EndStep(/*call_ok=*/true);
    tables.EndAhead(ahead_ok);
    ps::TableStep next;
    tables.StartLookup({std::vector<int64_t>{2, 5, 2}, b}, &next);
    if (ahead_ok) {
      EXPECT_TRUE(next.pulls.empty());
      EXPECT_EQ(tables.batch(0).rows.data()[0], 9.0f);
    } else {
      EXPECT_EQ(Names(next.pulls), (std::vector<std::string>{"a"}));
    }
  }
}

TEST(SessionTablesUnitTest, SpecsCarryTheTablesNamesAndTheCountIsChecked) {
  SessionTables tables = TwoTables();
  ASSERT_EQ(tables.size(), 2);
  EXPECT_EQ(tables.specs()[1].name, "b");
  EXPECT_TRUE(tables.CheckCount("Lookup", 2).ok());
  const absl::Status s = tables.CheckCount("Prefetch", 1);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(),
            "Prefetch got ids for 1 tables but the session declares 2; pass one span per table, in "
            "declaration order");
}

// LookupPrefetched's ids: the session's own copy of what the last Prefetch was given, taken with
// its deduplication and rows (no compare needed: the same memory); empty for a table never asked.
TEST(SessionTablesUnitTest, ThePrefetchedIdsAreTheCopyOfWhatPrefetchWasGiven) {
  SessionTables tables = TwoTables();
  EXPECT_TRUE(tables.PrefetchedIds()[0].empty());
  ps::TableStep lookup;
  tables.StartLookup({std::vector<int64_t>{1}, std::vector<int64_t>{2}}, &lookup);
  std::vector<int64_t> next_a = {4, 4, 6}, next_b = {9};
  tables.Prefetch({next_a, next_b});
  tables.StepCall().pulls[0].rows->data()[0] = 3.0f;
  tables.EndStep(/*call_ok=*/true);
  next_a[0] = 5;  // the caller's array changed: the session's copy did not
  const std::vector<absl::Span<const int64_t>> ids = tables.PrefetchedIds();
  EXPECT_EQ(std::vector<int64_t>(ids[0].begin(), ids[0].end()), (std::vector<int64_t>{4, 4, 6}));
  ps::TableStep next;
  tables.StartLookup(ids, &next);
  EXPECT_TRUE(next.pulls.empty());
  EXPECT_EQ(tables.batch(0).ids, (std::vector<int64_t>{4, 6}));
  EXPECT_EQ(tables.batch(0).index, (std::vector<int64_t>{0, 0, 1}));
  EXPECT_EQ(tables.batch(0).rows.data()[0], 3.0f);
}

}  // namespace
}  // namespace psflow::train
