// psflow/optim/optimizer.h — update rules, parameter groups and learning-rate schedules
// (docs/design.md#optimizers), written so that single-process training and the parameter server
// run the very same code: an Optimizer is
// a stateless, thread-safe rule; the state it needs (slots such as Adam's m and v, and the count
// of updates applied) lives beside each variable or shard in a SlotState owned by the caller, and
// an update is applied to one contiguous slice of floats at a time. Row-sparse updates call
// Apply once per touched row with that row's slices.
#ifndef PSFLOW_OPTIM_OPTIMIZER_H_
#define PSFLOW_OPTIM_OPTIMIZER_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "psflow/core/tensor.h"

namespace psflow::optim {

// Settings of one parameter group (torch.optim's param_groups): the ps variables it names use
// their own base learning rate and weight decay; every other hyper-parameter is the config's.
// A partitioned variable's shards follow their variable (the ps looks shards up by variable).
struct ParameterGroup {
  std::vector<std::string> variables;
  std::optional<float> learning_rate;  // this group's base lr; else the config's times lr_scale
  float lr_scale = 1.0f;
  std::optional<float> weight_decay;  // else the config's
  bool operator==(const ParameterGroup&) const = default;
};

struct OptimizerConfig {
  std::string name = "sgd";  // sgd | momentum | adagrad | adam | adamw | rmsprop
  // Whose kernels the rules follow (docs/design.md#optimizers): "tensorflow" (the default; psflow
  // train's seeds) or "torch" (torch.optim's, as psflow.optim sets). They differ in Adam's epsilon
  // (TF adds it to sqrt(v) before the bias correction, torch after), Adagrad (torch adds
  // adagrad_epsilon to sqrt(acc)) and RMSProp (torch: ms starts at 0, epsilon outside the sqrt,
  // lr applied after the momentum); sgd and momentum are the same under both.
  std::string convention = "tensorflow";
  float learning_rate = 0.01f;
  float momentum = 0.9f;                                              // momentum
  bool nesterov = false;                                              // momentum: w -= lr * (g + momentum * a)
  float initial_accumulator = 0.1f;                                   // adagrad
  float adagrad_epsilon = 1e-10f;                                     // adagrad, torch convention
  float beta1 = 0.9f, beta2 = 0.999f, adam_epsilon = 1e-8f;           // adam, adamw
  float rms_decay = 0.9f, rms_momentum = 0.0f, rms_epsilon = 1e-10f;  // rmsprop
  // adamw: decoupled, w *= 1 - lr * weight_decay before the Adam step; every other rule: L2,
  // g += weight_decay * w before the step (torch's weight_decay).
  float weight_decay = 0.0f;
  std::vector<ParameterGroup> groups;

  // The learning-rate schedule (LearningRateAt): an optional linear warmup, then one of
  //  "exponential": lr * rate^(step / decay_steps), the exponent floored when staircase
  //                 (decay_steps 0: constant; torch's StepLR is the staircase form);
  //  "cosine":      min_learning_rate + (lr - min_learning_rate)(1 + cos(pi s / cosine_steps)) / 2,
  //                 s clamped to cosine_steps (torch's CosineAnnealingLR up to T_max);
  //  "piecewise":   values[i] for boundaries[i-1] < step <= boundaries[i] (tf.train.piecewise_constant;
  //                 values are learning rates of the config's lr: a group's are scaled by its lr / lr).
  // With warmup_steps W > 0, steps s < W use lr * (f + (1 - f) s / W), f = warmup_start_factor
  // (torch's LinearLR), and the schedule above runs on step - W (torch's SequentialLR).
  std::string schedule = "exponential";
  int64_t decay_steps = 0;
  float decay_rate = 1.0f;
  bool staircase = false;
  int64_t cosine_steps = 0;
  float min_learning_rate = 0.0f;
  std::vector<int64_t> boundaries;
  std::vector<float> values;
  int64_t warmup_steps = 0;
  float warmup_start_factor = 0.0f;
};

// The learning rate at `global_step` under the config's schedule (the one function the ps, the
// single-process trainer and the worker session's `learning_rate` use).
float LearningRateAt(const OptimizerConfig& config, int64_t global_step);

// The config the rule of ps variable `variable` runs with: its group's learning rate and weight
// decay (piecewise values scaled by the group's lr / the config's), groups cleared.
OptimizerConfig ConfigForVariable(const OptimizerConfig& config, const std::string& variable);

// OK, or InvalidArgument naming the schedule field (or, ValidateGroups, the group) that is wrong.
// MakeOptimizer checks both; ValidateSchedule calls ValidateGroups.
absl::Status ValidateSchedule(const OptimizerConfig& config);
absl::Status ValidateGroups(const OptimizerConfig& config);

// State of one variable (or shard): one buffer per slot, each the variable's size, plus the
// number of updates applied so far (Adam's t is updates + 1 during an update).
struct SlotState {
  std::vector<FloatBuffer> slots;
  int64_t updates = 0;
};

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  virtual const std::string& name() const = 0;
  // Slot names in order ("m", "v" for adam; "ms", "mom" for rmsprop; ...).
  virtual const std::vector<std::string>& slot_names() const = 0;
  // The (validated) configuration this optimizer was made from.
  virtual const OptimizerConfig& config() const = 0;
  // Fresh state for a variable of n elements (slots at their initial values, e.g. rmsprop ms=1).
  virtual SlotState NewState(int64_t n) const = 0;
  // Applies one update to w[offset, offset+n) with gradient g[0, n) and the slot slices at the
  // same offset (weight decay included: L2 added to the gradient, or adamw's decoupled decay). `lr` is the (already
  // decayed) learning rate; `t` counts this update from 1. `w` is the variable's base pointer (the update touches w +
  // offset); `g` is not offset. The inner loops are plain vectorizable loops; callers parallelize by splitting [0,
  // size) into disjoint (offset, n) ranges, which is safe because ranges touch disjoint memory.
  virtual void Apply(float* w, const float* g, SlotState& state, int64_t offset, int64_t n, float lr,
                     int64_t t) const = 0;
  // Apply with the gradient's n float32 values stored at any byte address `g` (a received message's
  // bytes, which need not be float-aligned), read in place. The same result, bit for bit, as Apply
  // on an aligned copy of them (which is what this default does, a chunk at a time).
  virtual void ApplyFromBytes(float* w, const void* g, SlotState& state, int64_t offset, int64_t n, float lr,
                              int64_t t) const;

  // Dense update of a whole variable: Apply over all elements, then state.updates++.
  void ApplyDense(float* w, const float* g, int64_t n, SlotState& state, float lr) const;
  // Row-sparse update: rows[i] of a variable with `row_size` floats per row gets g_rows[i].
  // Only those rows (and their slot rows) change; then state.updates++. Every row shares the same
  // t (so Adam's slots of untouched rows are not decayed: "lazy" Adam). A row listed twice is
  // updated twice, in order. Rows must be in range: validate rows coming from peers beforehand.
  void ApplySparse(float* w, const std::vector<int64_t>& rows, const float* g_rows, int64_t row_size, SlotState& state,
                   float lr) const;
};

// The optimizer named in the config, or InvalidArgument naming the unknown name and the choices.
absl::StatusOr<std::unique_ptr<Optimizer>> MakeOptimizer(const OptimizerConfig& config);

}  // namespace psflow::optim

#endif  // PSFLOW_OPTIM_OPTIMIZER_H_
