// The table shard factory and the shared removal trigger (table_shard.h).
#include "ps/server/table/table_shard.h"

#include "absl/strings/str_cat.h"
#include "ps/server/table/dynamic_table.h"
#include "ps/server/table/fixed_table.h"

namespace psflow::ps::table {

int64_t TableShard::MaybeRemove(int64_t global_step) {
  return PassDue(global_step) ? RemoveNow(global_step) : 0;
}

absl::StatusOr<std::unique_ptr<TableShard>> MakeTableShard(const TableConfig& config,
                                                           const SparseRuleConfig& rule_config, int shard,
                                                           int num_ps) {
  if (auto s = ValidateTableConfig(config); !s.ok()) return s;
  absl::StatusOr<SparseRule> rule = SparseRule::Make(rule_config);
  if (!rule.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("table '", config.spec.name, "': ", rule.status().message()));
  }
  if (config.spec.kind == TableKind::kFixed) {
    if (shard < 0 || shard >= config.layout().num_shards) {
      return absl::InvalidArgumentError(absl::StrCat("table '", config.spec.name, "': shard ", shard,
                                                     " is not in [0, ", config.layout().num_shards, ")"));
    }
    return std::make_unique<FixedTableShard>(config, *std::move(rule), shard);
  }
  if (num_ps < 1 || shard < 0 || shard >= num_ps) {
    return absl::InvalidArgumentError(absl::StrCat("table '", config.spec.name, "': ps ", shard,
                                                   " is not in [0, ", num_ps, ")"));
  }
  return std::make_unique<DynamicTableShard>(config, *std::move(rule), shard, num_ps);
}

}  // namespace psflow::ps::table
