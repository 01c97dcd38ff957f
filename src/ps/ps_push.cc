// PsServer: pushes. Async mode applies each push on arrival; sync mode (SyncReplicasOptimizer)
// accumulates the step's gradients and applies their mean once the quorum is complete, holding
// each push's call open (its Responder) until then — no thread blocks per waiting worker.
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "ps/ps_server_impl.h"
#include "ps/wire_config.h"
#include "psflow/core/check.h"

namespace psflow::ps {

rpc::OutgoingMessage PsServer::Impl::PushAnswer(const std::vector<std::shared_ptr<Shard>>& pulls,
                                                int64_t step, bool stale) {
  wire::PushResponse header;
  header.set_step(step);
  header.set_stale(stale);
  rpc::OutgoingMessage message = rpc::OutgoingMessage::Of(header);
  for (const std::shared_ptr<Shard>& shard : pulls) {
    std::shared_ptr<const FloatBuffer> snapshot = shard->Snapshot();
    rpc::OutgoingTensor t;
    t.meta.set_name(shard->name());
    for (int64_t d : shard->shape()) t.meta.add_shape(d);
    t.data = snapshot->data();
    t.num_floats = static_cast<int64_t>(snapshot->size());
    t.owner = std::move(snapshot);  // sent without a copy; an update meanwhile copies first
    message.tensors.push_back(std::move(t));
  }
  return message;
}

void PsServer::Impl::AnswerStep(std::vector<Waiter> waiters, int64_t step) {
  for (Waiter& w : waiters) w.responder.Respond(PushAnswer(w.pulls, step, /*stale=*/false));
}

void PsServer::Impl::AnswerError(std::vector<Waiter> waiters, const absl::Status& status) {
  for (Waiter& w : waiters) w.responder.Respond(status);
}

void PsServer::Impl::HandlePush(const rpc::IncomingMessage& request, rpc::Responder responder) {
  std::shared_ptr<const Model> m = model();
  if (m == nullptr || !initialized()) {
    return responder.Respond(absl::FailedPreconditionError(kNotInitializedMessage));
  }
  wire::PushRequest header;
  if (absl::Status s = request.ParseHeader(&header); !s.ok()) return responder.Respond(s);
  // A retried push (its answer was lost) is answered with the first answer, never applied twice.
  std::optional<rpc::Responder> admitted =
      dedup_.Admit(header.client_id(), header.seq(), std::move(responder), [m, &header](const std::string& first) {
        std::vector<std::shared_ptr<Shard>> pulls;
        for (const std::string& name : header.pull_shards()) {
          if (auto it = m->by_name.find(name); it != m->by_name.end()) pulls.push_back(it->second);
        }
        rpc::OutgoingMessage answer = PushAnswer(pulls, 0, false);
        answer.header = first;
        return answer;
      });
  if (!admitted.has_value()) return;
  responder = *std::move(admitted);
  if (Finished(*m)) return responder.Respond(FinishedError());

  // Validate (and copy off the wire) everything before applying anything: a refused push changes
  // nothing.
  std::vector<ShardGradient> gradients(static_cast<size_t>(request.num_tensors()));
  absl::Status valid = absl::OkStatus();
  absl::flat_hash_map<std::string, int> seen;
  for (int i = 0; i < request.num_tensors() && valid.ok(); ++i) {
    const std::string& name = request.meta(i).name();
    auto it = m->by_name.find(name);
    if (it == m->by_name.end()) {
      valid = absl::InvalidArgumentError(absl::StrCat("gradient for unknown shard '", name, "'"));
    } else if (!seen.emplace(name, i).second) {
      valid = absl::InvalidArgumentError(absl::StrCat("two gradients for shard '", name, "' in one push"));
    } else {
      valid = it->second->DecodeGradient(request, i, &gradients[i]);
    }
  }
  std::vector<std::shared_ptr<Shard>> pulls;
  for (const std::string& name : header.pull_shards()) {
    if (!valid.ok()) break;
    auto it = m->by_name.find(name);
    if (it == m->by_name.end()) {
      valid = absl::InvalidArgumentError(absl::StrCat("asks to pull unknown shard '", name, "'"));
    } else {
      pulls.push_back(it->second);
    }
  }
  if (!valid.ok()) {
    pushes_refused_.fetch_add(1);
    return responder.Respond(absl::InvalidArgumentError(
        absl::StrCat("refused push from worker ", header.worker_index(), ": ", valid.message())));
  }
  if (m->config.sync) {
    PushSync(*m, gradients, header, std::move(pulls), std::move(responder));
  } else {
    PushAsync(*m, gradients, header, std::move(pulls), std::move(responder));
  }
}

void PsServer::Impl::PushAsync(const Model& m, std::vector<ShardGradient>& gradients,
                               const wire::PushRequest& header, std::vector<std::shared_ptr<Shard>> pulls,
                               rpc::Responder responder) {
  int64_t step = step_.load(std::memory_order_acquire);
  if (m.holds_global_step) {
    // Claim this push's step first, so concurrent pushes never carry the step past train_steps.
    do {
      if (m.config.train_steps > 0 && step >= m.config.train_steps) return responder.Respond(FinishedError());
    } while (!step_.compare_exchange_weak(step, step + 1, std::memory_order_acq_rel));
    ++step;
  }
  const float lr = optim::DecayedLearningRate(m.config.optimizer, header.step_tag());
  for (ShardGradient& g : gradients) g.shard->Apply(g, *m.optimizer, lr);
  responder.Respond(PushAnswer(pulls, m.holds_global_step ? step : step_.load(), /*stale=*/false));
}

int PsServer::Impl::QuorumLocked(const Model& m) const {
  const int r = m.config.replicas_to_aggregate;
  const int t = m.config.total_num_replicas;
  std::set<int> gone = dropped_;
  gone.insert(departed_.begin(), departed_.end());
  // Backup workers (T - R of them) absorb missing workers first; then the quorum shrinks.
  const int missing_beyond_backups = std::max(0, static_cast<int>(gone.size()) - (t - r));
  return std::max(1, r - missing_beyond_backups);
}

void PsServer::Impl::PushSync(const Model& m, const std::vector<ShardGradient>& gradients,
                              const wire::PushRequest& header, std::vector<std::shared_ptr<Shard>> pulls,
                              rpc::Responder responder) {
  const int worker = header.worker_index();
  bool stale = false;
  int64_t stale_step = 0;
  {
    absl::MutexLock lock(&sync_mu_);
    dropped_.erase(worker);  // pushing again: back in the quorum
    departed_.erase(worker);
    stale_step = step_.load();
    // Computed on old parameters, or a backup worker arriving after the quorum: dropped.
    stale = header.step_tag() < stale_step || quorum_closed_;
    if (stale) {
      stale_dropped_.fetch_add(1);
    } else {
      // Tags newer than the step join the current step, as TF's ConditionalAccumulator does.
      if (arrived_ == 0) {
        first_arrival_ = absl::Now();
        sync_cv_.SignalAll();  // arm the timeout
      }
      ++arrived_;
      ++in_flight_;
      arrived_workers_.insert(worker);
      step_waiters_.push_back({worker, std::move(responder), std::move(pulls)});
      if (arrived_ >= QuorumLocked(m)) quorum_closed_ = true;
    }
  }
  if (stale) return responder.Respond(PushAnswer(pulls, stale_step, /*stale=*/true));
  // Accumulate outside sync_mu_ (under each shard's lock) so pushes accumulate concurrently.
  for (const ShardGradient& g : gradients) g.shard->Accumulate(g);
  std::vector<Waiter> released;
  int64_t step = 0;
  {
    absl::MutexLock lock(&sync_mu_);
    --in_flight_;
    released = MaybeFinishStepLocked(m);
    step = step_.load();
  }
  AnswerStep(std::move(released), step);
}

std::vector<PsServer::Impl::Waiter> PsServer::Impl::MaybeFinishStepLocked(const Model& m) {
  if (arrived_ == 0 || in_flight_ > 0) return {};
  if (!quorum_closed_ && arrived_ < QuorumLocked(m)) return {};
  const int64_t step = step_.load();
  const float lr = optim::DecayedLearningRate(m.config.optimizer, step);
  for (const std::shared_ptr<Shard>& shard : m.shards) shard->ApplyAccumulated(arrived_, *m.optimizer, lr);
  step_.store(step + 1, std::memory_order_release);
  std::vector<Waiter> released;
  released.swap(step_waiters_);
  arrived_ = 0;
  quorum_closed_ = false;
  timed_out_ = false;
  arrived_workers_.clear();
  return released;
}

void PsServer::Impl::SyncTimerLoop() {
  for (;;) {
    std::vector<Waiter> released;
    int64_t step = 0;
    {
      absl::MutexLock lock(&sync_mu_);
      if (timer_stop_) return;
      std::shared_ptr<const Model> m = model();
      if (m == nullptr || !m->config.sync || arrived_ == 0 || timed_out_) {
        sync_cv_.Wait(&sync_mu_);
        continue;
      }
      const absl::Time deadline = first_arrival_ + absl::Seconds(m->config.sync_timeout_secs);
      const absl::Time now = absl::Now();
      if (now < deadline) {
        sync_cv_.WaitWithDeadline(&sync_mu_, deadline);
        continue;
      }
      // Woken far past the deadline: this task was frozen (SIGSTOP, a VM pause), and the pushes
      // that reached it meanwhile wait unread in its sockets. Timing the step out now would drop
      // workers that pushed in time: the step waits its timeout again (docs/failures.md).
      if (now - deadline > absl::Seconds(1)) {
        Log(absl::StrCat("sync step ", step_.load(), ": this task did not run for ",
                         absl::ToInt64Seconds(now - deadline), " s or more (frozen?); the step waits ",
                         m->config.sync_timeout_secs, " s again for its quorum"));
        first_arrival_ = now;
        continue;
      }
      // The quorum did not form in time: apply what arrived and stop waiting for the missing.
      timed_out_ = true;
      quorum_closed_ = true;
      std::vector<int> missing;
      for (int w : ExpectedWorkers(*m)) {
        if (!arrived_workers_.contains(w) && !departed_.contains(w)) missing.push_back(w);
      }
      dropped_.insert(missing.begin(), missing.end());
      Log(absl::StrCat("sync step ", step_.load(), ": applying ", arrived_, " gradient(s) after waiting ",
                       m->config.sync_timeout_secs, " s for ", m->config.replicas_to_aggregate,
                       "; missing worker(s) ", missing.empty() ? "none" : absl::StrJoin(missing, ", "),
                       " (left out of the quorum until they push again)"));
      released = MaybeFinishStepLocked(*m);
      step = step_.load();
    }
    AnswerStep(std::move(released), step);
  }
}

void PsServer::Impl::ResetSyncState(const absl::Status& status) {
  std::vector<Waiter> waiters;
  {
    absl::MutexLock lock(&sync_mu_);
    waiters.swap(step_waiters_);
    arrived_ = 0;
    quorum_closed_ = false;
    timed_out_ = false;
    arrived_workers_.clear();
    dropped_.clear();
    // in_flight_ pushes finish accumulating into the old model's shards and find nothing to apply.
  }
  AnswerError(std::move(waiters), status);
}

}  // namespace psflow::ps
