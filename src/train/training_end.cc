// The end-of-training marker (train/training_end.h).
#include "train/training_end.h"

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace psflow::train {
namespace {

std::string MarkerPath(const std::string& dir) { return dir + "/" + kTrainingEndFile; }

}  // namespace

absl::Status WriteTrainingEnd(const std::string& dir, const TrainingEnd& end, io::Env* env) {
  nlohmann::json j = end.failed ? nlohmann::json{{"outcome", "failed"}, {"reason", end.reason}}
                                : nlohmann::json{{"outcome", "done"}, {"global_step", end.global_step}};
  const std::string text = j.dump() + "\n";
  if (absl::Status s = io::WriteFileAtomically(env, MarkerPath(dir), {text}); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat("cannot write the end-of-training marker ", MarkerPath(dir), ": ",
                                               s.message(), "; an evaluator will not know training ended"));
  }
  return absl::OkStatus();
}

absl::Status ClearTrainingEnd(const std::string& dir, io::Env* env) {
  const std::string path = MarkerPath(dir);
  if (!env->FileExists(path)) return absl::OkStatus();
  if (absl::Status s = env->RemoveFile(path); !s.ok() && !absl::IsNotFound(s)) {
    return absl::Status(s.code(), absl::StrCat("cannot remove the previous run's end-of-training marker ", path, ": ",
                                               s.message(), "; remove it by hand"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::optional<TrainingEnd>> ReadTrainingEnd(const std::string& dir, io::Env* env) {
  const std::string path = MarkerPath(dir);
  auto text = env->ReadFileToString(path);
  if (absl::IsNotFound(text.status())) return std::optional<TrainingEnd>();
  if (!text.ok()) return text.status();
  auto j = nlohmann::json::parse(*text, nullptr, false);
  TrainingEnd end;
  if (j.is_object() && j.value("outcome", "") == "failed" && j.contains("reason") && j["reason"].is_string()) {
    end.failed = true;
    end.reason = j["reason"].get<std::string>();
    return std::optional<TrainingEnd>(end);
  }
  if (j.is_object() && j.value("outcome", "") == "done" && j.contains("global_step") &&
      j["global_step"].is_number_integer()) {
    end.global_step = j["global_step"].get<int64_t>();
    return std::optional<TrainingEnd>(end);
  }
  return absl::DataLossError(absl::StrCat(path,
                                          " is not an end-of-training marker ({\"outcome\": \"done\", "
                                          "\"global_step\": N} or {\"outcome\": \"failed\", \"reason\": ...}); "
                                          "remove it"));
}

}  // namespace psflow::train
