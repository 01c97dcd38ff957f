// Row routing of embedding tables (include/psflow/dist/table_routing.h): TF 1.x's embedding_lookup
// formulas for fixed tables, Mix64 for dynamic ones.
#include "psflow/dist/table_routing.h"

#include <algorithm>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "core/check.h"

namespace psflow::dist {

absl::StatusOr<TableStrategy> ParseTableStrategy(std::string_view flag) {
  if (flag == "div") return TableStrategy::kDiv;
  if (flag == "mod") return TableStrategy::kMod;
  return absl::InvalidArgumentError(
      absl::StrCat("partition strategy '", std::string(flag), "' is not one of div, mod"));
}

std::string_view TableStrategyName(TableStrategy strategy) { return strategy == TableStrategy::kDiv ? "div" : "mod"; }

absl::Status ValidateFixedLayout(std::string_view table, const FixedTableLayout& layout) {
  if (layout.num_embeddings < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("table '", std::string(table), "': num_embeddings must be >= 1, got ", layout.num_embeddings));
  }
  if (layout.num_shards < 1 || layout.num_shards > layout.num_embeddings) {
    return absl::InvalidArgumentError(
        absl::StrCat("table '", std::string(table), "': ", layout.num_shards, " shards for ", layout.num_embeddings,
                     " rows; a fixed table needs 1 <= shards <= rows (the partitioner takes min(shards, rows))"));
  }
  return absl::OkStatus();
}

namespace {

// TF's embedding_lookup(partition_strategy="div"): the first N % P shards hold N / P + 1 ids each,
// the others N / P, in order; the first id of `shard`.
int64_t FirstIdOfDivShard(const FixedTableLayout& layout, int shard) {
  const int64_t ipp = layout.num_embeddings / layout.num_shards;
  const int64_t extras = layout.num_embeddings % layout.num_shards;
  return shard < extras ? shard * (ipp + 1) : extras * (ipp + 1) + (shard - extras) * ipp;
}

}  // namespace

absl::StatusOr<RowLocation> RouteFixedId(std::string_view table, const FixedTableLayout& layout, int64_t id) {
  const int shard = FixedShardRouter(layout).ShardOf(id);
  if (shard < 0) {
    return absl::InvalidArgumentError(absl::StrCat("table '", std::string(table), "': id ", id,
                                                   " is outside the vocabulary [0, ", layout.num_embeddings, ")"));
  }
  if (layout.strategy == TableStrategy::kMod) return RowLocation{shard, id / layout.num_shards};
  return RowLocation{shard, id - FirstIdOfDivShard(layout, shard)};
}

int64_t FixedShardRows(const FixedTableLayout& layout, int shard) {
  const int64_t n = layout.num_embeddings;
  const int64_t p = layout.num_shards;
  CHECK(shard >= 0 && shard < p) << "shard " << shard << " of " << p;
  return n / p + (shard < n % p ? 1 : 0);
}

int64_t FixedRowId(const FixedTableLayout& layout, int shard, int64_t row) {
  CHECK(row >= 0 && row < FixedShardRows(layout, shard)) << "row " << row << " of shard " << shard;
  if (layout.strategy == TableStrategy::kMod) return row * layout.num_shards + shard;
  return FirstIdOfDivShard(layout, shard) + row;
}

int RouteDynamicId(int64_t id, int num_ps) {
  CHECK_GE(num_ps, 1);
  return static_cast<int>(Mix64(static_cast<uint64_t>(id)) % static_cast<uint64_t>(num_ps));
}

}  // namespace psflow::dist
