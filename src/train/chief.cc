#include "train/chief.h"

#include <chrono>
#include <memory>
#include <optional>
#include <thread>

#include "absl/strings/str_cat.h"
#include "ps/common/retry.h"
#include "psflow/ckpt/checkpoint_chain.h"
#include "train/table_checkpoint.h"
#include "train/training_end.h"

namespace psflow::train {
namespace {

ps::ModelSnapshot ToSnapshot(TrainingState state, const std::vector<dist::VariableSpec>& variables) {
  ps::ModelSnapshot snapshot;
  snapshot.global_step = state.global_step;
  for (const dist::VariableSpec& p : variables) {  // the plan's order
    VariableState& v = state.variables.at(p.name);
    snapshot.variables.push_back({p.name, std::move(v.value), std::move(v.slots), v.updates});
  }
  return snapshot;
}

}  // namespace

Chief::Chief(const TrainOptions& options, std::string model_name, ps::PsClient& client,
             std::vector<dist::VariableSpec> variables, InitialValues initial, const ps::TrainingConfig& config,
             const optim::Optimizer& optimizer, const LogSink& log, std::vector<dist::TableSpec> tables)
    : options_(options),
      model_name_(std::move(model_name)),
      client_(client),
      variables_(std::move(variables)),
      initial_(std::move(initial)),
      config_(config),
      optimizer_(optimizer),
      log_(log),
      schedule_(options.save_checkpoint_steps, options.save_checkpoint_secs, 0),
      tables_(std::move(tables)),
      chain_(options.full_checkpoint_every, options.seed) {
  if (!initial_.rebuild) {
    for (const Tensor* t : initial_.at_start) initial_copy_.push_back(*t);
  }
}

Chief::~Chief() { AbandonSave(); }

void Chief::WaitForSave() {
  if (save_thread_.joinable()) save_thread_.join();
}

void Chief::AbandonSave() {
  cancel_ = true;
  WaitForSave();
  cancel_ = false;
}

absl::StatusOr<std::optional<ps::ModelSnapshot>> Chief::CheckpointState() {
  if (options_.checkpoint_dir.empty()) return std::nullopt;
  restore_file_.reset();
  auto layout = TableLayoutOf(config_);
  if (!layout.ok()) return layout.status();
  // The tables are checked first: a table of another dim is named as such (its model's dense
  // layers around it usually change shape too).
  auto check_tables = [&](const ckpt::OpenedCheckpoint& file) { return TableSources(file, tables_, *layout).status(); };
  auto restored =
      OpenTrainingState(options_.checkpoint_dir, model_name_, variables_, optimizer_, log_, options_.env, check_tables);
  if (!restored.ok()) return restored.status();
  if (!restored->has_value()) return std::nullopt;
  // Saves go on numbering after the restored one; the next is full (the rows restored carry no
  // change marks the chief knows).
  chain_.Restart((*restored)->save_id);
  if (!tables_.empty()) restore_file_ = std::make_unique<ckpt::OpenedCheckpoint>(std::move((*restored)->checkpoint));
  restore_work_queue_ = (*restored)->state.work_queue;
  return ToSnapshot(std::move((*restored)->state), variables_);
}

absl::Status Chief::InitializeWith(const ps::ModelSnapshot& state, bool from_checkpoint) {
  absl::Status initialized = InitializeModelWith(state, from_checkpoint);
  if (!initialized.ok() || !from_checkpoint || restore_work_queue_.empty()) return initialized;
  // The work queue goes back to where the checkpoint saw it (its held slices back in the queue).
  // Workers that ask before it is back are told it is not configured yet, and wait.
  ps::WorkQueueCall restore;
  restore.op = ps::WorkQueueCall::Op::kConfigure;
  restore.state_json = restore_work_queue_;
  restore.replace = true;
  auto answer = client_.CallWorkQueue(restore);
  if (!answer.ok()) {
    return absl::Status(answer.status().code(),
                        absl::StrCat("restoring the work queue of the checkpoint: ", answer.status().message()));
  }
  log_(absl::StrCat("chief: restored the work queue at ", answer->handed, " of ", answer->total,
                    " slices handed out (the slices held at the checkpoint go out again)"));
  return absl::OkStatus();
}

absl::Status Chief::InitializeModelWith(const ps::ModelSnapshot& state, bool from_checkpoint) {
  std::unique_ptr<ckpt::OpenedCheckpoint> file = std::move(restore_file_);
  if (!from_checkpoint || tables_.empty()) return client_.Initialize(state, config_);
  if (file == nullptr) return absl::InternalError("the chief restores tables without their checkpoint file");
  auto layout = TableLayoutOf(config_);
  if (!layout.ok()) return layout.status();
  auto sources = TableSources(*file, tables_, *layout);
  if (!sources.ok()) return sources.status();
  return client_.Initialize(state, config_, *sources);
}

absl::StatusOr<ps::ModelSnapshot> Chief::RestorableState(bool* from_checkpoint) {
  if (from_checkpoint != nullptr) *from_checkpoint = false;
  auto checkpoint = CheckpointState();
  if (!checkpoint.ok()) return checkpoint.status();
  if (checkpoint->has_value()) {
    if (from_checkpoint != nullptr) *from_checkpoint = true;
    return std::move(**checkpoint);
  }
  // Fresh values: the job's initial values (not what the chief pulled since), with the
  // optimizer's initial slots.
  std::vector<Tensor> rebuilt;
  if (initial_.rebuild) {
    auto values = initial_.rebuild();
    if (!values.ok()) return values.status();
    rebuilt = *std::move(values);
  }
  const std::vector<Tensor>& values = initial_.rebuild ? rebuilt : initial_copy_;
  if (values.size() != variables_.size()) {
    return absl::InternalError(
        absl::StrCat("the chief has ", values.size(), " initial values for ", variables_.size(), " variables"));
  }
  TrainingState fresh{0, model_name_, optimizer_.name(), {}, {}};
  for (size_t i = 0; i < variables_.size(); ++i) {
    const Tensor& value = values[i];
    optim::SlotState slots = optimizer_.NewState(value.size());
    VariableState v{value, {}, 0};
    for (const FloatBuffer& s : slots.slots)
      v.slots.emplace_back(value.shape(), std::vector<float>(s.begin(), s.end()));
    fresh.variables.emplace(variables_[i].name, std::move(v));
  }
  return ToSnapshot(std::move(fresh), variables_);
}

absl::Status Chief::RetryWhileUnavailable(const std::function<absl::Status()>& attempt, double timeout_secs) {
  // The calls inside `attempt` wait out a silent ps task themselves (the client's retries); this
  // layer only starts the whole attempt again when a ps task broke off in the middle of it.
  ps::SilenceLog silences([this](const std::string& line) { log_("chief: " + line); });
  ps::RetryOptions retry;
  retry.peer = "the ps tasks";
  retry.what = "the chief's initialization";
  retry.budget_secs = timeout_secs;
  retry.budget_flag = "--init_timeout_secs";
  retry.log = &silences;
  retry.retryable = [](const absl::Status& s) { return absl::IsUnavailable(s); };
  return ps::RetryBlocking(retry, [&](double) { return attempt(); });
}

absl::Status Chief::InitializeCluster() {
  if (!options_.checkpoint_dir.empty()) {
    if (auto s = PrepareCheckpointDir(options_.checkpoint_dir, options_.env); !s.ok()) return s;
    // An earlier run's end marker would end a new evaluator at once.
    if (auto s = ClearTrainingEnd(options_.checkpoint_dir, options_.env); !s.ok()) return s;
  }
  // A ps task that dies while it is being initialized is waited for (bounded), then initialized again.
  return RetryWhileUnavailable([this] { return TryInitializeCluster(); }, options_.init_timeout_secs);
}

absl::Status Chief::TryInitializeCluster() {
  auto running = client_.IsInitialized();
  if (!running.ok()) return running.status();
  if (*running) {
    // A restarted chief: the ps tasks kept the job's state; take up the duties where they are.
    log_("chief: the ps tasks are already initialized (chief restart); resuming the running job");
    // Learns the job's configuration from them (its optimizer sizes the checkpoints' pulls) and
    // checks that this chief builds the same model; answered at once, the job being initialized.
    return client_.WaitForInitialization(options_.init_timeout_secs);
  }
  auto checkpoint = CheckpointState();
  if (!checkpoint.ok()) return checkpoint.status();
  const int64_t step = checkpoint->has_value() ? (*checkpoint)->global_step : 0;
  config_.initial_global_step = step;
  {
    absl::MutexLock lock(&mu_);
    schedule_ = CheckpointSchedule(options_.save_checkpoint_steps, options_.save_checkpoint_secs, step);
  }
  if (checkpoint->has_value()) {
    if (auto s = InitializeWith(**checkpoint, /*from_checkpoint=*/true); !s.ok()) return s;
  } else {
    // A fresh job: the chief's buffers still hold the initial values (nothing was pulled yet);
    // they go alone, and each ps makes the optimizer's initial slots itself (materialized slots
    // would cost the chief and every ps a copy of the whole optimizer state at start-up).
    std::vector<std::pair<std::string, const Tensor*>> initial;
    for (size_t i = 0; i < variables_.size(); ++i) initial.emplace_back(variables_[i].name, initial_.at_start[i]);
    if (auto s = client_.Initialize(initial, config_); !s.ok()) return s;
  }
  // A restore says so: the job continues at `step`, it does not start again.
  log_(absl::StrCat("chief: ", checkpoint->has_value() ? "restored " : "initialized ", variables_.size(), " variables",
                    tables_.empty() ? "" : absl::StrCat(" and ", tables_.size(), " tables"), " at global step ", step));
  return absl::OkStatus();
}

absl::Status Chief::MaybeCheckpoint(int64_t global_step) { return StartSave(global_step, false, {}); }

absl::Status Chief::CheckpointNow(int64_t global_step, SavedFn then) {
  return StartSave(global_step, true, std::move(then));
}

absl::Status Chief::StartSave(int64_t global_step, bool force, SavedFn then) {
  if (options_.checkpoint_dir.empty()) return absl::OkStatus();
  {
    absl::MutexLock lock(&mu_);
    if (!force && !schedule_.Due(global_step)) return absl::OkStatus();
  }
  // At most one save in flight: a save due while the previous one still writes waits for it, so each
  // save is of the step it was due at (a sync job's files are the same, run to run, whatever the
  // saves' speed). Training is held only when saves take longer than the interval between them.
  WaitForSave();
  {
    absl::MutexLock lock(&mu_);
    if (saved_step_ == global_step) {  // the one it waited for saved this step
      if (then) then(saved_step_, saved_path_);
      return absl::OkStatus();
    }
    if (!force && !schedule_.Due(global_step)) return absl::OkStatus();
    schedule_.Saved(global_step);  // this interval's save: the next is due at the next boundary
    saving_ = true;
  }
  // The dense variables are pulled here, before the chief's next push: the file holds (and is named
  // by) the step the save was due at. The tables' scans and the file's writing go on beside training.
  auto state = PullDense();
  auto failed = [this, global_step](const absl::Status& s) {
    log_(absl::StrCat("checkpoint failed: ", s.message()));
    absl::MutexLock lock(&mu_);
    // A failed save (a full disk) is tried again at the next interval, not at every step: each try
    // pulls the whole model from the ps tasks.
    schedule_.Saved(global_step);
    saving_ = false;
  };
  // The tables' scans start now too, on every ps task at once: each shard is read as it stands now,
  // whatever the chief and the others push while the save thread reads it.
  absl::StatusOr<SaveChain::Save> opened =
      state.ok() ? OpenTableScans(*state) : absl::StatusOr<SaveChain::Save>(state.status());
  if (!opened.ok()) {
    internal::ReleaseCachedBlocks();
    failed(opened.status());
    return absl::OkStatus();
  }
  save_thread_ = std::thread(
      [this, failed, state = *std::move(state), save = *std::move(opened), then = std::move(then)]() mutable {
        absl::Status saved = WriteCheckpoint(std::move(state), save, then);
        if (!saved.ok()) return failed(saved);
        absl::MutexLock lock(&mu_);
        saving_ = false;
      });
  return absl::OkStatus();
}

absl::Status Chief::SaveCheckpoint() {
  WaitForSave();
  return SaveCheckpointNow();
}

absl::Status Chief::SaveCheckpointNow() {
  if (options_.checkpoint_dir.empty()) return absl::OkStatus();
  auto state = PullDense();
  absl::StatusOr<SaveChain::Save> opened =
      state.ok() ? OpenTableScans(*state) : absl::StatusOr<SaveChain::Save>(state.status());
  if (!opened.ok()) {
    internal::ReleaseCachedBlocks();
    return opened.status();
  }
  return WriteCheckpoint(*std::move(state), *opened);
}

absl::StatusOr<SaveChain::Save> Chief::OpenTableScans(const TrainingState& state) {
  const int64_t global_step = state.global_step;
  // A full save's chain id comes from what it saves (two runs of one job write the same bits).
  const uint64_t fingerprint = options_.full_checkpoint_every > 1 ? ChainFingerprint(state) : 0;
  std::vector<std::string> names;
  for (const dist::TableSpec& t : tables_) names.push_back(t.name);
  // At most two tries: the save the chain asks for, then (an increment refused) a full one.
  for (bool refused = false;; refused = true) {
    SaveChain::Save save = chain_.Begin(global_step, fingerprint);
    if (tables_.empty()) return save;
    const absl::Status opened = client_.OpenTableScans(names, save.scan);
    if (opened.ok()) return save;
    chain_.Failed(save);
    (void)client_.CloseTableScans();
    // A ps task that cannot answer the increment (restarted, or its change log lost): full, at once.
    if (refused || !save.increment || !absl::IsFailedPrecondition(opened)) return opened;
    log_(absl::StrCat("chief: an incremental save was refused (", opened.message(), "); saving in full"));
    chain_.Restart(save.save_id);
  }
}

absl::Status Chief::SaveFinalCheckpoint(int64_t global_step) {
  WaitForSave();
  {
    absl::MutexLock lock(&mu_);
    if (global_step == saved_step_) return absl::OkStatus();
  }
  return SaveCheckpointNow();
}

absl::StatusOr<TrainingState> Chief::PullDense() {
  // The snapshot ((1 + slots) x the model) is a burst of big tensors once per checkpoint. The
  // tensor allocator's cache is emptied before it (the steps' freed buffers, up to 1 GiB, would
  // otherwise stay resident beside it) and after the file is written (its blocks would stay beside
  // the evaluation's or the next steps' buffers of other sizes until the next checkpoint). The 1 GB
  // model's chief (bench/memory.py --checkpoint) peaks 244 MB lower for it.
  internal::ReleaseCachedBlocks();
  auto snapshot = client_.PullState();
  if (!snapshot.ok()) return snapshot.status();
  TrainingState state{snapshot->global_step, model_name_, optimizer_.name(), {}, {}};
  // The work queue's state (a job reading --train_files), read after the variables: slices handed
  // out since are handed out again on a restore (at-least-once).
  ps::WorkQueueCall state_call;
  state_call.op = ps::WorkQueueCall::Op::kState;
  auto queue = client_.CallWorkQueue(state_call);
  if (!queue.ok()) return queue.status();
  if (queue->configured) state.work_queue = queue->state_json;
  for (ps::VariableSnapshot& v : snapshot->variables) {
    state.variables.emplace(v.name, VariableState{std::move(v.value), std::move(v.slots), v.updates});
  }
  return state;
}

absl::Status Chief::WriteCheckpoint(TrainingState state, const SaveChain::Save& save, const SavedFn& then) {
  auto path = WriteChainSave(state, save);
  state.variables.clear();
  internal::ReleaseCachedBlocks();
  if (!path.ok()) {
    // The scans it opened and did not read: the ps tasks drop their snapshots now rather than at the
    // next save (a disk that stays full would otherwise hold them interval after interval).
    if (!tables_.empty()) (void)client_.CloseTableScans();
    return path.status();
  }
  {
    absl::MutexLock lock(&mu_);
    schedule_.Saved(state.global_step);
    saved_step_ = state.global_step;
    saved_path_ = *path;
  }
  log_("saved checkpoint " + *path);
  if (then) then(state.global_step, *path);
  return absl::OkStatus();
}

absl::StatusOr<std::string> Chief::WriteChainSave(const TrainingState& state, const SaveChain::Save& save) {
  std::map<std::string, std::string> metadata = save.metadata;
  std::function<absl::Status(ckpt::SafetensorsWriter&)> tables;
  if (!tables_.empty()) {
    std::string names;
    for (const dist::TableSpec& t : tables_) absl::StrAppend(&names, t.name, "\n");
    if (options_.full_checkpoint_every > 1) metadata[ckpt::kTablesKey] = names;
    // The tables' scans were opened right after the dense pull (OpenTableScans, with this save's
    // number and kind): their rows are of the same moment (in sync mode the same step), read now
    // while training goes on.
    tables = [this, &save](ckpt::SafetensorsWriter& writer) {
      auto layout = TableLayoutOf(config_);
      if (!layout.ok()) return layout.status();
      // A save abandoned (a restore, the chief's end) stops between parts; its file is never renamed
      // into place, and the ps tasks drop the scan it left open.
      TableScan scan = [this, &save](const std::string& table, int64_t max_rows,
                                     const std::function<absl::Status(ps::TableRowsPart)>& sink) {
        return client_.ScanTable(table, max_rows, save.scan, [&](ps::TableRowsPart part) {
          if (cancel_) return absl::CancelledError("the save was abandoned");
          return sink(std::move(part));
        });
      };
      return WriteTables(scan, tables_, *layout, writer, save.increment);
    };
  }
  auto path = SaveTrainingState(options_.checkpoint_dir, state, optimizer_.slot_names(),
                                ckpt::SaveOptions{5, save.increment}, metadata, options_.env, tables);
  if (path.ok()) {
    chain_.Committed(save, state.global_step);
    return path;
  }
  chain_.Failed(save);
  // An increment that failed part-way (a ps task refused it: restarted, or its change log lost):
  // the next save is full.
  if (save.increment && absl::IsFailedPrecondition(path.status())) chain_.Restart(save.save_id);
  return path.status();
}

absl::Status Chief::MarkTrainingDone() {
  WaitForSave();
  int64_t saved_step;
  {
    absl::MutexLock lock(&mu_);
    saved_step = saved_step_;
  }
  if (options_.checkpoint_dir.empty() || saved_step < 0) return absl::OkStatus();
  return WriteTrainingEnd(options_.checkpoint_dir, {.failed = false, .global_step = saved_step, .reason = ""},
                          options_.env);
}

void Chief::MarkTrainingFailed(const std::string& reason) {
  if (options_.checkpoint_dir.empty()) return;
  AbandonSave();  // no save ends after the failure is marked
  if (auto s =
          WriteTrainingEnd(options_.checkpoint_dir, {.failed = true, .global_step = 0, .reason = reason}, options_.env);
      !s.ok()) {
    log_(absl::StrCat("chief: ", s.message()));
  }
}

absl::Status Chief::RestorePs(int task) {
  AbandonSave();
  bool from_checkpoint = false;
  auto state = RestorableState(&from_checkpoint);
  if (!state.ok()) return state.status();
  if (options_.checkpoint_dir.empty()) {
    log_(absl::StrCat("chief: ps task ", task, " restarted without its variables; restoring it at global step ",
                      state->global_step,
                      " (no --checkpoint_dir: its variables start over from their initial "
                      "values, the other ps tasks keep theirs)"));
    return client_.InitializePs(task, *state, config_);
  }
  // Every ps task goes back to the checkpoint, as TF's Saver.restore does: restoring the restarted
  // task alone would mix its values, optimizer slots and update counts at step S with the others'
  // newer ones (and leave the global step where it was when another task holds it).
  log_(absl::StrCat("chief: ps task ", task,
                    " restarted without its variables; restoring every ps task at global step ", state->global_step,
                    from_checkpoint ? " from the newest checkpoint (the steps since are trained again)"
                                    : " from the initial values (no checkpoint saved yet: the job starts over)"));
  // Another ps task down meanwhile is waited for by the client's own retries, as long as a worker
  // waits for an unreachable ps (--ps_timeout_secs; ps/client/fan_out.h), not twice that.
  if (auto s = InitializeWith(*state, from_checkpoint); !s.ok()) return s;
  chain_.Restart(0);  // the ps tasks hold restored rows: the next save is full
  absl::MutexLock lock(&mu_);
  schedule_ = CheckpointSchedule(options_.save_checkpoint_steps, options_.save_checkpoint_secs, state->global_step);
  return absl::OkStatus();
}

absl::Status WaitForChiefInitialization(ps::PsClient& client, double timeout_secs) {
  // No log: the chief's initialization is what a worker waits for, not a silence.
  ps::RetryOptions retry;
  retry.peer = "the chief";
  retry.what = "the chief's initialization of the ps tasks";
  retry.budget_secs = timeout_secs;
  retry.budget_flag = "--init_timeout_secs";
  retry.give_up = [timeout_secs](const std::string&, const absl::Status& last) {
    return absl::DeadlineExceededError(absl::StrCat("gave up after ", timeout_secs, " s: ", last.message()));
  };
  return ps::RetryBlocking(retry,
                           [&](double left) { return client.WaitForInitialization(std::clamp(left, 0.1, 5.0)); });
}

}  // namespace psflow::train
