// The evaluator task (TF's Evaluator replica; docs/evaluator.md): it watches --checkpoint_dir,
// evaluates each new checkpoint once as it appears, writes the metrics as TensorBoard scalars under
// --logdir/eval/ (beside the chief's curves, same tags) and ends when the chief says training ended.
// It reads checkpoint files only and never talks to the ps tasks, so it cannot slow training down.
//
// How it knows training ended: the chief's end-of-training marker (train/training_end.h). The
// evaluator ends (OK) once it has evaluated the checkpoint of step
// N, or fails with the chief's reason. A "done" marker of step N < --train_steps (when the
// evaluator was given --train_steps) is an earlier run's and is ignored.
//
// CheckpointWatcher and EvalReporter are used by one thread each (not thread-safe); the metrics
// registry is written at start-up (static initializers, main) and read afterwards.
#ifndef PSFLOW_PROGRAMS_EVAL_EVALUATOR_H_
#define PSFLOW_PROGRAMS_EVAL_EVALUATOR_H_

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "programs/eval/checkpoint_metrics.h"
#include "psflow/ckpt/checkpoint.h"
#include "psflow/io/env.h"
#include "psflow/tboard/event_writer.h"
#include "psflow/train/options.h"
#include "psflow/train/train.h"
#include "train/training_end.h"

namespace psflow::train {

struct WatchOptions {
  std::string checkpoint_dir;
  // Given: a "done" marker of a smaller step is an earlier run's (see above).
  std::optional<int64_t> final_step;
  // Gives up (DeadlineExceeded) after this long without a new checkpoint or the end marker.
  double timeout_secs = 3600;
  double poll_secs = 0.5;
  // The "waiting" line is logged at most this often.
  double log_every_secs = 60;
  io::Env* env = io::Env::Default();
};

class CheckpointWatcher {
 public:
  explicit CheckpointWatcher(WatchOptions options);
  // The newest checkpoint newer than the last one returned, as soon as there is one; nullopt when
  // training ended and its final checkpoint was returned already. Errors: the job failed (the
  // chief's reason), or nothing new within timeout_secs. Checkpoints saved while the caller was
  // evaluating are skipped for the newest one (TF's checkpoints_iterator does the same).
  // Opened only (the header read and the checksum checked): a model with embedding tables reads
  // the rows it needs, never a whole table.
  absl::StatusOr<std::optional<ckpt::OpenedCheckpoint>> NextOpened(const LogSink& log);
  // The same checkpoint read whole (every tensor in memory).
  absl::StatusOr<std::optional<ckpt::Checkpoint>> Next(const LogSink& log);
  int64_t last_step() const { return last_step_; }

 private:
  WatchOptions options_;
  int64_t last_step_ = -1;
  std::set<std::string> skipped_logged_;  // corrupt files already named (each is named once)
};

// The hook for models whose metrics are not accuracy and cross-entropy on MNIST-like images (the
// ctr models' log-loss and AUC): registered by model name, before the evaluator starts.
void RegisterCheckpointMetrics(const std::string& model, CheckpointMetricsFactory factory);
// The registered factory of options.model; for --model=ctr, CtrCheckpointMetrics
// (programs/ctr/eval_ctr.h); else the image
// models' (validation and test accuracy and cross-entropy of the model rebuilt from
// --model/--hidden_units with the checkpoint's values).
absl::StatusOr<CheckpointMetricsFn> CheckpointMetricsFor(const TrainOptions& options);

// Logs "eval: global_step=N validation_accuracy=0.9 ... checkpoint=PATH" and writes the scalars
// under logdir/eval/ (no events when logdir is empty).
class EvalReporter {
 public:
  static absl::StatusOr<std::unique_ptr<EvalReporter>> Create(const std::string& logdir, const LogSink& log,
                                                              io::Env* env = io::Env::Default());
  absl::Status Report(int64_t global_step, const std::string& checkpoint, const Metrics& metrics);
  int reported() const { return reported_; }

 private:
  EvalReporter(const LogSink& log, std::unique_ptr<tboard::EventWriter> events)
      : log_(log), events_(std::move(events)) {}
  const LogSink& log_;
  std::unique_ptr<tboard::EventWriter> events_;
  int reported_ = 0;
};

// The metrics line's text of one value: shortest of 6 significant digits.
std::string MetricText(double value);

// The whole evaluator task: watch, evaluate, report, until training ends.
absl::Status RunEvaluator(const TrainOptions& options, const WatchOptions& watch, const LogSink& log);

}  // namespace psflow::train

#endif  // PSFLOW_PROGRAMS_EVAL_EVALUATOR_H_
