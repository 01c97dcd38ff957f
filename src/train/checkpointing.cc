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
                                              const std::vector<std::string>& slot_names, int keep, io::Env* env,
                                              const std::function<absl::Status(ckpt::SafetensorsWriter&)>& more) {
  std::vector<std::pair<std::string, const Tensor*>> tensors;
  std::map<std::string, std::string> metadata = {{"model", state.model}, {"optimizer", state.optimizer}};
  if (!state.work_queue.empty()) metadata[kWorkQueueMetadataKey] = state.work_queue;
  for (const auto& [name, v] : state.variables) {
    tensors.emplace_back(name, &v.value);
    for (size_t s = 0; s < v.slots.size() && s < slot_names.size(); ++s) {
      tensors.emplace_back(ckpt::SlotTensorName(name, slot_names[s]), &v.slots[s]);
    }
    metadata["updates/" + name] = absl::StrCat(v.updates);
  }
  return ckpt::SaveCheckpointStreamed(
      dir, state.global_step,
      [&](ckpt::SafetensorsWriter& writer) {
        for (const auto& [name, t] : tensors) {
          if (absl::Status s = writer.AddF32(name, t); !s.ok()) return s;
        }
        return more ? more(writer) : absl::OkStatus();
      },
      std::move(metadata), keep, env);
}

absl::StatusOr<std::optional<TrainingState>> LoadTrainingState(const std::string& dir, const std::string& model,
                                                               const std::vector<dist::VariableSpec>& variables,
                                                               const optim::Optimizer& optimizer, const LogSink& log,
                                                               io::Env* env) {
  auto opened = OpenTrainingState(dir, model, variables, optimizer, log, env);
  if (!opened.ok()) return opened.status();
  if (!opened->has_value()) return std::optional<TrainingState>();
  return std::optional<TrainingState>(std::move((*opened)->state));
}

absl::StatusOr<std::optional<OpenedTrainingState>> OpenTrainingState(
    const std::string& dir, const std::string& model, const std::vector<dist::VariableSpec>& variables,
    const optim::Optimizer& optimizer, const LogSink& log, io::Env* env,
    const std::function<absl::Status(const ckpt::SafetensorsReader&)>& check_first) {
  std::vector<std::string> skipped;
  auto latest = ckpt::OpenLatestCheckpoint(dir, &skipped, env);
  if (!latest.ok()) return latest.status();
  for (const std::string& s : skipped) log(s);
  if (!latest->has_value()) return std::optional<OpenedTrainingState>();
  ckpt::OpenedCheckpoint& checkpoint = **latest;
  const ckpt::SafetensorsReader& file = *checkpoint.reader;
  std::map<std::string, std::string> meta = file.metadata();
  if (meta.count("model") && meta["model"] != model) {
    return absl::FailedPreconditionError(absl::StrCat(checkpoint.path, " holds model '", meta["model"],
                                                      "' but this run trains '", model,
                                                      "'; use another --checkpoint_dir or --model=", meta["model"]));
  }
  if (check_first) {
    if (absl::Status s = check_first(file); !s.ok()) return s;
  }
  TrainingState state;
  state.global_step = checkpoint.global_step;
  state.model = model;
  state.optimizer = optimizer.name();
  if (auto it = meta.find(kWorkQueueMetadataKey); it != meta.end()) state.work_queue = it->second;
  const bool same_optimizer = meta.count("optimizer") && meta["optimizer"] == optimizer.name();
  if (!same_optimizer) {
    log(absl::StrCat(checkpoint.path, ": optimizer '", meta["optimizer"], "' differs from --optimizer=",
                     optimizer.name(), "; restoring variables only, fresh optimizer state"));
  }
  for (const dist::VariableSpec& p : variables) {
    const ckpt::TensorEntry* entry = file.Find(p.name);
    if (entry == nullptr || entry->dtype != ckpt::Dtype::kF32) {
      return absl::FailedPreconditionError(absl::StrCat(checkpoint.path, " lacks variable ", p.name));
    }
    if (entry->shape != p.shape) {
      return absl::FailedPreconditionError(absl::StrCat(checkpoint.path, ": variable ", p.name, " has shape ",
                                                        ShapeToString(entry->shape), ", the model needs ",
                                                        ShapeToString(p.shape)));
    }
    VariableState v;
    auto value = file.ReadF32(p.name);
    if (!value.ok()) return value.status();
    v.value = *std::move(value);
    optim::SlotState fresh = optimizer.NewState(v.value.size());
    for (size_t s = 0; s < optimizer.slot_names().size(); ++s) {
      const std::string slot_name = ckpt::SlotTensorName(p.name, optimizer.slot_names()[s]);
      const ckpt::TensorEntry* slot = same_optimizer ? file.Find(slot_name) : nullptr;
      if (slot != nullptr && slot->dtype == ckpt::Dtype::kF32 && slot->elements() == v.value.size()) {
        auto slot_value = file.ReadF32(slot_name);
        if (!slot_value.ok()) return slot_value.status();
        v.slots.push_back(std::move(*slot_value).Reshaped(v.value.shape()));
      } else {
        v.slots.emplace_back(v.value.shape(), std::vector<float>(fresh.slots[s].begin(), fresh.slots[s].end()));
      }
    }
    // A count missing or malformed in the metadata restores as 0 updates.
    if (same_optimizer && !absl::SimpleAtoi(meta["updates/" + p.name], &v.updates)) v.updates = 0;
    state.variables.emplace(p.name, std::move(v));
  }
  log(absl::StrCat("restored ", checkpoint.path, " at global step ", state.global_step));
  return std::optional<OpenedTrainingState>(
      OpenedTrainingState{std::move(state), checkpoint.path, std::move(checkpoint.reader)});
}

}  // namespace psflow::train
