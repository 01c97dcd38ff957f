// train/session_impl.h — WorkerSession::Impl, the state behind psflow/train/session.h. Its
// methods live in two files by responsibility: session.cc opens and closes the session (the
// cluster, the chief, evaluations, the work queue, abort, the in-process ps), session_step.cc runs
// a step (gradients handed over as backward goes, the push deferred or waited for, lookups and
// prefetches, recovery after a ps task restarted). One thread drives a session; the deferred
// push and the pulls run on their own (session_pending.h, forward_pulls.h).
#ifndef PSFLOW_SRC_TRAIN_SESSION_IMPL_H_
#define PSFLOW_SRC_TRAIN_SESSION_IMPL_H_

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <iostream>
#include <thread>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/notification.h"
#include "psflow/ps/ps_client.h"
#include "psflow/train/session.h"
#include "psflow/train/train.h"
#include "train/chief.h"
#include "train/cluster_setup.h"
#include "train/eval_beside.h"
#include "train/forward_pulls.h"
#include "train/in_process_ps.h"
#include "train/option_value.h"
#include "train/progress.h"
#include "train/session_pending.h"
#include "train/session_state.h"
#include "train/session_summary.h"
#include "train/session_tables.h"
#include "train/telemetry.h"
#include "train/worker_roster.h"

namespace psflow::train {

class WorkerSession::Impl {
 public:
  Impl(Options options, std::vector<SessionParameter> params, std::vector<dist::TableSpec> tables)
      : options_(std::move(options)), params_(std::move(params)), tables_(std::move(tables)) {
    if (options_.model_name.empty()) options_.model_name = options_.train.model;
    if (!options_.log) options_.log = [](const std::string& line) { std::cout << line << std::endl; };
    for (const SessionParameter& p : params_) {
      variables_.push_back({p.name, p.value->shape()});
      pull_into_.emplace_back(p.name, p.value);
    }
    handed_.assign(params_.size(), false);
  }

  ~Impl() {
    // Nothing of this session's may be in flight once its client and buffers go.
    if (forward_pulls_ != nullptr) (void)forward_pulls_->Settle();
    if (pending_ != nullptr) pending_->Wait();
    SettleAhead(false);
    DropStream();
  }

  // Everything that needs no other task: the cluster, this task's role, the plan, the config.
  absl::Status Prepare();

  // Prepare's part after the cluster is known (again when the in-process ps task moved to fresh ports).
  absl::Status PrepareTask();

  absl::Status Open();

  bool ShouldStop() const {
    return state_.finished() || state_.closed() || global_step() >= OptionValue(options_.train.train_steps);
  }

  absl::Status Step(double loss, double accuracy);

  // A push's answer: the step it claimed, the progress line, telemetry, the chief's checkpoint and
  // evaluation; after a failure, the recovery (RecoverAndPull).
  absl::Status AfterPush(absl::StatusOr<ps::PushResult> pushed, double loss, double accuracy);

  // The push the last Step left in flight, waited for and taken: AfterPush of its answer. A
  // failure other than a ps restart or the end of training is returned in one line naming the
  // step it belonged to. `pushed`: whether it succeeded.
  absl::Status CollectPending(bool* pushed);

  // Waits for the push left in flight to be answered (at once when none is); whether it failed or
  // ended training (the step after it then pushes nothing).
  bool PendingEnds();

  // After a failed push or pull: training finished elsewhere (OutOfRange), or a ps task restarted
  // (the chief restores it, the others wait), then the current values are pulled.
  absl::Status RecoverAndPull(const absl::Status& failure);

  // --overlap: parameter `index`'s gradient is final; it joins the next early part.
  absl::Status GradientReady(int index);

  // The values come in forward order, or with the answer of a push left in flight.
  void WaitForValues(int index) {
    if (forward_pulls_ != nullptr) return forward_pulls_->Wait(index);
    if (pending_ != nullptr) pending_->Wait();
  }
  void WaitForValues();
  int ParameterIndex(const std::string& name) const;

  // The summary's, the progress line's and Prometheus' name of the training mode: async, sync, or
  // hybrid (--sync_replicas --table_sync=async: the dense variables sync, the tables async).
  std::string ModeName() const {
    if (!config_.sync) return "async";
    return config_.table_sync == "async" ? "hybrid" : "sync";
  }

  // --eval_every_steps: the chief's evaluation during training, logged and written as scalars.
  // It runs on the chief's thread, between two of its steps (the values it reads are the ones the
  // step pulled): the chief does not train meanwhile, the other workers do (async) or wait for it
  // (sync). The line says how long it took; docs/pytorch.md says how to evaluate beside training.
  absl::Status EvaluateNow();

  // The evaluations beside training finished since the last call: logged, written to TensorBoard at
  // their checkpoints' steps. A failed one fails the job, as an evaluation between steps does.
  absl::Status ReportBesideEvals();

  absl::Status AddClicks(absl::Span<const float> labels, absl::Span<const float> probabilities);

  absl::Status LogScalars(const std::vector<std::pair<std::string, double>>& scalars);

  absl::StatusOr<RunSummary> Close(const std::function<absl::StatusOr<SessionEval>()>& evaluate);

  absl::StatusOr<ps::WorkQueueAnswer> CallWorkQueue(const ps::WorkQueueCall& call);

  void Abort(const absl::Status& reason);

  absl::Status Lookup(const std::vector<absl::Span<const int64_t>>& ids);

  // Both forms of Prefetch: `unique` (may be null) is the caller's deduplication of next_ids.
  absl::Status Prefetch(const std::vector<absl::Span<const int64_t>>& next_ids, std::vector<UniqueIds>* unique,
                        bool ahead);

  TableBatch& table_batch(int t) { return tables_.batch(t); }
  SessionTables& tables() { return tables_; }
  int num_tables() const { return tables_.size(); }
  std::vector<dist::TableSpec> table_specs() const { return tables_.specs(); }

  // Which workers are connected: the chief's lines (train/worker_roster.h) and every worker's
  // /metrics gauge. A Stats call per ps from the training step, so only where someone reads it:
  // the chief every kWorkerCheckSecs, and each task serving /metrics every second (its gauge
  // follows workers joining a short job).
  void CheckWorkers();

  bool opened() const { return state_.opened(); }
  bool ended() const { return state_.ended(); }
  // Running alone: waits for the in-process ps task's end once the job ended (its error, if any),
  // or stops it after an abort.
  // The in-process ps task's port was free when Make picked it, at Create; another process may have
  // taken it since. Then the task starts again on fresh ports, with the worker's cluster and client
  // made anew for them (the cluster spec, hence its fingerprint in Hello, names the ports).
  absl::Status StartInProcessPs();

  absl::Status JoinInProcessPs() { return in_process_ps_ != nullptr ? in_process_ps_->Join() : absl::OkStatus(); }
  void StopInProcessPs() {
    if (in_process_ps_ != nullptr) in_process_ps_->Stop();
  }
  bool is_open() const { return state_.is_open(); }
  bool is_chief() const { return index_ == 0; }
  int index() const { return index_; }
  const dist::ClusterSpec& cluster() const { return cluster_; }
  const ps::TrainingConfig& config() const { return config_; }
  const Options& options() const { return options_; }
  const dist::PlacementPlan& plan() const { return plan_; }
  // The last answer's global step plus the push in flight (an estimate, exact once answered).
  int64_t global_step() const { return global_step_ + (pending_ != nullptr ? 1 : 0); }
  float learning_rate() const { return optim::LearningRateAt(config_.optimizer, global_step()); }
  // Step returns once its push is sent (see defers_), and the async data order is then
  // DeferredDataOrder's.
  bool defers() const { return defers_; }
  int64_t DeferredDataStep() const { return order_.NextBatch(cluster_.num_workers(), index_); }
  int64_t local_step() const { return local_step_; }
  // Async: whether global_step() is the step the last push claimed (not a pulled one).
  bool claimed() const { return state_.claimed(); }
  int64_t examples_per_global_step() const {
    return int64_t{OptionValue(options_.train.batch_size)} * (config_.sync ? config_.replicas_to_aggregate : 1);
  }

 private:
  void log(const std::string& line) const { options_.log(line); }

  static std::optional<ps::Gradient> GradientOf(const SessionParameter& p);

  // The step's gradients not pushed ahead (GradientReady): those still waiting for a part, then
  // the others.
  std::vector<ps::Gradient> Gradients();

  // Async (--overlap other than none; never in sync or hybrid mode): the next batch's rows given
  // to PrefetchAhead are pulled at once in a call of their own, beside the caller's compute,
  // instead of riding on the push's answer (docs/sync-async.md#overlap); Step waits for them
  // before its push, so they miss this worker's update of the step: one step stale, as async
  // allows, and the same every run.
  bool PullsAhead() const { return !config_.sync && options_.train.overlap != "none"; }
  // The pull ahead, waited for (at once when none runs): its rows are used when it succeeded and
  // `ok` (a failed one is no error: the next Lookup pulls the rows itself and meets the failure).
  void SettleAhead(bool ok) { tables_.SettleAhead(ok); }

  // The pull in forward order still running, waited for; its failure (OK when none).
  absl::Status SettlePulls() { return forward_pulls_ != nullptr ? forward_pulls_->Settle() : absl::OkStatus(); }
  // This step's early parts, waited for and forgotten (a step that is not pushed after all: sync
  // ps tasks drop what they staged when the next push comes).
  void DropStream();

  // A ps task that restarted empty: the chief restores it, the others wait until it has.
  absl::Status Recover(const absl::Status& status);

  // The variables as they stand (after a restore too): a ps task still being restored means
  // waiting for the chief again. OutOfRange: training finished elsewhere.
  absl::StatusOr<int64_t> PullCurrent();

  Options options_;
  std::vector<SessionParameter> params_;
  SessionTables tables_;
  std::vector<dist::VariableSpec> variables_;
  std::vector<std::pair<std::string, Tensor*>> pull_into_;
  dist::ClusterSpec cluster_;
  int index_ = 0;
  dist::PlacementPlan plan_;
  ps::TrainingConfig config_;
  std::unique_ptr<optim::Optimizer> optimizer_;
  std::unique_ptr<InProcessPs> in_process_ps_;  // running alone (in_process_ps.h); declared before the
                                                // client: destroyed (stopped) after it
  std::unique_ptr<ps::PsClient> client_;
  // Before chief_: the chief's save thread hands files to it, so it outlives that thread.
  std::unique_ptr<EvalBeside> beside_;  // chief, --eval_every_steps with evaluate_checkpoint
  std::unique_ptr<Chief> chief_;
  std::unique_ptr<Telemetry> telemetry_;
  std::unique_ptr<ProgressLog> progress_;
  static constexpr int kWorkerCheckSecs = 5;
  std::unique_ptr<WorkerRoster> roster_;
  std::chrono::steady_clock::time_point next_worker_check_{};  // the first step checks
  SessionState state_;  // open, stepped, finished, closed, evaluating, ended (train/session_state.h)
  int64_t global_step_ = 0, start_step_ = 0, local_step_ = 0, stale_ = 0;
  // --overlap: this step's push as backward goes (null until the first early part), the
  // gradients waiting for the next part, which parameters were handed over this step, and the
  // pull in forward order (push_pull with a caller that waits for values; else null).
  static constexpr int64_t kEarlyPartBytes = 64 << 10;
  std::unique_ptr<ps::PushStream> stream_;
  std::vector<ps::Gradient> ready_;
  int64_t ready_bytes_ = 0;
  std::vector<bool> handed_;
  std::unique_ptr<ForwardPulls> forward_pulls_;
  // Async with overlap and a caller that waits for values: the push Step left in flight (null
  // when none), a spare one whose buffers the next push reuses, and the data order that follows.
  bool defers_ = false;
  std::unique_ptr<PendingPush> pending_, spare_;
  DeferredDataOrder order_;
  std::unique_ptr<PushSender> sender_;  // last: its sends run (and end) before the rest goes
};

}  // namespace psflow::train

#endif  // PSFLOW_SRC_TRAIN_SESSION_IMPL_H_
