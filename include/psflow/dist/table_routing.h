// psflow/dist/table_routing.h — where an embedding table's row lives (docs/tables.md).
// Client and ps both call these: the client to send each id to the ps task that owns it, the ps to
// find the row inside its shard and to refuse ids that are not its own.
//
// Fixed-vocabulary tables [N, dim] are split by the job's partitioner into P shards along axis 0
// (sizes as dist::ShardRows: the first N % P shards one row longer) and route an id in [0, N) as
// TF 1.x's embedding_lookup does:
//   div: ipp = N / P, extras = N % P; shard = max(id / (ipp + 1), (id - extras) / ipp);
//        row = id % (ipp + 1) if shard < extras else (id - extras) % ipp   (contiguous ranges)
//   mod: shard = id % P, row = id / P
// Dynamic (hash-keyed) tables take any int64 id and live on ps task Mix64(id) % P.
//
// Pure functions, safe from any thread.
#ifndef PSFLOW_DIST_TABLE_ROUTING_H_
#define PSFLOW_DIST_TABLE_ROUTING_H_

#include <cstdint>
#include <string_view>

#include "absl/status/statusor.h"

namespace psflow::dist {

enum class TableStrategy { kDiv, kMod };

// Parses "div" or "mod"; anything else is InvalidArgument naming the value and the choices.
absl::StatusOr<TableStrategy> ParseTableStrategy(std::string_view flag);
std::string_view TableStrategyName(TableStrategy strategy);

// A fixed table's geometry: N rows split into P shards by `strategy`.
struct FixedTableLayout {
  int64_t num_embeddings = 0;  // N
  int num_shards = 1;          // P
  TableStrategy strategy = TableStrategy::kDiv;
};

// InvalidArgument naming `table` unless N >= 1 and 1 <= P <= N (the partitioner never makes more
// shards than rows: dist::NumShards is min(shards, N)).
absl::Status ValidateFixedLayout(std::string_view table, const FixedTableLayout& layout);

struct RowLocation {
  int shard = 0;
  int64_t row = 0;  // row inside the shard

  bool operator==(const RowLocation&) const = default;
};

// (shard, row) of `id` in a valid layout; InvalidArgument naming `table` and `id` when id is not in
// [0, N).
absl::StatusOr<RowLocation> RouteFixedId(std::string_view table, const FixedTableLayout& layout, int64_t id);

// RouteFixedId's shard for the loops that route many ids of one layout (the worker's routing of a
// call's ids, the ps's check that they are its own): the layout's divisions done once, then per id
// a range check and at most one division, inline, and no Status. -1 for an id outside [0, N)
// (RouteFixedId says why). The layout must be valid (ValidateFixedLayout).
class FixedShardRouter {
 public:
  explicit FixedShardRouter(const FixedTableLayout& layout)
      : n_(layout.num_embeddings),
        p_(layout.num_shards),
        mod_(layout.strategy == TableStrategy::kMod),
        ipp_(n_ / p_),
        extras_(n_ % p_),
        long_ids_(extras_ == 0 ? 0 : extras_ * (ipp_ + 1)) {}  // extras > 0: ipp + 1 <= N, no overflow

  int ShardOf(int64_t id) const {
    if (id < 0 || id >= n_) return -1;
    if (p_ == 1) return 0;
    if (mod_) return static_cast<int>(id % p_);
    // div: the first `extras` shards hold ipp + 1 ids each (the first long_ids ids), the rest ipp.
    return static_cast<int>(id < long_ids_ ? id / (ipp_ + 1) : extras_ + (id - long_ids_) / ipp_);
  }

 private:
  int64_t n_, p_;
  bool mod_;
  int64_t ipp_, extras_, long_ids_;
};

// Rows held by `shard` (the same under div and mod: N / P, plus one for the first N % P shards).
int64_t FixedShardRows(const FixedTableLayout& layout, int shard);

// The id stored at (shard, row): the inverse of RouteFixedId. Within one shard ids increase with
// the row under both strategies, so a shard read in row order is in id order. Arguments in range
// (CHECKed: callers hold rows of their own shard).
int64_t FixedRowId(const FixedTableLayout& layout, int shard, int64_t row);

// splitmix64's finalizer (Steele, Lea & Flood 2014, as in Vigna's splitmix64.c, without the
// increment): x ^= x >> 30; x *= 0xbf58476d1ce4e5b9; x ^= x >> 27; x *= 0x94d049bb133111eb;
// x ^= x >> 31. A bijection on 64 bits with full avalanche, so hashed ids spread evenly.
constexpr uint64_t Mix64(uint64_t x) {
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// The ps task (in [0, num_ps)) holding dynamic id `id`: Mix64(uint64(id)) % num_ps. num_ps >= 1
// (CHECKed).
int RouteDynamicId(int64_t id, int num_ps);

}  // namespace psflow::dist

#endif  // PSFLOW_DIST_TABLE_ROUTING_H_
