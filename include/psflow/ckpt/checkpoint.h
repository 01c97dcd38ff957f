// psflow/ckpt/checkpoint.h — training checkpoints in a directory: DIR/model.ckpt-STEP.safetensors,
// each holding every variable whole under its own name (independent of partitioning), the
// optimizer slots as "VARIABLE/slot/SLOT", and metadata (global step, model, optimizer, a CRC32
// of the data section). Saving is atomic (safetensors.h) and keeps the newest `keep` files;
// restoring takes the newest checkpoint that passes its checksum, naming any it had to skip.
// A save that fails (full disk, failing fsync or close, crash before the rename) leaves the
// checkpoints already there untouched and usable, and says in one line which file and why.
// Incremental checkpoints (checkpoint_chain.h): DIR/model.ckpt-STEP.increment.safetensors files
// after a full save; every function here that opens or reads a checkpoint opens an increment with its
// chain (its tables merged), and the newest checkpoint of a directory is the newest file whose whole
// chain reads back.
// Files are reached through an io::Env (the POSIX one unless a test passes another; borrowed).
// Stateless functions; two writers on one directory are not supported (only the chief saves).
#ifndef PSFLOW_CKPT_CHECKPOINT_H_
#define PSFLOW_CKPT_CHECKPOINT_H_

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "psflow/ckpt/safetensors.h"
#include "psflow/ckpt/safetensors_stream.h"

namespace psflow::ckpt {

struct Checkpoint {
  std::string path;
  int64_t global_step = 0;
  TensorFile contents;  // tensors (variables and slots) and metadata
};

// Name under which slot `slot` of `variable` is stored.
std::string SlotTensorName(const std::string& variable, const std::string& slot);

// How a save is written: a full save (DIR/model.ckpt-STEP.safetensors) or an increment
// (DIR/model.ckpt-STEP.increment.safetensors, checkpoint_chain.h); `keep` counts chains: after a
// save, the full saves beyond the newest `keep` go, with the increments of their chains.
struct SaveOptions {
  int keep = 5;
  bool increment = false;
};

// Writes DIR/model.ckpt-STEP.safetensors (creating DIR), then deletes all but the newest `keep`
// and any temporary file a crashed save left (a failed deletion is ignored: more files are kept).
// Returns the path written. On failure: "cannot save checkpoint PATH: <cause>; the previous
// checkpoints are kept", and nothing is deleted.
absl::StatusOr<std::string> SaveCheckpoint(const std::string& dir, int64_t global_step,
                                           const std::vector<std::pair<std::string, const Tensor*>>& tensors,
                                           std::map<std::string, std::string> metadata, int keep = 5,
                                           io::Env* env = io::Env::Default());

// The same, streamed: `fill` adds the tensors to the writer (whole or in parts, e.g. an embedding
// table scanned from the ps tasks); the file's checksum is computed on the way. The same errors.
absl::StatusOr<std::string> SaveCheckpointStreamed(const std::string& dir, int64_t global_step,
                                                   const std::function<absl::Status(SafetensorsWriter&)>& fill,
                                                   std::map<std::string, std::string> metadata, int keep = 5,
                                                   io::Env* env = io::Env::Default());

// The same, full or an increment (SaveOptions).
absl::StatusOr<std::string> SaveCheckpointStreamed(const std::string& dir, int64_t global_step,
                                                   const std::function<absl::Status(SafetensorsWriter&)>& fill,
                                                   std::map<std::string, std::string> metadata,
                                                   const SaveOptions& options, io::Env* env = io::Env::Default());

// A checkpoint file opened for streamed reading, its checksum checked (one pass over the file).
absl::StatusOr<std::unique_ptr<SafetensorsReader>> OpenCheckpoint(const std::string& path,
                                                                  io::Env* env = io::Env::Default());
// One file of a chain, opened.
struct ChainFile {
  std::string path;
  int64_t global_step = 0;
  std::unique_ptr<SafetensorsReader> reader;
};
struct OpenedCheckpoint {
  std::string path;
  int64_t global_step = 0;
  std::unique_ptr<SafetensorsReader> reader;  // the file: variables, metadata (and a full save's tables)
  // An increment's chain before it: its full save, then the increments it follows, oldest first;
  // empty for a full save. Its tables are read merged (ChainTableReader over chain()).
  std::vector<ChainFile> earlier;
  // The readers of the whole chain, the full save first and this file last.
  std::vector<const SafetensorsReader*> chain() const;
};
// One checkpoint file opened as above (an increment with its chain, each file checked: DataLoss or
// FailedPrecondition naming the file and step for an increment whose chain is broken — a file
// missing or corrupt, or one of another chain, i.e. another job's), its step taken as ReadCheckpoint
// takes it (the file's name, else its metadata).
absl::StatusOr<OpenedCheckpoint> OpenCheckpointFile(const std::string& path, io::Env* env = io::Env::Default());
// The newest checkpoint of `dir` that passes its checksum, opened (nothing read beyond the header
// and the checksum pass); nullopt when there is none. `skipped` as below.
absl::StatusOr<std::optional<OpenedCheckpoint>> OpenLatestCheckpoint(const std::string& dir,
                                                                     std::vector<std::string>* skipped = nullptr,
                                                                     io::Env* env = io::Env::Default());

// The newest checkpoint in `dir` that reads back and passes its checksum; nullopt when the
// directory has none (or does not exist). `skipped` receives one message per file refused.
absl::StatusOr<std::optional<Checkpoint>> LoadLatestCheckpoint(const std::string& dir,
                                                               std::vector<std::string>* skipped = nullptr,
                                                               io::Env* env = io::Env::Default());

// One checkpoint file, read and checked against its checksum (what LoadLatestCheckpoint does for
// each candidate): a file whose name does not carry its step gets the step of its metadata. An
// increment is read with its chain: its tables merged whole (as a full save at its step holds them).
// DataLoss naming the file when its checksum is missing or does not match.
absl::StatusOr<Checkpoint> ReadCheckpoint(const std::string& path, io::Env* env = io::Env::Default());

// Checkpoint files in `dir`, full saves and increments, newest first (at one step, the full save
// first; none when `dir` cannot be listed).
std::vector<std::pair<int64_t, std::string>> ListCheckpoints(const std::string& dir, io::Env* env = io::Env::Default());

}  // namespace psflow::ckpt

#endif  // PSFLOW_CKPT_CHECKPOINT_H_
