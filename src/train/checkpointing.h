// Training state <-> checkpoint files (psflow/ckpt/checkpoint.h). The state is every variable
// whole, its optimizer slots ("VAR/slot/NAME") and update count, and the global step: the same
// whether it came from one process or was assembled from the shards of many ps tasks, so a
// checkpoint restores onto any number of ps tasks and any partitioner.
#ifndef PSFLOW_TRAIN_CHECKPOINTING_H_
#define PSFLOW_TRAIN_CHECKPOINTING_H_

#include <algorithm>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "psflow/ckpt/checkpoint.h"
#include "psflow/ckpt/safetensors_stream.h"
#include "psflow/core/autodiff.h"
#include "psflow/dist/partition.h"
#include "psflow/io/env.h"
#include "psflow/optim/optimizer.h"
#include "psflow/ps/ps_client.h"
#include "psflow/train/train.h"

namespace psflow::train {

struct VariableState {
  Tensor value;
  std::vector<Tensor> slots;  // in optimizer.slot_names() order
  int64_t updates = 0;
};

struct TrainingState {
  int64_t global_step = 0;
  std::string model, optimizer;
  std::map<std::string, VariableState> variables;
  // The work queue of the training files (ps/server/work_queue.h State()), metadata key
  // "work_queue"; empty: the job has none (the key is left out).
  std::string work_queue;
};
inline constexpr char kWorkQueueMetadataKey[] = "work_queue";

// Creates `dir` (--checkpoint_dir) up front, so that one that cannot be created fails before
// training rather than at the first save: "cannot create the directory DIR: <cause>; pick a
// writable --checkpoint_dir".
absl::Status PrepareCheckpointDir(const std::string& dir, io::Env* env = io::Env::Default());

// Files go through `env` (borrowed). A failed save leaves the earlier checkpoints untouched. `more`,
// when given, adds tensors of its own after the variables (the chief's tables, streamed).
absl::StatusOr<std::string> SaveTrainingState(
    const std::string& dir, const TrainingState& state, const std::vector<std::string>& slot_names, int keep = 5,
    io::Env* env = io::Env::Default(), const std::function<absl::Status(ckpt::SafetensorsWriter&)>& more = nullptr);
// The same as a full save or an increment (`save`), with `metadata` added to the file's.
absl::StatusOr<std::string> SaveTrainingState(const std::string& dir, const TrainingState& state,
                                              const std::vector<std::string>& slot_names, const ckpt::SaveOptions& save,
                                              const std::map<std::string, std::string>& metadata, io::Env* env,
                                              const std::function<absl::Status(ckpt::SafetensorsWriter&)>& more);

// The newest valid checkpoint of `dir` as a TrainingState for `variables` (names and shapes must
// match: a mismatch is an error naming the variable), or nullopt when there is none. Skipped
// corrupt checkpoints are logged. Only the variables' tensors are read (not the file's tables).
absl::StatusOr<std::optional<TrainingState>> LoadTrainingState(const std::string& dir, const std::string& model,
                                                               const std::vector<dist::VariableSpec>& variables,
                                                               const optim::Optimizer& optimizer, const LogSink& log,
                                                               io::Env* env = io::Env::Default());

// LoadTrainingState's state with the checkpoint still open (its checksum checked; an increment with
// its chain), for the tensors read in parts afterwards (embedding tables: train/table_checkpoint.h).
// `check_first`, when given, checks the checkpoint before the variables are read (the tables' names
// and shapes). `save_id`: the save's number in its metadata (0 when it has none).
struct OpenedTrainingState {
  TrainingState state;
  std::string path;
  ckpt::OpenedCheckpoint checkpoint;
  int64_t save_id = 0;
};
absl::StatusOr<std::optional<OpenedTrainingState>> OpenTrainingState(
    const std::string& dir, const std::string& model, const std::vector<dist::VariableSpec>& variables,
    const optim::Optimizer& optimizer, const LogSink& log, io::Env* env = io::Env::Default(),
    const std::function<absl::Status(const ckpt::OpenedCheckpoint&)>& check_first = nullptr);

// The chief's saves as chains (docs/checkpoints.md#increments): it numbers them (save_id 1, 2, ...,
// going on from a restored save's number) and chooses full save or increment: with
// --full_checkpoint_every=K, a full save then K - 1 increments, each following the previous
// committed save. The next save is full after Restart (a restore, a ps task restarted, a chief
// (re)started: the ps tasks' change logs are unknown) and after a failed full save; a failed
// increment is followed by an increment since the same committed save (larger). K = 1 writes
// today's files (no chain metadata). A full save's chain id is derived, not drawn: from the job's
// --seed, the save's step and number, and the fingerprint of what it saves (ChainFingerprint), so
// two runs of the same job write the same bits, while another job's (another seed, or other dense
// values at that step) chain differs and its increments are refused. Not thread-safe (the chief's
// thread).
class SaveChain {
 public:
  explicit SaveChain(int64_t full_every, uint64_t seed = 0)
      : full_every_(std::max<int64_t>(full_every, 1)), seed_(seed) {}

  struct Save {
    int64_t save_id = 0;
    bool increment = false;
    ps::TableScanOptions scan;                    // the ps tasks' scans
    std::map<std::string, std::string> metadata;  // the chain's keys (ckpt/checkpoint_chain.h)
    std::string chain;
  };
  // The next save at `global_step`, numbered; a full one's chain id from `fingerprint` (what it
  // saves: ChainFingerprint of its state).
  Save Begin(int64_t global_step, uint64_t fingerprint = 0);
  void Committed(const Save& save, int64_t global_step);
  void Failed(const Save& save);
  // The next save is full, numbered after `last_save_id`.
  void Restart(int64_t last_save_id);

 private:
  const int64_t full_every_;
  const uint64_t seed_;
  int64_t next_id_ = 1;
  bool in_chain_ = false;  // the last committed save is in a chain the next increment may follow
  std::string chain_;
  int64_t base_step_ = 0, last_step_ = 0, last_save_id_ = 0, saves_in_chain_ = 0;
};

// A fingerprint of a save's state (its model, optimizer, global step and every dense variable's
// name, bytes, slots and update count; 64 bits, the same on every machine and run): what a full
// save's chain id is derived from.
uint64_t ChainFingerprint(const TrainingState& state);
// The chain id of a full save (16 hex digits) from the job's seed, its step, its number and its
// fingerprint.
std::string DerivedChainId(uint64_t seed, int64_t global_step, int64_t save_id, uint64_t fingerprint);

// Decides when the chief saves: each time the global step reaches a multiple of `steps`, and/or
// every `secs` seconds. The step schedule is on the boundaries, not relative to the last save: in
// async mode the step the chief sees after its push may already be past the boundary (the other
// workers pushed), and the file is named by the step of the values it holds (ckpt-501); counting
// `steps` from there made every later save drift (-1001, -1502, ...). A job resumed at step S
// saves next at the first multiple after S.
class CheckpointSchedule {
 public:
  CheckpointSchedule(int64_t steps, double secs, int64_t start_step)
      : steps_(steps), secs_(secs), last_step_(start_step), last_time_(std::chrono::steady_clock::now()) {}
  bool Due(int64_t global_step) const {
    if (steps_ > 0 && global_step / steps_ > last_step_ / steps_) return true;
    return secs_ > 0 && std::chrono::duration<double>(std::chrono::steady_clock::now() - last_time_).count() >= secs_;
  }
  void Saved(int64_t global_step) {
    last_step_ = global_step;
    last_time_ = std::chrono::steady_clock::now();
  }

 private:
  int64_t steps_;
  double secs_;
  int64_t last_step_;
  std::chrono::steady_clock::time_point last_time_;
};

}  // namespace psflow::train

#endif  // PSFLOW_TRAIN_CHECKPOINTING_H_
