// The six sparse update rules (sparse_rule.h). Each row kernel is a plain loop over __restrict
// pointers, inlined into a loop over a push's rows that PSFLOW_DISPATCH compiles per ISA
// (core/simd_dispatch.h; this library is built with -ffp-contract=off, so every clone rounds the
// same way).
#include "ps/server/table/sparse_rule.h"

#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "core/simd_dispatch.h"

namespace psflow::ps::table {
namespace {

inline __attribute__((always_inline)) void SgdRow(float* __restrict w, const float* __restrict g, int64_t n, float lr) {
  for (int64_t i = 0; i < n; ++i) w[i] -= lr * g[i];
}

inline __attribute__((always_inline)) void MomentumRow(float* __restrict w, float* __restrict a, const float* __restrict g,
                                 int64_t n, float lr, float mu) {
  for (int64_t i = 0; i < n; ++i) {
    a[i] = a[i] * mu + g[i];
    w[i] -= a[i] * lr;
  }
}

inline __attribute__((always_inline)) void AdagradRow(float* __restrict w, float* __restrict acc, const float* __restrict g,
                                int64_t n, float lr) {
  for (int64_t i = 0; i < n; ++i) {
    acc[i] += g[i] * g[i];
    w[i] -= g[i] * lr / std::sqrt(acc[i]);
  }
}

inline __attribute__((always_inline)) void FtrlRow(float* __restrict w, float* __restrict acc, float* __restrict z,
                             const float* __restrict g, int64_t n, float lr, float l1, float l2) {
  const float inv_lr = 1.0f / lr;
  for (int64_t i = 0; i < n; ++i) {
    const float acc_new = acc[i] + g[i] * g[i];
    const float sqrt_new = std::sqrt(acc_new);
    z[i] += g[i] - (sqrt_new - std::sqrt(acc[i])) * inv_lr * w[i];
    acc[i] = acc_new;
    const float quadratic = sqrt_new * inv_lr + 2.0f * l2;
    const float sign = z[i] < 0.0f ? -1.0f : 1.0f;
    w[i] = std::abs(z[i]) > l1 ? (sign * l1 - z[i]) / quadratic : 0.0f;
  }
}

inline __attribute__((always_inline)) void AdamRow(float* __restrict w, float* __restrict m, float* __restrict v,
                             const float* __restrict g, int64_t n, float alpha, float one_minus_beta1,
                             float one_minus_beta2, float eps) {
  for (int64_t i = 0; i < n; ++i) {
    m[i] += (g[i] - m[i]) * one_minus_beta1;
    v[i] += (g[i] * g[i] - v[i]) * one_minus_beta2;
    w[i] -= (m[i] * alpha) / (std::sqrt(v[i]) + eps);
  }
}

inline __attribute__((always_inline)) void RmsPropRow(float* __restrict w, float* __restrict ms, float* __restrict mom,
                                const float* __restrict g, int64_t n, float lr, float one_minus_rho,
                                float mu, float eps) {
  for (int64_t i = 0; i < n; ++i) {
    ms[i] += (g[i] * g[i] - ms[i]) * one_minus_rho;
    mom[i] = mom[i] * mu + (g[i] * lr) / std::sqrt(ms[i] + eps);
    w[i] -= mom[i];
  }
}

// Batched kernels, one dispatched call per push: rows r of recs ([w | slots], nullptr: skipped)
// get gradient g + r·dim; the next rows' records are prefetched while one is updated. Each row's
// arithmetic is the row kernel above, inlined into the clone, so results equal a per-row call's.
constexpr int64_t kRowsAhead = 4;

inline __attribute__((always_inline)) void PrefetchRecord(float* const* recs, int64_t r, int64_t n,
                                                          int64_t record_bytes) {
  if (r >= n || recs[r] == nullptr) return;
  const char* p = reinterpret_cast<const char*>(recs[r]);
  for (int64_t b = 0; b < record_bytes; b += 64) __builtin_prefetch(p + b, 1);
}

PSFLOW_DISPATCH void SgdRows(float* const* recs, const float* g, int64_t n, int64_t dim, float lr) {
  for (int64_t r = 0; r < n; ++r) {
    PrefetchRecord(recs, r + kRowsAhead, n, dim * 4);
    if (recs[r] != nullptr) SgdRow(recs[r], g + r * dim, dim, lr);
  }
}

PSFLOW_DISPATCH void MomentumRows(float* const* recs, const float* g, int64_t n, int64_t dim, float lr,
                                  float mu) {
  for (int64_t r = 0; r < n; ++r) {
    PrefetchRecord(recs, r + kRowsAhead, n, dim * 8);
    if (recs[r] != nullptr) MomentumRow(recs[r], recs[r] + dim, g + r * dim, dim, lr, mu);
  }
}

PSFLOW_DISPATCH void AdagradRows(float* const* recs, const float* g, int64_t n, int64_t dim, float lr) {
  for (int64_t r = 0; r < n; ++r) {
    PrefetchRecord(recs, r + kRowsAhead, n, dim * 8);
    if (recs[r] != nullptr) AdagradRow(recs[r], recs[r] + dim, g + r * dim, dim, lr);
  }
}

PSFLOW_DISPATCH void FtrlRows(float* const* recs, const float* g, int64_t n, int64_t dim, float lr, float l1,
                              float l2) {
  for (int64_t r = 0; r < n; ++r) {
    PrefetchRecord(recs, r + kRowsAhead, n, dim * 12);
    if (recs[r] != nullptr) FtrlRow(recs[r], recs[r] + dim, recs[r] + 2 * dim, g + r * dim, dim, lr, l1, l2);
  }
}

PSFLOW_DISPATCH void AdamRows(float* const* recs, const float* g, const float* alphas, int64_t n, int64_t dim,
                              float one_minus_beta1, float one_minus_beta2, float eps) {
  for (int64_t r = 0; r < n; ++r) {
    PrefetchRecord(recs, r + kRowsAhead, n, dim * 12);
    if (recs[r] != nullptr) {
      AdamRow(recs[r], recs[r] + dim, recs[r] + 2 * dim, g + r * dim, dim, alphas[r], one_minus_beta1,
              one_minus_beta2, eps);
    }
  }
}

PSFLOW_DISPATCH void RmsPropRows(float* const* recs, const float* g, int64_t n, int64_t dim, float lr,
                                 float one_minus_rho, float mu, float eps) {
  for (int64_t r = 0; r < n; ++r) {
    PrefetchRecord(recs, r + kRowsAhead, n, dim * 12);
    if (recs[r] != nullptr) {
      RmsPropRow(recs[r], recs[r] + dim, recs[r] + 2 * dim, g + r * dim, dim, lr, one_minus_rho, mu, eps);
    }
  }
}

// Lazy adam's step size for a row's own count t (bias correction in double, as the dense Adam).
float AdamAlpha(const optim::OptimizerConfig& c, float lr, int64_t t) {
  const double td = static_cast<double>(t);
  return static_cast<float>(lr * std::sqrt(1.0 - std::pow(static_cast<double>(c.beta2), td)) /
                            (1.0 - std::pow(static_cast<double>(c.beta1), td)));
}

}  // namespace

absl::StatusOr<SparseRule> SparseRule::Make(const SparseRuleConfig& config) {
  const std::string& name = config.optimizer.name;
  {
    // The row rules are TensorFlow's kernels without weight decay or parameter groups; refuse
    // rather than ignore what psflow.optim can set for dense variables.
    const optim::OptimizerConfig& o = config.optimizer;
    if (o.convention != "tensorflow" || o.weight_decay != 0.0f || o.nesterov || !o.groups.empty() ||
        name == "adamw") {
      return absl::InvalidArgumentError(absl::StrCat(
          "sparse optimizer '", name, "': embedding tables update rows with TensorFlow's rules only "
          "(no torch convention, adamw, weight_decay, nesterov or parameter groups)"));
    }
  }
  if (name == "ftrl") {
    const optim::OptimizerConfig& o = config.optimizer;
    if (!(o.learning_rate > 0.0f) || !std::isfinite(o.learning_rate)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "sparse optimizer 'ftrl': learning_rate must be a finite number > 0, got ", o.learning_rate));
    }
    if (!(o.initial_accumulator > 0.0f) || !std::isfinite(o.initial_accumulator)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "sparse optimizer 'ftrl': initial_accumulator must be > 0, got ", o.initial_accumulator));
    }
    if (!(config.ftrl_l1 >= 0.0f) || !(config.ftrl_l2 >= 0.0f) || !std::isfinite(config.ftrl_l1) ||
        !std::isfinite(config.ftrl_l2)) {
      return absl::InvalidArgumentError(absl::StrCat("sparse optimizer 'ftrl': --ftrl_l1 and --ftrl_l2 must be finite and >= 0, got ",
                                                     config.ftrl_l1, " and ", config.ftrl_l2));
    }
    if (o.decay_steps < 0 || (o.decay_steps > 0 && !(o.decay_rate > 0.0f))) {
      return absl::InvalidArgumentError("sparse optimizer 'ftrl': decay_steps must be >= 0 and decay_rate > 0");
    }
    return SparseRule(SparseRuleKind::kFtrl, config, {"accumulator", "linear"});
  }
  // The dense optimizer's validation of the shared hyper-parameters (and of the name).
  if (auto made = optim::MakeOptimizer(config.optimizer); !made.ok()) {
    if (made.status().code() == absl::StatusCode::kInvalidArgument &&
        made.status().message().find("unknown") != std::string_view::npos) {
      return absl::InvalidArgumentError(absl::StrCat(
          "sparse optimizer '", name, "' is not one of sgd, momentum, adagrad, ftrl, adam, rmsprop"));
    }
    return made.status();
  }
  if (name == "sgd") return SparseRule(SparseRuleKind::kSgd, config, {});
  if (name == "momentum") return SparseRule(SparseRuleKind::kMomentum, config, {"momentum"});
  if (name == "adagrad") return SparseRule(SparseRuleKind::kAdagrad, config, {"accumulator"});
  if (name == "adam") return SparseRule(SparseRuleKind::kAdam, config, {"m", "v"});
  if (name == "rmsprop") return SparseRule(SparseRuleKind::kRmsProp, config, {"ms", "mom"});
  return absl::InvalidArgumentError(absl::StrCat(
      "sparse optimizer '", name, "' is not one of sgd, momentum, adagrad, ftrl, adam, rmsprop"));
}

float SparseRule::LearningRate(int64_t global_step) const {
  return optim::LearningRateAt(config_.optimizer, global_step);
}

void SparseRule::InitSlots(float* slots, int64_t dim) const {
  switch (kind_) {
    case SparseRuleKind::kSgd:
      return;
    case SparseRuleKind::kMomentum:
      std::fill(slots, slots + dim, 0.0f);
      return;
    case SparseRuleKind::kAdagrad:
      std::fill(slots, slots + dim, config_.optimizer.initial_accumulator);
      return;
    case SparseRuleKind::kFtrl:
      std::fill(slots, slots + dim, config_.optimizer.initial_accumulator);
      std::fill(slots + dim, slots + 2 * dim, 0.0f);
      return;
    case SparseRuleKind::kAdam:
      std::fill(slots, slots + 2 * dim, 0.0f);
      return;
    case SparseRuleKind::kRmsProp:
      std::fill(slots, slots + dim, 1.0f);
      std::fill(slots + dim, slots + 2 * dim, 0.0f);
      return;
  }
}

void SparseRule::Apply(float* w, float* slots, const float* g, int64_t dim, float lr, int64_t t) const {
  const optim::OptimizerConfig& c = config_.optimizer;
  switch (kind_) {
    case SparseRuleKind::kSgd:
      SgdRow(w, g, dim, lr);
      return;
    case SparseRuleKind::kMomentum:
      MomentumRow(w, slots, g, dim, lr, c.momentum);
      return;
    case SparseRuleKind::kAdagrad:
      AdagradRow(w, slots, g, dim, lr);
      return;
    case SparseRuleKind::kFtrl:
      FtrlRow(w, slots, slots + dim, g, dim, lr, config_.ftrl_l1, config_.ftrl_l2);
      return;
    case SparseRuleKind::kAdam:
      AdamRow(w, slots, slots + dim, g, dim, AdamAlpha(c, lr, t), 1.0f - c.beta1, 1.0f - c.beta2,
              c.adam_epsilon);
      return;
    case SparseRuleKind::kRmsProp:
      RmsPropRow(w, slots, slots + dim, g, dim, lr, 1.0f - c.rms_decay, c.rms_momentum, c.rms_epsilon);
      return;
  }
}

void SparseRule::ApplyRows(float* const* records, const float* grads, const int64_t* t, int64_t n, int64_t dim,
                           float lr) const {
  const optim::OptimizerConfig& c = config_.optimizer;
  switch (kind_) {
    case SparseRuleKind::kSgd:
      SgdRows(records, grads, n, dim, lr);
      return;
    case SparseRuleKind::kMomentum:
      MomentumRows(records, grads, n, dim, lr, c.momentum);
      return;
    case SparseRuleKind::kAdagrad:
      AdagradRows(records, grads, n, dim, lr);
      return;
    case SparseRuleKind::kFtrl:
      FtrlRows(records, grads, n, dim, lr, config_.ftrl_l1, config_.ftrl_l2);
      return;
    case SparseRuleKind::kAdam: {
      // One step size per row; rows pushed together often share their count, so the pow()s run once
      // per distinct run of counts.
      std::vector<float> alphas(static_cast<size_t>(n));
      int64_t last_t = -1;
      float alpha = 0.0f;
      for (int64_t r = 0; r < n; ++r) {
        if (records[r] == nullptr) continue;
        if (t[r] != last_t) {
          last_t = t[r];
          alpha = AdamAlpha(c, lr, last_t);
        }
        alphas[r] = alpha;
      }
      AdamRows(records, grads, alphas.data(), n, dim, 1.0f - c.beta1, 1.0f - c.beta2, c.adam_epsilon);
      return;
    }
    case SparseRuleKind::kRmsProp:
      RmsPropRows(records, grads, n, dim, lr, 1.0f - c.rms_decay, c.rms_momentum, c.rms_epsilon);
      return;
  }
}

}  // namespace psflow::ps::table
