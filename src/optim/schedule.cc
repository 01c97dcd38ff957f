// Learning-rate schedules and parameter groups of psflow/optim/optimizer.h (docs/design.md#optimizers).
// LearningRateAt is the one definition of the learning rate at a global step: the ps tasks apply
// updates with it, the single-process trainer steps with it, and the worker session reports it.
// Every schedule is computed in double from the step (closed forms, as torch's schedulers'
// _get_closed_form_lr and TF's decay functions), then rounded once to float.
#include <algorithm>
#include <cmath>
#include <numbers>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "psflow/optim/optimizer.h"

namespace psflow::optim {
namespace {

// The schedule after the warmup, at `step` counted from the warmup's end, for base lr `lr`.
double MainSchedule(const OptimizerConfig& c, double lr, int64_t step) {
  if (c.schedule == "cosine") {
    const double s = static_cast<double>(std::min(step, c.cosine_steps));
    const double min_lr = c.min_learning_rate;
    return min_lr + (lr - min_lr) * (1.0 + std::cos(std::numbers::pi * s / static_cast<double>(c.cosine_steps))) / 2.0;
  }
  if (c.schedule == "piecewise") {
    // tf.train.piecewise_constant: values[0] while step <= boundaries[0], ...
    const size_t i =
        static_cast<size_t>(std::lower_bound(c.boundaries.begin(), c.boundaries.end(), step) - c.boundaries.begin());
    return static_cast<double>(c.values[i]);
  }
  // exponential (constant when decay_steps is 0). Like tf.train.exponential_decay: real-valued
  // exponent, floored when staircase; in double so that large steps do not lose the fraction.
  if (c.decay_steps <= 0) return lr;
  double exponent = static_cast<double>(step) / static_cast<double>(c.decay_steps);
  if (c.staircase) exponent = std::floor(exponent);
  return lr * std::pow(static_cast<double>(c.decay_rate), exponent);
}

absl::Status Bad(const OptimizerConfig& c, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat("optimizer '", c.name, "' schedule '", c.schedule, "': ", what));
}

}  // namespace

float LearningRateAt(const OptimizerConfig& c, int64_t global_step) {
  const double lr = c.learning_rate;
  if (c.warmup_steps > 0 && global_step < c.warmup_steps) {
    // torch's LinearLR(start_factor=f, end_factor=1, total_iters=W).
    const double f = c.warmup_start_factor;
    return static_cast<float>(lr * (f + (1.0 - f) * static_cast<double>(std::max<int64_t>(global_step, 0)) /
                                            static_cast<double>(c.warmup_steps)));
  }
  return static_cast<float>(MainSchedule(c, lr, global_step - std::max<int64_t>(c.warmup_steps, 0)));
}

absl::Status ValidateSchedule(const OptimizerConfig& c) {
  if (c.schedule != "exponential" && c.schedule != "cosine" && c.schedule != "piecewise") {
    return Bad(c, "unknown schedule; choose one of exponential, cosine, piecewise");
  }
  if (c.decay_steps < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("optimizer '", c.name, "': decay_steps must be >= 0 (0 = no decay), got ", c.decay_steps));
  }
  if (c.schedule == "exponential" && c.decay_steps > 0 && (!(c.decay_rate > 0.0f) || !std::isfinite(c.decay_rate))) {
    return absl::InvalidArgumentError(absl::StrCat(
        "optimizer '", c.name, "': decay_rate must be a finite number > 0 when decay_steps > 0, got ", c.decay_rate));
  }
  if (c.schedule == "cosine") {
    if (c.cosine_steps < 1) return Bad(c, absl::StrCat("cosine_steps must be >= 1, got ", c.cosine_steps));
    if (!(c.min_learning_rate >= 0.0f) || !std::isfinite(c.min_learning_rate)) {
      return Bad(c, absl::StrCat("min_learning_rate must be a finite number >= 0, got ", c.min_learning_rate));
    }
  }
  if (c.schedule == "piecewise") {
    if (c.values.size() != c.boundaries.size() + 1) {
      return Bad(c, absl::StrCat("needs one more value than boundaries, got ", c.boundaries.size(), " boundaries and ",
                                 c.values.size(), " values"));
    }
    for (size_t i = 1; i < c.boundaries.size(); ++i) {
      if (c.boundaries[i] <= c.boundaries[i - 1]) {
        return Bad(c, absl::StrCat("boundaries must increase, got [", absl::StrJoin(c.boundaries, ", "), "]"));
      }
    }
    for (float v : c.values) {
      if (!(v >= 0.0f) || !std::isfinite(v)) return Bad(c, absl::StrCat("values must be finite and >= 0, got ", v));
    }
  }
  if (c.warmup_steps < 0) return Bad(c, absl::StrCat("warmup_steps must be >= 0, got ", c.warmup_steps));
  if (!(c.warmup_start_factor >= 0.0f && c.warmup_start_factor <= 1.0f)) {
    return Bad(c, absl::StrCat("warmup_start_factor must be in [0, 1], got ", c.warmup_start_factor));
  }
  return ValidateGroups(c);
}

absl::Status ValidateGroups(const OptimizerConfig& c) {
  absl::flat_hash_set<std::string> seen;
  for (size_t i = 0; i < c.groups.size(); ++i) {
    const ParameterGroup& g = c.groups[i];
    const std::string where = absl::StrCat("optimizer '", c.name, "' parameter group ", i, ": ");
    if (g.learning_rate.has_value() && (!(*g.learning_rate > 0.0f) || !std::isfinite(*g.learning_rate))) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, "learning_rate must be a finite number > 0, got ", *g.learning_rate));
    }
    if (!(g.lr_scale > 0.0f) || !std::isfinite(g.lr_scale)) {
      return absl::InvalidArgumentError(absl::StrCat(where, "lr_scale must be a finite number > 0, got ", g.lr_scale));
    }
    if (g.weight_decay.has_value() && (!(*g.weight_decay >= 0.0f) || !std::isfinite(*g.weight_decay))) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, "weight_decay must be a finite number >= 0, got ", *g.weight_decay));
    }
    for (const std::string& v : g.variables) {
      if (v.empty()) return absl::InvalidArgumentError(absl::StrCat(where, "an empty variable name"));
      if (!seen.insert(v).second) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, "variable '", v, "' is already in another group; a variable belongs to one group"));
      }
    }
  }
  return absl::OkStatus();
}

OptimizerConfig ConfigForVariable(const OptimizerConfig& config, const std::string& variable) {
  OptimizerConfig c = config;
  c.groups.clear();
  for (const ParameterGroup& g : config.groups) {
    if (std::find(g.variables.begin(), g.variables.end(), variable) == g.variables.end()) continue;
    c.learning_rate = g.learning_rate.has_value() ? *g.learning_rate : config.learning_rate * g.lr_scale;
    if (g.weight_decay.has_value()) c.weight_decay = *g.weight_decay;
    const double ratio = static_cast<double>(c.learning_rate) / static_cast<double>(config.learning_rate);
    for (float& v : c.values) v = static_cast<float>(v * ratio);
    break;
  }
  return c;
}

}  // namespace psflow::optim
