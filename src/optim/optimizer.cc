// Update rules of docs/design.md#optimizers, written as TensorFlow's ApplyGradientDescent / ApplyMomentum /
// ApplyAdagrad / ApplyAdam / ApplyRMSProp kernels compute them. Each inner loop is a plain loop
// over __restrict float pointers so that the compiler vectorizes it (the parameter server runs
// them on slices of up to millions of floats); hyper-parameters are hoisted into locals first.
#include "psflow/optim/optimizer.h"

#include <cmath>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "core/simd_dispatch.h"
#include "core/check.h"

namespace psflow::optim {

float DecayedLearningRate(const OptimizerConfig& config, int64_t global_step) {
  if (config.decay_steps <= 0) return config.learning_rate;
  // Like tf.train.exponential_decay: real-valued exponent, floored when staircase. Computed in
  // double so that large steps do not lose the fraction.
  double exponent = static_cast<double>(global_step) / static_cast<double>(config.decay_steps);
  if (config.staircase) exponent = std::floor(exponent);
  return static_cast<float>(static_cast<double>(config.learning_rate) *
                            std::pow(static_cast<double>(config.decay_rate), exponent));
}

void Optimizer::ApplyDense(float* w, const float* g, int64_t n, SlotState& state,
                           float lr) const {
  CHECK_EQ(state.slots.size(), slot_names().size()) << "state was not made by " << name();
  for (const FloatBuffer& slot : state.slots) CHECK_GE(static_cast<int64_t>(slot.size()), n);
  Apply(w, g, state, 0, n, lr, state.updates + 1);
  ++state.updates;
}

void Optimizer::ApplySparse(float* w, const std::vector<int64_t>& rows, const float* g_rows,
                            int64_t row_size, SlotState& state, float lr) const {
  CHECK_EQ(state.slots.size(), slot_names().size()) << "state was not made by " << name();
  const int64_t t = state.updates + 1;
  for (size_t i = 0; i < rows.size(); ++i) {
    const int64_t row = rows[i];
    CHECK_GE(row, 0);
    for (const FloatBuffer& slot : state.slots) {
      CHECK_LE((row + 1) * row_size, static_cast<int64_t>(slot.size())) << "row " << row;
    }
    Apply(w, g_rows + static_cast<int64_t>(i) * row_size, state, row * row_size, row_size, lr, t);
  }
  ++state.updates;
}

namespace {

// The kernels take __restrict parameters (GCC honours restrict on parameters, not on local
// pointers) so that the loops vectorize without a run-time aliasing check. PSFLOW_DISPATCH
// compiles each for AVX-512F, AVX2 and baseline x86-64 and picks one at load time.
PSFLOW_DISPATCH void SgdKernel(float* __restrict w, const float* __restrict g, int64_t n, float lr) {
  for (int64_t i = 0; i < n; ++i) w[i] -= lr * g[i];
}

PSFLOW_DISPATCH void MomentumKernel(float* __restrict w, const float* __restrict g, float* __restrict a,
                    int64_t n, float lr, float mu) {
  for (int64_t i = 0; i < n; ++i) {
    a[i] = a[i] * mu + g[i];
    w[i] -= a[i] * lr;
  }
}

PSFLOW_DISPATCH void AdagradKernel(float* __restrict w, const float* __restrict g, float* __restrict acc,
                   int64_t n, float lr) {
  for (int64_t i = 0; i < n; ++i) {
    acc[i] += g[i] * g[i];
    w[i] -= g[i] * lr / std::sqrt(acc[i]);
  }
}

PSFLOW_DISPATCH void AdamKernel(float* __restrict w, const float* __restrict g, float* __restrict m,
                float* __restrict v, int64_t n, float alpha, float one_minus_beta1,
                float one_minus_beta2, float eps) {
  for (int64_t i = 0; i < n; ++i) {
    m[i] += (g[i] - m[i]) * one_minus_beta1;
    v[i] += (g[i] * g[i] - v[i]) * one_minus_beta2;
    w[i] -= (m[i] * alpha) / (std::sqrt(v[i]) + eps);
  }
}

PSFLOW_DISPATCH void RmsPropKernel(float* __restrict w, const float* __restrict g, float* __restrict ms,
                   float* __restrict mom, int64_t n, float lr, float one_minus_rho, float mu,
                   float eps) {
  for (int64_t i = 0; i < n; ++i) {
    ms[i] += (g[i] * g[i] - ms[i]) * one_minus_rho;
    mom[i] = mom[i] * mu + (g[i] * lr) / std::sqrt(ms[i] + eps);
    w[i] -= mom[i];
  }
}

// Holds what every rule shares: its name, slot names and config.
class RuleBase : public Optimizer {
 public:
  RuleBase(std::string name, std::vector<std::string> slot_names, OptimizerConfig config)
      : name_(std::move(name)), slot_names_(std::move(slot_names)), config_(std::move(config)) {}
  const std::string& name() const override { return name_; }
  const std::vector<std::string>& slot_names() const override { return slot_names_; }
  const OptimizerConfig& config() const override { return config_; }

 protected:
  float* Slot(SlotState& state, int i, int64_t offset) const {
    return state.slots[i].data() + offset;
  }

 private:
  std::string name_;
  std::vector<std::string> slot_names_;
  OptimizerConfig config_;
};

// w -= lr * g
class Sgd final : public RuleBase {
 public:
  explicit Sgd(const OptimizerConfig& c) : RuleBase("sgd", {}, c) {}
  SlotState NewState(int64_t n) const override { return {}; }
  void Apply(float* w_base, const float* g_in, SlotState& state, int64_t offset, int64_t n,
             float lr, int64_t t) const override {
    SgdKernel(w_base + offset, g_in, n, lr);
  }
};

// a = mu * a + g; w -= lr * a
class Momentum final : public RuleBase {
 public:
  explicit Momentum(const OptimizerConfig& c) : RuleBase("momentum", {"momentum"}, c) {}
  SlotState NewState(int64_t n) const override {
    SlotState s;
    s.slots.emplace_back(n, 0.0f);
    return s;
  }
  void Apply(float* w_base, const float* g_in, SlotState& state, int64_t offset, int64_t n,
             float lr, int64_t t) const override {
    MomentumKernel(w_base + offset, g_in, Slot(state, 0, offset), n, lr, config().momentum);
  }
};

// acc += g^2; w -= lr * g / sqrt(acc)
class Adagrad final : public RuleBase {
 public:
  explicit Adagrad(const OptimizerConfig& c) : RuleBase("adagrad", {"accumulator"}, c) {}
  SlotState NewState(int64_t n) const override {
    SlotState s;
    s.slots.emplace_back(n, config().initial_accumulator);
    return s;
  }
  void Apply(float* w_base, const float* g_in, SlotState& state, int64_t offset, int64_t n,
             float lr, int64_t t) const override {
    AdagradKernel(w_base + offset, g_in, Slot(state, 0, offset), n, lr);
  }
};

// alpha = lr * sqrt(1 - beta2^t) / (1 - beta1^t); m += (g - m)(1 - beta1);
// v += (g^2 - v)(1 - beta2); w -= alpha * m / (sqrt(v) + eps)
class Adam final : public RuleBase {
 public:
  explicit Adam(const OptimizerConfig& c) : RuleBase("adam", {"m", "v"}, c) {}
  SlotState NewState(int64_t n) const override {
    SlotState s;
    s.slots.emplace_back(n, 0.0f);
    s.slots.emplace_back(n, 0.0f);
    return s;
  }
  void Apply(float* w_base, const float* g_in, SlotState& state, int64_t offset, int64_t n,
             float lr, int64_t t) const override {
    const OptimizerConfig& c = config();
    // The bias correction in double: beta^t for large t must not be rounded step by step.
    const double t_d = static_cast<double>(t);
    const float alpha =
        static_cast<float>(lr * std::sqrt(1.0 - std::pow(static_cast<double>(c.beta2), t_d)) /
                           (1.0 - std::pow(static_cast<double>(c.beta1), t_d)));
    AdamKernel(w_base + offset, g_in, Slot(state, 0, offset), Slot(state, 1, offset), n, alpha,
               1.0f - c.beta1, 1.0f - c.beta2, c.adam_epsilon);
  }
};

// ms starts at 1; ms += (g^2 - ms)(1 - rho); mom = mu * mom + lr * g / sqrt(ms + eps); w -= mom
class RmsProp final : public RuleBase {
 public:
  explicit RmsProp(const OptimizerConfig& c) : RuleBase("rmsprop", {"ms", "mom"}, c) {}
  SlotState NewState(int64_t n) const override {
    SlotState s;
    s.slots.emplace_back(n, 1.0f);
    s.slots.emplace_back(n, 0.0f);
    return s;
  }
  void Apply(float* w_base, const float* g_in, SlotState& state, int64_t offset, int64_t n,
             float lr, int64_t t) const override {
    const OptimizerConfig& c = config();
    RmsPropKernel(w_base + offset, g_in, Slot(state, 0, offset), Slot(state, 1, offset), n, lr,
                  1.0f - c.rms_decay, c.rms_momentum, c.rms_epsilon);
  }
};

absl::Status Invalid(const OptimizerConfig& c, const std::string& field, float value,
                     const std::string& requirement) {
  return absl::InvalidArgumentError(absl::StrCat("optimizer '", c.name, "': ", field,
                                                 " must be ", requirement, ", got ", value));
}

absl::Status Validate(const OptimizerConfig& c) {
  // `!(x > 0)` also rejects NaN.
  if (!(c.learning_rate > 0.0f) || !std::isfinite(c.learning_rate)) {
    return Invalid(c, "learning_rate", c.learning_rate, "a finite number > 0 (--learning_rate)");
  }
  if (c.decay_steps < 0) {
    return absl::InvalidArgumentError(absl::StrCat("optimizer '", c.name,
                                                   "': decay_steps must be >= 0 (0 = no decay), got ",
                                                   c.decay_steps));
  }
  if (c.decay_steps > 0 && (!(c.decay_rate > 0.0f) || !std::isfinite(c.decay_rate))) {
    return Invalid(c, "decay_rate", c.decay_rate, "a finite number > 0 when decay_steps > 0");
  }
  if (c.name == "momentum" && !(c.momentum >= 0.0f)) {
    return Invalid(c, "momentum", c.momentum, ">= 0");
  }
  if (c.name == "adagrad" && !(c.initial_accumulator > 0.0f)) {
    return Invalid(c, "initial_accumulator", c.initial_accumulator, "> 0");
  }
  if (c.name == "adam") {
    if (!(c.beta1 >= 0.0f && c.beta1 < 1.0f)) return Invalid(c, "beta1", c.beta1, "in [0, 1)");
    if (!(c.beta2 >= 0.0f && c.beta2 < 1.0f)) return Invalid(c, "beta2", c.beta2, "in [0, 1)");
    if (!(c.adam_epsilon > 0.0f)) return Invalid(c, "adam_epsilon", c.adam_epsilon, "> 0");
  }
  if (c.name == "rmsprop") {
    if (!(c.rms_decay >= 0.0f && c.rms_decay <= 1.0f)) {
      return Invalid(c, "rms_decay", c.rms_decay, "in [0, 1]");
    }
    if (!(c.rms_momentum >= 0.0f)) return Invalid(c, "rms_momentum", c.rms_momentum, ">= 0");
    if (!(c.rms_epsilon > 0.0f)) return Invalid(c, "rms_epsilon", c.rms_epsilon, "> 0");
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<Optimizer>> MakeOptimizer(const OptimizerConfig& config) {
  std::unique_ptr<Optimizer> opt;
  if (config.name == "sgd") {
    opt = std::make_unique<Sgd>(config);
  } else if (config.name == "momentum") {
    opt = std::make_unique<Momentum>(config);
  } else if (config.name == "adagrad") {
    opt = std::make_unique<Adagrad>(config);
  } else if (config.name == "adam") {
    opt = std::make_unique<Adam>(config);
  } else if (config.name == "rmsprop") {
    opt = std::make_unique<RmsProp>(config);
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        "unknown optimizer '", config.name, "'; choose one of sgd, momentum, adagrad, adam, rmsprop"));
  }
  if (absl::Status s = Validate(config); !s.ok()) return s;
  return opt;
}

}  // namespace psflow::optim
