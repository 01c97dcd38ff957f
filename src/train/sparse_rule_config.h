// train/sparse_rule_config.h — the embedding tables' update rule the options describe
// (--sparse_optimizer, --sparse_learning_rate, --ftrl_l1, --ftrl_l2, and --optimizer's other
// hyper-parameters and decay). Internal: the ps table config is not a public type.
#ifndef PSFLOW_SRC_TRAIN_SPARSE_RULE_CONFIG_H_
#define PSFLOW_SRC_TRAIN_SPARSE_RULE_CONFIG_H_

#include "ps/server/table/table_config.h"
#include "psflow/train/options.h"

namespace psflow::train {

// After ResolveTrainOptions (which validated it with ps::table::SparseRule::Make).
ps::table::SparseRuleConfig SparseRuleConfigFrom(const TrainOptions& options);

}  // namespace psflow::train

#endif  // PSFLOW_SRC_TRAIN_SPARSE_RULE_CONFIG_H_
