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

absl::StatusOr<RowLocation> RouteFixedId(std::string_view table, const FixedTableLayout& layout, int64_t id) {
  const int64_t n = layout.num_embeddings;
  const int64_t p = layout.num_shards;
  if (id < 0 || id >= n) {
    return absl::InvalidArgumentError(
        absl::StrCat("table '", std::string(table), "': id ", id, " is outside the vocabulary [0, ", n, ")"));
  }
  if (layout.strategy == TableStrategy::kMod) {
    return RowLocation{static_cast<int>(id % p), id / p};
  }
  // TF's embedding_lookup(partition_strategy="div").
  const int64_t ipp = n / p;  // >= 1 for a valid layout
  const int64_t extras = n % p;
  const int64_t shard = std::max(id / (ipp + 1), (id - extras) / ipp);
  const int64_t row = shard < extras ? id % (ipp + 1) : (id - extras) % ipp;
  return RowLocation{static_cast<int>(shard), row};
}

int64_t FixedShardRows(const FixedTableLayout& layout, int shard) {
  const int64_t n = layout.num_embeddings;
  const int64_t p = layout.num_shards;
  CHECK(shard >= 0 && shard < p) << "shard " << shard << " of " << p;
  return n / p + (shard < n % p ? 1 : 0);
}

int64_t FixedRowId(const FixedTableLayout& layout, int shard, int64_t row) {
  CHECK(row >= 0 && row < FixedShardRows(layout, shard)) << "row " << row << " of shard " << shard;
  const int64_t n = layout.num_embeddings;
  const int64_t p = layout.num_shards;
  if (layout.strategy == TableStrategy::kMod) return row * p + shard;
  const int64_t ipp = n / p;
  const int64_t extras = n % p;
  const int64_t first = shard < extras ? shard * (ipp + 1) : extras * (ipp + 1) + (shard - extras) * ipp;
  return first + row;
}

int RouteDynamicId(int64_t id, int num_ps) {
  CHECK_GE(num_ps, 1);
  return static_cast<int>(Mix64(static_cast<uint64_t>(id)) % static_cast<uint64_t>(num_ps));
}

}  // namespace psflow::dist
