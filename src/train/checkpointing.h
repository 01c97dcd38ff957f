// Training state <-> checkpoint files (psflow/ckpt/checkpoint.h). The state is every variable
// whole, its optimizer slots ("VAR/slot/NAME") and update count, and the global step: the same
// whether it came from one process or was assembled from the shards of many ps tasks, so a
// checkpoint restores onto any number of ps tasks and any partitioner.
#ifndef PSFLOW_TRAIN_CHECKPOINTING_H_
#define PSFLOW_TRAIN_CHECKPOINTING_H_

#include <chrono>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "psflow/core/autodiff.h"
#include "psflow/dist/partition.h"
#include "psflow/optim/optimizer.h"
#include "psflow/train/train.h"

namespace psflow::train {

struct VariableState {
  Tensor value;
  std::vector<Tensor> slots;  // in optimizer.slot_names() order
  int64_t updates = 0;
};

struct TrainingState {
  int64_t global_step = 0;
  std::string model, optimizer;
  std::map<std::string, VariableState> variables;
};

absl::StatusOr<std::string> SaveTrainingState(const std::string& dir, const TrainingState& state,
                                              const std::vector<std::string>& slot_names, int keep = 5);

// The newest valid checkpoint of `dir` as a TrainingState for `variables` (names and shapes must
// match: a mismatch is an error naming the variable), or nullopt when there is none. Skipped
// corrupt checkpoints are logged.
absl::StatusOr<std::optional<TrainingState>> LoadTrainingState(const std::string& dir, const std::string& model,
                                                              const std::vector<dist::VariableSpec>& variables,
                                                              const optim::Optimizer& optimizer, const LogSink& log);

// Decides when the chief saves: every `steps` global steps and/or every `secs` seconds.
class CheckpointSchedule {
 public:
  CheckpointSchedule(int64_t steps, double secs, int64_t start_step)
      : steps_(steps), secs_(secs), last_step_(start_step), last_time_(std::chrono::steady_clock::now()) {}
  bool Due(int64_t global_step) const {
    if (steps_ > 0 && global_step - last_step_ >= steps_) return true;
    return secs_ > 0 && std::chrono::duration<double>(std::chrono::steady_clock::now() - last_time_).count() >= secs_;
  }
  void Saved(int64_t global_step) {
    last_step_ = global_step;
    last_time_ = std::chrono::steady_clock::now();
  }

 private:
  int64_t steps_;
  double secs_;
  int64_t last_step_;
  std::chrono::steady_clock::time_point last_time_;
};

}  // namespace psflow::train

#endif  // PSFLOW_TRAIN_CHECKPOINTING_H_
