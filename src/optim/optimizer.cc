// Update rules of docs/design.md#optimizers, written as TensorFlow's ApplyGradientDescent / ApplyMomentum /
// ApplyAdagrad / ApplyAdam / ApplyRMSProp kernels compute them (convention "tensorflow") or as
// torch.optim's single-tensor SGD / Adagrad / Adam / AdamW / RMSprop do (convention "torch", the
// same operations in the same order, so both round alike). Weight decay wraps every rule
// (RuleBase::Apply). Schedules and parameter groups are schedule.cc's. Each inner loop is a plain loop
// over __restrict float pointers so that the compiler vectorizes it (the parameter server runs
// them on slices of up to millions of floats); hyper-parameters are hoisted into locals first.
#include "psflow/optim/optimizer.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "core/simd_dispatch.h"
#include "core/check.h"

namespace psflow::optim {

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

PSFLOW_DISPATCH void NesterovKernel(float* __restrict w, const float* __restrict g, float* __restrict a,
                                    int64_t n, float lr, float mu) {
  for (int64_t i = 0; i < n; ++i) {
    a[i] = a[i] * mu + g[i];
    w[i] -= (g[i] + a[i] * mu) * lr;
  }
}

// torch.optim.Adagrad (lr_decay 0): acc += g*g; w -= lr * g / (sqrt(acc) + eps).
PSFLOW_DISPATCH void TorchAdagradKernel(float* __restrict w, const float* __restrict g, float* __restrict acc,
                                        int64_t n, float lr, float eps) {
  for (int64_t i = 0; i < n; ++i) {
    acc[i] += g[i] * g[i];
    w[i] -= lr * (g[i] / (std::sqrt(acc[i]) + eps));
  }
}

// torch.optim.Adam: m.lerp_(g, 1 - b1); v = v * b2 + (1 - b2) g g;
// w -= step_size * m / (sqrt(v) / sqrt(1 - b2^t) + eps), step_size = lr / (1 - b1^t).
PSFLOW_DISPATCH void TorchAdamKernel(float* __restrict w, const float* __restrict g, float* __restrict m,
                                     float* __restrict v, int64_t n, float step_size, float bc2_sqrt,
                                     float one_minus_beta1, float beta2, float one_minus_beta2, float eps) {
  for (int64_t i = 0; i < n; ++i) {
    m[i] += one_minus_beta1 * (g[i] - m[i]);
    v[i] = v[i] * beta2 + one_minus_beta2 * g[i] * g[i];
    w[i] -= step_size * (m[i] / (std::sqrt(v[i]) / bc2_sqrt + eps));
  }
}

// torch.optim.RMSprop (centered False): ms = ms * a + (1 - a) g g; mom = mu * mom + g / (sqrt(ms) + eps);
// w -= lr * mom (with mu 0 this is torch's w -= lr * g / (sqrt(ms) + eps)).
PSFLOW_DISPATCH void TorchRmsPropKernel(float* __restrict w, const float* __restrict g, float* __restrict ms,
                                        float* __restrict mom, int64_t n, float lr, float alpha,
                                        float one_minus_alpha, float mu, float eps) {
  for (int64_t i = 0; i < n; ++i) {
    ms[i] = ms[i] * alpha + one_minus_alpha * g[i] * g[i];
    mom[i] = mom[i] * mu + g[i] / (std::sqrt(ms[i]) + eps);
    w[i] -= lr * mom[i];
  }
}

// g + wd * w into out (torch's grad.add(param, alpha=weight_decay)).
PSFLOW_DISPATCH void L2Kernel(float* __restrict out, const float* __restrict g, const float* __restrict w,
                              int64_t n, float wd) {
  for (int64_t i = 0; i < n; ++i) out[i] = g[i] + wd * w[i];
}

PSFLOW_DISPATCH void ScaleKernel(float* __restrict w, int64_t n, float factor) {
  for (int64_t i = 0; i < n; ++i) w[i] *= factor;
}

// 1 - x computed in double then rounded, as torch turns the Python float (1 - beta) into the op's
// float scalar (1.0f - 0.999f would be 1.3e-5 off).
float OneMinus(float x) { return static_cast<float>(1.0 - static_cast<double>(x)); }

bool Torch(const OptimizerConfig& c) { return c.convention == "torch"; }

// Holds what every rule shares: its name, slot names and config.
class RuleBase : public Optimizer {
 public:
  RuleBase(std::string name, std::vector<std::string> slot_names, OptimizerConfig config)
      : name_(std::move(name)), slot_names_(std::move(slot_names)), config_(std::move(config)) {}
  const std::string& name() const override { return name_; }
  const std::vector<std::string>& slot_names() const override { return slot_names_; }
  const OptimizerConfig& config() const override { return config_; }

  // Weight decay, then the rule's Update. L2 decay cannot change the received gradient in place,
  // so the decayed gradient goes through a per-thread scratch buffer a chunk at a time.
  void Apply(float* w, const float* g, SlotState& state, int64_t offset, int64_t n, float lr,
             int64_t t) const final {
    const float wd = config_.weight_decay;
    if (wd == 0.0f) return Update(w, g, state, offset, n, lr, t);
    if (config_.name == "adamw") {
      ScaleKernel(w + offset, n, static_cast<float>(1.0 - static_cast<double>(lr) * wd));
      return Update(w, g, state, offset, n, lr, t);
    }
    constexpr int64_t kChunk = 4096;
    thread_local std::vector<float> scratch(kChunk);
    for (int64_t begin = 0; begin < n; begin += kChunk) {
      const int64_t len = std::min(kChunk, n - begin);
      L2Kernel(scratch.data(), g + begin, w + offset + begin, len, wd);
      Update(w, scratch.data(), state, offset + begin, len, lr, t);
    }
  }

 protected:
  // The rule without weight decay (Optimizer::Apply's contract).
  virtual void Update(float* w_base, const float* g_in, SlotState& state, int64_t offset, int64_t n,
                      float lr, int64_t t) const = 0;

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
  void Update(float* w_base, const float* g_in, SlotState& state, int64_t offset, int64_t n,
              float lr, int64_t t) const override {
    SgdKernel(w_base + offset, g_in, n, lr);
  }
};

// a = mu * a + g; w -= lr * a (nesterov: w -= lr * (g + mu * a)), under both conventions
class Momentum final : public RuleBase {
 public:
  explicit Momentum(const OptimizerConfig& c) : RuleBase("momentum", {"momentum"}, c) {}
  SlotState NewState(int64_t n) const override {
    SlotState s;
    s.slots.emplace_back(n, 0.0f);
    return s;
  }
  void Update(float* w_base, const float* g_in, SlotState& state, int64_t offset, int64_t n,
              float lr, int64_t t) const override {
    if (config().nesterov) {
      NesterovKernel(w_base + offset, g_in, Slot(state, 0, offset), n, lr, config().momentum);
    } else {
      MomentumKernel(w_base + offset, g_in, Slot(state, 0, offset), n, lr, config().momentum);
    }
  }
};

// acc += g^2; w -= lr * g / sqrt(acc) (torch: / (sqrt(acc) + eps))
class Adagrad final : public RuleBase {
 public:
  explicit Adagrad(const OptimizerConfig& c) : RuleBase("adagrad", {"accumulator"}, c) {}
  SlotState NewState(int64_t n) const override {
    SlotState s;
    s.slots.emplace_back(n, config().initial_accumulator);
    return s;
  }
  void Update(float* w_base, const float* g_in, SlotState& state, int64_t offset, int64_t n,
              float lr, int64_t t) const override {
    if (Torch(config())) {
      TorchAdagradKernel(w_base + offset, g_in, Slot(state, 0, offset), n, lr, config().adagrad_epsilon);
    } else {
      AdagradKernel(w_base + offset, g_in, Slot(state, 0, offset), n, lr);
    }
  }
};

// alpha = lr * sqrt(1 - beta2^t) / (1 - beta1^t); m += (g - m)(1 - beta1);
// v += (g^2 - v)(1 - beta2); w -= alpha * m / (sqrt(v) + eps) (torch: TorchAdamKernel).
// "adamw" is this rule after RuleBase's decoupled decay.
class Adam final : public RuleBase {
 public:
  explicit Adam(const OptimizerConfig& c) : RuleBase(c.name, {"m", "v"}, c) {}
  SlotState NewState(int64_t n) const override {
    SlotState s;
    s.slots.emplace_back(n, 0.0f);
    s.slots.emplace_back(n, 0.0f);
    return s;
  }
  void Update(float* w_base, const float* g_in, SlotState& state, int64_t offset, int64_t n,
              float lr, int64_t t) const override {
    const OptimizerConfig& c = config();
    // The bias correction in double: beta^t for large t must not be rounded step by step.
    const double t_d = static_cast<double>(t);
    const double bc1 = 1.0 - std::pow(static_cast<double>(c.beta1), t_d);
    const double bc2 = 1.0 - std::pow(static_cast<double>(c.beta2), t_d);
    if (Torch(c)) {
      TorchAdamKernel(w_base + offset, g_in, Slot(state, 0, offset), Slot(state, 1, offset), n,
                      static_cast<float>(lr / bc1), static_cast<float>(std::sqrt(bc2)), OneMinus(c.beta1),
                      c.beta2, OneMinus(c.beta2), c.adam_epsilon);
      return;
    }
    const float alpha = static_cast<float>(lr * std::sqrt(bc2) / bc1);
    AdamKernel(w_base + offset, g_in, Slot(state, 0, offset), Slot(state, 1, offset), n, alpha,
               1.0f - c.beta1, 1.0f - c.beta2, c.adam_epsilon);
  }
};

// ms starts at 1; ms += (g^2 - ms)(1 - rho); mom = mu * mom + lr * g / sqrt(ms + eps); w -= mom
// (torch: TorchRmsPropKernel, ms starting at 0)
class RmsProp final : public RuleBase {
 public:
  explicit RmsProp(const OptimizerConfig& c) : RuleBase("rmsprop", {"ms", "mom"}, c) {}
  SlotState NewState(int64_t n) const override {
    SlotState s;
    s.slots.emplace_back(n, Torch(config()) ? 0.0f : 1.0f);
    s.slots.emplace_back(n, 0.0f);
    return s;
  }
  void Update(float* w_base, const float* g_in, SlotState& state, int64_t offset, int64_t n,
              float lr, int64_t t) const override {
    const OptimizerConfig& c = config();
    if (Torch(c)) {
      TorchRmsPropKernel(w_base + offset, g_in, Slot(state, 0, offset), Slot(state, 1, offset), n, lr,
                         c.rms_decay, OneMinus(c.rms_decay), c.rms_momentum, c.rms_epsilon);
      return;
    }
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
  if (c.convention != "tensorflow" && c.convention != "torch") {
    return absl::InvalidArgumentError(absl::StrCat("optimizer '", c.name, "': convention must be tensorflow or torch, got '",
                                                   c.convention, "'"));
  }
  // `!(x > 0)` also rejects NaN.
  if (!(c.learning_rate > 0.0f) || !std::isfinite(c.learning_rate)) {
    return Invalid(c, "learning_rate", c.learning_rate, "a finite number > 0 (--learning_rate)");
  }
  if (!(c.weight_decay >= 0.0f) || !std::isfinite(c.weight_decay)) {
    return Invalid(c, "weight_decay", c.weight_decay, "a finite number >= 0");
  }
  if (c.name == "momentum" && !(c.momentum >= 0.0f)) {
    return Invalid(c, "momentum", c.momentum, ">= 0");
  }
  if (c.nesterov && !(c.name == "momentum" && c.momentum > 0.0f)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "optimizer '", c.name, "': nesterov needs the momentum rule with momentum > 0 (torch: SGD(momentum=...))"));
  }
  if (c.name == "adagrad") {
    if (Torch(c) ? !(c.initial_accumulator >= 0.0f) : !(c.initial_accumulator > 0.0f)) {
      return Invalid(c, "initial_accumulator", c.initial_accumulator, Torch(c) ? ">= 0" : "> 0");
    }
    if (Torch(c) && !(c.adagrad_epsilon > 0.0f)) {
      return Invalid(c, "adagrad_epsilon", c.adagrad_epsilon, "> 0");
    }
  }
  if (c.name == "adam" || c.name == "adamw") {
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
  return ValidateSchedule(c);
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
  } else if (config.name == "adam" || config.name == "adamw") {
    opt = std::make_unique<Adam>(config);
  } else if (config.name == "rmsprop") {
    opt = std::make_unique<RmsProp>(config);
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        "unknown optimizer '", config.name, "'; choose one of sgd, momentum, adagrad, adam, adamw, rmsprop"));
  }
  if (absl::Status s = Validate(config); !s.ok()) return s;
  return opt;
}

}  // namespace psflow::optim
