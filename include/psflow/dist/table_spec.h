// psflow/dist/table_spec.h — an embedding table declared in one type (docs/tables.md): TableSpec,
// what every layer reads — the C++ session (train/session.h), Python's psflow.torch.Embedding /
// EmbeddingBag (through the binding), the placement plan (partition.h), the wire
// (ps/common/wire_config.h) and the ps's table shards. A table has a kind (fixed [N, dim] routed
// by div/mod, or dynamic hash-keyed), a parsed initializer (distribution, parameters, seed: a row's
// initial value depends only on these and the id), a dynamic row's life cycle, an optional update
// rule of its own and a storage tier.
//
// The defaults live in one place: TableSpec's member initializers. TableFields() lists the fields a
// user sets by name (name, help, text form, default taken from TableSpec{}); Python's keyword
// arguments and psflow train's --table_* flags (train/flags.cc) are made from it, so a new field
// is one member, one row there and its wire field (wire_config_test.cc fails until the wire
// carries it).
//
// Plain values and pure functions; safe to copy and call from any thread.
#ifndef PSFLOW_DIST_TABLE_SPEC_H_
#define PSFLOW_DIST_TABLE_SPEC_H_

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "psflow/dist/table_routing.h"

namespace psflow::dist {

enum class TableKind { kFixed, kDynamic };

// Where a table's rows live on the ps (docs/design.md §11): in memory (slabs and an index), or on
// disk behind a hot-row cache. A build without the disk tier refuses `kDisk` at the ps, naming the table.
enum class TableStorage { kMemory, kDisk };

enum class InitKind { kZeros, kConstant, kUniform, kNormal, kTruncatedNormal };

// A row's initial distribution, per element (core/init.h's distributions, drawn per row from
// (seed, id) by the ps: ps/server/table/row_init.h).
struct TableInitializer {
  InitKind kind = InitKind::kTruncatedNormal;
  float value = 0.0f;                     // constant
  float minval = -0.05f, maxval = 0.05f;  // uniform: [minval, maxval)
  float mean = 0.0f, stddev = 0.01f;      // normal, truncated_normal (redrawn beyond 2 stddev)
  uint64_t seed = 0;                      // initial values are a function of (seed, id)

  // The distributions by name (the other parameters keep their defaults).
  static TableInitializer Zeros(uint64_t seed = 0) { return Of(InitKind::kZeros, seed); }
  static TableInitializer Constant(float v, uint64_t seed = 0) {
    TableInitializer i = Of(InitKind::kConstant, seed);
    i.value = v;
    return i;
  }
  static TableInitializer Uniform(float min, float max, uint64_t seed = 0) {
    TableInitializer i = Of(InitKind::kUniform, seed);
    i.minval = min;
    i.maxval = max;
    return i;
  }
  static TableInitializer Normal(float mean, float stddev, uint64_t seed = 0) {
    return Gaussian(InitKind::kNormal, mean, stddev, seed);
  }
  static TableInitializer TruncatedNormal(float mean, float stddev, uint64_t seed = 0) {
    return Gaussian(InitKind::kTruncatedNormal, mean, stddev, seed);
  }

  // Parses zeros | constant:V | uniform:MIN:MAX | normal:MEAN:STDDEV | truncated_normal:MEAN:STDDEV
  // (the seed is not part of the spelling and stays 0). InvalidArgument naming the value and the
  // accepted forms for anything else (non-finite numbers, minval > maxval, stddev < 0 included).
  static absl::StatusOr<TableInitializer> Parse(std::string_view text);
  // The spelling Parse reads back to the same distribution and parameters (shortest round-trip numbers).
  std::string ToString() const;

  bool operator==(const TableInitializer&) const = default;

 private:
  static TableInitializer Of(InitKind kind, uint64_t seed) {
    TableInitializer i;
    i.kind = kind;
    i.seed = seed;
    return i;
  }
  static TableInitializer Gaussian(InitKind kind, float mean, float stddev, uint64_t seed) {
    TableInitializer i = Of(kind, seed);
    i.mean = mean;
    i.stddev = stddev;
    return i;
  }
};

// A dynamic row's life cycle (DeepRec's EmbeddingVariable options). Every default keeps every row.
struct TableLifecycle {
  int64_t admit_after = 0;    // K: gradients of an id are dropped until K pushes held it (0, 1: none)
  int64_t steps_to_live = 0;  // S: rows not updated in the last S global steps are removed (0: never)
  int64_t max_rows = 0;       // M over all ps tasks; a ps keeps ceil(M / P) (0: unbounded)
  int64_t evict_every = 100;  // removal runs when the global step is a multiple of this (and before saves)

  bool operator==(const TableLifecycle&) const = default;
};

// An embedding table: a kind of ps variable whose rows live on the ps tasks only. Fixed:
// [num_embeddings, dim], split by the job's partitioner along axis 0 and routed by `strategy`
// (div/mod). Dynamic: any int64 id, no size, row on ps Mix64(id) % P. Values are never given: each
// ps computes a row's initial value from `initializer` (with its seed) and the id.
struct TableSpec {
  std::string name;
  TableKind kind = TableKind::kFixed;
  int64_t dim = 0;
  int64_t num_embeddings = 0;                    // fixed only
  TableStrategy strategy = TableStrategy::kDiv;  // fixed only
  TableInitializer initializer;
  TableLifecycle lifecycle;  // dynamic only (a fixed table takes none)
  // This table's update rule (sgd | momentum | adagrad | ftrl | adam | rmsprop) with the job's
  // hyper-parameters; empty: the job's --sparse_optimizer.
  std::string sparse_optimizer;
  TableStorage storage = TableStorage::kMemory;

  bool dynamic() const { return kind == TableKind::kDynamic; }
  bool operator==(const TableSpec&) const = default;
};

// A table as the chief declares it to the ps tasks: its spec and the plan's number of shards of a
// fixed table (PlanTables; a dynamic table's share per ps task ignores it). What a ps's table
// shard is made from (ps/server/table/table_shard.h).
struct TableDeclaration {
  TableSpec spec;
  int num_shards = 1;

  // A fixed table's geometry: N, P and the strategy.
  FixedTableLayout layout() const { return {spec.num_embeddings, num_shards, spec.strategy}; }
  bool operator==(const TableDeclaration&) const = default;
};

// InvalidArgument, one line naming the table and the field, unless: the name is non-empty, dim >= 1,
// a fixed table has num_embeddings >= 1, the initializer's parameters are finite (stddev >= 0,
// minval <= maxval), the life cycle's numbers are >= 0 with evict_every >= 1, a fixed table takes
// no life cycle options (admit_after <= 1, steps_to_live and max_rows 0), and sparse_optimizer is
// empty or a rule's name.
absl::Status ValidateTableSpec(const TableSpec& spec);

// The names of the enums as the fields' text forms read them.
std::string_view TableKindName(TableKind kind);           // "fixed" | "dynamic"
std::string_view TableStorageName(TableStorage storage);  // "memory" | "disk"
std::string_view InitKindName(InitKind kind);             // "zeros" | ... | "truncated_normal"
absl::StatusOr<TableKind> ParseTableKind(std::string_view text);
absl::StatusOr<TableStorage> ParseTableStorage(std::string_view text);
absl::StatusOr<InitKind> ParseInitKind(std::string_view text);

// The update rules a table may name (sparse_optimizer), space-separated.
inline constexpr std::string_view kTableRules = "sgd momentum adagrad ftrl adam rmsprop";

// A field a user sets by name: Python's keyword arguments of psflow.torch.Embedding/EmbeddingBag
// and psflow train's --table_<name> flags are made from these rows. The kind, dim and
// num_embeddings are not among them (they are the modules' positional arguments and the model's
// --ctr_* flags), nor the name.
struct TableField {
  std::string_view name;
  std::string_view help;
  // "int" (an integer >= 0, or any uint64 for the seed) or "text".
  std::string_view type;
  // What a value must be, completing "FIELD=TEXT must be ...": "an integer >= 0", "memory or disk", ...
  std::string_view must_be;
};

// Every field in the order Python's signatures list them.
std::span<const TableField> TableFields();
// The field's value in `spec` as text that SetTableField reads back to the same value.
// CHECKs that `field` is a row of TableFields().
std::string TableFieldText(const TableSpec& spec, std::string_view field);
// The field's default: its text in TableSpec{}.
std::string TableFieldDefault(std::string_view field);
// Sets the field from its text form; InvalidArgument "table 'NAME': FIELD=TEXT must be ..." (without
// the "table 'NAME': " while the spec has no name) for
// text it cannot read (or an unknown field, listing the known ones). Values are checked as far as
// one field allows (numbers >= 0, evict_every >= 1, a rule's name); ValidateTableSpec checks the whole.
absl::Status SetTableField(TableSpec* spec, std::string_view field, std::string_view text);

}  // namespace psflow::dist

#endif  // PSFLOW_DIST_TABLE_SPEC_H_
