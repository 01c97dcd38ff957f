// The chief's duties beyond training (worker 0): bring the ps tasks up — resume a job that is
// already running, restore the newest checkpoint, or initialize fresh values — save checkpoints
// of the whole training state on schedule and at the end, and roll the job back to the newest
// checkpoint when a ps task restarted without its variables. Embedding tables are in the files too
// (train/table_checkpoint.h), scanned and restored in parts. Used by the chief's training thread only;
// a scheduled save runs beside it on the Chief's own save thread (docs/checkpoints.md#saves-beside-training):
// the training thread starts it and steps on, at most one save is in flight, and every other duty
// (the final save, a restore, the destructor) first waits for it (a restore abandons it).
#ifndef PSFLOW_TRAIN_CHIEF_H_
#define PSFLOW_TRAIN_CHIEF_H_

#include <atomic>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
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

  // Abandons a save in flight (the ps tasks drop its scans) and waits for its thread.
  ~Chief();

  absl::Status InitializeCluster();
  // Starts a save on the save thread when the schedule says so and none is in flight, and returns
  // at once (no-op without --checkpoint_dir): the chief steps on while the save scans the tables and
  // writes the file. A failed save is logged ("checkpoint failed: ...") and tried again at the next
  // interval; a save due while the previous one still runs waits for it (one save in flight).
  absl::Status MaybeCheckpoint(int64_t global_step);
  // Called with a save's global step and file once it is written (on the save thread).
  using SavedFn = std::function<void(int64_t global_step, const std::string& path)>;
  // The same save made whether or not the schedule says so (--eval_every_steps' evaluation beside
  // training), then `then` with its file; when the save in flight it waits for was of this step,
  // `then` gets that file. A failed save is logged and `then` not called.
  absl::Status CheckpointNow(int64_t global_step, SavedFn then);
  // Saves now, on the calling thread, after the save in flight (if any) has ended.
  absl::Status SaveCheckpoint();
  // Waits for the save in flight, if any (its failure was logged).
  void WaitForSave();
  // The chief's last save at Close: waits for the save in flight, then SaveCheckpoint, unless the
  // schedule (or that save) has just saved the
  // checkpoint of `global_step` (--train_steps a multiple of --save_checkpoint_steps), which would
  // only be written and logged a second time.
  absl::Status SaveFinalCheckpoint(int64_t global_step);
  // Ps task `task` restarted empty: rolls every ps task back to the newest checkpoint (a consistent
  // model, global step included), or, without --checkpoint_dir, gives that task fresh values. A save
  // in flight is abandoned first (its rows would mix the states before and after the restore).
  absl::Status RestorePs(int task);
  // The end-of-training marker for the evaluator (train/training_end.h), with --checkpoint_dir only:
  // done at the step of the last checkpoint saved (call it after the final save), or failed.
  absl::Status MarkTrainingDone();
  void MarkTrainingFailed(const std::string& reason);

 private:
  // SaveCheckpoint without the wait.
  absl::Status SaveCheckpointNow();
  // A save's halves: the dense variables pulled and the tables' scans opened on every ps task (on
  // the training thread, before its next push: the save's consistent moment), then the tables read
  // and the file written (on the save thread for a scheduled save); WriteCheckpoint stops with
  // Cancelled between table parts once cancel_ is set.
  absl::StatusOr<TrainingState> PullDense();
  // Begins the chain's next save at the state's step and opens its scans (an increment a ps task
  // refuses is begun again in full).
  absl::StatusOr<SaveChain::Save> OpenTableScans(const TrainingState& state);
  absl::Status WriteCheckpoint(TrainingState state, const SaveChain::Save& save, const SavedFn& then = {});
  // MaybeCheckpoint's save, begun when `force` or the schedule says so.
  absl::Status StartSave(int64_t global_step, bool force, SavedFn then);
  // Sets cancel_, waits for the save in flight, clears cancel_.
  void AbandonSave();
  // WriteCheckpoint's file: `state` and the tables as `save` (full or increment). The path.
  absl::StatusOr<std::string> WriteChainSave(const TrainingState& state, const SaveChain::Save& save);
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
  // InitializeWith's model and tables (the work queue after them).
  absl::Status InitializeModelWith(const ps::ModelSnapshot& state, bool from_checkpoint);

  const TrainOptions& options_;
  const std::string model_name_;
  ps::PsClient& client_;
  const std::vector<dist::VariableSpec> variables_;
  InitialValues initial_;
  std::vector<Tensor> initial_copy_;  // when initial_.rebuild is not given
  ps::TrainingConfig config_;
  const optim::Optimizer& optimizer_;
  const LogSink& log_;
  absl::Mutex mu_;  // the schedule and the last save, shared with the save thread
  CheckpointSchedule schedule_ ABSL_GUARDED_BY(mu_);
  int64_t saved_step_ ABSL_GUARDED_BY(mu_) = -1;          // global step of the last checkpoint this chief wrote
  std::string saved_path_ ABSL_GUARDED_BY(mu_);           // and its file
  bool saving_ ABSL_GUARDED_BY(mu_) = false;              // a save is in flight on save_thread_
  std::thread save_thread_;                               // started and joined by the training thread only
  std::atomic<bool> cancel_{false};                       // the save in flight stops at its next table part
  const std::vector<dist::TableSpec> tables_;             // embedding tables: scanned into / restored from the files
  std::unique_ptr<ckpt::OpenedCheckpoint> restore_file_;  // CheckpointState's checkpoint, until InitializeWith
  // The saves' numbers, full or increment (--full_checkpoint_every). Used by one save at a time:
  // begun on the training thread where its scans open (OpenTableScans, after waiting for the save
  // before it), committed or failed on the save thread; and by restores (after AbandonSave).
  SaveChain chain_;
  // The work queue's state in the checkpoint CheckpointState read (empty: none), given back to ps
  // task 0 by InitializeWith.
  std::string restore_work_queue_;
};

// What a worker waits for before its first step: the chief's initialization of every ps task,
// asked in short slices so that a ps killed and restarted meanwhile (its held call broken) is asked
// again, until `timeout_secs` in all (--init_timeout_secs). DeadlineExceeded when it gives up.
absl::Status WaitForChiefInitialization(ps::PsClient& client, double timeout_secs);

}  // namespace psflow::train

#endif  // PSFLOW_TRAIN_CHIEF_H_
