// WorkerSession (psflow/train/session.h): the worker's and chief's machinery, step by step. The
// chief's duties beyond training (initialize / restore / checkpoint) live in train/chief.*, the
// tables' batches and prefetches in train/session_tables.*, the life cycle's states and legal moves
// in train/session_state.*, the step in session_step.cc (the class: session_impl.h); this file
// opens the session, closes it, aborts it, and forwards the public calls.
#include "psflow/train/session.h"

#include "train/session_impl.h"

namespace psflow::train {

absl::Status WorkerSession::Impl::Prepare() {
  if (InProcessPs::Wanted(options_.train)) {  // alone: worker 0 of a loopback cluster of our own
    auto ps = InProcessPs::Make(&options_.train, options_.log);
    if (!ps.ok()) return ps.status();
    in_process_ps_ = *std::move(ps);
  }
  return PrepareTask();
}

absl::Status WorkerSession::Impl::PrepareTask() {
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
  client_options.transfer_slice_bytes = options_.train.transfer_slice_bytes;  // used by forward_pulls_
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

absl::Status WorkerSession::Impl::Open() {
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

int WorkerSession::Impl::ParameterIndex(const std::string& name) const {
  for (size_t i = 0; i < params_.size(); ++i) {
    if (params_[i].name == name) return static_cast<int>(i);
  }
  return -1;
}

absl::Status WorkerSession::Impl::EvaluateNow() {
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

absl::Status WorkerSession::Impl::ReportBesideEvals() {
  for (EvalBeside::Result& r : beside_->TakeResults()) {
    if (!r.eval.ok()) {
      return absl::Status(r.eval.status().code(),
                          absl::StrCat("the evaluation of ", r.path, " beside training: ", r.eval.status().message()));
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

absl::Status WorkerSession::Impl::AddClicks(absl::Span<const float> labels, absl::Span<const float> probabilities) {
  if (!state_.opened() || !progress_) {
    return absl::FailedPreconditionError("AddClicks before the worker session is open: call Open() first");
  }
  return progress_->AddClicks(labels, probabilities);
}

absl::Status WorkerSession::Impl::LogScalars(const std::vector<std::pair<std::string, double>>& scalars) {
  if (!state_.opened() || !telemetry_) {
    return absl::FailedPreconditionError("log_scalar before the worker session is open");
  }
  for (const auto& [name, value] : scalars) {
    if (auto s = CheckMetricName(name); !s.ok()) return s;
  }
  telemetry_->OnScalars(scalars, global_step_);
  return absl::OkStatus();
}

absl::StatusOr<RunSummary> WorkerSession::Impl::Close(const std::function<absl::StatusOr<SessionEval>()>& evaluate) {
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

absl::StatusOr<ps::WorkQueueAnswer> WorkerSession::Impl::CallWorkQueue(const ps::WorkQueueCall& call) {
  if (!state_.opened() || client_ == nullptr) {
    return absl::FailedPreconditionError("the work queue needs an open worker session (after Open())");
  }
  return client_->CallWorkQueue(call);
}

void WorkerSession::Impl::Abort(const absl::Status& reason) {
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

void WorkerSession::Impl::CheckWorkers() {
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

absl::Status WorkerSession::Impl::StartInProcessPs() {
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
absl::Status WorkerSession::LookupPrefetched() { return impl_->Lookup(impl_->tables().PrefetchedIds()); }
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
absl::StatusOr<int> WorkerSession::GroupTables(int first, int count) { return impl_->tables().Group(first, count); }
TableGroupBatch& WorkerSession::table_group(int g) { return impl_->tables().group(g); }
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
