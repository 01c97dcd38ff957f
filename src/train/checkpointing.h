// Saving the model's variables, whole and by name, in the safetensors layout, as
// DIR/model.ckpt-STEP.safetensors (independent of how the variables were partitioned).
// TODO(issue 4): optimizer state, periodic saves, keep-last-K, checksums and restore.
#ifndef PSFLOW_TRAIN_CHECKPOINTING_H_
#define PSFLOW_TRAIN_CHECKPOINTING_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "psflow/core/autodiff.h"

namespace psflow::train {

absl::Status SaveVariables(const std::string& dir, const std::string& model, const std::vector<Var>& params,
                           int64_t global_step);

}  // namespace psflow::train

#endif  // PSFLOW_TRAIN_CHECKPOINTING_H_
