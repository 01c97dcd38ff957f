// psflow fault_injection_env.cc — see fault_injection_env.h.
#include "io/fault_injection_env.h"

#include <algorithm>
#include <filesystem>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "io/io_error.h"

namespace psflow::io {
namespace {

// The verb the POSIX Env uses in its message for each operation.
const char* Verb(FileOp op) {
  switch (op) {
    case FileOp::kCreate:
      return "create";
    case FileOp::kAppend:
      return "write";
    case FileOp::kFlush:
      return "write";
    case FileOp::kSync:
      return "sync";
    case FileOp::kClose:
      return "close";
    case FileOp::kRename:
      return "rename";
    case FileOp::kRemove:
      return "remove";
    case FileOp::kCreateDir:
      return "create the directory";
    case FileOp::kSyncDir:
      return "sync the directory";
    case FileOp::kOpen:
      return "open";
    case FileOp::kRead:
      return "read";
    case FileOp::kAny:
      return "use";
  }
  return "use";
}

}  // namespace

const char* FileOpName(FileOp op) {
  switch (op) {
    case FileOp::kCreate:
      return "create";
    case FileOp::kAppend:
      return "append";
    case FileOp::kFlush:
      return "flush";
    case FileOp::kSync:
      return "sync";
    case FileOp::kClose:
      return "close";
    case FileOp::kRename:
      return "rename";
    case FileOp::kRemove:
      return "remove";
    case FileOp::kCreateDir:
      return "create_dir";
    case FileOp::kSyncDir:
      return "sync_dir";
    case FileOp::kOpen:
      return "open";
    case FileOp::kRead:
      return "read";
    case FileOp::kAny:
      return "any";
  }
  return "any";
}

// A file of the base Env whose every call is first checked by the FaultInjectionEnv.
class FaultFile final : public WritableFile {
 public:
  FaultFile(FaultInjectionEnv* env, std::unique_ptr<WritableFile> base)
      : env_(env), base_(std::move(base)), path_(base_->path()) {}

  absl::Status Append(std::string_view data) override {
    if (!base_) return ClosedError();
    FaultInjectionEnv::Verdict v = env_->Check(FileOp::kAppend, path());
    if (!v.status.ok()) {
      if (v.partial && base_->Append(data.substr(0, data.size() / 2)).ok()) {
        size_ += static_cast<int64_t>(data.size() / 2);
        (void)base_->Flush();  // the half that fitted reached the disk
      }
      return v.status;
    }
    absl::Status s = base_->Append(data);
    if (s.ok()) size_ += static_cast<int64_t>(data.size());
    return s;
  }
  absl::Status Flush() override {
    if (!base_) return ClosedError();
    if (auto v = env_->Check(FileOp::kFlush, path()); !v.status.ok()) return v.status;
    return base_->Flush();
  }
  absl::Status Sync() override {
    if (auto v = env_->Check(FileOp::kSync, path()); !v.status.ok()) return v.status;
    if (!base_) return ClosedError();
    absl::Status s = base_->Sync();
    if (s.ok()) env_->Synced(path(), size_);
    return s;
  }
  absl::Status Close() override {
    if (auto v = env_->Check(FileOp::kClose, path()); !v.status.ok()) {
      base_.reset();  // a failed close(2) still releases the descriptor (unflushed data is lost)
      return v.status;
    }
    if (!base_) return absl::OkStatus();
    return base_->Close();
  }
  const std::string& path() const override { return path_; }

 private:
  absl::Status ClosedError() const {
    return absl::FailedPreconditionError(absl::StrCat("cannot write ", path_, ": the file is already closed"));
  }

  FaultInjectionEnv* const env_;  // borrowed; outlives its files
  std::unique_ptr<WritableFile> base_;
  const std::string path_;
  int64_t size_ = 0;  // bytes handed to the base file
};

// A file of the base Env being read; every Read is first checked by the FaultInjectionEnv.
class FaultSequentialFile final : public SequentialFile {
 public:
  FaultSequentialFile(FaultInjectionEnv* env, std::unique_ptr<SequentialFile> base)
      : env_(env), base_(std::move(base)) {}

  absl::StatusOr<size_t> Read(char* buf, size_t n) override {
    if (auto v = env_->Check(FileOp::kRead, path()); !v.status.ok()) return v.status;
    return base_->Read(buf, n);
  }
  const std::string& path() const override { return base_->path(); }

 private:
  FaultInjectionEnv* const env_;  // borrowed; outlives its files
  const std::unique_ptr<SequentialFile> base_;
};

void FaultInjectionEnv::Inject(Fault fault) {
  absl::MutexLock lock(&mu_);
  faults_.emplace_back(std::move(fault), 0);
}

void FaultInjectionEnv::Crash() {
  absl::MutexLock lock(&mu_);
  CrashLocked();
}

bool FaultInjectionEnv::crashed() const {
  absl::MutexLock lock(&mu_);
  return crashed_;
}

void FaultInjectionEnv::Reset() {
  absl::MutexLock lock(&mu_);
  faults_.clear();
  counts_.clear();
  fired_.clear();
  crashed_ = false;
  synced_size_.clear();
  pending_renames_.clear();
}

int64_t FaultInjectionEnv::Count(FileOp op) const {
  absl::MutexLock lock(&mu_);
  auto it = counts_.find(op);
  return it == counts_.end() ? 0 : it->second;
}

std::vector<std::string> FaultInjectionEnv::Fired() const {
  absl::MutexLock lock(&mu_);
  return fired_;
}

FaultInjectionEnv::Verdict FaultInjectionEnv::Check(FileOp op, const std::string& path) {
  absl::MutexLock lock(&mu_);
  if (crashed_) {
    return {absl::AbortedError(absl::StrCat("cannot ", Verb(op), " ", path, ": the simulated machine crashed"))};
  }
  ++counts_[op];
  ++counts_[FileOp::kAny];
  for (auto& [fault, seen] : faults_) {
    if (fault.op != FileOp::kAny && fault.op != op) continue;
    if (!fault.path_part.empty() && path.find(fault.path_part) == std::string::npos) continue;
    ++seen;
    if (seen != fault.nth && !(fault.sticky && seen > fault.nth)) continue;
    if (fault.crash) {
      fired_.push_back(absl::StrCat("crash before ", FileOpName(op), " of ", path));
      CrashLocked();
      return {absl::AbortedError(absl::StrCat("cannot ", Verb(op), " ", path, ": simulated crash"))};
    }
    absl::Status status = IoError(Verb(op), path, fault.error);
    fired_.push_back(std::string(status.message()));
    return {status, fault.partial};
  }
  return {};
}

void FaultInjectionEnv::CrashLocked() {
  crashed_ = true;
  // Renames whose directory was not synced since are lost, newest first.
  for (auto it = pending_renames_.rbegin(); it != pending_renames_.rend(); ++it) {
    const auto& [from, to] = *it;
    if (base_->RenameFile(to, from).ok()) {
      if (auto f = synced_size_.find(to); f != synced_size_.end()) {
        const int64_t size = f->second;
        synced_size_.erase(f);
        synced_size_[from] = size;
      }
    }
  }
  pending_renames_.clear();
  // Data not synced is lost.
  for (const auto& [path, size] : synced_size_) {
    std::error_code ec;
    if (std::filesystem::exists(path, ec) && std::filesystem::file_size(path, ec) > static_cast<uintmax_t>(size)) {
      std::filesystem::resize_file(path, static_cast<uintmax_t>(size), ec);
    }
  }
}

void FaultInjectionEnv::Created(const std::string& path) {
  absl::MutexLock lock(&mu_);
  synced_size_[path] = 0;
}

void FaultInjectionEnv::Synced(const std::string& path, int64_t size) {
  absl::MutexLock lock(&mu_);
  synced_size_[path] = size;
}

absl::StatusOr<std::unique_ptr<WritableFile>> FaultInjectionEnv::NewWritableFile(const std::string& path,
                                                                                 CreateMode mode) {
  if (auto v = Check(FileOp::kCreate, path); !v.status.ok()) return v.status;
  auto file = base_->NewWritableFile(path, mode);
  if (!file.ok()) return file.status();
  Created(path);
  return std::unique_ptr<WritableFile>(new FaultFile(this, std::move(file).value()));
}

absl::StatusOr<std::unique_ptr<SequentialFile>> FaultInjectionEnv::NewSequentialFile(const std::string& path) {
  if (auto v = Check(FileOp::kOpen, path); !v.status.ok()) return v.status;
  auto file = base_->NewSequentialFile(path);
  if (!file.ok()) return file.status();
  return std::unique_ptr<SequentialFile>(new FaultSequentialFile(this, std::move(file).value()));
}

absl::Status FaultInjectionEnv::RenameFile(const std::string& from, const std::string& to) {
  if (auto v = Check(FileOp::kRename, absl::StrCat(from, " to ", to)); !v.status.ok()) return v.status;
  absl::Status s = base_->RenameFile(from, to);
  if (!s.ok()) return s;
  absl::MutexLock lock(&mu_);
  pending_renames_.emplace_back(from, to);
  if (auto f = synced_size_.find(from); f != synced_size_.end()) {
    const int64_t size = f->second;
    synced_size_.erase(f);
    synced_size_[to] = size;
  } else {
    synced_size_.erase(to);  // replaced by a file this Env did not write: keep it whole
  }
  return s;
}

absl::Status FaultInjectionEnv::RemoveFile(const std::string& path) {
  if (auto v = Check(FileOp::kRemove, path); !v.status.ok()) return v.status;
  absl::Status s = base_->RemoveFile(path);
  if (s.ok()) {
    absl::MutexLock lock(&mu_);
    synced_size_.erase(path);
  }
  return s;
}

absl::Status FaultInjectionEnv::CreateDir(const std::string& dir) {
  if (auto v = Check(FileOp::kCreateDir, dir); !v.status.ok()) return v.status;
  return base_->CreateDir(dir);
}

absl::StatusOr<std::vector<std::string>> FaultInjectionEnv::GetChildren(const std::string& dir) {
  return base_->GetChildren(dir);
}

bool FaultInjectionEnv::FileExists(const std::string& path) { return base_->FileExists(path); }

absl::Status FaultInjectionEnv::SyncDir(const std::string& dir) {
  if (auto v = Check(FileOp::kSyncDir, dir); !v.status.ok()) return v.status;
  absl::Status s = base_->SyncDir(dir);
  if (s.ok()) {
    absl::MutexLock lock(&mu_);
    std::erase_if(pending_renames_, [&](const auto& r) { return DirName(r.second) == dir; });
  }
  return s;
}

}  // namespace psflow::io
