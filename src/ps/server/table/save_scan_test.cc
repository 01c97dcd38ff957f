// A save's scan reads the shard as it was when the scan started while pushes go on
// (scan_snapshot.h, docs/checkpoints.md#saves-beside-training): between every two parts of a full
// scan, and of an increment, pushes change rows already read and rows not read yet, create rows and
// make removal passes due; what the scan returns is exactly the shard at its start (compared with a
// plain scan taken then), for memory and disk dynamic tables and fixed tables under adagrad and
// adam — while the shard itself did change, removal passes included.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "ps/server/table/disk_store.h"
#include "ps/server/table/table_shard.h"
#include "ps/server/table/table_test_util.h"

namespace psflow::ps::table {
namespace {

constexpr int64_t kDim = 3;

// A row as a checkpoint stores it, bit for bit.
struct Row {
  std::vector<float> floats;  // value, then each slot
  int64_t last_step = 0, count = 0;
  bool operator==(const Row& o) const {
    return floats.size() == o.floats.size() &&
           std::memcmp(floats.data(), o.floats.data(), floats.size() * sizeof(float)) == 0 &&
           last_step == o.last_step && count == o.count;
  }
};
using Rows = std::map<int64_t, Row>;

// Appends a part's rows to `rows` (ids ascending across parts).
void Collect(const RowsPart& p, Rows* rows) {
  for (size_t i = 0; i < p.ids.size(); ++i) {
    EXPECT_TRUE(rows->empty() || p.ids[i] > rows->rbegin()->first) << p.ids[i];
    Row r;
    r.floats.assign(p.values.begin() + i * kDim, p.values.begin() + (i + 1) * kDim);
    for (const auto& s : p.slots) r.floats.insert(r.floats.end(), s.begin() + i * kDim, s.begin() + (i + 1) * kDim);
    r.last_step = p.last_step[i];
    r.count = p.count[i];
    (*rows)[p.ids[i]] = r;
  }
}

// A plain scan (no snapshot) to the end: the shard as it stands.
Rows Everything(const TableShard& shard) {
  Rows rows;
  std::unique_ptr<RowScan> scan = shard.Scan();
  RowsPart p;
  while (scan->Next(1000, &p)) Collect(p, &rows);
  EXPECT_TRUE(scan->status().ok()) << scan->status();
  return rows;
}

using testing::Storage;
using Case = testing::StorageRule;

class SaveScanTest : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    const Case c = GetParam();
    TableConfig config;
    if (c.storage == Storage::kFixed) {
      config = testing::FixedConfig(300, kDim, 1, dist::TableStrategy::kDiv);
    } else {
      config = testing::DynamicConfig(kDim);
      // Admission after 2 pushes, removals by age every 5 steps: passes come due during the scans.
      config.spec.lifecycle = {/*admit_after=*/2, /*steps_to_live=*/15, /*max_rows=*/0, /*evict_every=*/5};
    }
    const SparseRuleConfig rule = testing::Rule(c.rule, 0.05f);
    shard_ = testing::MakeShardOn(c.storage, config, rule, 12 * 200, &tier_);  // a cache of a few rows
    ASSERT_NE(shard_, nullptr);
  }

  // Pushes at steps [step_, step_ + n): a few ids of 0..299 each, new ones among them.
  void Push(int n) {
    std::uniform_int_distribution<int64_t> id(0, 299);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (int k = 0; k < n; ++k, ++step_) {
      std::vector<int64_t> batch;
      while (batch.size() < 8) {
        const int64_t i = id(rng_);
        if (std::find(batch.begin(), batch.end(), i) == batch.end()) batch.push_back(i);
      }
      std::vector<float> grads(batch.size() * kDim);
      for (float& g : grads) g = normal(rng_);
      ASSERT_TRUE(shard_->Apply(batch, grads, step_).ok());
      removed_ += shard_->MaybeRemove(step_);
    }
  }

  // Reads `scan` to its end in parts of 9 rows, pushing 3 steps between two parts.
  Rows ReadWhilePushing(RowScan* scan) {
    Rows rows;
    RowsPart p;
    while (scan->Next(9, &p)) {
      Collect(p, &rows);
      Push(3);
    }
    EXPECT_TRUE(scan->status().ok()) << scan->status();
    return rows;
  }

  std::shared_ptr<DiskTier> tier_;
  std::unique_ptr<TableShard> shard_;
  std::mt19937_64 rng_{5};
  int64_t step_ = 1;
  int64_t removed_ = 0;
};

TEST_P(SaveScanTest, AFullScanReadsTheShardAsItWasWhenItStarted) {
  Push(60);
  const Rows at_start = Everything(*shard_);
  ASSERT_GT(at_start.size(), 30u);
  const int64_t removed_before = removed_;
  auto scan = shard_->Scan(ScanOptions{.save_id = 1});
  ASSERT_TRUE(scan.ok()) << scan.status();
  const Rows read = ReadWhilePushing(scan->get());
  EXPECT_TRUE(read == at_start) << "the scan read " << read.size() << " rows, the shard held " << at_start.size()
                                << " at its start";
  scan->reset();
  // The pushes did change the shard meanwhile (so the comparison above could fail).
  EXPECT_FALSE(Everything(*shard_) == at_start);
  // Removal passes ran during the scan (their rows were read as they were at its start).
  if (GetParam().storage != Storage::kFixed) {
    EXPECT_GT(removed_, removed_before);
  }
}

TEST_P(SaveScanTest, AnIncrementReadsTheChangedRowsAsTheyWereWhenItStarted) {
  Push(40);
  auto full = shard_->Scan(ScanOptions{.save_id = 1, .track_changes = true});
  ASSERT_TRUE(full.ok()) << full.status();
  ReadWhilePushing(full->get());
  full->reset();
  Push(10);
  const Rows at_start = Everything(*shard_);
  auto increment =
      shard_->Scan(ScanOptions{.save_id = 2, .increment = true, .changed_since = 1, .track_changes = true});
  ASSERT_TRUE(increment.ok()) << increment.status();
  const Rows read = ReadWhilePushing(increment->get());
  ASSERT_FALSE(read.empty());
  for (const auto& [id, row] : read) {
    ASSERT_TRUE(at_start.count(id)) << "row " << id << " made after the increment started";
    EXPECT_TRUE(row == at_start.at(id)) << "row " << id << " read as it was changed during the scan";
  }
  increment->reset();
  EXPECT_FALSE(Everything(*shard_) == at_start);
}

INSTANTIATE_TEST_SUITE_P(Stores, SaveScanTest,
                         ::testing::Values(Case{Storage::kMemory, "adagrad"}, Case{Storage::kMemory, "adam"},
                                           Case{Storage::kDisk, "adagrad"}, Case{Storage::kDisk, "adam"},
                                           Case{Storage::kFixed, "adagrad"}, Case{Storage::kFixed, "adam"}),
                         testing::StorageRuleName);

}  // namespace
}  // namespace psflow::ps::table
