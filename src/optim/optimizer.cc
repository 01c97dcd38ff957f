// The dense optimizer of docs/design.md#optimizers: one Rule class over the update kernels of
// update_kernels.h (TensorFlow's or torch.optim's formulas, the same ones the ps tables' sparse rules
// run), with weight decay around them (Rule::Apply) and the hyper-parameter checks. Schedules and
// parameter groups are schedule.cc's. The weight-decay loops are plain loops over __restrict float
// pointers, dispatched per ISA, as the kernels are (the ps runs them on slices of millions of floats).
#include "psflow/optim/optimizer.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "core/check.h"
#include "core/simd_dispatch.h"
#include "optim/update_kernels.h"

namespace psflow::optim {

void Optimizer::ApplyDense(float* w, const float* g, int64_t n, SlotState& state, float lr) const {
  CHECK_EQ(state.slots.size(), slot_names().size()) << "state was not made by " << name();
  for (const FloatBuffer& slot : state.slots) CHECK_GE(static_cast<int64_t>(slot.size()), n);
  Apply(w, g, state, 0, n, lr, state.updates + 1);
  ++state.updates;
}

void Optimizer::ApplyFromBytes(float* w, const void* g, SlotState& state, int64_t offset, int64_t n, float lr,
                               int64_t t) const {
  constexpr int64_t kChunk = 4096;
  alignas(64) float chunk[kChunk];
  const char* bytes = static_cast<const char*>(g);
  for (int64_t begin = 0; begin < n; begin += kChunk) {
    const int64_t len = std::min(kChunk, n - begin);
    std::memcpy(chunk, bytes + begin * 4, static_cast<size_t>(len) * sizeof(float));
    Apply(w, chunk, state, offset + begin, len, lr, t);
  }
}

void Optimizer::ApplySparse(float* w, const std::vector<int64_t>& rows, const float* g_rows, int64_t row_size,
                            SlotState& state, float lr) const {
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

// g + wd * w into out (torch's grad.add(param, alpha=weight_decay)).
PSFLOW_DISPATCH void L2Kernel(float* __restrict out, const float* __restrict g, const float* __restrict w, int64_t n,
                              float wd) {
  for (int64_t i = 0; i < n; ++i) out[i] = g[i] + wd * w[i];
}

PSFLOW_DISPATCH void ScaleKernel(float* __restrict w, int64_t n, float factor) {
  for (int64_t i = 0; i < n; ++i) w[i] *= factor;
}

bool Torch(const OptimizerConfig& c) { return c.convention == "torch"; }

// Every rule: the config's kernel (update_kernels.h: its formula, slots and their initial values)
// wrapped in weight decay. "adamw" is adam's kernel after the decoupled decay.
class Rule final : public Optimizer {
 public:
  explicit Rule(OptimizerConfig config)
      : kernel_(kernels::KernelFor(config)),
        config_(std::move(config)),
        scalars_(kernels::Prepare(kernel_, config_, config_.learning_rate, 1)) {}
  const std::string& name() const override { return config_.name; }
  const std::vector<std::string>& slot_names() const override { return kernels::SlotNames(kernel_); }
  const OptimizerConfig& config() const override { return config_; }

  SlotState NewState(int64_t n) const override {
    SlotState state;
    for (int slot = 0; slot < static_cast<int>(slot_names().size()); ++slot) {
      state.slots.emplace_back(n, kernels::SlotInitialValue(kernel_, config_, slot));
    }
    return state;
  }

  // Weight decay, then the kernel. L2 decay cannot change the received gradient in place, so the
  // decayed gradient goes through a per-thread scratch buffer a chunk at a time.
  // The gradient read in place for the kernels without L2 decay; L2 decay reads it through an
  // aligned chunk (Optimizer's default), as Apply's scratch already copies it.
  void ApplyFromBytes(float* w, const void* g, SlotState& state, int64_t offset, int64_t n, float lr,
                      int64_t t) const override {
    const float wd = config_.weight_decay;
    if (wd != 0.0f && config_.name != "adamw") return Optimizer::ApplyFromBytes(w, g, state, offset, n, lr, t);
    if (wd != 0.0f) ScaleKernel(w + offset, n, static_cast<float>(1.0 - static_cast<double>(lr) * wd));
    float* s0 = nullptr;
    float* s1 = nullptr;
    const kernels::Scalars scalars = ScalarsFor(state, offset, lr, t, &s0, &s1);
    kernels::ApplySliceFromBytes(kernel_, scalars, w + offset, s0, s1, g, n);
  }

  void Apply(float* w, const float* g, SlotState& state, int64_t offset, int64_t n, float lr,
             int64_t t) const override {
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

 private:
  // The rule without weight decay on w[offset, offset + n), g not offset.
  void Update(float* w, const float* g, SlotState& state, int64_t offset, int64_t n, float lr, int64_t t) const {
    float* s0 = nullptr;
    float* s1 = nullptr;
    const kernels::Scalars scalars = ScalarsFor(state, offset, lr, t, &s0, &s1);
    kernels::ApplySlice(kernel_, scalars, w + offset, s0, s1, g, n);
  }

  // The kernel's scalars for an update at lr and t, and its slots' slices at `offset`.
  kernels::Scalars ScalarsFor(SlotState& state, int64_t offset, float lr, int64_t t, float** s0, float** s1) const {
    const size_t slots = state.slots.size();
    *s0 = slots > 0 ? state.slots[0].data() + offset : nullptr;
    *s1 = slots > 1 ? state.slots[1].data() + offset : nullptr;
    // The scalars made once, but for the learning rate (and adam's, which also reads t).
    kernels::Scalars scalars = scalars_;
    if (kernels::ReadsStep(kernel_)) {
      scalars = kernels::Prepare(kernel_, config_, lr, t);
    } else {
      scalars.lr = lr;
    }
    return scalars;
  }

  kernels::Kernel kernel_;
  OptimizerConfig config_;
  kernels::Scalars scalars_;
};

absl::Status Invalid(const OptimizerConfig& c, const std::string& field, float value, const std::string& requirement) {
  return absl::InvalidArgumentError(
      absl::StrCat("optimizer '", c.name, "': ", field, " must be ", requirement, ", got ", value));
}

absl::Status Validate(const OptimizerConfig& c) {
  if (c.convention != "tensorflow" && c.convention != "torch") {
    return absl::InvalidArgumentError(
        absl::StrCat("optimizer '", c.name, "': convention must be tensorflow or torch, got '", c.convention, "'"));
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
  static const absl::flat_hash_set<std::string> kNames = {"sgd", "momentum", "adagrad", "adam", "adamw", "rmsprop"};
  if (!kNames.contains(config.name)) {
    return absl::InvalidArgumentError(absl::StrCat("unknown optimizer '", config.name,
                                                   "'; choose one of sgd, momentum, adagrad, adam, adamw, rmsprop"));
  }
  if (absl::Status s = Validate(config); !s.ok()) return s;
  return std::make_unique<Rule>(config);
}

}  // namespace psflow::optim
