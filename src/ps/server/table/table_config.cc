// The ps's check of a table declaration and its rule (table_config.h).
#include "ps/server/table/table_config.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace psflow::ps::table {

absl::StatusOr<InitializerSpec> ParseInitializer(std::string_view flag) { return dist::TableInitializer::Parse(flag); }

SparseRuleConfig RuleForTable(SparseRuleConfig job, const dist::TableSpec& spec) {
  if (!spec.sparse_optimizer.empty()) job.optimizer.name = spec.sparse_optimizer;
  return job;
}

absl::Status ValidateTableConfig(const TableConfig& c) {
  if (absl::Status s = dist::ValidateTableSpec(c.spec); !s.ok()) return s;
  if (c.spec.kind == TableKind::kFixed) {
    if (c.spec.storage == dist::TableStorage::kDisk) {
      return absl::InvalidArgumentError(absl::StrCat(
          "table '", c.spec.name, "' is a fixed table: disk storage holds dynamic tables only (use storage=memory)"));
    }
    if (auto s = dist::ValidateFixedLayout(c.spec.name, c.layout()); !s.ok()) return s;
  }
  return absl::OkStatus();
}

}  // namespace psflow::ps::table
