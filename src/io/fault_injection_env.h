// psflow fault_injection_env.h (internal, for tests) — an Env over real files that breaks on
// command, in the spirit of leveldb's db/fault_injection_test.cc. It forwards every call to a base
// Env (the POSIX one by default) and can:
//   - fail the Nth call of an operation (a full disk at the Nth write: ENOSPC, "No space left on
//     device"; a failing fsync, close or read: EIO; a file that cannot be opened: EACCES),
//     optionally for every later call too (a disk that stays full), optionally only on paths
//     containing a given part, and for writes optionally after writing half the data (a write cut
//     short);
//   - crash the "machine" just before the Nth call: every file written through this Env is cut back
//     to what was last synced, every rename not yet made durable by SyncDir of its directory is
//     undone, and every later call fails (Aborted) until Reset() — what a power cut leaves behind.
// Files created and not yet renamed stay where they are (a temporary file left by the crash).
// Opening a file for reading and each Read of it are operations like the others (kOpen, kRead);
// listing a directory and FileExists are passed through and never fail.
// A failed call does nothing (apart from the partial write). Errors read exactly like the POSIX
// Env's ("cannot write PATH: No space left on device").
// Thread-safe (one mutex); each file by one thread at a time, as for any Env.
#ifndef PSFLOW_IO_FAULT_INJECTION_ENV_H_
#define PSFLOW_IO_FAULT_INJECTION_ENV_H_

#include <cerrno>
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "psflow/io/env.h"

namespace psflow::io {

// The operations a fault can hit. kAny matches every one of them.
enum class FileOp {
  kCreate,
  kAppend,
  kFlush,
  kSync,
  kClose,
  kRename,
  kRemove,
  kCreateDir,
  kSyncDir,
  kOpen,
  kRead,
  kAny
};
const char* FileOpName(FileOp op);

class FaultInjectionEnv final : public Env {
 public:
  struct Fault {
    FileOp op = FileOp::kAny;
    int64_t nth = 1;             // the nth matching call from now (1-based) fires
    int error = ENOSPC;          // errno the call fails with
    bool crash = false;          // instead of failing with `error`, crash just before the call
    bool sticky = false;         // every later matching call fails too
    bool partial = false;        // kAppend: write half the data, then fail
    std::string path_part = {};  // only paths containing this (empty: every path)
  };

  explicit FaultInjectionEnv(Env* base = Env::Default()) : base_(base) {}  // `base` is borrowed

  void Inject(Fault fault);
  // Crashes now (see above).
  void Crash();
  bool crashed() const;
  // Disarms every fault, clears the counts and the crash: a restarted process on the same disk.
  void Reset();
  // Calls of `op` seen since construction or Reset (failed ones included; kAny: all operations).
  int64_t Count(FileOp op) const;
  // One line per fault that fired: "write /d/x.tmp: No space left on device" or "crash before rename ...".
  std::vector<std::string> Fired() const;

  absl::StatusOr<std::unique_ptr<WritableFile>> NewWritableFile(const std::string& path,
                                                                CreateMode mode = CreateMode::kTruncate) override;
  absl::StatusOr<std::unique_ptr<SequentialFile>> NewSequentialFile(const std::string& path) override;
  absl::Status RenameFile(const std::string& from, const std::string& to) override;
  absl::Status RemoveFile(const std::string& path) override;
  absl::Status CreateDir(const std::string& dir) override;
  absl::StatusOr<std::vector<std::string>> GetChildren(const std::string& dir) override;
  bool FileExists(const std::string& path) override;
  absl::Status SyncDir(const std::string& dir) override;

 private:
  friend class FaultFile;
  friend class FaultSequentialFile;
  struct Verdict {
    absl::Status status;
    bool partial = false;
  };
  // Counts the call and decides whether it fails; crashes when a crash fault fires.
  Verdict Check(FileOp op, const std::string& path) ABSL_LOCKS_EXCLUDED(mu_);
  void CrashLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Bookkeeping of what a crash keeps.
  void Created(const std::string& path) ABSL_LOCKS_EXCLUDED(mu_);
  void Synced(const std::string& path, int64_t size) ABSL_LOCKS_EXCLUDED(mu_);

  Env* const base_;
  mutable absl::Mutex mu_;
  std::vector<std::pair<Fault, int64_t>> faults_ ABSL_GUARDED_BY(mu_);  // armed fault, matching calls seen
  std::map<FileOp, int64_t> counts_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> fired_ ABSL_GUARDED_BY(mu_);
  bool crashed_ ABSL_GUARDED_BY(mu_) = false;
  std::map<std::string, int64_t> synced_size_ ABSL_GUARDED_BY(mu_);  // files written through this Env
  std::vector<std::pair<std::string, std::string>> pending_renames_ ABSL_GUARDED_BY(mu_);  // not yet dir-synced
};

}  // namespace psflow::io

#endif  // PSFLOW_IO_FAULT_INJECTION_ENV_H_
