#include "ps/server/work_queue.h"

#include <algorithm>
#include <map>
#include <set>
#include <utility>

#include "gtest/gtest.h"

namespace psflow::ps {
namespace {

// Two files: a.gz cut in 3, b in 2.
WorkPlan Plan(int64_t epochs = 1, bool shuffle = false, uint64_t seed = 7) {
  WorkPlan plan;
  plan.files = {"/d/a.gz", "/d/b"};
  plan.slices = {{0, 0, 100}, {0, 100, 200}, {0, 200, kWorkSliceToEnd}, {1, 0, 50}, {1, 50, kWorkSliceToEnd}};
  plan.num_epochs = epochs;
  plan.shuffle = shuffle;
  plan.seed = seed;
  return plan;
}

TEST(WorkQueueTest, OrderIsAPermutationOfTheSeedAndEpoch) {
  EXPECT_EQ(WorkOrder(4, false, 1, 3), (std::vector<int>{0, 1, 2, 3}));
  const std::vector<int> a = WorkOrder(50, true, 1, 0);
  std::vector<int> sorted = a;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_EQ(sorted, WorkOrder(50, false, 1, 0));
  EXPECT_EQ(a, WorkOrder(50, true, 1, 0));
  EXPECT_NE(a, WorkOrder(50, true, 1, 1));
  EXPECT_NE(a, WorkOrder(50, true, 2, 0));
  EXPECT_NE(a, sorted);
}

TEST(WorkQueueTest, PlansMustCutEveryFileWhole) {
  EXPECT_TRUE(CheckWorkPlan(Plan()).ok());
  WorkPlan gap = Plan();
  gap.slices[1].begin = 101;
  EXPECT_EQ(CheckWorkPlan(gap).code(), absl::StatusCode::kInvalidArgument);
  WorkPlan short_end = Plan();
  short_end.slices[2].end = 300;
  EXPECT_FALSE(CheckWorkPlan(short_end).ok());
  WorkPlan missing_file = Plan();
  missing_file.slices.resize(3);
  EXPECT_FALSE(CheckWorkPlan(missing_file).ok());
  EXPECT_FALSE(CheckWorkPlan(WorkPlan()).ok());
  WorkPlan no_epochs = Plan();
  no_epochs.num_epochs = 0;
  EXPECT_FALSE(CheckWorkPlan(no_epochs).ok());
}

TEST(WorkQueueTest, NotConfiguredIsRefused) {
  WorkQueue q;
  EXPECT_EQ(q.Next(0, 0, true).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_FALSE(q.State().ok());
}

// Workers asking in turn get every slice of every epoch once, then the end.
TEST(WorkQueueTest, EverySliceOncePerEpochThenTheEnd) {
  WorkQueue q;
  ASSERT_TRUE(q.Configure(Plan(/*epochs=*/3, /*shuffle=*/true), false).ok());
  std::map<int64_t, std::multiset<int>> by_epoch;
  int64_t seq[3] = {0, 0, 0};
  int ends = 0;
  for (int i = 0; ends < 3 && i < 100; ++i) {
    const int w = i % 3;
    const bool fresh = seq[w] == 0;
    auto t = q.Next(w, seq[w]++, fresh);
    ASSERT_TRUE(t.ok()) << t.status();
    if (t->end) {
      ++ends;
      continue;
    }
    by_epoch[t->epoch].insert(t->slice);
    EXPECT_EQ(t->path, Plan().files[Plan().slices[t->slice].file]);
  }
  ASSERT_EQ(by_epoch.size(), 3u);
  for (const auto& [epoch, slices] : by_epoch) EXPECT_EQ(slices, (std::multiset<int>{0, 1, 2, 3, 4})) << epoch;
  EXPECT_TRUE(q.progress().end);
  EXPECT_EQ(q.progress().held, 0);
  EXPECT_EQ(q.progress().handed, 15);
}

TEST(WorkQueueTest, ARetriedCallGetsTheSameAnswer) {
  WorkQueue q;
  ASSERT_TRUE(q.Configure(Plan(), false).ok());
  auto a = q.Next(1, 0, true);
  auto again = q.Next(1, 0, false);
  ASSERT_TRUE(a.ok() && again.ok());
  EXPECT_EQ(a->slice, again->slice);
  auto b = q.Next(1, 1, false);
  ASSERT_TRUE(b.ok());
  EXPECT_NE(a->slice, b->slice);
  EXPECT_EQ(q.progress().handed, 2);
}

// A restarted worker (fresh) gives its predecessor's unfinished slice back: the next caller gets it.
TEST(WorkQueueTest, AFreshWorkerReturnsItsPredecessorsSlice) {
  WorkQueue q;
  ASSERT_TRUE(q.Configure(Plan(), false).ok());
  auto dead = q.Next(1, 0, true);  // worker 1 takes slice 0, then is killed
  ASSERT_TRUE(dead.ok());
  ASSERT_TRUE(q.Next(0, 0, true).ok());  // worker 0 takes slice 1
  auto reborn = q.Next(1, 0, true);      // the new worker 1 process
  ASSERT_TRUE(reborn.ok());
  EXPECT_EQ(reborn->slice, dead->slice);
  EXPECT_EQ(q.progress().returned, 1);
}

// Workers asking in turn each read a run of consecutive slices of one file (a gzip file is then
// inflated about once in all); a worker whose file is done takes a slice that does not sit right
// behind another worker's.
TEST(WorkQueueTest, EachWorkerReadsARunOfOneFile) {
  WorkPlan plan;
  plan.files = {"/d/a.gz", "/d/b.gz"};
  plan.slices = {{0, 0, 10}, {0, 10, 20}, {0, 20, kWorkSliceToEnd}, {1, 0, 10}, {1, 10, 20}, {1, 20, kWorkSliceToEnd}};
  WorkQueue q;
  ASSERT_TRUE(q.Configure(plan, false).ok());
  std::vector<int> got;
  int64_t seq[2] = {0, 0};
  for (int i = 0; i < 6; ++i) {
    const int w = i % 2;
    auto t = q.Next(w, seq[w], seq[w] == 0);
    ++seq[w];
    ASSERT_TRUE(t.ok() && !t->end);
    got.push_back(t->slice);
  }
  EXPECT_EQ(got, (std::vector<int>{0, 3, 1, 4, 2, 5}));  // worker 0 reads a, worker 1 reads b

  // Worker 1 slow: worker 0 reads all of a, then takes b's last slice, not the one right behind
  // worker 1's, and worker 1 goes on with its run.
  WorkQueue slow;
  ASSERT_TRUE(slow.Configure(plan, false).ok());
  EXPECT_EQ(slow.Next(0, 0, true)->slice, 0);
  EXPECT_EQ(slow.Next(1, 0, true)->slice, 3);
  EXPECT_EQ(slow.Next(0, 1, false)->slice, 1);
  EXPECT_EQ(slow.Next(0, 2, false)->slice, 2);
  EXPECT_EQ(slow.Next(0, 3, false)->slice, 5);
  EXPECT_EQ(slow.Next(1, 1, false)->slice, 4);
  EXPECT_TRUE(slow.Next(0, 4, false)->end);
  EXPECT_TRUE(slow.Next(1, 2, false)->end);

  // The state saved with slices taken out of order restores them as taken.
  WorkQueue mid;
  ASSERT_TRUE(mid.Configure(plan, false).ok());
  EXPECT_EQ(mid.Next(0, 0, true)->slice, 0);
  EXPECT_EQ(mid.Next(1, 0, true)->slice, 3);
  EXPECT_EQ(mid.Next(1, 1, false)->slice, 4);  // 3 done
  auto state = mid.State();
  ASSERT_TRUE(state.ok());
  WorkQueue restored;
  ASSERT_TRUE(restored.Restore(*state, true).ok());
  std::multiset<int> after;
  for (int64_t s = 0;; ++s) {
    auto t = restored.Next(0, s, s == 0);
    ASSERT_TRUE(t.ok());
    if (t->end) break;
    after.insert(t->slice);
  }
  EXPECT_EQ(after, (std::multiset<int>{0, 4, 1, 2, 5}));  // the held 0 and 4 again, then the rest
}

// A worker that stops inside its slice (training ended by steps) gives it back: handed next, first
// in line; it then holds nothing, and releasing again changes nothing.
TEST(WorkQueueTest, AReleasedSliceGoesBackFirstInLine) {
  WorkQueue q;
  ASSERT_TRUE(q.Configure(Plan(), false).ok());
  auto stopped = q.Next(1, 0, true);
  ASSERT_TRUE(stopped.ok());
  ASSERT_TRUE(q.Next(0, 0, true).ok());
  q.Release(1, 40, 2);
  EXPECT_EQ(q.progress().held, 1);
  EXPECT_EQ(q.progress().holders, std::vector<int>{0});
  EXPECT_EQ(q.progress().returned, 1);
  EXPECT_EQ(q.progress().examples, 40);
  EXPECT_EQ(q.progress().bad_lines, 2);
  q.Release(1, 40, 2);  // a retried release: nothing more
  q.Release(3);         // a worker holding nothing
  EXPECT_EQ(q.progress().returned, 1);
  EXPECT_EQ(q.progress().examples, 40);
  auto again = q.Next(0, 1, false);  // worker 0's slice is used up: the released one comes first
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->slice, stopped->slice);
  // And the saved state hands it again after a restore too (it was handed and is held now).
  auto state = q.State();
  ASSERT_TRUE(state.ok());
  WorkQueue restored;
  ASSERT_TRUE(restored.Restore(*state, true).ok());
  auto first = restored.Next(2, 0, true);
  ASSERT_TRUE(first.ok());
  EXPECT_EQ(first->slice, stopped->slice);
}

// The state saved mid-epoch restores where it stood; held slices are handed again (at-least-once).
TEST(WorkQueueTest, StateRoundTripGivesHeldSlicesBack) {
  WorkQueue q;
  ASSERT_TRUE(q.Configure(Plan(/*epochs=*/2, /*shuffle=*/true), false).ok());
  std::multiset<std::pair<int64_t, int>> done;
  auto held0 = q.Next(0, 0, true);
  auto held1 = q.Next(1, 0, true);
  auto next0 = q.Next(0, 1, false);  // worker 0's first slice is done
  ASSERT_TRUE(held0.ok() && held1.ok() && next0.ok());
  done.insert({held0->epoch, held0->slice});
  auto state = q.State();
  ASSERT_TRUE(state.ok()) << state.status();

  WorkQueue restored;
  ASSERT_TRUE(restored.Restore(*state, true).ok());
  auto again = restored.State();
  ASSERT_TRUE(again.ok());
  std::multiset<std::pair<int64_t, int>> after;
  for (int64_t seq = 0;; ++seq) {
    auto t = restored.Next(2, seq, seq == 0);
    ASSERT_TRUE(t.ok());
    if (t->end) break;
    after.insert({t->epoch, t->slice});
  }
  // The two held when saved come first, then the rest of both epochs.
  EXPECT_EQ(after.size(), 10u - done.size());
  EXPECT_EQ(after.count({held1->epoch, held1->slice}), 1u);
  EXPECT_EQ(after.count({next0->epoch, next0->slice}), 1u);
  for (const auto& d : done) EXPECT_EQ(after.count(d), 0u);
}

TEST(WorkQueueTest, ARunningQueueIsKeptUnlessReplaced) {
  WorkQueue q;
  ASSERT_TRUE(q.Configure(Plan(), false).ok());
  ASSERT_TRUE(q.Next(0, 0, true).ok());
  ASSERT_TRUE(q.Configure(Plan(), false).ok());  // a restarted chief, same files
  EXPECT_EQ(q.progress().handed, 1);
  WorkPlan other = Plan();
  other.files[1] = "/d/c";
  const absl::Status refused = q.Configure(other, false);
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(refused.message().find("/d/c"), std::string::npos) << refused;
  ASSERT_TRUE(q.Configure(other, true).ok());
  EXPECT_EQ(q.progress().handed, 0);
}

TEST(WorkQueueTest, BadStateIsRefused) {
  WorkQueue q;
  EXPECT_EQ(q.Restore("{", true).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(q.Restore(R"({"version": 9})", true).code(), absl::StatusCode::kInvalidArgument);
  WorkQueue good;
  ASSERT_TRUE(good.Configure(Plan(), false).ok());
  std::string state = *good.State();
  const std::string key = "\"cursor\":0";
  ASSERT_NE(state.find(key), std::string::npos) << state;
  state.replace(state.find(key), key.size(), "\"cursor\":99");
  EXPECT_EQ(q.Restore(state, true).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(q.configured());
}

// The static split (the baseline): worker w takes positions w, w + N, ... of each epoch's order only,
// however fast the others are; the state keeps each worker's place.
TEST(WorkQueueTest, TheStaticSplitGivesEachWorkerItsOwnSlices) {
  WorkPlan plan = Plan(/*epochs=*/2, /*shuffle=*/true);
  plan.split_workers = 2;
  WorkQueue q;
  ASSERT_TRUE(q.Configure(plan, false).ok());
  std::vector<std::pair<int64_t, int>> worker0;
  for (int64_t seq = 0;; ++seq) {  // worker 0 alone, to its end
    auto t = q.Next(0, seq, seq == 0);
    ASSERT_TRUE(t.ok());
    if (t->end) break;
    worker0.push_back({t->epoch, t->slice});
  }
  std::vector<std::pair<int64_t, int>> want;
  for (int64_t e = 0; e < 2; ++e) {
    const std::vector<int> order = WorkOrder(5, true, 7, e);
    for (int p = 0; p < 5; p += 2) want.push_back({e, order[p]});
  }
  EXPECT_EQ(worker0, want);
  auto first = q.Next(1, 0, true);  // worker 1's share is still there
  ASSERT_TRUE(first.ok());
  EXPECT_FALSE(first->end);
  EXPECT_EQ(first->slice, WorkOrder(5, true, 7, 0)[1]);
  WorkQueue restored;
  ASSERT_TRUE(restored.Restore(*q.State(), true).ok());
  auto next = restored.Next(1, 0, true);  // the held slice first (at-least-once), then its next own
  auto after = restored.Next(1, 1, false);
  ASSERT_TRUE(next.ok() && after.ok());
  EXPECT_EQ(next->slice, first->slice);
  EXPECT_EQ(after->slice, WorkOrder(5, true, 7, 0)[3]);
}

}  // namespace
}  // namespace psflow::ps
