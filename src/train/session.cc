// WorkerSession (psflow/train/session.h): the worker's and chief's machinery, step by step. The
// chief's duties beyond training (initialize / restore / checkpoint) live in train/chief.*, the
// tables' batches and prefetches in train/session_tables.*, the life cycle's states and legal moves
// in train/session_state.*; this file drives them: open, step with recovery, close, abort.
#include "psflow/train/session.h"

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
  absl::Status Prepare() {
    if (InProcessPs::Wanted(options_.train)) {  // alone: worker 0 of a loopback cluster of our own
      auto ps = InProcessPs::Make(&options_.train, options_.log);
      if (!ps.ok()) return ps.status();
      in_process_ps_ = *std::move(ps);
    }
    return PrepareTask();
  }

  // Prepare's part after the cluster is known (again when the in-process ps task moved to fresh ports).
  absl::Status PrepareTask() {
    auto setup = SetUpTask(options_.train);
    if (!setup.ok()) return setup.status();
    if (setup->task.job != "worker") {
      return absl::InvalidArgumentError(absl::StrCat("a worker session needs a worker task, but this task is ",
                                                     setup->task.job, " ", setup->task.index,
                                                     " (run ps tasks with psflow.Server or psflow train)"));
    }
    cluster_ = setup->cluster;
    index_ = setup->task.index;
    auto plan = PlanFor(variables_, table_specs(), options_.train, cluster_.num_ps());
    if (!plan.ok()) return plan.status();
    plan_ = *std::move(plan);
    auto config = TrainingConfigFor(options_.train, cluster_.num_workers());
    if (!config.ok()) return config.status();
    config_ = *config;
    if (options_.optimizer.has_value()) config_.optimizer = *options_.optimizer;
    // Async, with overlap, and a caller that waits for the values before reading them: Step may
    // return once its push is sent (docs/sync-async.md#overlap). Never in sync or hybrid mode.
    defers_ = !config_.sync && options_.train.overlap != "none" && options_.waits_for_values;
    auto optimizer = optim::MakeOptimizer(config_.optimizer);
    if (!optimizer.ok()) return optimizer.status();
    optimizer_ = *std::move(optimizer);

    ps::PsClient::Options client_options;
    client_options.cluster = cluster_;
    client_options.plan = plan_;
    client_options.worker_index = index_;
    client_options.security = setup->security;
    client_options.rpc_timeout_secs = options_.train.rpc_timeout_secs;
    client_options.wire_dtype = options_.train.wire_dtype;
    client_options.connect_timeout_secs = options_.train.ps_timeout_secs;
    client_options.ps_unavailable_timeout_secs = options_.train.ps_timeout_secs;
    client_options.log = options_.log;
    auto client = ps::PsClient::Create(client_options);
    if (!client.ok()) return client.status();
    client_ = *std::move(client);
    const std::string& overlap = options_.train.overlap;
    if ((overlap == "push_pull" || overlap == "auto") && options_.waits_for_values) {
      forward_pulls_ = std::make_unique<ForwardPulls>(client_.get(), pull_into_);
      // Deferred, the pull in forward order follows the push's answer; when it is all in flight at
      // once anyway (at most kWindow groups), the values come with that answer instead, a round
      // trip sooner (WaitForValues waits for it).
      if (defers_ && forward_pulls_->num_groups() <= ForwardPulls::kWindow) forward_pulls_.reset();
    }
    return absl::OkStatus();
  }

  absl::Status Open() {
    if (state_.opened()) return absl::FailedPreconditionError("the worker session is already open");
    const TrainOptions& o = options_.train;
    if (in_process_ps_ != nullptr) {
      if (auto s = StartInProcessPs(); !s.ok()) return s;
    }
    state_.MoveTo(SessionState::kOpen);  // from here on, a failure aborts the job (chief)
    if (auto s = client_->Connect(); !s.ok()) return s;
    if (is_chief()) {
      // The chief's values at Open are the job's initial values.
      Chief::InitialValues initial;
      for (const SessionParameter& p : params_) initial.at_start.push_back(p.value);
      initial.rebuild = options_.rebuild_initial_values;
      chief_ = std::make_unique<Chief>(o, options_.model_name, *client_, variables_, std::move(initial), config_,
                                       *optimizer_, options_.log, table_specs());
      if (o.eval_every_steps > 0 && options_.evaluate_checkpoint && !o.checkpoint_dir.empty()) {
        beside_ = std::make_unique<EvalBeside>(options_.evaluate_checkpoint);
      }
    }
    if (is_chief() || o.log_device_placement) log("variable placement:\n" + plan_.Format());
    if (is_chief()) {
      if (auto s = chief_->InitializeCluster(); !s.ok()) return s;
    } else {
      log("waiting for the chief (worker 0) to initialize the variables");
      if (auto s = WaitForChiefInitialization(*client_, o.init_timeout_secs); !s.ok()) return s;
    }
    auto telemetry = Telemetry::Create(o, /*write_events=*/is_chief(), "", options_.log);
    if (!telemetry.ok()) return telemetry.status();
    telemetry_ = *std::move(telemetry);
    roster_ = std::make_unique<WorkerRoster>(cluster_.num_workers(), index_);
    // Hybrid (sync dense, async tables) names itself on each progress line; sync and async are told
    // apart by the flags alone.
    const std::string mode = ModeName();
    telemetry_->SetTrainingMode(mode);
    progress_ = std::make_unique<ProgressLog>(options_.log, mode == "hybrid" ? "hybrid: " : "",
                                              OptionValue(o.train_steps), OptionValue(o.batch_size));

    auto first = PullCurrent();
    if (absl::IsOutOfRange(first.status())) {
      state_.MoveTo(SessionState::kFinished);
    } else if (!first.ok()) {
      return first.status();
    } else {
      global_step_ = *first;
    }
    start_step_ = global_step_;
    order_.Reset(global_step_);
    return absl::OkStatus();
  }

  bool ShouldStop() const {
    return state_.finished() || state_.closed() || global_step() >= OptionValue(options_.train.train_steps);
  }

  absl::Status Step(double loss, double accuracy) {
    if (!state_.opened())
      return absl::FailedPreconditionError("step before the worker session is open: call Open() first");
    if (state_.closed()) return absl::FailedPreconditionError("step after the worker session was closed");
    if (ShouldStop()) {
      return absl::FailedPreconditionError(absl::StrCat("step after training finished at global step ", global_step(),
                                                        ": stop when should_stop() is true"));
    }
    // The push the last Step left in flight is answered first (one push in flight per worker). When
    // it failed (a ps task restarted, training finished) or training ended with it, this step's
    // gradients — computed on values that may not hold it — are not pushed.
    if (pending_ != nullptr) {
      bool pushed = false;
      absl::Status late = CollectPending(&pushed);
      if (!late.ok() || !pushed || ShouldStop()) {
        DropStream();
        ++local_step_;
        return late;
      }
    }
    // The last step's pull in forward order (--overlap=push_pull) must have ended; a failed one
    // (a ps task restarted, training finished) is handled as a failed push would be, and this
    // step's gradients, computed on values that did not all arrive, are not pushed.
    if (absl::Status pulled = SettlePulls(); !pulled.ok()) {
      DropStream();
      ++local_step_;
      return RecoverAndPull(pulled);
    }
    // A diverged step is not pushed (the ps would refuse its NaN gradients anyway).
    if (!std::isfinite(loss)) {
      DropStream();
      return DivergedError(global_step_, loss, config_.optimizer.learning_rate);
    }
    ++local_step_;
    // One call per ps (or its last part, when gradients went ahead as backward finished them):
    // the gradients (dense and the tables' rows) go in, the variables as they stand after the
    // update and the next batch's rows (prefetch) come back — or, with the pull in forward order,
    // the values come behind it (async: starting with the last part; sync: once the step is
    // applied).
    const bool forward_order = forward_pulls_ != nullptr;
    static const std::vector<std::pair<std::string, Tensor*>> kNoDense;
    const auto& out = forward_order ? kNoDense : pull_into_;
    std::vector<ps::Gradient> grads = Gradients();
    tables_.WaitAhead();  // the rows pulled ahead come before this push (deterministic staleness)
    // Deferred (docs/sync-async.md#overlap): Step returns once the push is sent, unless a prefetch
    // rides on it (its rows come with the answer) or the global step it claims ends training.
    const bool defer = defers_ && !tables_.RidesOnPush() && global_step_ + 1 < OptionValue(options_.train.train_steps);
    std::unique_ptr<PendingPush> pending = std::move(spare_);
    if (pending == nullptr) pending = std::make_unique<PendingPush>();
    pending->Begin(local_step_, global_step_ + 1, loss, accuracy);
    if (defer) grads = pending->Keep(grads);
    const ps::TableStep table_call =
        defer ? tables_.StepCall(pending->table_ids(), pending->table_grads()) : tables_.StepCall();
    // Async: the pull in forward order starts once the push is answered, so that the values hold
    // this worker's own push (one worker: the same bits every run, and as without overlap).
    std::function<void(const absl::Status&)> then;
    if (forward_order && !config_.sync) {
      forward_pulls_->Arm();
      then = [pulls = forward_pulls_.get()](const absl::Status& pushed) { pulls->Fire(pushed); };
    }
    std::function<void(absl::StatusOr<ps::PushResult>)> done = pending->Done(std::move(then));
    order_.Sent();
    if (defer) {
      // Sent on the sender's thread (the routing and encoding of the tables' rows): it reads only
      // the pending push's own copies and the session's value buffers, which nothing touches until
      // the answer.
      if (sender_ == nullptr) sender_ = std::make_unique<PushSender>();
      // The early parts read the caller's gradient memory, which it reuses once Step returns.
      if (stream_ != nullptr) (void)stream_->WaitForParts();  // (a failure: FinishAsync's, below)
      std::shared_ptr<ps::PushStream> stream(stream_.release());
      sender_->Post([client = client_.get(), stream, grads = std::move(grads), table_call, out = &out,
                     step = global_step_, done = std::move(done)] {
        if (stream != nullptr) {
          stream->FinishAsync(grads, *out, table_call, done);
        } else {
          client->PushAndPullAsync(grads, step, *out, table_call, done);
        }
      });
      std::fill(handed_.begin(), handed_.end(), false);
      tables_.EndStep(true);
      SettleAhead(true);  // the next batch's rows pulled ahead (dropped if the push fails)
      pending_ = std::move(pending);
      return absl::OkStatus();
    }
    if (stream_ != nullptr) {
      stream_->FinishAsync(grads, out, table_call, std::move(done));
    } else {
      client_->PushAndPullAsync(grads, global_step_, out, table_call, std::move(done));
    }
    pending->Wait();
    stream_.reset();
    std::fill(handed_.begin(), handed_.end(), false);
    absl::StatusOr<ps::PushResult> pushed = pending->Take();
    spare_ = std::move(pending);
    tables_.EndStep(pushed.ok());
    SettleAhead(pushed.ok());  // the next batch's rows pulled ahead: used unless the push failed
    return AfterPush(std::move(pushed), loss, accuracy);
  }

  // A push's answer: the step it claimed, the progress line, telemetry, the chief's checkpoint and
  // evaluation; after a failure, the recovery (RecoverAndPull).
  absl::Status AfterPush(absl::StatusOr<ps::PushResult> pushed, double loss, double accuracy) {
    if (!pushed.ok()) {
      (void)SettlePulls();  // the values are pulled again after a recovery
      return RecoverAndPull(pushed.status());
    }
    stale_ += pushed->stale;
    const int64_t step_before = global_step_;
    global_step_ = pushed->global_step;
    order_.Claimed(global_step_);
    state_.MoveTo(SessionState::kStepped);
    if (forward_pulls_ != nullptr && config_.sync) forward_pulls_->Start();
    progress_->Step(global_step_, loss, accuracy, options_.train.log_every);
    telemetry_->OnStep(global_step_, loss, accuracy, learning_rate(), examples_per_global_step());
    if (is_chief()) {
      const int64_t every = options_.train.eval_every_steps;
      const bool eval_due = every > 0 && global_step_ / every != step_before / every;
      // Beside training: this step's checkpoint, evaluated on the evaluation thread once written.
      absl::Status saved =
          eval_due && beside_ != nullptr
              ? chief_->CheckpointNow(global_step_,
                                      [this](int64_t step, const std::string& path) { beside_->Submit(step, path); })
              : chief_->MaybeCheckpoint(global_step_);
      if (!saved.ok()) log(absl::StrCat("checkpoint failed: ", saved.message()));
      if (beside_ != nullptr) {
        if (auto s = ReportBesideEvals(); !s.ok()) return s;
      } else if (eval_due && options_.evaluate) {
        if (auto s = EvaluateNow(); !s.ok()) return s;
      }
    }
    CheckWorkers();
    return absl::OkStatus();
  }

  // The push the last Step left in flight, waited for and taken: AfterPush of its answer. A
  // failure other than a ps restart or the end of training is returned in one line naming the
  // step it belonged to. `pushed`: whether it succeeded.
  absl::Status CollectPending(bool* pushed) {
    std::unique_ptr<PendingPush> p = std::move(pending_);
    absl::StatusOr<ps::PushResult> answer = p->Take();
    *pushed = answer.ok();
    if (!answer.ok()) {
      tables_.DropPrefetched();  // read beside a push that failed: pulled again
      const absl::Status& s = answer.status();
      if (!absl::IsOutOfRange(s) && !ps::IsPsRestarted(s)) {
        answer = absl::Status(
            s.code(), absl::StrCat("the push of local step ", p->local_step(), " (global step ", p->global_step(),
                                   "), answered after its step returned: ", s.message()));
      }
    }
    const double loss = p->loss(), accuracy = p->accuracy();
    spare_ = std::move(p);
    return AfterPush(std::move(answer), loss, accuracy);
  }

  // Waits for the push left in flight to be answered (at once when none is); whether it failed or
  // ended training (the step after it then pushes nothing).
  bool PendingEnds() {
    if (pending_ == nullptr) return false;
    const absl::StatusOr<ps::PushResult>& answer = pending_->Peek();
    return !answer.ok() || answer->global_step >= OptionValue(options_.train.train_steps);
  }

  // After a failed push or pull: training finished elsewhere (OutOfRange), or a ps task restarted
  // (the chief restores it, the others wait), then the current values are pulled.
  absl::Status RecoverAndPull(const absl::Status& failure) {
    if (absl::IsOutOfRange(failure)) {  // training finished elsewhere
      state_.MoveTo(SessionState::kFinished);
      return absl::OkStatus();
    }
    if (auto s = Recover(failure); !s.ok()) return s;
    auto step = PullCurrent();  // continue from the restored state
    if (absl::IsOutOfRange(step.status())) {
      state_.MoveTo(SessionState::kFinished);
      return absl::OkStatus();
    }
    if (!step.ok()) return step.status();
    global_step_ = *step;
    order_.Reset(global_step_);
    state_.MoveTo(SessionState::kOpen);  // a pulled step, not one this worker's push claimed
    return absl::OkStatus();
  }

  // --overlap: parameter `index`'s gradient is final; it joins the next early part.
  absl::Status GradientReady(int index) {
    if (!state_.is_open() || state_.finished()) {
      return absl::FailedPreconditionError("GradientReady needs an open worker session whose training goes on");
    }
    if (index < 0 || index >= static_cast<int>(params_.size())) {
      return absl::InvalidArgumentError(
          absl::StrCat("GradientReady: no parameter ", index, " (the session has ", params_.size(), ")"));
    }
    if (handed_[index]) {
      return absl::InvalidArgumentError(absl::StrCat(
          "parameter '", params_[index].name,
          "' got a second gradient before the step: with --overlap its first was already pushed; call step() after "
          "each backward, or accumulate several backward passes with --overlap=none"));
    }
    if (options_.train.overlap == "none") return absl::OkStatus();  // pushed with the step
    // After a failed pull the step is not pushed (Step recovers first). Nor after a push left in
    // flight that failed or ended training; and a part goes only once that push is answered, so
    // each ps applies this worker's pushes in order (one worker: the same bits as without overlap).
    if (forward_pulls_ != nullptr && forward_pulls_->failed()) return absl::OkStatus();
    if (PendingEnds()) return absl::OkStatus();
    std::optional<ps::Gradient> g = GradientOf(params_[index]);
    if (!g.has_value()) return absl::OkStatus();
    handed_[index] = true;
    ready_.push_back(*g);
    if (g->dense != nullptr) ready_bytes_ += static_cast<int64_t>(g->dense->bytes());
    if (g->sparse != nullptr) ready_bytes_ += static_cast<int64_t>(g->sparse->values.bytes());
    if (ready_bytes_ >= kEarlyPartBytes) {
      // Tagged with the step of the values the gradient was computed from: a push left in flight
      // brought them (its answer is in: PendingEnds waited), and the ps's staleness (and with it
      // --staleness_aware_lr) counts from there.
      if (stream_ == nullptr)
        stream_ = client_->StartPush(pending_ != nullptr ? pending_->Peek()->global_step : global_step_);
      stream_->Send(ready_);
      ready_.clear();
      ready_bytes_ = 0;
    }
    return absl::OkStatus();
  }

  // The values come in forward order, or with the answer of a push left in flight.
  void WaitForValues(int index) {
    if (forward_pulls_ != nullptr) return forward_pulls_->Wait(index);
    if (pending_ != nullptr) pending_->Wait();
  }
  void WaitForValues() {
    if (pending_ != nullptr && forward_pulls_ == nullptr) pending_->Wait();
    if (forward_pulls_ == nullptr) return;
    for (int i = 0; i < static_cast<int>(params_.size()); ++i) forward_pulls_->Wait(i);
  }
  int ParameterIndex(const std::string& name) const {
    for (size_t i = 0; i < params_.size(); ++i) {
      if (params_[i].name == name) return static_cast<int>(i);
    }
    return -1;
  }

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
  absl::Status EvaluateNow() {
    // The values of the pull behind the step; a failed one is recovered from (and pulled) first.
    if (auto s = SettlePulls(); !s.ok()) {
      if (auto r = RecoverAndPull(s); !r.ok()) return r;
    }
    const auto start = std::chrono::steady_clock::now();
    auto eval = options_.evaluate();
    if (!eval.ok()) return eval.status();
    if (auto s = CheckEval(*eval); !s.ok()) return s;
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    log(absl::StrCat("eval at global step ", global_step_, ": ", ScalarsText(eval->scalars),
                     absl::StrFormat(" (%.1fs, the chief's training paused)", seconds)));
    telemetry_->OnScalars(eval->scalars, global_step_);
    return absl::OkStatus();
  }

  // The evaluations beside training finished since the last call: logged, written to TensorBoard at
  // their checkpoints' steps. A failed one fails the job, as an evaluation between steps does.
  absl::Status ReportBesideEvals() {
    for (EvalBeside::Result& r : beside_->TakeResults()) {
      if (!r.eval.ok()) {
        return absl::Status(r.eval.status().code(), absl::StrCat("the evaluation of ", r.path,
                                                                 " beside training: ", r.eval.status().message()));
      }
      if (auto s = CheckEval(*r.eval); !s.ok()) return s;
      log(absl::StrCat("eval at global step ", r.global_step, ": ", ScalarsText(r.eval->scalars),
                       absl::StrFormat(" (%.1fs beside training, ", r.seconds), r.path,
                       r.replaced > 0 ? absl::StrCat("; ", r.replaced,
                                                     " earlier checkpoint(s) left unevaluated: the "
                                                     "evaluation falls behind --eval_every_steps")
                                      : std::string(),
                       ")"));
      telemetry_->OnScalars(r.eval->scalars, r.global_step);
    }
    return absl::OkStatus();
  }

  absl::Status AddClicks(absl::Span<const float> labels, absl::Span<const float> probabilities) {
    if (!state_.opened() || !progress_) {
      return absl::FailedPreconditionError("AddClicks before the worker session is open: call Open() first");
    }
    return progress_->AddClicks(labels, probabilities);
  }

  absl::Status LogScalars(const std::vector<std::pair<std::string, double>>& scalars) {
    if (!state_.opened() || !telemetry_) {
      return absl::FailedPreconditionError("log_scalar before the worker session is open");
    }
    for (const auto& [name, value] : scalars) {
      if (auto s = CheckMetricName(name); !s.ok()) return s;
    }
    telemetry_->OnScalars(scalars, global_step_);
    return absl::OkStatus();
  }

  absl::StatusOr<RunSummary> Close(const std::function<absl::StatusOr<SessionEval>()>& evaluate) {
    if (!state_.opened())
      return absl::FailedPreconditionError("close before the worker session is open: call Open() first");
    if (state_.closed()) return absl::FailedPreconditionError("the worker session is already closed");
    // The push the last Step left in flight: its failure is this call's.
    if (pending_ != nullptr) {
      bool pushed = false;
      if (absl::Status late = CollectPending(&pushed); !late.ok()) return late;
    }
    // A failed last pull is of no matter here: the chief pulls the final values again.
    (void)SettlePulls();
    SettleAhead(false);
    DropStream();
    state_.MoveTo(SessionState::kClosed);
    const double train_seconds = progress_->ElapsedSeconds();
    RunSummary summary;
    summary.model = options_.model_name;
    summary.mode = ModeName();
    summary.workers = cluster_.num_workers();
    summary.ps = cluster_.num_ps();
    summary.stale_gradients_dropped = stale_;
    summary.global_step = global_step_;
    if (!is_chief()) {
      // The session's count (sess.local_step): every Step() call, recoveries included.
      log(absl::StrCat("worker ", index_, ": done after ", local_step_, " local steps"));
      (void)client_->Goodbye();
      state_.MoveTo(SessionState::kEnded);
      return summary;
    }

    // The chief checkpoints and evaluates the final parameters, then ends the job.
    auto step = client_->Pull(pull_into_);
    if (!step.ok()) return step.status();
    if (auto s = chief_->SaveFinalCheckpoint(*step); !s.ok()) return s;
    if (beside_ != nullptr) {  // the last evaluations beside training (their saves are written)
      beside_->Finish();
      if (auto s = ReportBesideEvals(); !s.ok()) return s;
    }
    // The job succeeded even if the marker cannot be written: say so (an evaluator then waits for
    // --eval_timeout_secs).
    if (auto s = chief_->MarkTrainingDone(); !s.ok()) log(absl::StrCat("chief: ", s.message()));
    summary.global_step = *step;
    summary.train_seconds = train_seconds;
    summary.examples_per_sec = (*step - start_step_) * examples_per_global_step() / std::max(train_seconds, 1e-9);
    if (evaluate) {
      state_.MoveTo(SessionState::kEvaluating);
      auto eval = evaluate();
      if (state_.evaluating()) state_.MoveTo(SessionState::kClosed);  // (an Abort inside ended it)
      if (!eval.ok()) return eval.status();
      if (auto s = CheckEval(*eval); !s.ok()) return s;
      telemetry_->OnScalars(eval->scalars, *step);
      AddEvalToSummary(*eval, &summary);
    }
    telemetry_->OnFinal(summary.global_step, summary.validation_accuracy, summary.test_accuracy);
    if (auto stats = client_->Stats(); stats.ok()) {
      CountWorkersThatPushed(*stats, cluster_.num_workers(), options_.log, &summary);
      AddPsStatsToSummary(*stats, plan_.global_step_ps, &summary);
    }
    if (auto s = client_->Shutdown(); !s.ok()) return s;
    state_.MoveTo(SessionState::kEnded);  // the job is over: nothing left to abort
    log(absl::StrCat("worker ", index_, ": done after ", local_step_, " local steps"));
    if (options_.report_summary) {
      if (auto s = ReportSummary(summary, options_.train.metrics_json, options_.log); !s.ok()) return s;
    }
    return summary;
  }

  absl::StatusOr<ps::WorkQueueAnswer> CallWorkQueue(const ps::WorkQueueCall& call) {
    if (!state_.opened() || client_ == nullptr) {
      return absl::FailedPreconditionError("the work queue needs an open worker session (after Open())");
    }
    return client_->CallWorkQueue(call);
  }

  void Abort(const absl::Status& reason) {
    if (!state_.opened() || state_.ended()) return;
    if (pending_ != nullptr) pending_->Wait();  // its answer says no more: the job ends
    pending_.reset();
    (void)SettlePulls();
    SettleAhead(false);
    DropStream();
    state_.MoveTo(SessionState::kEnded);
    // The chief giving up ends the job: the ps tasks exit non-zero with its reason rather than
    // waiting for a chief that will not come back. (Aborted means a ps told us the job is over.)
    // The end marker is written first: a ps task that exits on the abort may get the chief killed
    // (psflow local stops every task when one fails) before a later write.
    if (is_chief() && chief_ != nullptr) chief_->MarkTrainingFailed(std::string(reason.message()));
    if (is_chief() && !absl::IsAborted(reason)) client_->Abort(std::string(reason.message()));
    // Told the job was aborted: leave, so the ps tasks need not wait for us. Giving up (a ps task
    // silent past --ps_timeout_secs, a script that raised, ...): say why, so no ps task waits
    // --worker_timeout_secs for us.
    if (!is_chief()) {
      (void)client_->Goodbye(absl::IsAborted(reason) ? "" : std::string(reason.message()));
    }
  }

  absl::Status Lookup(const std::vector<absl::Span<const int64_t>>& ids) {
    if (!state_.is_open() && !state_.evaluating()) {
      return absl::FailedPreconditionError("Lookup needs an open worker session (after Open(), before Close())");
    }
    if (auto s = tables_.CheckCount("Lookup", ids.size()); !s.ok()) return s;
    // A session that defers its pushes, every table's rows prefetched: no call, so neither the pull
    // in forward order nor the push left in flight is waited for (the next Step meets their failure).
    SettleAhead(true);
    if (defers_ && state_.is_open() && tables_.ServedByPrefetch(ids)) {
      ps::TableStep none;
      tables_.StartLookup(ids, &none);
      return absl::OkStatus();
    }
    // Rows pulled now must see this worker's last push.
    if (pending_ != nullptr) {
      bool pushed = false;
      if (absl::Status late = CollectPending(&pushed); !late.ok()) return late;
    }
    bool with_dense = false;  // after a ps restart the dense values are pulled again too
    if (absl::Status pulled = SettlePulls(); !pulled.ok()) {
      if (absl::IsOutOfRange(pulled) && state_.is_open()) state_.MoveTo(SessionState::kFinished);
      if (!ps::IsPsRestarted(pulled) || state_.evaluating()) return pulled;
      if (auto s = Recover(pulled); !s.ok()) return s;
      with_dense = true;
    }
    ps::TableStep step;
    tables_.StartLookup(ids, &step);
    if (step.pulls.empty() && !with_dense) return absl::OkStatus();
    // The rows only (the dense values came with the last step); after a ps restart, both.
    static const std::vector<std::pair<std::string, Tensor*>> kNoDense;
    for (;;) {
      auto pulled = client_->Pull(with_dense ? pull_into_ : kNoDense, step);
      if (pulled.ok()) {
        if (with_dense) {  // after a ps restart: a pulled step
          global_step_ = *pulled;
          order_.Reset(global_step_);
        }
        return absl::OkStatus();
      }
      if (absl::IsOutOfRange(pulled.status()) && state_.is_open()) state_.MoveTo(SessionState::kFinished);
      if (!ps::IsPsRestarted(pulled.status()) || state_.evaluating()) return pulled.status();
      if (auto s = Recover(pulled.status()); !s.ok()) return s;
      with_dense = true;
    }
  }

  // Both forms of Prefetch: `unique` (may be null) is the caller's deduplication of next_ids.
  absl::Status Prefetch(const std::vector<absl::Span<const int64_t>>& next_ids, std::vector<UniqueIds>* unique,
                        bool ahead) {
    if (!state_.is_open()) {
      return absl::FailedPreconditionError("Prefetch needs an open worker session (after Open(), before Close())");
    }
    if (auto s = tables_.CheckCount("Prefetch", next_ids.size()); !s.ok()) return s;
    SettleAhead(false);  // a second Prefetch before the step: the first one's rows are dropped
    if (unique != nullptr) {
      if (auto s = tables_.Prefetch(next_ids, unique); !s.ok()) return s;
    } else {
      tables_.Prefetch(next_ids);
    }
    // Pulled once the push left in flight is answered: the rows miss exactly this step's update.
    if (ahead && PullsAhead() && !PendingEnds()) tables_.StartAhead(*client_);
    return absl::OkStatus();
  }

  TableBatch& table_batch(int t) { return tables_.batch(t); }
  int num_tables() const { return tables_.size(); }
  std::vector<dist::TableSpec> table_specs() const { return tables_.specs(); }

  // Which workers are connected: the chief's lines (train/worker_roster.h) and every worker's
  // /metrics gauge. A Stats call per ps from the training step, so only where someone reads it:
  // the chief every kWorkerCheckSecs, and each task serving /metrics every second (its gauge
  // follows workers joining a short job).
  void CheckWorkers() {
    const bool serves_metrics = options_.train.metrics_port != 0;
    if (!is_chief() && !serves_metrics) return;
    const auto now = std::chrono::steady_clock::now();
    if (now < next_worker_check_) return;
    next_worker_check_ = now + std::chrono::seconds(serves_metrics ? 1 : kWorkerCheckSecs);
    auto stats = client_->Stats();
    if (!stats.ok()) return;  // a silent ps task: the next push reports it
    const std::string line = roster_->Update(*stats, progress_->ElapsedSeconds());
    telemetry_->registry().SetGauge(metrics::kConnectedWorkers, {}, double(roster_->connected()));
    if (!line.empty() && is_chief()) log(line);
  }

  bool opened() const { return state_.opened(); }
  bool ended() const { return state_.ended(); }
  // Running alone: waits for the in-process ps task's end once the job ended (its error, if any),
  // or stops it after an abort.
  // The in-process ps task's port was free when Make picked it, at Create; another process may have
  // taken it since. Then the task starts again on fresh ports, with the worker's cluster and client
  // made anew for them (the cluster spec, hence its fingerprint in Hello, names the ports).
  absl::Status StartInProcessPs() {
    constexpr int kTries = 3;
    for (int tries = 1;; ++tries) {
      log(
          absl::StrCat("standalone: no cluster flags and no TF_CONFIG: training in this process, with an "
                       "in-process ps task on 127.0.0.1:",
                       in_process_ps_->port()));
      absl::Status started = in_process_ps_->Start();
      if (started.ok() || tries == kTries || !InProcessPs::PortTaken(started)) return started;
      log(absl::StrCat("standalone: ", started.message(), "; trying fresh ports"));
      auto ps = InProcessPs::Make(&options_.train, options_.log);
      if (!ps.ok()) return ps.status();
      in_process_ps_ = *std::move(ps);
      forward_pulls_.reset();  // holds the client PrepareTask replaces
      if (auto s = PrepareTask(); !s.ok()) return s;
    }
  }

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

  static std::optional<ps::Gradient> GradientOf(const SessionParameter& p) {
    ps::Gradient g{p.name};
    const bool ready = p.dense_grad_ready == nullptr || *p.dense_grad_ready;
    if (p.grad != nullptr && !p.grad->empty() && ready) g.dense = p.grad;
    if (p.sparse_grad != nullptr && p.sparse_grad->has_value()) g.sparse = &**p.sparse_grad;
    if (!g.dense && !g.sparse) return std::nullopt;
    return g;
  }

  // The step's gradients not pushed ahead (GradientReady): those still waiting for a part, then
  // the others.
  std::vector<ps::Gradient> Gradients() {
    std::vector<ps::Gradient> grads = std::move(ready_);
    ready_.clear();
    ready_bytes_ = 0;
    for (size_t i = 0; i < params_.size(); ++i) {
      if (handed_[i]) continue;
      if (std::optional<ps::Gradient> g = GradientOf(params_[i]); g.has_value()) grads.push_back(*g);
    }
    return grads;
  }

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
  void DropStream() {
    if (stream_ != nullptr) (void)stream_->WaitForParts();
    stream_.reset();
    ready_.clear();
    ready_bytes_ = 0;
    std::fill(handed_.begin(), handed_.end(), false);
  }

  // A ps task that restarted empty: the chief restores it, the others wait until it has.
  absl::Status Recover(const absl::Status& status) {
    if (!ps::IsPsRestarted(status)) return status;
    if (is_chief()) return chief_->RestorePs(ps::RestartedPsTask(status));
    log(absl::StrCat(status.message(), "; waiting for the chief to restore it"));
    return WaitForChiefInitialization(*client_, options_.train.init_timeout_secs);
  }

  // The variables as they stand (after a restore too): a ps task still being restored means
  // waiting for the chief again. OutOfRange: training finished elsewhere.
  absl::StatusOr<int64_t> PullCurrent() {
    for (;;) {
      auto step = client_->Pull(pull_into_);
      if (step.ok() || !ps::IsPsRestarted(step.status())) return step;
      if (auto s = Recover(step.status()); !s.ok()) return s;
    }
  }

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

// ---------------------------------------------------------------------------------------------

absl::StatusOr<std::unique_ptr<WorkerSession>> WorkerSession::Create(Options options,
                                                                     std::vector<SessionParameter> params,
                                                                     std::vector<dist::TableSpec> tables) {
  if (auto s = ResolveTrainOptions(&options.train); !s.ok()) return s;
  if (params.empty()) return absl::InvalidArgumentError("a worker session needs at least one parameter");
  absl::flat_hash_set<std::string> names;
  for (const SessionParameter& p : params) {
    if (p.name.empty()) return absl::InvalidArgumentError("a parameter has an empty name; give every parameter a name");
    if (!names.insert(p.name).second) {
      return absl::InvalidArgumentError(absl::StrCat("parameter '", p.name, "' is given twice; names must be unique"));
    }
    if (p.value == nullptr) return absl::InvalidArgumentError(absl::StrCat("parameter '", p.name, "' has no value"));
    if (p.grad != nullptr && !p.grad->empty() && p.grad->shape() != p.value->shape()) {
      return absl::InvalidArgumentError(absl::StrCat("the gradient of parameter '", p.name, "' has shape ",
                                                     ShapeToString(p.grad->shape()), " but the parameter is ",
                                                     ShapeToString(p.value->shape())));
    }
  }
  absl::flat_hash_set<std::string> table_names;
  for (const dist::TableSpec& t : tables) {
    if (t.name.empty()) return absl::InvalidArgumentError("a table has an empty name; give every table a name");
    if (!table_names.insert(t.name).second || names.contains(t.name)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "table '", t.name, "' is given twice (or is also a parameter's name); ", "names must be unique"));
    }
  }
  auto impl = std::make_unique<Impl>(std::move(options), std::move(params), std::move(tables));
  if (auto s = impl->Prepare(); !s.ok()) return s;
  return std::unique_ptr<WorkerSession>(new WorkerSession(std::move(impl)));
}

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
absl::StatusOr<std::unique_ptr<WorkerSession>> WorkerSession::Create(Options options,
                                                                     std::vector<SessionParameter> params,
                                                                     std::vector<SessionTable> tables) {
  std::vector<dist::TableSpec> specs;
  for (SessionTable& t : tables) {
    specs.push_back(std::move(t.spec));
    specs.back().name = std::move(t.name);
  }
  return Create(std::move(options), std::move(params), std::move(specs));
}
#pragma GCC diagnostic pop

WorkerSession::WorkerSession(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

WorkerSession::~WorkerSession() {
  if (impl_->opened() && !impl_->ended()) {
    impl_->Abort(absl::CancelledError(
        absl::StrCat("worker ", impl_->index(), " ended its session without closing it (the job is aborted)")));
  }
}

absl::Status WorkerSession::Open() { return impl_->Open(); }
absl::Status WorkerSession::GradientReady(int index) { return impl_->GradientReady(index); }
void WorkerSession::WaitForValues(int index) { impl_->WaitForValues(index); }
void WorkerSession::WaitForValues() { impl_->WaitForValues(); }
int WorkerSession::ParameterIndex(const std::string& name) const { return impl_->ParameterIndex(name); }
bool WorkerSession::ShouldStop() const { return impl_->ShouldStop(); }
absl::StatusOr<ps::WorkQueueAnswer> WorkerSession::CallWorkQueue(const ps::WorkQueueCall& call) {
  return impl_->CallWorkQueue(call);
}
absl::Status WorkerSession::Step(double loss, double accuracy) { return impl_->Step(loss, accuracy); }
absl::StatusOr<RunSummary> WorkerSession::Close(const std::function<absl::StatusOr<SessionEval>()>& evaluate) {
  absl::StatusOr<RunSummary> summary = impl_->Close(evaluate);
  if (summary.ok() && impl_->ended()) {  // alone: the job is over, so is our ps task
    if (absl::Status s = impl_->JoinInProcessPs(); !s.ok()) return s;
  }
  return summary;
}
void WorkerSession::Abort(const absl::Status& reason) {
  impl_->Abort(reason);
  impl_->StopInProcessPs();
}
absl::Status WorkerSession::LogScalars(const std::vector<std::pair<std::string, double>>& scalars) {
  return impl_->LogScalars(scalars);
}
absl::Status WorkerSession::AddClicks(absl::Span<const float> labels, absl::Span<const float> probabilities) {
  return impl_->AddClicks(labels, probabilities);
}
absl::Status WorkerSession::Lookup(const std::vector<absl::Span<const int64_t>>& ids) { return impl_->Lookup(ids); }
absl::Status WorkerSession::Prefetch(const std::vector<absl::Span<const int64_t>>& next_ids) {
  return impl_->Prefetch(next_ids, nullptr, false);
}
absl::Status WorkerSession::Prefetch(const std::vector<absl::Span<const int64_t>>& next_ids,
                                     std::vector<UniqueIds>* unique) {
  return impl_->Prefetch(next_ids, unique, false);
}
absl::Status WorkerSession::PrefetchAhead(const std::vector<absl::Span<const int64_t>>& next_ids,
                                          std::vector<UniqueIds>* unique) {
  return impl_->Prefetch(next_ids, unique, true);
}
TableBatch& WorkerSession::table_batch(int t) { return impl_->table_batch(t); }
int WorkerSession::num_tables() const { return impl_->num_tables(); }
bool WorkerSession::is_open() const { return impl_->is_open(); }
bool WorkerSession::is_chief() const { return impl_->is_chief(); }
int WorkerSession::worker_index() const { return impl_->index(); }
int WorkerSession::num_workers() const { return impl_->cluster().num_workers(); }
int WorkerSession::num_ps() const { return impl_->cluster().num_ps(); }
bool WorkerSession::sync() const { return impl_->config().sync; }
int64_t WorkerSession::global_step() const { return impl_->global_step(); }
float WorkerSession::learning_rate() const { return impl_->learning_rate(); }
int64_t WorkerSession::local_step() const { return impl_->local_step(); }
int64_t WorkerSession::data_step() const {
  if (sync()) return impl_->global_step();
  // Async, batches of the one-worker stream: each push claims a distinct global step s, and its
  // worker's next batch is s + N - 1; batches 0..N-1 (N - 1 + the first claimed step 1 is batch N)
  // are the workers' first ones. So every batch is taken once, in the order the job advances,
  // whatever the workers' speeds; a session that opens (or re-pulls after a ps restart) at
  // global step S takes S + worker_index first: a resumed job continues at its checkpoint's step.
  // A session whose Step returns before its push is answered: train/session_pending.h.
  if (impl_->defers()) return impl_->DeferredDataStep();
  const int64_t n = num_workers();
  return impl_->global_step() + (impl_->claimed() ? n - 1 : worker_index());
}
int WorkerSession::data_worker_index() const { return sync() ? worker_index() : 0; }
int WorkerSession::data_num_workers() const { return sync() ? num_workers() : 1; }
int64_t WorkerSession::examples_per_global_step() const { return impl_->examples_per_global_step(); }
const TrainOptions& WorkerSession::options() const { return impl_->options().train; }
std::string WorkerSession::PlacementListing() const { return impl_->plan().Format(); }

}  // namespace psflow::train
