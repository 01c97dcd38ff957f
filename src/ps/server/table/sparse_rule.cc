// The six sparse update rules (sparse_rule.h): their checks here, their arithmetic in
// optim/update_kernels.h, the kernels the dense optimizer runs too (a row of a table and a row of a
// dense variable updated with the same scalars hold the same bits).
#include "ps/server/table/sparse_rule.h"

#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "optim/update_kernels.h"

namespace psflow::ps::table {

absl::StatusOr<SparseRule> SparseRule::Make(const SparseRuleConfig& config) {
  const std::string& name = config.optimizer.name;
  {
    // The row rules are TensorFlow's kernels without weight decay or parameter groups; refuse
    // rather than ignore what psflow.optim can set for dense variables.
    const optim::OptimizerConfig& o = config.optimizer;
    if (o.convention != "tensorflow" || o.weight_decay != 0.0f || o.nesterov || !o.groups.empty() || name == "adamw") {
      return absl::InvalidArgumentError(
          absl::StrCat("sparse optimizer '", name,
                       "': embedding tables update rows with TensorFlow's rules only "
                       "(no torch convention, adamw, weight_decay, nesterov or parameter groups); pass "
                       "--sparse_optimizer=sgd, momentum, adagrad, ftrl, adam or rmsprop for the tables"));
    }
  }
  if (name == "ftrl") {
    const optim::OptimizerConfig& o = config.optimizer;
    if (!(o.learning_rate > 0.0f) || !std::isfinite(o.learning_rate)) {
      return absl::InvalidArgumentError(
          absl::StrCat("sparse optimizer 'ftrl': learning_rate must be a finite number > 0, got ", o.learning_rate));
    }
    if (!(o.initial_accumulator > 0.0f) || !std::isfinite(o.initial_accumulator)) {
      return absl::InvalidArgumentError(
          absl::StrCat("sparse optimizer 'ftrl': initial_accumulator must be > 0, got ", o.initial_accumulator));
    }
    if (!(config.ftrl_l1 >= 0.0f) || !(config.ftrl_l2 >= 0.0f) || !std::isfinite(config.ftrl_l1) ||
        !std::isfinite(config.ftrl_l2)) {
      return absl::InvalidArgumentError(
          absl::StrCat("sparse optimizer 'ftrl': --ftrl_l1 and --ftrl_l2 must be finite and >= 0, got ", config.ftrl_l1,
                       " and ", config.ftrl_l2));
    }
    if (o.decay_steps < 0 || (o.decay_steps > 0 && !(o.decay_rate > 0.0f))) {
      return absl::InvalidArgumentError("sparse optimizer 'ftrl': decay_steps must be >= 0 and decay_rate > 0");
    }
    return SparseRule(SparseRuleKind::kFtrl, config);
  }
  // The dense optimizer's validation of the shared hyper-parameters (and of the name).
  if (auto made = optim::MakeOptimizer(config.optimizer); !made.ok()) {
    if (made.status().code() == absl::StatusCode::kInvalidArgument &&
        made.status().message().find("unknown") != std::string_view::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat("sparse optimizer '", name, "' is not one of sgd, momentum, adagrad, ftrl, adam, rmsprop"));
    }
    return made.status();
  }
  if (name == "sgd") return SparseRule(SparseRuleKind::kSgd, config);
  if (name == "momentum") return SparseRule(SparseRuleKind::kMomentum, config);
  if (name == "adagrad") return SparseRule(SparseRuleKind::kAdagrad, config);
  if (name == "adam") return SparseRule(SparseRuleKind::kAdam, config);
  if (name == "rmsprop") return SparseRule(SparseRuleKind::kRmsProp, config);
  return absl::InvalidArgumentError(
      absl::StrCat("sparse optimizer '", name, "' is not one of sgd, momentum, adagrad, ftrl, adam, rmsprop"));
}

float SparseRule::LearningRate(int64_t global_step) const {
  return optim::LearningRateAt(config_.optimizer, global_step);
}

void SparseRule::InitSlots(float* slots, int64_t dim) const {
  for (int slot = 0; slot < num_slots(); ++slot) {
    std::fill(slots + slot * dim, slots + (slot + 1) * dim,
              optim::kernels::SlotInitialValue(kernel_, config_.optimizer, slot));
  }
}

optim::kernels::Scalars SparseRule::Scalars(float lr, int64_t t) const {
  return optim::kernels::Prepare(kernel_, config_.optimizer, lr, t, config_.ftrl_l1, config_.ftrl_l2);
}

void SparseRule::Apply(float* w, float* slots, const float* g, int64_t dim, float lr, int64_t t) const {
  optim::kernels::ApplySlice(kernel_, Scalars(lr, t), w, num_slots() > 0 ? slots : nullptr,
                             num_slots() > 1 ? slots + dim : nullptr, g, dim);
}

void SparseRule::ApplyRows(float* const* records, const float* grads, const int64_t* t, int64_t n, int64_t dim,
                           float lr) const {
  if (!needs_row_steps()) {
    optim::kernels::ApplyRows(kernel_, Scalars(lr, 1), records, grads, nullptr, n, dim);
    return;
  }
  // Lazy adam: one step size per row; rows pushed together often share their count, so the pow()s
  // run once per distinct run of counts.
  std::vector<float> alphas(static_cast<size_t>(n));
  int64_t last_t = -1;
  float alpha = 0.0f;
  for (int64_t r = 0; r < n; ++r) {
    if (records[r] == nullptr) continue;
    if (t[r] != last_t) {
      last_t = t[r];
      alpha = optim::kernels::AdamStepSize(config_.optimizer, lr, last_t);
    }
    alphas[r] = alpha;
  }
  optim::kernels::ApplyRows(kernel_, Scalars(lr, 1), records, grads, alphas.data(), n, dim);
}

}  // namespace psflow::ps::table
