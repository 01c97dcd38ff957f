#include "psflow/ckpt/checkpoint.h"

#include <algorithm>
#include <regex>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "psflow/ckpt/safetensors_stream.h"

namespace psflow::ckpt {
namespace {

constexpr char kChecksumKey[] = "psflow.crc32";
constexpr char kStepKey[] = "global_step";

}  // namespace

std::string SlotTensorName(const std::string& variable, const std::string& slot) {
  return absl::StrCat(variable, "/slot/", slot);
}

std::vector<std::pair<int64_t, std::string>> ListCheckpoints(const std::string& dir, io::Env* env) {
  std::vector<std::pair<int64_t, std::string>> found;
  auto names = env->GetChildren(dir);
  if (!names.ok()) return found;
  static const std::regex kName(R"(model\.ckpt-(\d+)\.safetensors)");
  for (const std::string& name : *names) {
    std::smatch m;
    int64_t step;
    if (std::regex_match(name, m, kName) && absl::SimpleAtoi(m[1].str(), &step)) {
      found.emplace_back(step, absl::StrCat(dir, "/", name));
    }
  }
  std::sort(found.rbegin(), found.rend());
  return found;
}

absl::StatusOr<std::string> SaveCheckpoint(const std::string& dir, int64_t global_step,
                                           const std::vector<std::pair<std::string, const Tensor*>>& tensors,
                                           std::map<std::string, std::string> metadata, int keep, io::Env* env) {
  return SaveCheckpointStreamed(
      dir, global_step,
      [&](SafetensorsWriter& writer) {
        for (const auto& [name, t] : tensors) {
          if (absl::Status s = writer.AddF32(name, t); !s.ok()) return s;
        }
        return absl::OkStatus();
      },
      std::move(metadata), keep, env);
}

absl::StatusOr<std::string> SaveCheckpointStreamed(const std::string& dir, int64_t global_step,
                                                   const std::function<absl::Status(SafetensorsWriter&)>& fill,
                                                   std::map<std::string, std::string> metadata, int keep,
                                                   io::Env* env) {
  const std::string path = absl::StrCat(dir, "/model.ckpt-", global_step, ".safetensors");
  auto failed = [&](const absl::Status& cause) {
    return absl::Status(cause.code(), absl::StrCat("cannot save checkpoint ", path, ": ", cause.message(),
                                                   "; the previous checkpoints are kept"));
  };
  if (absl::Status s = env->CreateDir(dir); !s.ok()) return failed(s);
  {
    SafetensorsWriter writer(path, env);  // its destructor removes its temporary files
    if (absl::Status s = fill(writer); !s.ok()) return failed(s);
    metadata[kChecksumKey] = absl::StrCat(writer.Crc32());
    metadata[kStepKey] = absl::StrCat(global_step);
    if (absl::Status s = writer.Finish(metadata); !s.ok()) return failed(s);
  }
  auto all = ListCheckpoints(dir, env);
  for (size_t i = std::max(keep, 1); i < all.size(); ++i) (void)env->RemoveFile(all[i].second);
  // Temporary files of saves that crashed before their rename (the file, and a streamed tensor's
  // data): never read, removed once a save succeeded.
  static const std::regex kTemporary(R"(model\.ckpt-\d+\.safetensors\.tmp(\.\d+)?)");
  if (auto names = env->GetChildren(dir); names.ok()) {
    for (const std::string& name : *names) {
      if (std::regex_match(name, kTemporary)) (void)env->RemoveFile(absl::StrCat(dir, "/", name));
    }
  }
  return path;
}

absl::StatusOr<std::unique_ptr<SafetensorsReader>> OpenCheckpoint(const std::string& path, io::Env* env) {
  auto reader = SafetensorsReader::Open(path, env);
  if (!reader.ok()) return reader.status();
  auto it = (*reader)->metadata().find(kChecksumKey);
  if (it == (*reader)->metadata().end()) {
    return absl::DataLossError(absl::StrCat(path, ": no ", kChecksumKey, " in its metadata"));
  }
  auto crc = (*reader)->Crc32();
  if (!crc.ok()) return crc.status();
  if (it->second != absl::StrCat(*crc)) {
    return absl::DataLossError(
        absl::StrCat(path, ": checksum mismatch (stored ", it->second, ", computed ", *crc, ")"));
  }
  return reader;
}

absl::StatusOr<std::optional<OpenedCheckpoint>> OpenLatestCheckpoint(const std::string& dir,
                                                                     std::vector<std::string>* skipped, io::Env* env) {
  for (const auto& [step, path] : ListCheckpoints(dir, env)) {
    auto reader = OpenCheckpoint(path, env);
    if (!reader.ok()) {
      if (skipped) skipped->push_back(absl::StrCat("refusing checkpoint ", reader.status().message()));
      continue;
    }
    return std::optional<OpenedCheckpoint>(OpenedCheckpoint{path, step, *std::move(reader)});
  }
  return std::optional<OpenedCheckpoint>();
}

namespace {

// A checkpoint file's step: from its name (model.ckpt-STEP.safetensors), else its metadata, else 0.
int64_t StepOfFile(const std::string& path, const std::map<std::string, std::string>& metadata) {
  static const std::regex kName(R"((^|.*/)model\.ckpt-(\d+)\.safetensors)");
  std::smatch m;
  int64_t step = 0;
  if (std::regex_match(path, m, kName) && absl::SimpleAtoi(m[2].str(), &step)) return step;
  auto it = metadata.find(kStepKey);
  if (it == metadata.end() || !absl::SimpleAtoi(it->second, &step)) return 0;
  return step;
}

}  // namespace

absl::StatusOr<Checkpoint> ReadCheckpoint(const std::string& path, io::Env* env) {
  auto reader = OpenCheckpoint(path, env);
  if (!reader.ok()) return reader.status();
  TensorFile file;
  file.metadata = (*reader)->metadata();
  for (const TensorEntry& t : (*reader)->tensors()) {
    if (t.dtype == Dtype::kF32) {
      auto value = (*reader)->ReadF32(t.name);
      if (!value.ok()) return value.status();
      file.tensors.emplace(t.name, *std::move(value));
    } else {
      auto value = (*reader)->ReadI64(t.name);
      if (!value.ok()) return value.status();
      file.int64s.emplace(t.name, *std::move(value));
    }
  }
  const int64_t step = StepOfFile(path, file.metadata);
  return Checkpoint{path, step, std::move(file)};
}

absl::StatusOr<OpenedCheckpoint> OpenCheckpointFile(const std::string& path, io::Env* env) {
  auto reader = OpenCheckpoint(path, env);
  if (!reader.ok()) return reader.status();
  const int64_t step = StepOfFile(path, (*reader)->metadata());
  return OpenedCheckpoint{path, step, *std::move(reader)};
}

absl::StatusOr<std::optional<Checkpoint>> LoadLatestCheckpoint(const std::string& dir,
                                                               std::vector<std::string>* skipped, io::Env* env) {
  for (const auto& [step, path] : ListCheckpoints(dir, env)) {
    auto ckpt = ReadCheckpoint(path, env);
    if (!ckpt.ok()) {
      if (skipped) skipped->push_back(absl::StrCat("refusing checkpoint ", ckpt.status().message()));
      continue;
    }
    ckpt->global_step = step;
    return std::optional<Checkpoint>(*std::move(ckpt));
  }
  return std::optional<Checkpoint>();
}

}  // namespace psflow::ckpt
