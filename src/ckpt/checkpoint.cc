#include "psflow/ckpt/checkpoint.h"

#include <algorithm>
#include <cstring>
#include <regex>
#include <tuple>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "psflow/ckpt/checkpoint_chain.h"
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
  static const std::regex kName(R"(model\.ckpt-(\d+)(\.increment)?\.safetensors)");
  // Sorted by step, then the full save after (newer than) an increment of the same step.
  std::vector<std::tuple<int64_t, bool, std::string>> sorted;
  for (const std::string& name : *names) {
    std::smatch m;
    int64_t step;
    if (std::regex_match(name, m, kName) && absl::SimpleAtoi(m[1].str(), &step)) {
      sorted.emplace_back(step, !m[2].matched, absl::StrCat(dir, "/", name));
    }
  }
  std::sort(sorted.rbegin(), sorted.rend());
  for (auto& [step, full, path] : sorted) found.emplace_back(step, std::move(path));
  return found;
}

std::vector<const SafetensorsReader*> OpenedCheckpoint::chain() const {
  std::vector<const SafetensorsReader*> links;
  for (const ChainFile& f : earlier) links.push_back(f.reader.get());
  links.push_back(reader.get());
  return links;
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
  return SaveCheckpointStreamed(dir, global_step, fill, std::move(metadata), SaveOptions{keep, false}, env);
}

absl::StatusOr<std::string> SaveCheckpointStreamed(const std::string& dir, int64_t global_step,
                                                   const std::function<absl::Status(SafetensorsWriter&)>& fill,
                                                   std::map<std::string, std::string> metadata,
                                                   const SaveOptions& options, io::Env* env) {
  const std::string path = options.increment ? IncrementPath(dir, global_step)
                                             : absl::StrCat(dir, "/model.ckpt-", global_step, ".safetensors");
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
  // Retention by chains: the newest `keep` full saves and the increments after the oldest of them.
  const auto all = ListCheckpoints(dir, env);
  const size_t keep = static_cast<size_t>(std::max(options.keep, 1));
  size_t fulls = 0;
  int64_t oldest_kept = -1;  // the step of the oldest full save kept
  for (const auto& [step, file] : all) {
    if (IsIncrementPath(file)) {
      if (fulls >= keep && step <= oldest_kept) (void)env->RemoveFile(file);
    } else if (++fulls > keep) {
      (void)env->RemoveFile(file);
    } else {
      oldest_kept = step;
    }
  }
  // Temporary files of saves that crashed before their rename (the file, and a streamed tensor's
  // data): never read, removed once a save succeeded.
  static const std::regex kTemporary(R"(model\.ckpt-\d+(\.increment)?\.safetensors\.tmp(\.\d+)?)");
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

namespace {

// A checkpoint file's step: from its name (model.ckpt-STEP[.increment].safetensors), else its
// metadata, else 0.
int64_t StepOfFile(const std::string& path, const std::map<std::string, std::string>& metadata) {
  static const std::regex kName(R"((^|.*/)model\.ckpt-(\d+)(\.increment)?\.safetensors)");
  std::smatch m;
  int64_t step = 0;
  if (std::regex_match(path, m, kName) && absl::SimpleAtoi(m[2].str(), &step)) return step;
  auto it = metadata.find(kStepKey);
  if (it == metadata.end() || !absl::SimpleAtoi(it->second, &step)) return 0;
  return step;
}

std::string Meta(const SafetensorsReader& r, const char* key) {
  auto it = r.metadata().find(key);
  return it == r.metadata().end() ? std::string() : it->second;
}

int64_t MetaInt(const SafetensorsReader& r, const char* key) {
  int64_t v = -1;
  if (!absl::SimpleAtoi(Meta(r, key), &v)) return -1;
  return v;
}

std::string DirOf(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? std::string(".") : path.substr(0, slash);
}

// `opened` (an increment, checked) with the files of its chain before it, walking back from the save
// each one follows to the chain's full save; each checked and of the same chain.
absl::Status OpenChainOf(OpenedCheckpoint* opened, io::Env* env) {
  const std::string dir = DirOf(opened->path);
  const SafetensorsReader& last = *opened->reader;
  const std::string chain = Meta(last, kChainKey);
  const int64_t base_step = MetaInt(last, kBaseStepKey);
  auto broken = [&](auto&&... why) {
    return absl::DataLossError(absl::StrCat(opened->path, " (step ", opened->global_step, "): ", why...));
  };
  if (chain.empty() || base_step < 0 || MetaInt(last, kPrevStepKey) < 0) {
    return broken("an increment without its chain's metadata (", kChainKey, ", ", kBaseStepKey, ", ", kPrevStepKey,
                  ")");
  }
  std::vector<ChainFile> files;  // newest first
  const SafetensorsReader* follower = &last;
  std::string follower_path = opened->path;
  while (true) {
    const int64_t prev_step = MetaInt(*follower, kPrevStepKey);
    const int64_t prev_save = MetaInt(*follower, kPrevSaveIdKey);
    const bool full = prev_step == base_step;
    const std::string path =
        full ? absl::StrCat(dir, "/model.ckpt-", prev_step, ".safetensors") : IncrementPath(dir, prev_step);
    if (prev_step < base_step || prev_step >= StepOfFile(follower_path, follower->metadata())) {
      return broken(follower_path, " follows step ", prev_step, ", outside its chain (full save at step ", base_step,
                    ")");
    }
    if (!env->FileExists(path)) {
      return broken("its chain lacks ", path, " (step ", prev_step, "), the save ", follower_path,
                    " follows; the chain is read up to the save before it");
    }
    auto reader = OpenCheckpoint(path, env);
    if (!reader.ok()) {
      return broken("its chain's ", path, " (step ", prev_step, ") is unreadable: ", reader.status().message());
    }
    const std::string their_chain = Meta(**reader, kChainKey);
    if (their_chain != chain) {
      return absl::FailedPreconditionError(absl::StrCat(
          opened->path, " (step ", opened->global_step, ") is an increment of chain ", chain, ", but ", path,
          " belongs to chain ", their_chain.empty() ? std::string("(none)") : their_chain,
          ": an increment from another job (or run) is not restored; remove it or use another --checkpoint_dir"));
    }
    if (prev_save >= 0 && MetaInt(**reader, kSaveIdKey) != prev_save) {
      return broken(follower_path, " follows save ", prev_save, " but ", path, " is save ",
                    MetaInt(**reader, kSaveIdKey));
    }
    const bool is_increment = Meta(**reader, kKindKey) == "increment";
    if (full == is_increment) return broken(path, " is not the kind of save its follower names");
    files.push_back(ChainFile{path, prev_step, *std::move(reader)});
    if (full) break;
    follower = files.back().reader.get();
    follower_path = path;
  }
  std::reverse(files.begin(), files.end());
  opened->earlier = std::move(files);
  return absl::OkStatus();
}

// The tables a file lists (kTablesKey).
std::vector<std::string> TablesOf(const SafetensorsReader& r) {
  std::vector<std::string> tables;
  for (absl::string_view t : absl::StrSplit(Meta(r, kTablesKey), '\n', absl::SkipEmpty())) tables.emplace_back(t);
  return tables;
}

}  // namespace

absl::StatusOr<std::optional<OpenedCheckpoint>> OpenLatestCheckpoint(const std::string& dir,
                                                                     std::vector<std::string>* skipped, io::Env* env) {
  for (const auto& [step, path] : ListCheckpoints(dir, env)) {
    auto opened = OpenCheckpointFile(path, env);
    if (!opened.ok()) {
      if (skipped) skipped->push_back(absl::StrCat("refusing checkpoint ", opened.status().message()));
      continue;
    }
    return std::optional<OpenedCheckpoint>(*std::move(opened));
  }
  return std::optional<OpenedCheckpoint>();
}

absl::StatusOr<Checkpoint> ReadCheckpoint(const std::string& path, io::Env* env) {
  auto opened = OpenCheckpointFile(path, env);
  if (!opened.ok()) return opened.status();
  const SafetensorsReader& reader = *opened->reader;
  TensorFile file;
  file.metadata = reader.metadata();
  // An increment's tables, merged over its chain: every column whole, as a full save holds them.
  std::vector<std::string> merged_names;
  if (!opened->earlier.empty()) {
    for (const std::string& table : TablesOf(reader)) {
      auto merged = ChainTableReader::Open(opened->chain(), table);
      if (!merged.ok()) return merged.status();
      const auto& columns = (*merged)->columns();
      std::vector<int64_t> all_ids, ids;
      std::vector<std::vector<char>> all(columns.size()), part;
      while (true) {
        auto more = (*merged)->Next(1 << 14, &ids, &part);
        if (!more.ok()) return more.status();
        if (!*more) break;
        all_ids.insert(all_ids.end(), ids.begin(), ids.end());
        for (size_t c = 0; c < columns.size(); ++c) all[c].insert(all[c].end(), part[c].begin(), part[c].end());
      }
      const int64_t n = static_cast<int64_t>(all_ids.size());
      for (size_t c = 0; c < columns.size(); ++c) {
        const TensorEntry* e = reader.Find(columns[c].name);
        Shape shape = e->shape;
        shape[0] = n;
        if (columns[c].dtype == Dtype::kF32) {
          Tensor t = Tensor::Uninitialized(shape);
          if (!all[c].empty()) std::memcpy(t.data(), all[c].data(), all[c].size());
          file.tensors.emplace(columns[c].name, std::move(t));
        } else {
          std::vector<int64_t> v(all[c].size() / sizeof(int64_t));
          if (!v.empty()) std::memcpy(v.data(), all[c].data(), all[c].size());
          file.int64s.emplace(columns[c].name, std::move(v));
        }
        merged_names.push_back(columns[c].name);
      }
      merged_names.push_back(table + "/ids");
      merged_names.push_back(table + "/removed");
      if ((*merged)->has_ids()) file.int64s.emplace(table + "/ids", std::move(all_ids));
    }
  }
  for (const TensorEntry& t : reader.tensors()) {
    if (std::find(merged_names.begin(), merged_names.end(), t.name) != merged_names.end()) continue;
    if (t.dtype == Dtype::kF32) {
      auto value = reader.ReadF32(t.name);
      if (!value.ok()) return value.status();
      file.tensors.emplace(t.name, *std::move(value));
    } else {
      auto value = reader.ReadI64(t.name);
      if (!value.ok()) return value.status();
      file.int64s.emplace(t.name, *std::move(value));
    }
  }
  return Checkpoint{opened->path, opened->global_step, std::move(file)};
}

absl::StatusOr<OpenedCheckpoint> OpenCheckpointFile(const std::string& path, io::Env* env) {
  auto reader = OpenCheckpoint(path, env);
  if (!reader.ok()) return reader.status();
  const int64_t step = StepOfFile(path, (*reader)->metadata());
  OpenedCheckpoint opened{path, step, *std::move(reader), {}};
  if (Meta(*opened.reader, kKindKey) == "increment") {
    if (absl::Status s = OpenChainOf(&opened, env); !s.ok()) return s;
  }
  return opened;
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
