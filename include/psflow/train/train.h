// psflow/train/train.h — the three things a psflow task does: train alone in one process, run a
// worker (task 0 is the chief: it initializes the ps tasks, evaluates and reports at the end, and
// tells the ps tasks to exit), or run a parameter server until training ends. Each call blocks
// until its task is done and returns the task's outcome; errors name what went wrong.
// RunParameterServer is in the psflow::train library (the runtime); the programs (training alone, a
// worker, evaluation) are in psflow::programs (src/programs, by model); psflow::psflow has both.
#ifndef PSFLOW_TRAIN_TRAIN_H_
#define PSFLOW_TRAIN_TRAIN_H_

#include <functional>
#include <string>

#include "absl/status/statusor.h"
#include "psflow/data/mnist.h"
#include "psflow/nn/model.h"
#include "psflow/train/options.h"
#include "psflow/train/summary.h"

namespace psflow::train {

// Where log lines go (stdout by default); the tests capture them.
using LogSink = std::function<void(const std::string& line)>;

absl::StatusOr<RunSummary> TrainSingleProcess(const TrainOptions& options, const LogSink& log);
// Runs worker `options.task_index`; the chief returns the run's summary, others a summary of
// what they saw (no evaluation).
absl::StatusOr<RunSummary> RunWorker(const TrainOptions& options, const LogSink& log);
absl::Status RunParameterServer(const TrainOptions& options, const LogSink& log);

struct EvalResult {
  double accuracy = 0;
  double cross_entropy = 0;
};
// Accuracy and mean cross-entropy of the model (as its parameters stand) over a whole dataset,
// without dropout, in batches.
EvalResult Evaluate(nn::Model& model, const data::Dataset& dataset);

struct CheckpointEval {
  std::string path;
  int64_t global_step = 0;
  EvalResult validation, test;
};
// Evaluates the newest valid checkpoint of options.checkpoint_dir (psflow eval).
absl::StatusOr<CheckpointEval> EvaluateCheckpoint(const TrainOptions& options, const LogSink& log);

// The training data a model trains on: MNIST from options.data_dir, or synthetic 32x32x3 images
// for vgg19. Errors name the directory or file.
absl::StatusOr<data::MnistData> LoadTrainingData(const TrainOptions& options);

}  // namespace psflow::train

#endif  // PSFLOW_TRAIN_TRAIN_H_
