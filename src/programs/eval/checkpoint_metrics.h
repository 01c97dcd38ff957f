// programs/eval/checkpoint_metrics.h — what a model's checkpoint evaluation returns: the types the
// evaluator task (programs/eval/evaluator.h) calls and each model's program provides (the image
// models' in evaluator.cc, the ctr model's in programs/ctr/eval_ctr.h). Types only.
#ifndef PSFLOW_PROGRAMS_EVAL_CHECKPOINT_METRICS_H_
#define PSFLOW_PROGRAMS_EVAL_CHECKPOINT_METRICS_H_

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "psflow/ckpt/checkpoint.h"
#include "psflow/train/options.h"

namespace psflow::train {

// Named metrics of one checkpoint, in print order: "validation_accuracy", "test_cross_entropy",
// "test_log_loss", "test_auc", ... ("SPLIT_WHAT" is written to TensorBoard as "WHAT/SPLIT").
using Metrics = std::vector<std::pair<std::string, double>>;
using CheckpointMetricsFn = std::function<absl::StatusOr<Metrics>(const ckpt::OpenedCheckpoint&)>;
// Makes the evaluation function of a model (it may load its data once here).
using CheckpointMetricsFactory = std::function<absl::StatusOr<CheckpointMetricsFn>(const TrainOptions&)>;

}  // namespace psflow::train

#endif  // PSFLOW_PROGRAMS_EVAL_CHECKPOINT_METRICS_H_
