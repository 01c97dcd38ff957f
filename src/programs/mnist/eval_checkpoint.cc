// `psflow eval`: the test and validation accuracy and cross-entropy of the newest valid
// checkpoint in --checkpoint_dir; and the model of a checkpoint, which the evaluator task
// (programs/eval/evaluator.h) evaluates the same way.
#include "absl/strings/str_cat.h"
#include "programs/mnist/mnist.h"
#include "psflow/ckpt/checkpoint.h"
#include "psflow/train/train.h"

namespace psflow::train {

absl::StatusOr<std::unique_ptr<nn::Model>> ModelFromCheckpoint(const TrainOptions& options,
                                                               const ckpt::Checkpoint& checkpoint) {
  auto model_name = checkpoint.contents.metadata.find("model");
  if (model_name != checkpoint.contents.metadata.end() && model_name->second != options.model) {
    return absl::InvalidArgumentError(absl::StrCat(checkpoint.path, " holds model '", model_name->second,
                                                   "', not --model=", options.model,
                                                   "; pass --model=", model_name->second));
  }
  auto model = nn::BuildModel(ModelConfigFrom(options));
  if (!model.ok()) return model.status();
  for (const Var& p : (*model)->parameters()) {
    auto it = checkpoint.contents.tensors.find(p->name);
    if (it == checkpoint.contents.tensors.end()) {
      return absl::InvalidArgumentError(absl::StrCat(checkpoint.path, " has no variable ", p->name, " of model ",
                                                     options.model, " (check --model and --hidden_units)"));
    }
    if (it->second.shape() != p->value.shape()) {
      return absl::InvalidArgumentError(absl::StrCat(checkpoint.path, ": variable ", p->name, " has shape ",
                                                     ShapeToString(it->second.shape()), ", model ", options.model,
                                                     " needs ", ShapeToString(p->value.shape())));
    }
    p->value = it->second;
  }
  return model;
}

absl::StatusOr<CheckpointEval> EvaluateCheckpoint(const TrainOptions& options, const LogSink& log) {
  if (options.checkpoint_dir.empty()) {
    return absl::InvalidArgumentError(
        "psflow eval needs --checkpoint_dir=DIR (a directory the chief saved checkpoints to)");
  }
  std::vector<std::string> skipped;
  auto latest = ckpt::LoadLatestCheckpoint(options.checkpoint_dir, &skipped);
  if (!latest.ok()) return latest.status();
  for (const std::string& s : skipped) log(s);
  if (!latest->has_value()) {
    return absl::NotFoundError(absl::StrCat("no valid checkpoint in --checkpoint_dir=", options.checkpoint_dir));
  }
  const ckpt::Checkpoint& checkpoint = **latest;
  auto model = ModelFromCheckpoint(options, checkpoint);
  if (!model.ok()) return model.status();
  auto data = LoadTrainingData(options);
  if (!data.ok()) return data.status();
  CheckpointEval result;
  result.path = checkpoint.path;
  result.global_step = checkpoint.global_step;
  result.validation = Evaluate(**model, data->validation);
  result.test = Evaluate(**model, data->test);
  return result;
}

}  // namespace psflow::train
