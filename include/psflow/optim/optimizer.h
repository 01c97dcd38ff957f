// psflow/optim/optimizer.h — update rules and learning-rate schedules (docs/design.md#optimizers), written so
// that single-process training and the parameter server run the very same code: an Optimizer is
// a stateless, thread-safe rule; the state it needs (slots such as Adam's m and v, and the count
// of updates applied) lives beside each variable or shard in a SlotState owned by the caller, and
// an update is applied to one contiguous slice of floats at a time. Row-sparse updates call
// Apply once per touched row with that row's slices.
#ifndef PSFLOW_OPTIM_OPTIMIZER_H_
#define PSFLOW_OPTIM_OPTIMIZER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "psflow/core/tensor.h"

namespace psflow::optim {

struct OptimizerConfig {
  std::string name = "sgd";  // sgd | momentum | adagrad | adam | rmsprop
  float learning_rate = 0.01f;
  float momentum = 0.9f;           // momentum
  float initial_accumulator = 0.1f;  // adagrad
  float beta1 = 0.9f, beta2 = 0.999f, adam_epsilon = 1e-8f;  // adam
  float rms_decay = 0.9f, rms_momentum = 0.0f, rms_epsilon = 1e-10f;  // rmsprop
  // Exponential decay: lr * rate^(step / decay_steps), exponent floored when staircase.
  int64_t decay_steps = 0;  // 0 = constant learning rate
  float decay_rate = 1.0f;
  bool staircase = false;
};

// The learning rate at `global_step` under the config's decay schedule.
float DecayedLearningRate(const OptimizerConfig& config, int64_t global_step);

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
  // same offset. `lr` is the (already decayed) learning rate; `t` counts this update from 1.
  // `w` is the variable's base pointer (the update touches w + offset); `g` is not offset. The
  // inner loops are plain vectorizable loops; callers parallelize by splitting [0, size) into
  // disjoint (offset, n) ranges, which is safe because ranges touch disjoint memory.
  virtual void Apply(float* w, const float* g, SlotState& state, int64_t offset, int64_t n,
                     float lr, int64_t t) const = 0;

  // Dense update of a whole variable: Apply over all elements, then state.updates++.
  void ApplyDense(float* w, const float* g, int64_t n, SlotState& state, float lr) const;
  // Row-sparse update: rows[i] of a variable with `row_size` floats per row gets g_rows[i].
  // Only those rows (and their slot rows) change; then state.updates++. Every row shares the same
  // t (so Adam's slots of untouched rows are not decayed: "lazy" Adam). A row listed twice is
  // updated twice, in order. Rows must be in range: validate rows coming from peers beforehand.
  void ApplySparse(float* w, const std::vector<int64_t>& rows, const float* g_rows,
                   int64_t row_size, SlotState& state, float lr) const;
};

// The optimizer named in the config, or InvalidArgument naming the unknown name and the choices.
absl::StatusOr<std::unique_ptr<Optimizer>> MakeOptimizer(const OptimizerConfig& config);

}  // namespace psflow::optim

#endif  // PSFLOW_OPTIM_OPTIMIZER_H_
