#include "psflow/ckpt/checkpoint.h"

#include <zlib.h>

#include <algorithm>
#include <regex>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace psflow::ckpt {
namespace {

constexpr char kChecksumKey[] = "psflow.crc32";
constexpr char kStepKey[] = "global_step";

// zlib's CRC-32 over every tensor's bytes in name order: detects torn or bit-flipped data that the
// safetensors structure checks alone would accept.
uint32_t ChecksumOf(const std::map<std::string, const Tensor*>& tensors) {
  uLong crc = crc32(0L, Z_NULL, 0);
  for (const auto& [name, t] : tensors) {
    crc = crc32(crc, reinterpret_cast<const Bytef*>(name.data()), name.size());
    const auto* p = reinterpret_cast<const Bytef*>(t->data());
    size_t left = t->bytes();
    while (left > 0) {  // crc32 takes a uInt length
      const uInt n = static_cast<uInt>(std::min<size_t>(left, 1u << 30));
      crc = crc32(crc, p, n);
      p += n;
      left -= n;
    }
  }
  return static_cast<uint32_t>(crc);
}

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
  const std::string path = absl::StrCat(dir, "/model.ckpt-", global_step, ".safetensors");
  auto failed = [&](const absl::Status& cause) {
    return absl::Status(cause.code(), absl::StrCat("cannot save checkpoint ", path, ": ", cause.message(),
                                                   "; the previous checkpoints are kept"));
  };
  if (absl::Status s = env->CreateDir(dir); !s.ok()) return failed(s);
  std::map<std::string, const Tensor*> by_name(tensors.begin(), tensors.end());
  metadata[kChecksumKey] = absl::StrCat(ChecksumOf(by_name));
  metadata[kStepKey] = absl::StrCat(global_step);
  if (absl::Status s = WriteSafetensors(path, tensors, metadata, env); !s.ok()) return failed(s);
  auto all = ListCheckpoints(dir, env);
  for (size_t i = std::max(keep, 1); i < all.size(); ++i) (void)env->RemoveFile(all[i].second);
  // Temporary files of saves that crashed before their rename: never read, removed once a save succeeded.
  static const std::regex kTemporary(R"(model\.ckpt-\d+\.safetensors\.tmp)");
  if (auto names = env->GetChildren(dir); names.ok()) {
    for (const std::string& name : *names) {
      if (std::regex_match(name, kTemporary)) (void)env->RemoveFile(absl::StrCat(dir, "/", name));
    }
  }
  return path;
}

absl::StatusOr<Checkpoint> ReadCheckpoint(const std::string& path, io::Env* env) {
  auto file = ReadSafetensors(path, env);
  if (!file.ok()) return file.status();
  std::map<std::string, const Tensor*> by_name;
  for (const auto& [name, t] : file->tensors) by_name[name] = &t;
  auto it = file->metadata.find(kChecksumKey);
  if (it == file->metadata.end()) {
    return absl::DataLossError(absl::StrCat(path, ": no ", kChecksumKey, " in its metadata"));
  }
  if (it->second != absl::StrCat(ChecksumOf(by_name))) {
    return absl::DataLossError(
        absl::StrCat(path, ": checksum mismatch (stored ", it->second, ", computed ", ChecksumOf(by_name), ")"));
  }
  Checkpoint ckpt{path, 0, std::move(file).value()};
  static const std::regex kName(R"((^|.*/)model\.ckpt-(\d+)\.safetensors)");
  std::smatch m;
  if (std::regex_match(path, m, kName) && absl::SimpleAtoi(m[2].str(), &ckpt.global_step)) return ckpt;
  auto step = ckpt.contents.metadata.find(kStepKey);
  if (step == ckpt.contents.metadata.end() || !absl::SimpleAtoi(step->second, &ckpt.global_step)) {
    ckpt.global_step = 0;
  }
  return ckpt;
}

absl::StatusOr<std::optional<Checkpoint>> LoadLatestCheckpoint(const std::string& dir, std::vector<std::string>* skipped,
                                                               io::Env* env) {
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
