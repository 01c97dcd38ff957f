// psflow/train/train.h's program entry points, routed by --model: the ctr model's programs
// (programs/ctr) or the image classifiers' (programs/mnist).
#include "absl/strings/str_cat.h"
#include "programs/ctr/ctr_single.h"
#include "programs/mnist/mnist.h"
#include "psflow/train/train.h"

namespace psflow::train {
namespace {

// Files in Criteo's layout are the ctr model's data (programs/ctr/ctr_files.h).
absl::Status NoCtrFiles(const TrainOptions& options) {
  if (options.train_files.empty() && options.test_files.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "--train_files and --test_files are the ctr model's data; --model=", options.model, " reads --data_dir"));
}

}  // namespace

absl::StatusOr<RunSummary> TrainSingleProcess(const TrainOptions& options, const LogSink& log) {
  if (options.model == "ctr") return RunCtrSingleProcess(options, log);  // tables, not an image classifier
  if (absl::Status s = NoCtrFiles(options); !s.ok()) return s;
  return TrainImageSingleProcess(options, log);
}

absl::StatusOr<RunSummary> RunWorker(const TrainOptions& options, const LogSink& log) {
  if (options.model == "ctr") return RunCtrWorker(options, log);  // tables on the ps, not an image classifier
  if (absl::Status s = NoCtrFiles(options); !s.ok()) return s;
  return RunImageWorker(options, log);
}

}  // namespace psflow::train
