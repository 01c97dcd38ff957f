// The worker session's step (WorkerSession::Impl, train/session_impl.h): gradients handed over
// as backward finishes them (--overlap), the push (deferred in async with overlap, waited for
// otherwise) and its answer, the tables' lookups and prefetches, and the recovery after a ps task
// restarted. docs/sync-async.md#overlap says what each mode sends when.
#include "train/session_impl.h"

namespace psflow::train {
namespace {

// The step's push: the last part of a stream whose early parts went as backward finished them,
// or the whole push in one call per ps.
void SendPush(ps::PsClient* client, ps::PushStream* stream, const std::vector<ps::Gradient>& grads, int64_t step,
              const std::vector<std::pair<std::string, Tensor*>>& out, const ps::TableStep& table_call,
              std::function<void(absl::StatusOr<ps::PushResult>)> done) {
  if (stream != nullptr) {
    stream->FinishAsync(grads, out, table_call, std::move(done));
  } else {
    client->PushAndPullAsync(grads, step, out, table_call, std::move(done));
  }
}

}  // namespace

absl::Status WorkerSession::Impl::Step(double loss, double accuracy) {
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
  const ps::TableStep table_call = defer ? tables_.StepCall(pending->tables()) : tables_.StepCall();
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
                   step = global_step_,
                   done = std::move(done)] { SendPush(client, stream.get(), grads, step, *out, table_call, done); });
    std::fill(handed_.begin(), handed_.end(), false);
    tables_.EndStep(true);
    SettleAhead(true);  // the next batch's rows pulled ahead (dropped if the push fails)
    pending_ = std::move(pending);
    return absl::OkStatus();
  }
  SendPush(client_.get(), stream_.get(), grads, global_step_, out, table_call, std::move(done));
  pending->Wait();
  stream_.reset();
  std::fill(handed_.begin(), handed_.end(), false);
  absl::StatusOr<ps::PushResult> pushed = pending->Take();
  spare_ = std::move(pending);
  tables_.EndStep(pushed.ok());
  SettleAhead(pushed.ok());  // the next batch's rows pulled ahead: used unless the push failed
  return AfterPush(std::move(pushed), loss, accuracy);
}

absl::Status WorkerSession::Impl::AfterPush(absl::StatusOr<ps::PushResult> pushed, double loss, double accuracy) {
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

absl::Status WorkerSession::Impl::CollectPending(bool* pushed) {
  std::unique_ptr<PendingPush> p = std::move(pending_);
  absl::StatusOr<ps::PushResult> answer = p->Take();
  p->ReleaseTables();  // the gradients the caller lent are read no more
  *pushed = answer.ok();
  if (!answer.ok()) {
    tables_.DropPrefetched();  // read beside a push that failed: pulled again
    const absl::Status& s = answer.status();
    if (!absl::IsOutOfRange(s) && !ps::IsPsRestarted(s)) {
      answer =
          absl::Status(s.code(), absl::StrCat("the push of local step ", p->local_step(), " (global step ",
                                              p->global_step(), "), answered after its step returned: ", s.message()));
    }
  }
  const double loss = p->loss(), accuracy = p->accuracy();
  spare_ = std::move(p);
  return AfterPush(std::move(answer), loss, accuracy);
}

bool WorkerSession::Impl::PendingEnds() {
  if (pending_ == nullptr) return false;
  const absl::StatusOr<ps::PushResult>& answer = pending_->Peek();
  return !answer.ok() || answer->global_step >= OptionValue(options_.train.train_steps);
}

absl::Status WorkerSession::Impl::RecoverAndPull(const absl::Status& failure) {
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

absl::Status WorkerSession::Impl::GradientReady(int index) {
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

void WorkerSession::Impl::WaitForValues() {
  if (pending_ != nullptr && forward_pulls_ == nullptr) pending_->Wait();
  if (forward_pulls_ == nullptr) return;
  for (int i = 0; i < static_cast<int>(params_.size()); ++i) forward_pulls_->Wait(i);
}

absl::Status WorkerSession::Impl::Lookup(const std::vector<absl::Span<const int64_t>>& ids) {
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

absl::Status WorkerSession::Impl::Prefetch(const std::vector<absl::Span<const int64_t>>& next_ids,
                                           std::vector<UniqueIds>* unique, bool ahead) {
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

std::optional<ps::Gradient> WorkerSession::Impl::GradientOf(const SessionParameter& p) {
  ps::Gradient g{p.name};
  const bool ready = p.dense_grad_ready == nullptr || *p.dense_grad_ready;
  if (p.grad != nullptr && !p.grad->empty() && ready) g.dense = p.grad;
  if (p.sparse_grad != nullptr && p.sparse_grad->has_value()) g.sparse = &**p.sparse_grad;
  if (!g.dense && !g.sparse) return std::nullopt;
  return g;
}

std::vector<ps::Gradient> WorkerSession::Impl::Gradients() {
  std::vector<ps::Gradient> grads = std::move(ready_);
  ready_.clear();
  ready_bytes_ = 0;
  for (size_t i = 0; i < params_.size(); ++i) {
    if (handed_[i]) continue;
    if (std::optional<ps::Gradient> g = GradientOf(params_[i]); g.has_value()) grads.push_back(*g);
  }
  return grads;
}

void WorkerSession::Impl::DropStream() {
  if (stream_ != nullptr) (void)stream_->WaitForParts();
  stream_.reset();
  ready_.clear();
  ready_bytes_ = 0;
  std::fill(handed_.begin(), handed_.end(), false);
}

absl::Status WorkerSession::Impl::Recover(const absl::Status& status) {
  if (!ps::IsPsRestarted(status)) return status;
  if (is_chief()) return chief_->RestorePs(ps::RestartedPsTask(status));
  log(absl::StrCat(status.message(), "; waiting for the chief to restore it"));
  return WaitForChiefInitialization(*client_, options_.train.init_timeout_secs);
}

absl::StatusOr<int64_t> WorkerSession::Impl::PullCurrent() {
  for (;;) {
    auto step = client_->Pull(pull_into_);
    if (step.ok() || !ps::IsPsRestarted(step.status())) return step;
    if (auto s = Recover(step.status()); !s.ok()) return s;
  }
}

}  // namespace psflow::train
