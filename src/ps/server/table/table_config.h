// ps/server/table/table_config.h — what declares an embedding table on the ps (docs/tables.md,
// docs/tables.md): its kind (fixed [N, dim] routed by div/mod, or dynamic hash-keyed), its
// initializer and seed (a row's initial value depends only on these and the id), the sparse update
// rule's hyper-parameters, and a dynamic row's life cycle. Plain values; safe to copy and share.
#ifndef PSFLOW_PS_SERVER_TABLE_TABLE_CONFIG_H_
#define PSFLOW_PS_SERVER_TABLE_TABLE_CONFIG_H_

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "psflow/dist/table_routing.h"
#include "psflow/optim/optimizer.h"

namespace psflow::ps::table {

enum class InitKind { kZeros, kConstant, kUniform, kNormal, kTruncatedNormal };

// A row's initial distribution, per element (core/init.h's distributions, drawn per row).
struct InitializerSpec {
  InitKind kind = InitKind::kTruncatedNormal;
  float value = 0.0f;                    // constant
  float minval = -0.05f, maxval = 0.05f;  // uniform: [minval, maxval)
  float mean = 0.0f, stddev = 0.01f;     // normal, truncated_normal (redrawn beyond 2 stddev)
};

// Parses zeros | constant:V | uniform:MIN:MAX | normal:MEAN:STDDEV | truncated_normal:MEAN:STDDEV.
// Errors name the value and the accepted forms.
absl::StatusOr<InitializerSpec> ParseInitializer(std::string_view flag);

enum class TableKind { kFixed, kDynamic };

// Dynamic rows' life cycle (DeepRec's EmbeddingVariable options). Every default keeps every row.
struct TableLifecycle {
  int64_t admit_after = 0;    // K: gradients of an id are dropped until K pushes held it (0, 1: none)
  int64_t steps_to_live = 0;  // S: rows not updated in the last S global steps are removed (0: never)
  int64_t max_rows = 0;       // M over all ps tasks; a ps keeps ceil(M / P) (0: unbounded)
  int64_t evict_every = 100;  // removal runs when the global step is a multiple of this (and before saves)
};

struct TableConfig {
  std::string name;
  int64_t dim = 0;
  TableKind kind = TableKind::kDynamic;
  dist::FixedTableLayout layout;  // fixed tables only
  InitializerSpec initializer;
  uint64_t seed = 0;  // the table's seed: initial values are a function of (seed, id)
  TableLifecycle lifecycle;  // dynamic tables only
};

// The sparse update rule's hyper-parameters: the dense optimizer's config (name one of sgd,
// momentum, adagrad, adam, rmsprop, or ftrl; adagrad and ftrl take initial_accumulator) plus FTRL's
// regularization. FTRL's learning_rate_power is -0.5 (TF's default), fixed.
struct SparseRuleConfig {
  optim::OptimizerConfig optimizer;
  float ftrl_l1 = 0.0f, ftrl_l2 = 0.0f;
};

// InvalidArgument naming the table and the field unless: name non-empty, dim >= 1, a fixed table's
// layout valid (dist::ValidateFixedLayout), the initializer's parameters finite (stddev >= 0,
// minval <= maxval) and the life cycle's numbers >= 0 (evict_every >= 1); a fixed table takes no
// life cycle options.
absl::Status ValidateTableConfig(const TableConfig& config);

}  // namespace psflow::ps::table

#endif  // PSFLOW_PS_SERVER_TABLE_TABLE_CONFIG_H_
