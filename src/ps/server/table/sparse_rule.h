// ps/server/table/sparse_rule.h — the update rules applied to a table's touched rows on the ps
// (docs/tables.md#semantics, Sparse update rules; Paddle's SGD rule role): a closed set of six formulas, one
// file (the arithmetic is optim/update_kernels.h's, shared with the dense optimizer). A rule owns
// its slots' names, their initial values, and one row's update; the table stores
// the row and its slots ([w | slot 0 | slot 1], each `dim` floats), the accessor owns the row's life.
//   sgd       w -= lr·g
//   momentum  a = μ·a + g; w -= lr·a                                       (TF SparseApplyMomentum)
//   adagrad   acc += g²; w -= lr·g/√acc, acc starts at initial_accumulator (TF SparseApplyAdagrad)
//   ftrl      n' = n + g²; z += g − (√n' − √n)/lr·w; n = n';
//             w = (sign(z)·l1 − z)/(√n/lr + 2·l2) if |z| > l1 else 0,
//             n starts at initial_accumulator, z at 0                     (TF ApplyFtrl, lr_power −0.5)
//   adam      lazy, with the row's own step count t (from 1 at its first update):
//             α = lr·√(1−β2^t)/(1−β1^t); m += (g−m)(1−β1); v += (g²−v)(1−β2); w −= α·m/(√v+ε)
//   rmsprop   ms += (g²−ms)(1−ρ); mom = μ·mom + lr·g/√(ms+ε); w −= mom, ms starts at 1
//             (TF SparseApplyRMSProp)
// Hyper-parameters come from the dense optimizer's OptimizerConfig (plus FTRL's l1, l2), and the
// learning rate decays with the global step as the dense one does. Immutable; thread-safe.
#ifndef PSFLOW_PS_SERVER_TABLE_SPARSE_RULE_H_
#define PSFLOW_PS_SERVER_TABLE_SPARSE_RULE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "optim/update_kernels.h"
#include "ps/server/table/table_config.h"

namespace psflow::ps::table {

enum class SparseRuleKind { kSgd, kMomentum, kAdagrad, kFtrl, kAdam, kRmsProp };

class SparseRule {
 public:
  // The rule named by config.optimizer.name, or InvalidArgument naming the bad name or
  // hyper-parameter (the dense optimizer's checks, plus l1, l2 >= 0 for ftrl).
  static absl::StatusOr<SparseRule> Make(const SparseRuleConfig& config);

  SparseRuleKind kind() const { return kind_; }
  const std::string& name() const { return config_.optimizer.name; }
  const SparseRuleConfig& config() const { return config_; }
  // Slot names in storage order ("momentum"; "accumulator"; "accumulator", "linear"; "m", "v";
  // "ms", "mom").
  const std::vector<std::string>& slot_names() const { return optim::kernels::SlotNames(kernel_); }
  int num_slots() const { return static_cast<int>(slot_names().size()); }
  // Whether the rule reads the row's own update count (lazy adam): tables keep one per row then.
  bool needs_row_steps() const { return kind_ == SparseRuleKind::kAdam; }

  // The learning rate at `global_step` (optim::LearningRateAt of the config).
  float LearningRate(int64_t global_step) const;
  // A new row's slots: slots[k·dim, (k+1)·dim) = slot k's initial value.
  void InitSlots(float* slots, int64_t dim) const;
  // One update of one row: w[0, dim), its slots at slots[0, num_slots·dim), gradient g[0, dim),
  // the decayed `lr`, and the row's update count `t` (1 at its first update; adam only).
  void Apply(float* w, float* slots, const float* g, int64_t dim, float lr, int64_t t) const;
  // The same update for the n rows of one push, in one call (what the tables use): row r's record
  // [w | slots] at records[r] (nullptr: row skipped), its gradient at grads[r·dim, (r+1)·dim), its
  // update count t[r] (adam only; t may be null for the other rules). Records must not overlap.
  // Bit-identical to n calls of Apply.
  void ApplyRows(float* const* records, const float* grads, const int64_t* t, int64_t n, int64_t dim, float lr) const;

 private:
  SparseRule(SparseRuleKind kind, SparseRuleConfig config)
      : kind_(kind), kernel_(optim::kernels::KernelFor(config.optimizer)), config_(std::move(config)) {}
  // The kernel's scalars for learning rate lr at row count t.
  optim::kernels::Scalars Scalars(float lr, int64_t t) const;

  SparseRuleKind kind_;
  optim::kernels::Kernel kernel_;
  SparseRuleConfig config_;
};

}  // namespace psflow::ps::table

#endif  // PSFLOW_PS_SERVER_TABLE_SPARSE_RULE_H_
