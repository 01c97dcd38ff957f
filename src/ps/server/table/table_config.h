// ps/server/table/table_config.h — what a ps's table shard is made from (docs/tables.md): the
// table's one spec (psflow/dist/table_spec.h) with the plan's number of shards, and the sparse
// update rule's hyper-parameters. The names here are the ps's short names for the public types
// (no second copy of a field). Plain values; safe to copy and share.
#ifndef PSFLOW_PS_SERVER_TABLE_TABLE_CONFIG_H_
#define PSFLOW_PS_SERVER_TABLE_TABLE_CONFIG_H_

#include <string_view>

#include "absl/status/statusor.h"
#include "psflow/dist/table_routing.h"
#include "psflow/dist/table_spec.h"
#include "psflow/optim/optimizer.h"

namespace psflow::ps::table {

using InitKind = dist::InitKind;
// A row's initial distribution and its seed.
using InitializerSpec = dist::TableInitializer;
using TableKind = dist::TableKind;
using TableLifecycle = dist::TableLifecycle;
// spec (kind, dim, initializer, life cycle, rule, storage) and num_shards (a fixed table's P).
using TableConfig = dist::TableDeclaration;

// dist::TableInitializer::Parse (errors name the value and the accepted forms).
absl::StatusOr<InitializerSpec> ParseInitializer(std::string_view flag);

// The sparse update rule's hyper-parameters: the dense optimizer's config (name one of sgd,
// momentum, adagrad, adam, rmsprop, or ftrl; adagrad and ftrl take initial_accumulator) plus FTRL's
// regularization. FTRL's learning_rate_power is -0.5 (TF's default), fixed.
struct SparseRuleConfig {
  optim::OptimizerConfig optimizer;
  float ftrl_l1 = 0.0f, ftrl_l2 = 0.0f;
};

// The job's rule as one table applies it: its spec's sparse_optimizer (when set) names the rule.
SparseRuleConfig RuleForTable(SparseRuleConfig job, const dist::TableSpec& spec);

// InvalidArgument naming the table and the field unless dist::ValidateTableSpec accepts the spec
// and a fixed table's layout is valid (dist::ValidateFixedLayout). A table on `disk` storage is
// refused (one line naming the table) while this build has no disk tier.
absl::Status ValidateTableConfig(const TableConfig& config);

}  // namespace psflow::ps::table

#endif  // PSFLOW_PS_SERVER_TABLE_TABLE_CONFIG_H_
