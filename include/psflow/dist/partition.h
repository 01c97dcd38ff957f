// psflow/dist/partition.h — partitioners (how a variable is split into shards along one axis) and
// placement (which ps task holds each shard), with TensorFlow 1.x semantics
// (docs/design.md#partitioners-and-placement):
// fixed_size_partitioner, min_max_variable_partitioner, variable_axis_size_partitioner,
// replica_device_setter's round robin and GreedyLoadBalancingStrategy by bytes.
//
// Pure functions over plain values; a PlacementPlan owns its variables and shards (the pointers that
// ShardsOf / ShardsOn return borrow from the plan and live as long as it is not modified).
// Everything here is safe to call from many threads; a plan is immutable once built.
#ifndef PSFLOW_DIST_PARTITION_H_
#define PSFLOW_DIST_PARTITION_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "psflow/core/tensor.h"
#include "psflow/dist/table_routing.h"
#include "psflow/dist/table_spec.h"

namespace psflow::dist {

// A model variable (float32). Names are unique within a model.
struct VariableSpec {
  std::string name;
  Shape shape;

  bool operator==(const VariableSpec&) const = default;
};

enum class PartitionerKind { kNone, kFixedSize, kMinMax, kVariableAxisSize };

struct PartitionerSpec {
  PartitionerKind kind = PartitionerKind::kNone;
  int num_shards = 1;                   // kFixedSize
  int max_partitions = 1;               // kMinMax
  int64_t min_slice_bytes = 256 << 10;  // kMinMax (TF's min_slice_size)
  int64_t max_shard_bytes = 0;          // kVariableAxisSize
  int axis = 0;                         // the axis split (the flag always gives 0, as TF's defaults)
};

// Parses --partitioner=none|fixed:N|min_max:P[:MIN_SLICE_BYTES]|axis_size:MAX_SHARD_BYTES.
// Byte counts take an optional K, M or G suffix (powers of 1024): "axis_size:4M". "" means none.
// Numbers must be >= 1; anything else is an error naming the flag value and the accepted forms.
absl::StatusOr<PartitionerSpec> ParsePartitioner(std::string_view flag);

// Number of shards of a variable of this shape (TF semantics,
// docs/design.md#partitioners-and-placement), always in 1..dim:
//   none: 1;  fixed:N: min(N, dim);
//   min_max: max(1, min(dim, max_partitions, ceil(total_bytes / min_slice_bytes)));
//   axis_size: ceil(dim / max(1, floor(max_shard_bytes / (total_bytes / dim)))).
// Scalars (rank 0), zero-sized axes and an axis beyond the rank give 1 (never split).
int NumShards(const PartitionerSpec& spec, const Shape& shape);

// Rows per shard along the axis: base dim / n, and the first dim % n shards get one extra row.
// num_shards >= 1 (CHECKed).
std::vector<int64_t> ShardRows(int64_t dim, int num_shards);

enum class PlacementStrategy { kRoundRobin, kGreedy };

// Parses --placement=round_robin|greedy.
absl::StatusOr<PlacementStrategy> ParsePlacement(std::string_view flag);

struct ShardSpec {
  std::string variable;  // the variable's name
  std::string name;      // NAME/part_I when the variable has >1 shard, else NAME
  int shard_index = 0, num_shards = 1, axis = 0;
  int64_t offset = 0;  // first row along axis
  Shape shape;         // the shard's shape
  int ps_task = 0;
  int64_t bytes() const;  // 4 * elements
};

// Embedding tables are declared by TableSpec (psflow/dist/table_spec.h).

// One ps task's part of a table: a fixed table's shard (rows [`rows`, dim], named NAME/part_I, or
// NAME with one shard), or a dynamic table's share on `ps_task` (named NAME; `rows` 0: unknown).
struct TableShardSpec {
  std::string table, name;
  int shard_index = 0, num_shards = 1;
  int64_t rows = 0;
  int ps_task = 0;
};

// A table placed: its spec, its layout (fixed: P shards by the partitioner; dynamic: P = num_ps)
// and its shards in shard order (dynamic: one per ps task, shard_index = ps_task).
struct TablePlacement {
  TableSpec spec;
  FixedTableLayout layout;
  std::vector<TableShardSpec> shards;
};

struct PlacementPlan {
  int num_ps = 0;
  int global_step_ps = 0;               // where global_step lives (created first)
  std::vector<VariableSpec> variables;  // in model order
  std::vector<ShardSpec> shards;        // in creation order (global_step is not among them)
  std::vector<int64_t> bytes_per_ps;    // variable bytes per ps (global_step counts 8 bytes)
  std::vector<int64_t> params_per_ps;   // float parameters per ps (global_step not counted)
  std::vector<TablePlacement> tables;   // in declaration order (PlanTables); not in `variables`

  // The table of that name, or nullptr.
  const TablePlacement* Table(std::string_view name) const;

  // Shards of one variable in shard order; empty for an unknown name.
  std::vector<const ShardSpec*> ShardsOf(const std::string& variable) const;
  // Shards held by one ps task in creation order.
  std::vector<const ShardSpec*> ShardsOn(int ps_task) const;
  // max(bytes_per_ps) / mean(bytes_per_ps): 1.0 is perfect balance.
  double MaxOverMeanBytes() const;
  // Canonical text of the variables ("name[d0,d1]" per line, model order) and its FNV-1a
  // fingerprint: peers compare it to check they build the same model. Independent of partitioning.
  std::string ModelSignature() const;
  uint64_t ModelFingerprint() const;
  // The listing the seeds print (--log_device_placement): global_step first, then one line per shard
  // "NAME [shape] BYTES bytes -> /job:ps/task:N", then one line per table shard with its kind and
  // strategy ("table fixed div", "table dynamic mix64"), then the bytes per ps and the imbalance.
  // The signature lists tables after the variables ("table NAME[dim] fixed:N|dynamic").
  std::string Format() const;
};

// global_step is created first and placed by the same strategy (round robin: counter 0 -> ps 0);
// then the variables in order, every shard advancing the round-robin counter; greedy puts each
// shard on the ps with the least bytes so far, ties to the lowest index. num_ps >= 1, variable names
// unique and dims >= 0 (CHECKed: callers build variables from model code, not from user input).
PlacementPlan PlanPlacement(const std::vector<VariableSpec>& variables, const PartitionerSpec& partitioner,
                            PlacementStrategy strategy, int num_ps);

// Adds `tables` to `plan` (made by PlanPlacement): a fixed table gets NumShards(partitioner,
// [N, dim]) shards (rows by ShardRows), placed by `strategy` after the variables (round robin
// continues the counter; greedy adds each shard's weight bytes, slots not counted); a dynamic one a
// share on every ps task. InvalidArgument, one line naming the table, for: two tables of one name,
// a table named like a variable, or a spec ValidateTableSpec refuses.
absl::Status PlanTables(const std::vector<TableSpec>& tables, const PartitionerSpec& partitioner,
                        PlacementStrategy strategy, PlacementPlan* plan);

}  // namespace psflow::dist

#endif  // PSFLOW_DIST_PARTITION_H_
