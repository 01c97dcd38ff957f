// A dynamic table on disk does the same arithmetic as in memory (DESIGN §11): for every sparse rule,
// with and without a life cycle (admission, steps_to_live, max_rows), the same pushes give the same
// gathers and bit-identical scans (values, slots, last step, count) with a cache of a few rows, a
// restore of the scan included. And the refusals: a fixed table on disk, a batch larger than the
// cache.
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "ps/server/table/disk_store.h"
#include "ps/server/table/table_shard.h"
#include "ps/server/table/table_test_util.h"

namespace psflow::ps::table {
namespace {

namespace fs = std::filesystem;

std::string FreshDir(const std::string& name) {
  static std::atomic<int> n{0};
  const fs::path p = fs::path(::testing::TempDir()) /
                     ("disk_table_" + std::to_string(getpid()) + "_" + std::to_string(n++) + "_" + name);
  fs::remove_all(p);
  fs::create_directories(p);
  return p.string();
}

// Every row of a shard's scan, in parts of `part` rows.
RowsPart ScanAll(const TableShard& shard, int64_t part) {
  RowsPart all;
  auto scan = shard.Scan();
  RowsPart p;
  while (scan->Next(part, &p)) {
    all.ids.insert(all.ids.end(), p.ids.begin(), p.ids.end());
    all.values.insert(all.values.end(), p.values.begin(), p.values.end());
    all.slots.resize(p.slots.size());
    for (size_t k = 0; k < p.slots.size(); ++k)
      all.slots[k].insert(all.slots[k].end(), p.slots[k].begin(), p.slots[k].end());
    all.last_step.insert(all.last_step.end(), p.last_step.begin(), p.last_step.end());
    all.count.insert(all.count.end(), p.count.begin(), p.count.end());
  }
  EXPECT_TRUE(scan->status().ok()) << scan->status();
  return all;
}

bool SameFloats(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

void ExpectSameRows(const RowsPart& a, const RowsPart& b) {
  EXPECT_EQ(a.ids, b.ids);
  EXPECT_TRUE(SameFloats(a.values, b.values));
  ASSERT_EQ(a.slots.size(), b.slots.size());
  for (size_t k = 0; k < a.slots.size(); ++k) EXPECT_TRUE(SameFloats(a.slots[k], b.slots[k])) << "slot " << k;
  EXPECT_EQ(a.last_step, b.last_step);
  EXPECT_EQ(a.count, b.count);
}

struct Case {
  std::string rule;
  bool lifecycle;
};

class SameArithmeticTest : public ::testing::TestWithParam<Case> {};

TEST_P(SameArithmeticTest, DiskEqualsMemoryBitForBit) {
  const Case c = GetParam();
  TableConfig config = testing::DynamicConfig(5);
  if (c.lifecycle)
    config.spec.lifecycle = {/*admit_after=*/2, /*steps_to_live=*/25, /*max_rows=*/120, /*evict_every=*/7};
  const SparseRuleConfig rule = testing::Rule(c.rule, 0.05f);
  const std::string dir = FreshDir(c.rule);
  constexpr int64_t kCacheRows = 12;
  const int64_t slots = c.rule == "sgd" ? 0 : (c.rule == "momentum" || c.rule == "adagrad") ? 1 : 2;
  // Runs of 3 rows: a miss finds its row in the open run, a sealed run or on disk.
  const int64_t row_bytes = 64 + (1 + slots) * 5 * 4;
  DiskTierOptions options{dir, kCacheRows * row_bytes, 0};
  options.run_bytes = 3 * row_bytes;
  auto tier = DiskTier::Open(options, nullptr);
  ASSERT_TRUE(tier.ok()) << tier.status();
  auto memory = testing::MakeOrDie(config, rule, 0, 1);
  auto made = MakeTableShard(config, rule, 0, 1, tier->get());
  ASSERT_TRUE(made.ok()) << made.status();
  auto disk = *std::move(made);

  std::mt19937_64 rng(11);
  std::vector<int64_t> universe;
  for (int i = 0; i < 300; ++i) universe.push_back(static_cast<int64_t>(rng()));
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int64_t step = 1; step <= 200; ++step) {
    std::vector<int64_t> batch;
    // A skewed draw (hot ids come back often, cold ones leave the cache), unique ids.
    while (batch.size() < 1 + rng() % 10) {
      const int64_t id =
          universe[std::min<size_t>(universe.size() - 1, static_cast<size_t>(std::abs(normal(rng)) * 60))];
      if (std::find(batch.begin(), batch.end(), id) == batch.end()) batch.push_back(id);
    }
    std::vector<float> grads(batch.size() * 5);
    for (float& g : grads) g = normal(rng);
    std::vector<float> from_memory(grads.size()), from_disk(grads.size());
    ASSERT_TRUE(memory->Gather(batch, absl::MakeSpan(from_memory)).ok());
    ASSERT_TRUE(disk->Gather(batch, absl::MakeSpan(from_disk)).ok());
    ASSERT_TRUE(SameFloats(from_memory, from_disk)) << "step " << step;
    ASSERT_TRUE(memory->Apply(batch, grads, step).ok());
    const absl::Status s = disk->Apply(batch, grads, step);
    ASSERT_TRUE(s.ok()) << s;
    EXPECT_EQ(memory->MaybeRemove(step), disk->MaybeRemove(step)) << "step " << step;
  }
  EXPECT_EQ(memory->RemoveNow(201), disk->RemoveNow(201));
  const TableStats m = memory->stats(), d = disk->stats();
  EXPECT_EQ(m.rows, d.rows);
  EXPECT_GT(m.rows, 3 * kCacheRows);  // far more rows than the cache holds
  EXPECT_EQ(m.admissions, d.admissions);
  EXPECT_EQ(m.evictions, d.evictions);
  if (c.lifecycle) {
    EXPECT_GT(d.evictions, 0);
  }
  EXPECT_GT(d.disk_rows_read, 0);
  EXPECT_GT(d.disk_rows_written, 0);
  EXPECT_GT(d.cache_hits, 0);
  EXPECT_STREQ(d.storage, "disk");
  const RowsPart saved = ScanAll(*memory, 17);
  ExpectSameRows(saved, ScanAll(*disk, 17));
  ExpectSameRows(saved, ScanAll(*disk, 1000));

  // A restore into a disk table (in parts, through its small cache): the same rows again, and the
  // same arithmetic after it as the memory table's.
  TableConfig again = config;
  again.spec.name = "restored";
  auto restored = *MakeTableShard(again, rule, 0, 1, tier->get());
  auto restored_memory = testing::MakeOrDie(again, rule, 0, 1);  // no pending counts either
  for (size_t start = 0; start < saved.ids.size(); start += 29) {
    const size_t n = std::min<size_t>(29, saved.ids.size() - start);
    RowsPart part;
    part.ids.assign(saved.ids.begin() + start, saved.ids.begin() + start + n);
    part.values.assign(saved.values.begin() + start * 5, saved.values.begin() + (start + n) * 5);
    part.slots.resize(saved.slots.size());
    for (size_t k = 0; k < saved.slots.size(); ++k) {
      part.slots[k].assign(saved.slots[k].begin() + start * 5, saved.slots[k].begin() + (start + n) * 5);
    }
    part.last_step.assign(saved.last_step.begin() + start, saved.last_step.begin() + start + n);
    part.count.assign(saved.count.begin() + start, saved.count.begin() + start + n);
    ASSERT_TRUE(restored->Load(part).ok());
    ASSERT_TRUE(restored_memory->Load(part).ok());
  }
  ExpectSameRows(saved, ScanAll(*restored, 50));
  std::vector<int64_t> batch(universe.begin(), universe.begin() + 8);
  std::vector<float> grads(batch.size() * 5, 0.5f);
  ASSERT_TRUE(restored_memory->Apply(batch, grads, 202).ok());
  ASSERT_TRUE(restored->Apply(batch, grads, 202).ok());
  ExpectSameRows(ScanAll(*restored_memory, 64), ScanAll(*restored, 64));
}

TEST(DiskTableTest, RefusesAFixedTable) {
  auto tier = DiskTier::Open({FreshDir("fixed"), 1 << 20, 0}, nullptr);
  ASSERT_TRUE(tier.ok());
  auto made = MakeTableShard(testing::FixedConfig(10, 2, 1, dist::TableStrategy::kDiv), testing::Rule("sgd"), 0, 1,
                             tier->get());
  EXPECT_EQ(made.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(made.status().message().find("table 'emb' is a fixed table"), std::string::npos) << made.status();
}

TEST(DiskTableTest, RefusesABatchLargerThanTheCache) {
  const int64_t row_bytes = 64 + 2 * 4 * 4;  // header and meta, w and adagrad's accumulator of dim 4
  auto tier = DiskTier::Open({FreshDir("small"), 3 * row_bytes, 1}, nullptr);
  ASSERT_TRUE(tier.ok());
  TableConfig config = testing::DynamicConfig(4);
  auto shard = *MakeTableShard(config, testing::Rule("adagrad"), 1, 2, tier->get());
  std::vector<int64_t> ids;
  for (int64_t id = 0; ids.size() < 4; ++id) {
    if (dist::RouteDynamicId(id, 2) == 1) ids.push_back(id);
  }
  std::vector<float> rows(ids.size() * 4, 1.0f);
  // A gather goes in runs the cache holds (it changes nothing); a push must hold all its rows.
  EXPECT_TRUE(shard->Gather(ids, absl::MakeSpan(rows)).ok());
  const absl::Status s = shard->Apply(ids, rows, 1);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(s.message().find("ps task 1, table 'dyn': --table_cache_bytes=" + std::to_string(3 * row_bytes) +
                             " holds 3 rows of " + std::to_string(row_bytes) + " bytes but one batch here has 4 rows"),
            std::string::npos)
      << s;
  // The failure is kept: the table answers no more.
  EXPECT_EQ(shard->Gather(absl::MakeSpan(ids).subspan(0, 1), absl::MakeSpan(rows).subspan(0, 4)).code(),
            absl::StatusCode::kResourceExhausted);
}

std::vector<Case> Cases() {
  std::vector<Case> cases;
  for (const char* rule : {"sgd", "momentum", "adagrad", "ftrl", "adam", "rmsprop"}) {
    for (bool lifecycle : {false, true}) cases.push_back({rule, lifecycle});
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(EveryRule, SameArithmeticTest, ::testing::ValuesIn(Cases()),
                         [](const auto& info) { return info.param.rule + (info.param.lifecycle ? "_lifecycle" : ""); });

}  // namespace
}  // namespace psflow::ps::table
