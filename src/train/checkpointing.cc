#include "train/checkpointing.h"

#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "psflow/ckpt/checkpoint.h"
#include "psflow/ckpt/checkpoint_chain.h"

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
  return SaveTrainingState(dir, state, slot_names, ckpt::SaveOptions{keep, false}, {}, env, more);
}

absl::StatusOr<std::string> SaveTrainingState(const std::string& dir, const TrainingState& state,
                                              const std::vector<std::string>& slot_names, const ckpt::SaveOptions& save,
                                              const std::map<std::string, std::string>& extra, io::Env* env,
                                              const std::function<absl::Status(ckpt::SafetensorsWriter&)>& more) {
  std::vector<std::pair<std::string, const Tensor*>> tensors;
  std::map<std::string, std::string> metadata = extra;
  metadata["model"] = state.model;
  metadata["optimizer"] = state.optimizer;
  // In every save, full or increment.
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
      std::move(metadata), save, env);
}

namespace {

// A 64-bit mix of words (the finalizer of SplitMix64 over a running state): stable across runs and
// machines, unlike absl::Hash.
class Fingerprint {
 public:
  void Add(uint64_t word) { h_ = Mix(h_ ^ (word + 0x9e3779b97f4a7c15ULL + (h_ << 6) + (h_ >> 2))); }
  void Add(const std::string& s) {
    Add(static_cast<uint64_t>(s.size()));
    AddBytes(s.data(), s.size());
  }
  void AddBytes(const void* data, size_t n) {
    const auto* p = static_cast<const unsigned char*>(data);
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
      uint64_t w;
      std::memcpy(&w, p + i, 8);
      Add(w);
    }
    uint64_t tail = 0;
    for (size_t k = 0; i < n; ++i, ++k) tail |= static_cast<uint64_t>(p[i]) << (8 * k);
    Add(tail);
  }
  uint64_t value() const { return h_; }

 private:
  static uint64_t Mix(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }
  uint64_t h_ = 0x70736666c6f77ULL;  // "psflow"
};

}  // namespace

uint64_t ChainFingerprint(const TrainingState& state) {
  Fingerprint f;
  f.Add(state.model);
  f.Add(state.optimizer);
  f.Add(static_cast<uint64_t>(state.global_step));
  for (const auto& [name, v] : state.variables) {  // a std::map: name order
    f.Add(name);
    f.AddBytes(v.value.data(), v.value.size() * sizeof(float));
    for (const Tensor& slot : v.slots) f.AddBytes(slot.data(), slot.size() * sizeof(float));
    f.Add(static_cast<uint64_t>(v.updates));
  }
  return f.value();
}

std::string DerivedChainId(uint64_t seed, int64_t global_step, int64_t save_id, uint64_t fingerprint) {
  Fingerprint f;
  f.Add(seed);
  f.Add(static_cast<uint64_t>(global_step));
  f.Add(static_cast<uint64_t>(save_id));
  f.Add(fingerprint);
  return absl::StrFormat("%016x", f.value());
}

SaveChain::Save SaveChain::Begin(int64_t global_step, uint64_t fingerprint) {
  Save save;
  save.save_id = next_id_++;
  save.increment = full_every_ > 1 && in_chain_ && saves_in_chain_ < full_every_ && global_step > last_step_;
  save.scan.save_id = save.save_id;
  save.scan.increment = save.increment;
  save.scan.changed_since = save.increment ? last_save_id_ : -1;
  save.scan.track_changes = full_every_ > 1;
  if (full_every_ == 1) return save;  // today's files: no chain
  save.chain = save.increment ? chain_ : DerivedChainId(seed_, global_step, save.save_id, fingerprint);
  save.metadata[ckpt::kKindKey] = save.increment ? "increment" : "full";
  save.metadata[ckpt::kChainKey] = save.chain;
  save.metadata[ckpt::kSaveIdKey] = absl::StrCat(save.save_id);
  if (save.increment) {
    save.metadata[ckpt::kBaseStepKey] = absl::StrCat(base_step_);
    save.metadata[ckpt::kPrevStepKey] = absl::StrCat(last_step_);
    save.metadata[ckpt::kPrevSaveIdKey] = absl::StrCat(last_save_id_);
  }
  return save;
}

void SaveChain::Committed(const Save& save, int64_t global_step) {
  if (!save.increment) {
    chain_ = save.chain;
    base_step_ = global_step;
    saves_in_chain_ = 0;
  }
  ++saves_in_chain_;
  in_chain_ = true;
  last_step_ = global_step;
  last_save_id_ = save.save_id;
}

void SaveChain::Failed(const Save& save) {
  if (!save.increment) in_chain_ = false;
}

void SaveChain::Restart(int64_t last_save_id) {
  in_chain_ = false;
  next_id_ = std::max(next_id_, last_save_id + 1);
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
    const std::function<absl::Status(const ckpt::OpenedCheckpoint&)>& check_first) {
  std::vector<std::string> skipped;
  auto latest = ckpt::OpenLatestCheckpoint(dir, &skipped, env);
  if (!latest.ok()) return latest.status();
  for (const std::string& s : skipped) log(s);
  if (!latest->has_value()) return std::optional<OpenedTrainingState>();
  ckpt::OpenedCheckpoint& checkpoint = **latest;
  const ckpt::SafetensorsReader& file = *checkpoint.reader;  // an increment's variables are whole in it
  std::map<std::string, std::string> meta = file.metadata();
  if (meta.count("model") && meta["model"] != model) {
    return absl::FailedPreconditionError(absl::StrCat(checkpoint.path, " holds model '", meta["model"],
                                                      "' but this run trains '", model,
                                                      "'; use another --checkpoint_dir or --model=", meta["model"]));
  }
  if (check_first) {
    if (absl::Status s = check_first(checkpoint); !s.ok()) return s;
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
  int64_t save_id = 0;
  if (!absl::SimpleAtoi(meta[ckpt::kSaveIdKey], &save_id)) save_id = 0;
  log(absl::StrCat("restored ", checkpoint.path, " at global step ", state.global_step,
                   checkpoint.earlier.empty()
                       ? std::string()
                       : absl::StrCat(" (a chain: the full save ", checkpoint.earlier.front().path, " and ",
                                      checkpoint.earlier.size(),
                                      checkpoint.earlier.size() == 1 ? " increment" : " increments", ")")));
  std::string path = checkpoint.path;
  return std::optional<OpenedTrainingState>(
      OpenedTrainingState{std::move(state), std::move(path), std::move(checkpoint), save_id});
}

}  // namespace psflow::train
