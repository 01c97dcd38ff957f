// psflow/io/env.h — the file system as psflow sees it, in the spirit of leveldb's Env:
// checkpoints (ckpt/), TensorBoard event files (tboard/) and the --metrics_json summary are
// written, and checkpoints, IDX data files (data/) and the --cluster_secret_file are read, only
// through an Env, so a test can hand them one that fails (src/io/fault_injection_env.h: a full disk
// at the Nth write, a failing fsync or close, a crash between write and rename, a failing read).
//
// Env::Default() is the POSIX file system; it lives for the whole process and must not be deleted.
// Every error is an absl::Status whose one-line message names the operation, the path and the
// cause, e.g. "cannot write /ckpt/model.ckpt-20.safetensors.tmp: No space left on device"; its code
// follows errno (absl::ErrnoToStatusCode: ENOSPC -> ResourceExhausted, ENOENT -> NotFound, ...).
//
// Ownership: NewWritableFile and NewSequentialFile return a file owned by the caller. Thread
// safety: an Env may be used from many threads at once; one file by one thread at a time.
#ifndef PSFLOW_IO_ENV_H_
#define PSFLOW_IO_ENV_H_

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace psflow::io {

// A file being written sequentially. Data passes through three stages: Append keeps it in the
// process (a small buffer), Flush hands it to the operating system (it survives the process being
// killed), Sync makes it durable (it survives the machine crashing). Close flushes and closes;
// every call after Close fails. Destroying a file that was not closed closes its descriptor and
// drops data that was appended but never flushed, as a killed process would.
class WritableFile {
 public:
  virtual ~WritableFile() = default;
  virtual absl::Status Append(std::string_view data) = 0;
  virtual absl::Status Flush() = 0;
  virtual absl::Status Sync() = 0;  // Flush, then fsync
  virtual absl::Status Close() = 0;
  virtual const std::string& path() const = 0;
};

// A file being read from its start to its end. Destroying it closes it.
class SequentialFile {
 public:
  virtual ~SequentialFile() = default;
  // Reads up to `n` bytes into `buf`: fewer only at the end of the file (0 there). An error names
  // the file: "cannot read PATH: Input/output error".
  virtual absl::StatusOr<size_t> Read(char* buf, size_t n) = 0;
  // Moves `n` bytes forward (reading and dropping them unless the file can seek). OutOfRange
  // naming the file when it ends first.
  virtual absl::Status Skip(uint64_t n);
  virtual const std::string& path() const = 0;
};

class Env {
 public:
  enum class CreateMode {
    kTruncate,   // create the file, or empty an existing one
    kExclusive,  // create the file; AlreadyExists when it exists (O_EXCL)
  };

  virtual ~Env() = default;

  // The POSIX file system. Never null; never delete it.
  static Env* Default();

  virtual absl::StatusOr<std::unique_ptr<WritableFile>> NewWritableFile(const std::string& path,
                                                                        CreateMode mode = CreateMode::kTruncate) = 0;
  // Opens `path` for reading ("cannot open PATH: No such file or directory": NotFound).
  virtual absl::StatusOr<std::unique_ptr<SequentialFile>> NewSequentialFile(const std::string& path) = 0;
  // The whole content of a file, read through NewSequentialFile. NotFound when it does not exist.
  absl::StatusOr<std::string> ReadFileToString(const std::string& path);
  // rename(2): atomically replaces `to` if it exists. Durable only after SyncDir of its directory.
  virtual absl::Status RenameFile(const std::string& from, const std::string& to) = 0;
  virtual absl::Status RemoveFile(const std::string& path) = 0;
  // Creates `dir` and any missing parents; OK when it already is a directory.
  virtual absl::Status CreateDir(const std::string& dir) = 0;
  // Names (not paths) of the entries of `dir`, in no particular order, without "." and "..".
  virtual absl::StatusOr<std::vector<std::string>> GetChildren(const std::string& dir) = 0;
  virtual bool FileExists(const std::string& path) = 0;
  // fsync of a directory: makes the creation, rename or removal of its entries durable.
  virtual absl::Status SyncDir(const std::string& dir) = 0;
};

// Writes `pieces`, concatenated, to `path` so that a crash or a failure at any point leaves either
// the old file or the complete new one, never a torn one: PATH.tmp is written, synced and closed,
// renamed over PATH, and the directory synced. On failure before the rename the temporary file is
// removed (best effort) and the first error returned; `path` is untouched. A failure of the final
// directory sync is returned too: the new file is then in place but not known to be durable.
absl::Status WriteFileAtomically(Env* env, const std::string& path, absl::Span<const std::string_view> pieces);

// The directory part of `path` ("." when it has none).
std::string DirName(const std::string& path);

}  // namespace psflow::io

#endif  // PSFLOW_IO_ENV_H_
