// psflow/train/train.h's program entry points, routed by --model: the ctr model's programs
// (programs/ctr) or the image classifiers' (programs/mnist).
#include "programs/ctr/ctr_single.h"
#include "programs/mnist/mnist.h"
#include "psflow/train/train.h"

namespace psflow::train {

absl::StatusOr<RunSummary> TrainSingleProcess(const TrainOptions& options, const LogSink& log) {
  if (options.model == "ctr") return RunCtrSingleProcess(options, log);  // tables, not an image classifier
  return TrainImageSingleProcess(options, log);
}

absl::StatusOr<RunSummary> RunWorker(const TrainOptions& options, const LogSink& log) {
  if (options.model == "ctr") return RunCtrWorker(options, log);  // tables on the ps, not an image classifier
  return RunImageWorker(options, log);
}

}  // namespace psflow::train
