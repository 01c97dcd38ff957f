#include "train/checkpointing.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "psflow/ckpt/checkpoint.h"

namespace psflow::train {

absl::Status PrepareCheckpointDir(const std::string& dir, io::Env* env) {
  if (absl::Status s = env->CreateDir(dir); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat(s.message(), "; pick a writable --checkpoint_dir"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> SaveTrainingState(const std::string& dir, const TrainingState& state,
                                              const std::vector<std::string>& slot_names, int keep, io::Env* env) {
  std::vector<std::pair<std::string, const Tensor*>> tensors;
  std::vector<std::string> names;  // keeps slot names alive while `tensors` points at them
  std::map<std::string, std::string> metadata = {{"model", state.model}, {"optimizer", state.optimizer}};
  for (const auto& [name, v] : state.variables) {
    tensors.emplace_back(name, &v.value);
    for (size_t s = 0; s < v.slots.size() && s < slot_names.size(); ++s) {
      tensors.emplace_back(ckpt::SlotTensorName(name, slot_names[s]), &v.slots[s]);
    }
    metadata["updates/" + name] = absl::StrCat(v.updates);
  }
  return ckpt::SaveCheckpoint(dir, state.global_step, tensors, metadata, keep, env);
}

absl::StatusOr<std::optional<TrainingState>> LoadTrainingState(const std::string& dir, const std::string& model,
                                                              const std::vector<dist::VariableSpec>& variables,
                                                              const optim::Optimizer& optimizer, const LogSink& log,
                                                              io::Env* env) {
  std::vector<std::string> skipped;
  auto latest = ckpt::LoadLatestCheckpoint(dir, &skipped, env);
  if (!latest.ok()) return latest.status();
  for (const std::string& s : skipped) log(s);
  if (!latest->has_value()) return std::optional<TrainingState>();
  ckpt::Checkpoint& checkpoint = **latest;
  auto& meta = checkpoint.contents.metadata;
  auto& tensors = checkpoint.contents.tensors;
  if (meta.count("model") && meta["model"] != model) {
    return absl::FailedPreconditionError(absl::StrCat(checkpoint.path, " holds model '", meta["model"],
                                                      "' but this run trains '", model,
                                                      "'; use another --checkpoint_dir or --model=", meta["model"]));
  }
  TrainingState state;
  state.global_step = checkpoint.global_step;
  state.model = model;
  state.optimizer = optimizer.name();
  const bool same_optimizer = meta.count("optimizer") && meta["optimizer"] == optimizer.name();
  if (!same_optimizer) {
    log(absl::StrCat(checkpoint.path, ": optimizer '", meta["optimizer"], "' differs from --optimizer=",
                     optimizer.name(), "; restoring variables only, fresh optimizer state"));
  }
  for (const dist::VariableSpec& p : variables) {
    auto it = tensors.find(p.name);
    if (it == tensors.end()) {
      return absl::FailedPreconditionError(absl::StrCat(checkpoint.path, " lacks variable ", p.name));
    }
    if (it->second.shape() != p.shape) {
      return absl::FailedPreconditionError(absl::StrCat(checkpoint.path, ": variable ", p.name, " has shape ",
                                                        ShapeToString(it->second.shape()), ", the model needs ",
                                                        ShapeToString(p.shape)));
    }
    VariableState v;
    v.value = std::move(it->second);
    optim::SlotState fresh = optimizer.NewState(v.value.size());
    for (size_t s = 0; s < optimizer.slot_names().size(); ++s) {
      auto slot = same_optimizer ? tensors.find(ckpt::SlotTensorName(p.name, optimizer.slot_names()[s])) : tensors.end();
      if (slot != tensors.end() && slot->second.size() == v.value.size()) {
        v.slots.push_back(std::move(slot->second).Reshaped(v.value.shape()));
      } else {
        v.slots.emplace_back(v.value.shape(), std::vector<float>(fresh.slots[s].begin(), fresh.slots[s].end()));
      }
    }
    // A count missing or malformed in the metadata restores as 0 updates.
    if (same_optimizer && !absl::SimpleAtoi(meta["updates/" + p.name], &v.updates)) v.updates = 0;
    state.variables.emplace(p.name, std::move(v));
  }
  log(absl::StrCat("restored ", checkpoint.path, " at global step ", state.global_step));
  return std::optional<TrainingState>(std::move(state));
}

}  // namespace psflow::train
