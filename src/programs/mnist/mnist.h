// programs/mnist/mnist.h — the image classifiers' programs (softmax, mlp, cnn on MNIST; vgg19 on
// synthetic 32x32x3 images): train alone in one process, run a worker of a cluster, and rebuild a
// model from a checkpoint. psflow/train/train.h's TrainSingleProcess and RunWorker route here for
// every --model but ctr (programs/programs.cc); Evaluate, LoadTrainingData and EvaluateCheckpoint
// of train.h are defined in this library too. Each call blocks; one thread drives it.
#ifndef PSFLOW_PROGRAMS_MNIST_MNIST_H_
#define PSFLOW_PROGRAMS_MNIST_MNIST_H_

#include <memory>

#include "absl/status/statusor.h"
#include "psflow/ckpt/checkpoint.h"
#include "psflow/nn/model.h"
#include "psflow/train/options.h"
#include "psflow/train/summary.h"
#include "psflow/train/train.h"

namespace psflow::train {

// `psflow train` of an image model without a cluster (single.cc).
absl::StatusOr<RunSummary> TrainImageSingleProcess(const TrainOptions& options, const LogSink& log);
// A worker task of an image model (worker.cc); the chief evaluates the final parameters on MNIST.
absl::StatusOr<RunSummary> RunImageWorker(const TrainOptions& options, const LogSink& log);

// The model of --model/--hidden_units with the checkpoint's values (errors name the checkpoint,
// the variable and the fix: another --model, --hidden_units). eval_checkpoint.cc.
absl::StatusOr<std::unique_ptr<nn::Model>> ModelFromCheckpoint(const TrainOptions& options,
                                                               const ckpt::Checkpoint& checkpoint);

}  // namespace psflow::train

#endif  // PSFLOW_PROGRAMS_MNIST_MNIST_H_
