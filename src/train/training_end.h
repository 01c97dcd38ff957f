// train/training_end.h — the end-of-training marker in a checkpoint directory: the chief (or a
// single-process run) writes DIR/training_end.json once it has saved the final checkpoint
// ({"outcome": "done", "global_step": N}) or when it aborts the job ({"outcome": "failed",
// "reason": "..."}), and removes it when it initializes a job (psflow local removes it before
// starting the tasks). The evaluator task (programs/eval/evaluator.h) reads it to know when to end.
// Free functions over files; safe from any thread (each call is one atomic file operation).
#ifndef PSFLOW_TRAIN_TRAINING_END_H_
#define PSFLOW_TRAIN_TRAINING_END_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "psflow/io/env.h"

namespace psflow::train {

inline constexpr char kTrainingEndFile[] = "training_end.json";
struct TrainingEnd {
  bool failed = false;
  int64_t global_step = 0;  // done: the step of the final checkpoint
  std::string reason;       // failed: why
};
// Writes DIR/training_end.json atomically.
absl::Status WriteTrainingEnd(const std::string& dir, const TrainingEnd& end, io::Env* env = io::Env::Default());
// Removes it (a missing file is fine).
absl::Status ClearTrainingEnd(const std::string& dir, io::Env* env = io::Env::Default());
// nullopt when there is none; an error when it exists but does not parse.
absl::StatusOr<std::optional<TrainingEnd>> ReadTrainingEnd(const std::string& dir, io::Env* env = io::Env::Default());

}  // namespace psflow::train

#endif  // PSFLOW_TRAIN_TRAINING_END_H_
