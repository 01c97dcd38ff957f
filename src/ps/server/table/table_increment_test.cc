// Save generations (table_shard.h ScanOptions): a full scan and the increments after it, merged in
// order (removed ids first, then rows), give exactly every row a full scan reads at the end — for
// memory and disk dynamic tables (with removals by steps_to_live and max_rows, and ids removed and
// created again) and fixed tables, several sparse rules; an increment holds only the rows pushed
// since the save it follows; a failed (uncommitted) increment makes the next one larger; the
// increments a shard cannot answer are refused.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "ps/server/table/disk_store.h"
#include "ps/server/table/table_shard.h"
#include "ps/server/table/table_test_util.h"

namespace psflow::ps::table {
namespace {

constexpr int64_t kDim = 3;

// A row as a checkpoint stores it.
struct Row {
  std::vector<float> value;
  std::vector<std::vector<float>> slots;
  int64_t last_step = 0, count = 0;
  bool operator==(const Row& o) const {
    auto same = [](const std::vector<float>& a, const std::vector<float>& b) {
      return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
    };
    if (!same(value, o.value) || slots.size() != o.slots.size()) return false;
    for (size_t k = 0; k < slots.size(); ++k) {
      if (!same(slots[k], o.slots[k])) return false;
    }
    return last_step == o.last_step && count == o.count;
  }
};
using Rows = std::map<int64_t, Row>;

// Reads a scan to its end: its rows (checked ascending) and its removed ids.
void ReadAll(RowScan* scan, Rows* rows, std::vector<int64_t>* removed) {
  RowsPart p;
  int64_t last = INT64_MIN;
  bool first = true;
  while (scan->Next(7, &p)) {
    for (size_t i = 0; i < p.ids.size(); ++i) {
      EXPECT_TRUE(first || p.ids[i] > last) << p.ids[i];
      first = false;
      last = p.ids[i];
      Row r;
      r.value.assign(p.values.begin() + i * kDim, p.values.begin() + (i + 1) * kDim);
      for (const auto& s : p.slots) r.slots.emplace_back(s.begin() + i * kDim, s.begin() + (i + 1) * kDim);
      r.last_step = p.last_step[i];
      r.count = p.count[i];
      (*rows)[p.ids[i]] = r;
    }
  }
  EXPECT_TRUE(scan->status().ok()) << scan->status();
  if (removed != nullptr) *removed = scan->removed();
}

Rows Everything(const TableShard& shard) {
  Rows rows;
  ReadAll(shard.Scan().get(), &rows, nullptr);
  return rows;
}

using testing::Storage;
using Case = testing::StorageRule;

class IncrementTest : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    const Case c = GetParam();
    TableConfig config;
    if (c.storage == Storage::kFixed) {
      config = testing::FixedConfig(400, kDim, 1, dist::TableStrategy::kDiv);
    } else {
      config = testing::DynamicConfig(kDim);
      // Removals (by age and by count), admission after 2 pushes, a pass every 5 steps.
      config.spec.lifecycle = {/*admit_after=*/2, /*steps_to_live=*/20, /*max_rows=*/150, /*evict_every=*/5};
    }
    const SparseRuleConfig rule = testing::Rule(c.rule, 0.05f);
    shard_ = testing::MakeShardOn(c.storage, config, rule, 10 * 200, &tier_);  // a cache of a few rows
    ASSERT_NE(shard_, nullptr);
  }

  // Steps [from, to) of pushes of a few ids from 0..399 (hot ids more often); the ids pushed into
  // `pushed`.
  void Push(int64_t from, int64_t to, std::set<int64_t>* pushed) {
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (int64_t step = from; step < to; ++step) {
      std::vector<int64_t> batch;
      while (batch.size() < 1 + rng_() % 6) {
        const int64_t id = std::min<int64_t>(399, static_cast<int64_t>(std::abs(normal(rng_)) * 90));
        if (std::find(batch.begin(), batch.end(), id) == batch.end()) batch.push_back(id);
      }
      std::vector<float> grads(batch.size() * kDim);
      for (float& g : grads) g = normal(rng_);
      ASSERT_TRUE(shard_->Apply(batch, grads, step).ok());
      shard_->MaybeRemove(step);
      pushed->insert(batch.begin(), batch.end());
    }
  }

  absl::StatusOr<std::unique_ptr<RowScan>> Save(int64_t save_id, int64_t changed_since) {
    ScanOptions o;
    o.save_id = save_id;
    o.increment = changed_since >= 0;
    o.changed_since = changed_since;
    o.track_changes = true;
    return shard_->Scan(o);
  }

  std::shared_ptr<DiskTier> tier_;
  std::unique_ptr<TableShard> shard_;
  std::mt19937_64 rng_{5};
};

TEST_P(IncrementTest, FullPlusIncrementsEqualsAFullScan) {
  std::set<int64_t> pushed;
  Push(1, 40, &pushed);
  auto full = Save(1, -1);
  ASSERT_TRUE(full.ok()) << full.status();
  Rows merged;
  ReadAll(full->get(), &merged, nullptr);
  EXPECT_EQ(merged, Everything(*shard_));
  int64_t step = 40, committed = 1;
  bool saw_removal = false, saw_recreated = false;
  pushed.clear();
  for (int64_t save = 2; save <= 8; ++save) {
    Push(step, step + 15, &pushed);
    step += 15;
    auto inc = Save(save, committed);
    ASSERT_TRUE(inc.ok()) << inc.status();
    Rows rows;
    std::vector<int64_t> removed;
    ReadAll(inc->get(), &rows, &removed);
    if (save == 4) continue;  // this increment "fails" (not committed): the next covers it too
    // Only rows pushed since the last committed save (those of the failed save included).
    for (const auto& [id, row] : rows) {
      EXPECT_TRUE(pushed.count(id) > 0) << "save " << save << ": row " << id << " was not pushed";
    }
    EXPECT_TRUE(std::is_sorted(removed.begin(), removed.end()));
    if (GetParam().storage == Storage::kFixed) {
      EXPECT_TRUE(removed.empty());
      EXPECT_EQ(rows.size(), pushed.size());
    }
    pushed.clear();
    // Removed ids first, then the rows.
    for (int64_t id : removed) {
      saw_removal = true;
      if (rows.count(id) > 0) saw_recreated = true;
      merged.erase(id);
    }
    for (auto& [id, row] : rows) merged[id] = row;
    const Rows now = Everything(*shard_);
    ASSERT_EQ(merged.size(), now.size()) << "save " << save;
    EXPECT_TRUE(merged == now) << "save " << save;
    committed = save;
  }
  if (GetParam().storage != Storage::kFixed) {
    EXPECT_TRUE(saw_removal);
    (void)saw_recreated;  // depends on the draw; merged == now covers it when it happens
  }
}

TEST_P(IncrementTest, AnIncrementTheShardCannotAnswerIsRefused) {
  std::set<int64_t> pushed;
  Push(1, 10, &pushed);
  // Never saved: it does not know what changed since save 3.
  auto s = Save(4, 3);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kFailedPrecondition) << s.status();
  EXPECT_NE(s.status().message().find("must be full"), std::string::npos) << s.status();
  ASSERT_TRUE(Save(5, -1).ok());
  // Since a save before the full one it started from: refused.
  EXPECT_EQ(Save(6, 3).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(Save(6, 5).ok());
  // Bad options.
  EXPECT_EQ(Save(7, 9).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Save(-1, -1).status().code(), absl::StatusCode::kInvalidArgument);
  if (GetParam().storage != Storage::kFixed) {
    // A full save without tracking ends the change log: the next increment is refused.
    ScanOptions untracked;
    untracked.save_id = 8;
    ASSERT_TRUE(shard_->Scan(untracked).ok());
    EXPECT_EQ(Save(9, 8).status().code(), absl::StatusCode::kFailedPrecondition);
  }
}

TEST_P(IncrementTest, AnIncrementWithNothingChangedIsEmpty) {
  std::set<int64_t> pushed;
  Push(1, 30, &pushed);
  ASSERT_TRUE(Save(1, -1).ok());
  auto inc = Save(2, 1);
  ASSERT_TRUE(inc.ok());
  Rows rows;
  std::vector<int64_t> removed;
  ReadAll(inc->get(), &rows, &removed);
  EXPECT_TRUE(rows.empty());
  EXPECT_TRUE(removed.empty());
  // A restored row (Load) is a change.
  Rows all = Everything(*shard_);
  ASSERT_FALSE(all.empty());
  const auto& [id, row] = *all.begin();
  RowsPart part;
  part.ids = {id};
  part.values = row.value;
  part.slots = row.slots;
  part.last_step = {row.last_step};
  part.count = {row.count};
  ASSERT_TRUE(shard_->Load(part).ok());
  auto after = Save(3, 2);
  ASSERT_TRUE(after.ok());
  rows.clear();
  ReadAll(after->get(), &rows, nullptr);
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_EQ(rows.begin()->first, id);
}

// An increment reads its rows without admitting them (RowStore::Peek): after a save over changed
// rows that are not cached (and rows in the runs and on disk), the cache holds what it held and its
// counters are as they were, so the hot rows pulled next still hit; the increment holds every row
// changed, as a full scan reads it.
TEST(DiskIncrement, ASaveOfRowsNotCachedLeavesTheCacheAsItWas) {
  std::shared_ptr<DiskTier> tier;
  std::unique_ptr<TableShard> shard = testing::MakeShardOn(Storage::kDisk, testing::DynamicConfig(kDim),
                                                           testing::Rule("adagrad", 0.05f), 10 * 200, &tier);
  ASSERT_NE(shard, nullptr);
  const std::vector<int64_t> hot = {0, 1, 2, 3};
  auto push = [&](const std::vector<int64_t>& ids, int64_t step) {
    std::vector<float> grads(ids.size() * kDim);
    for (size_t i = 0; i < grads.size(); ++i) grads[i] = 0.01f * static_cast<float>(i % 7) - 0.02f;
    ASSERT_TRUE(shard->Apply(ids, grads, step).ok());
  };
  auto cold_pushes = [&](int64_t first_step) {
    for (int64_t b = 0; b < 20; ++b) {
      std::vector<int64_t> ids;
      for (int64_t k = 0; k < 10; ++k) ids.push_back(1000 + b * 10 + k);
      push(ids, first_step + b);
    }
  };
  cold_pushes(1);
  ScanOptions o;
  o.save_id = 1;
  o.track_changes = true;
  auto full = shard->Scan(o);
  ASSERT_TRUE(full.ok()) << full.status();
  Rows saved;
  ReadAll(full->get(), &saved, nullptr);
  ASSERT_EQ(saved.size(), 200u);
  cold_pushes(21);  // every cold row changed; a few of them are in the cache's 20-odd records
  for (int64_t step = 41; step < 45; ++step) push(hot, step);
  const TableStats before = shard->stats();
  const int64_t cached_bytes = tier->cache_bytes_used();
  o.save_id = 2;
  o.increment = true;
  o.changed_since = 1;
  auto inc = shard->Scan(o);
  ASSERT_TRUE(inc.ok()) << inc.status();
  Rows rows;
  ReadAll(inc->get(), &rows, nullptr);
  EXPECT_EQ(rows.size(), 204u);
  const TableStats after = shard->stats();
  EXPECT_EQ(after.cache_hits, before.cache_hits);
  EXPECT_EQ(after.cache_misses, before.cache_misses);
  EXPECT_EQ(after.disk_rows_read, before.disk_rows_read);
  EXPECT_EQ(tier->cache_bytes_used(), cached_bytes);
  // The hot rows are still cached: pulled, each is a hit.
  std::vector<float> out(hot.size() * kDim);
  ASSERT_TRUE(shard->Gather(hot, absl::MakeSpan(out)).ok());
  EXPECT_EQ(shard->stats().cache_misses, before.cache_misses);
  EXPECT_EQ(shard->stats().cache_hits, before.cache_hits + static_cast<int64_t>(hot.size()));
  // The rows as a full scan reads them (nothing was pushed since the increment).
  const Rows now = Everything(*shard);
  ASSERT_EQ(now.size(), rows.size());
  EXPECT_TRUE(now == rows);
}

INSTANTIATE_TEST_SUITE_P(Storages, IncrementTest,
                         ::testing::Values(Case{Storage::kMemory, "sgd"}, Case{Storage::kMemory, "adagrad"},
                                           Case{Storage::kMemory, "adam"}, Case{Storage::kMemory, "ftrl"},
                                           Case{Storage::kDisk, "sgd"}, Case{Storage::kDisk, "adagrad"},
                                           Case{Storage::kDisk, "adam"}, Case{Storage::kFixed, "sgd"},
                                           Case{Storage::kFixed, "adagrad"}, Case{Storage::kFixed, "adam"}),
                         testing::StorageRuleName);

}  // namespace
}  // namespace psflow::ps::table
