// The table shard factory and the shared removal trigger (table_shard.h).
#include "ps/server/table/table_shard.h"

#include "absl/strings/str_cat.h"
#include "ps/server/table/disk_store.h"
#include "ps/server/table/dynamic_table.h"
#include "ps/server/table/fixed_table.h"

namespace psflow::ps::table {

int64_t TableShard::MaybeRemove(int64_t global_step) { return PassDue(global_step) ? RemoveNow(global_step) : 0; }

absl::StatusOr<std::unique_ptr<TableShard>> MakeTableShard(const TableConfig& config,
                                                           const SparseRuleConfig& rule_config, int shard, int num_ps) {
  if (config.spec.storage == dist::TableStorage::kDisk) {
    return absl::FailedPreconditionError(
        absl::StrCat("table '", config.spec.name,
                     "': storage=disk needs a disk tier, which only ps tasks started with "
                     "--table_dir have (one-process training keeps its tables in memory: use storage=memory)"));
  }
  return MakeTableShard(config, rule_config, shard, num_ps, nullptr);
}

absl::StatusOr<std::unique_ptr<TableShard>> MakeTableShard(const TableConfig& config,
                                                           const SparseRuleConfig& rule_config, int shard, int num_ps,
                                                           DiskTier* disk) {
  if (auto s = ValidateTableConfig(config); !s.ok()) return s;
  absl::StatusOr<SparseRule> rule = SparseRule::Make(rule_config);
  if (!rule.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("table '", config.spec.name, "': ", rule.status().message()));
  }
  if (config.spec.kind == TableKind::kFixed) {
    if (disk != nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("table '", config.spec.name,
                       "' is a fixed table: disk storage holds dynamic tables only (use storage=memory)"));
    }
    if (shard < 0 || shard >= config.layout().num_shards) {
      return absl::InvalidArgumentError(absl::StrCat("table '", config.spec.name, "': shard ", shard, " is not in [0, ",
                                                     config.layout().num_shards, ")"));
    }
    return std::make_unique<FixedTableShard>(config, *std::move(rule), shard);
  }
  if (num_ps < 1 || shard < 0 || shard >= num_ps) {
    return absl::InvalidArgumentError(
        absl::StrCat("table '", config.spec.name, "': ps ", shard, " is not in [0, ", num_ps, ")"));
  }
  const int64_t floats = (1 + rule->num_slots()) * config.spec.dim;
  std::unique_ptr<RowStore> store;
  if (disk != nullptr) {
    absl::StatusOr<std::unique_ptr<DiskRowStore>> opened = disk->OpenTable(config.spec.name, floats);
    if (!opened.ok()) return opened.status();
    store = *std::move(opened);
  } else {
    store = std::make_unique<MemoryRowStore>(floats);
  }
  return std::make_unique<DynamicTableShard>(config, *std::move(rule), shard, num_ps, std::move(store));
}

}  // namespace psflow::ps::table
