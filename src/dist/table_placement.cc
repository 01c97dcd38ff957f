// psflow/dist/table_placement.cc — embedding tables in the placement plan (PlanTables, the
// listing's and the signature's table lines): where each fixed table's shards go, and the
// dynamic tables' shares (docs/tables.md).
#include <algorithm>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "dist/next_ps.h"
#include "psflow/dist/partition.h"

namespace psflow::dist {
namespace {

constexpr int64_t kFloatBytes = 4;

absl::Status BadTable(const TableSpec& t, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat("table '", t.name, "': ", why));
}

}  // namespace

const TablePlacement* PlacementPlan::Table(std::string_view name) const {
  for (const TablePlacement& t : tables) {
    if (t.spec.name == name) return &t;
  }
  return nullptr;
}

absl::Status PlanTables(const std::vector<TableSpec>& tables, const PartitionerSpec& partitioner,
                        PlacementStrategy strategy, PlacementPlan* plan) {
  std::set<std::string> names;
  for (const VariableSpec& v : plan->variables) names.insert(v.name);
  for (const TablePlacement& t : plan->tables) names.insert(t.spec.name);
  for (const TableSpec& t : tables) {
    if (absl::Status s = ValidateTableSpec(t); !s.ok()) return s;
    if (!names.insert(t.name).second) {
      return BadTable(t, "declared twice (or named like a variable): give each table and variable its own name");
    }
  }
  // Round robin continues the counter PlanPlacement left: global_step and every shard advanced it.
  int64_t counter = 1 + static_cast<int64_t>(plan->shards.size());
  for (const TablePlacement& t : plan->tables) {
    if (!t.spec.dynamic()) counter += static_cast<int64_t>(t.shards.size());
  }
  for (const TableSpec& spec : tables) {
    TablePlacement placed;
    placed.spec = spec;
    if (spec.dynamic()) {
      placed.layout.num_shards = plan->num_ps;
      for (int p = 0; p < plan->num_ps; ++p) {
        placed.shards.push_back({spec.name, spec.name, p, plan->num_ps, 0, p});
      }
    } else {
      const int n = std::max(1, NumShards(partitioner, {spec.num_embeddings, spec.dim}));
      placed.layout = {spec.num_embeddings, n, spec.strategy};
      for (int i = 0; i < n; ++i) {
        TableShardSpec shard;
        shard.table = spec.name;
        shard.name = n > 1 ? absl::StrCat(spec.name, "/part_", i) : spec.name;
        shard.shard_index = i;
        shard.num_shards = n;
        shard.rows = FixedShardRows(placed.layout, i);
        shard.ps_task = NextPs(strategy, counter, plan->bytes_per_ps);
        plan->bytes_per_ps[shard.ps_task] += shard.rows * spec.dim * kFloatBytes;
        plan->params_per_ps[shard.ps_task] += shard.rows * spec.dim;
        placed.shards.push_back(std::move(shard));
      }
    }
    plan->tables.push_back(std::move(placed));
  }
  return absl::OkStatus();
}

// Table lines of the listing and the signature (partition.cc's Format and ModelSignature call these).
std::string FormatTables(const PlacementPlan& plan) {
  std::string out;
  for (const TablePlacement& t : plan.tables) {
    for (const TableShardSpec& s : t.shards) {
      if (t.spec.dynamic()) {
        absl::StrAppendFormat(&out, "%-32s %-14s %16s -> /job:ps/task:%d (table dynamic mix64(id)%%%d)\n", s.name,
                              absl::StrCat("[?,", t.spec.dim, "]"), "rows on demand", s.ps_task, plan.num_ps);
      } else {
        absl::StrAppendFormat(&out, "%-32s %-14s %10d bytes -> /job:ps/task:%d (table fixed %s, %d rows)\n", s.name,
                              absl::StrCat("[", s.rows, ",", t.spec.dim, "]"), s.rows * t.spec.dim * kFloatBytes,
                              s.ps_task, std::string(TableStrategyName(t.layout.strategy)).c_str(), s.rows);
      }
    }
  }
  return out;
}

std::string TablesSignature(const PlacementPlan& plan) {
  std::string out;
  for (const TablePlacement& t : plan.tables) {
    absl::StrAppend(&out, "table ", t.spec.name, "[", t.spec.dim, "] ",
                    t.spec.dynamic() ? "dynamic" : absl::StrCat("fixed:", t.spec.num_embeddings), "\n");
  }
  return out;
}

}  // namespace psflow::dist
