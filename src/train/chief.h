// The chief's duties beyond training (worker 0): bring the ps tasks up — resume a job that is
// already running, restore the newest checkpoint, or initialize fresh values — save checkpoints
// of the whole training state on schedule and at the end, and roll the job back to the newest
// checkpoint when a ps task restarted without its variables. Embedding tables are in the files too
// (train/table_checkpoint.h), scanned and restored in parts. Used by the chief's training thread only.
#ifndef PSFLOW_TRAIN_CHIEF_H_
#define PSFLOW_TRAIN_CHIEF_H_

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "psflow/dist/partition.h"
#include "psflow/optim/optimizer.h"
#include "psflow/ps/ps_client.h"
#include "psflow/train/train.h"
#include "train/checkpointing.h"

namespace psflow::train {

class Chief {
 public:
  // The job's step-0 values. `at_start` points at the chief's own buffers, which hold them until
  // its first pull (a fresh initialization sends them). `rebuild`, when given, makes them again for
  // a ps restart before the first checkpoint; without it the Chief keeps a copy made here.
  struct InitialValues {
    std::vector<const Tensor*> at_start;
    std::function<absl::StatusOr<std::vector<Tensor>>()> rebuild;
  };

  // `variables` in the plan's order, `initial` in the same order. `model_name` is the checkpoints'
  // "model" metadata. The rest is borrowed and outlives the Chief.
  Chief(const TrainOptions& options, std::string model_name, ps::PsClient& client,
        std::vector<dist::VariableSpec> variables, InitialValues initial, const ps::TrainingConfig& config,
        const optim::Optimizer& optimizer, const LogSink& log, std::vector<dist::TableSpec> tables = {});

  absl::Status InitializeCluster();
  // Saves a checkpoint when the schedule says so (no-op without --checkpoint_dir).
  absl::Status MaybeCheckpoint(int64_t global_step);
  absl::Status SaveCheckpoint();
  // The chief's last save at Close: SaveCheckpoint, unless the schedule has just saved the
  // checkpoint of `global_step` (--train_steps a multiple of --save_checkpoint_steps), which would
  // only be written and logged a second time.
  absl::Status SaveFinalCheckpoint(int64_t global_step);
  // Ps task `task` restarted empty: rolls every ps task back to the newest checkpoint (a consistent
  // model, global step included), or, without --checkpoint_dir, gives that task fresh values.
  absl::Status RestorePs(int task);
  // The end-of-training marker for the evaluator (train/training_end.h), with --checkpoint_dir only:
  // done at the step of the last checkpoint saved (call it after the final save), or failed.
  absl::Status MarkTrainingDone();
  void MarkTrainingFailed(const std::string& reason);

 private:
  // SaveCheckpoint's pull and write.
  absl::Status PullAndWriteCheckpoint();
  // Writes `state` and the tables as the chain's next save (full or increment; an increment a ps
  // task refuses is saved in full instead). The file's path.
  absl::StatusOr<std::string> WriteChainSave(const TrainingState& state);
  absl::Status TryInitializeCluster();
  // Repeats `attempt` while it fails Unavailable (a ps task down), every 0.5 s for up to `timeout_secs`.
  absl::Status RetryWhileUnavailable(const std::function<absl::Status()>& attempt, double timeout_secs);
  // The newest checkpoint as a snapshot for the ps tasks, or fresh initial values at step 0;
  // `from_checkpoint` (optional) says which.
  absl::StatusOr<ps::ModelSnapshot> RestorableState(bool* from_checkpoint = nullptr);
  // The newest checkpoint as a snapshot, or nullopt when there is none (or no --checkpoint_dir).
  // Keeps the file open in restore_file_ for its tables.
  absl::StatusOr<std::optional<ps::ModelSnapshot>> CheckpointState();
  // Initializes every ps task with `state`; the tables' rows come from restore_file_ when
  // `from_checkpoint` (fresh initial values otherwise). Closes restore_file_.
  absl::Status InitializeWith(const ps::ModelSnapshot& state, bool from_checkpoint);

  const TrainOptions& options_;
  const std::string model_name_;
  ps::PsClient& client_;
  const std::vector<dist::VariableSpec> variables_;
  InitialValues initial_;
  std::vector<Tensor> initial_copy_;  // when initial_.rebuild is not given
  ps::TrainingConfig config_;
  const optim::Optimizer& optimizer_;
  const LogSink& log_;
  CheckpointSchedule schedule_;
  int64_t saved_step_ = -1;                                // global step of the last checkpoint this chief wrote
  const std::vector<dist::TableSpec> tables_;              // embedding tables: scanned into / restored from the files
  std::unique_ptr<ckpt::OpenedCheckpoint> restore_file_;  // CheckpointState's checkpoint, until InitializeWith
  SaveChain chain_;  // the saves' numbers, full or increment (--full_checkpoint_every)
};

}  // namespace psflow::train

#endif  // PSFLOW_TRAIN_CHIEF_H_
