// ps/server/table/table_test_util.h — small builders shared by the table tests.
#ifndef PSFLOW_PS_SERVER_TABLE_TABLE_TEST_UTIL_H_
#define PSFLOW_PS_SERVER_TABLE_TABLE_TEST_UTIL_H_

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "ps/server/table/disk_store.h"
#include "ps/server/table/table_shard.h"

namespace psflow::ps::table::testing {

inline TableConfig FixedConfig(int64_t n, int64_t dim, int shards, dist::TableStrategy strategy, uint64_t seed = 7) {
  TableConfig c;
  c.spec.name = "emb";
  c.spec.dim = dim;
  c.spec.kind = TableKind::kFixed;
  c.spec.num_embeddings = n;
  c.spec.strategy = strategy;
  c.num_shards = shards;
  c.spec.initializer.kind = InitKind::kTruncatedNormal;
  c.spec.initializer.stddev = 0.1f;
  c.spec.initializer.seed = seed;
  return c;
}

inline TableConfig DynamicConfig(int64_t dim, uint64_t seed = 7) {
  TableConfig c;
  c.spec.name = "dyn";
  c.spec.dim = dim;
  c.spec.kind = TableKind::kDynamic;
  c.spec.initializer.kind = InitKind::kTruncatedNormal;
  c.spec.initializer.stddev = 0.1f;
  c.spec.initializer.seed = seed;
  return c;
}

inline SparseRuleConfig Rule(const std::string& name, float lr = 0.1f) {
  SparseRuleConfig r;
  r.optimizer.name = name;
  r.optimizer.learning_rate = lr;
  return r;
}

inline std::unique_ptr<TableShard> MakeOrDie(const TableConfig& config, const SparseRuleConfig& rule, int shard,
                                             int num_ps) {
  auto made = MakeTableShard(config, rule, shard, num_ps);
  EXPECT_TRUE(made.ok()) << made.status();
  return made.ok() ? *std::move(made) : nullptr;
}

// Where a test's shard keeps its rows: a dynamic table in memory or on disk, or a fixed table. Tests
// run over each with a sparse rule (TestWithParam<StorageRule>, named by StorageRuleName).
enum class Storage { kMemory, kDisk, kFixed };
struct StorageRule {
  Storage storage;
  std::string rule;
};
inline std::string StorageRuleName(const ::testing::TestParamInfo<StorageRule>& info) {
  const char* storage[] = {"memory", "disk", "fixed"};
  return std::string(storage[static_cast<int>(info.param.storage)]) + "_" + info.param.rule;
}

// A new empty directory under the test's temporary directory, its name starting with `prefix`.
inline std::string FreshTempDir(const std::string& prefix) {
  static std::atomic<int> n{0};
  const std::filesystem::path p = std::filesystem::path(::testing::TempDir()) /
                                  (prefix + "_" + std::to_string(getpid()) + "_" + std::to_string(n++));
  std::filesystem::remove_all(p);
  std::filesystem::create_directories(p);
  return p.string();
}

// Shard 0 of 1 of `config` under `rule`; Storage::kDisk opens a disk tier with a cache of
// `cache_bytes` and runs of a quarter of that in a fresh directory into `tier` (the caller keeps it
// while the shard lives).
inline std::unique_ptr<TableShard> MakeShardOn(Storage storage, const TableConfig& config, const SparseRuleConfig& rule,
                                               int64_t cache_bytes, std::shared_ptr<DiskTier>* tier) {
  if (storage != Storage::kDisk) return MakeOrDie(config, rule, 0, 1);
  // Runs of a quarter of the cache: misses find rows in the open run, in sealed runs and on disk.
  DiskTierOptions options{FreshTempDir("table_disk"), cache_bytes, 0};
  options.run_bytes = cache_bytes / 4;
  auto opened = DiskTier::Open(options, nullptr);
  EXPECT_TRUE(opened.ok()) << opened.status();
  if (!opened.ok()) return nullptr;
  *tier = *opened;
  auto made = MakeTableShard(config, rule, 0, 1, tier->get());
  EXPECT_TRUE(made.ok()) << made.status();
  return made.ok() ? *std::move(made) : nullptr;
}

// Every shard of a table: a fixed table's P shards, or a dynamic table's share on each of P ps.
inline std::vector<std::unique_ptr<TableShard>> AllShards(TableConfig config, const SparseRuleConfig& rule, int p) {
  std::vector<std::unique_ptr<TableShard>> shards;
  if (config.spec.kind == TableKind::kFixed) config.num_shards = p;
  for (int s = 0; s < p; ++s) shards.push_back(MakeOrDie(config, rule, s, p));
  return shards;
}

// The shard that owns `id` among AllShards(config, rule, p).
inline int Owner(const TableConfig& config, int p, int64_t id) {
  if (config.spec.kind == TableKind::kDynamic) return dist::RouteDynamicId(id, p);
  dist::FixedTableLayout layout = config.layout();
  layout.num_shards = p;
  return dist::RouteFixedId(config.spec.name, layout, id)->shard;
}

// Row `id` gathered from the table's shards.
inline std::vector<float> GatherOne(const std::vector<std::unique_ptr<TableShard>>& shards, int64_t id) {
  const TableConfig& c = shards[0]->config();
  std::vector<float> row(static_cast<size_t>(c.spec.dim));
  const int owner = Owner(c, static_cast<int>(shards.size()), id);
  const int64_t ids[] = {id};
  EXPECT_TRUE(shards[owner]->Gather(ids, absl::MakeSpan(row)).ok());
  return row;
}

}  // namespace psflow::ps::table::testing

#endif  // PSFLOW_PS_SERVER_TABLE_TABLE_TEST_UTIL_H_
