// The sync step's quorum, drops, timeout and re-initialization (ps/server/sync_accumulator.h).
#include "ps/server/sync_accumulator.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace psflow::ps {

SyncAccumulator::SyncAccumulator(std::atomic<int64_t>* step, std::function<void(const std::string&)> log,
                                 std::unique_ptr<Clock> clock)
    : step_(step), log_(std::move(log)), clock_(std::move(clock)) {
  if (clock_ == nullptr) clock_ = std::make_unique<SystemClock>();
}

SyncAccumulator::~SyncAccumulator() {
  absl::MutexLock lock(&mu_);
  if (timer_ != 0) clock_->Cancel(timer_);
}

uint64_t SyncAccumulator::Reconfigure(Config config, const absl::Status& status) {
  std::vector<Waiter> waiters;
  uint64_t epoch;
  {
    absl::MutexLock lock(&mu_);
    waiters = ForgetStepLocked();
    dropped_.clear();
    heard_.clear();
    config_ = std::move(config);
    epoch = ++epoch_;
    epoch_status_ = status;
  }
  Answer(std::move(waiters), status);
  return epoch;
}

void SyncAccumulator::Release(const absl::Status& status) {
  std::vector<Waiter> waiters;
  {
    absl::MutexLock lock(&mu_);
    waiters = ForgetStepLocked();
    dropped_.clear();
  }
  Answer(std::move(waiters), status);
}

std::vector<SyncAccumulator::Waiter> SyncAccumulator::ForgetStepLocked() {
  std::vector<Waiter> waiters;
  waiters.swap(waiters_);
  if (timer_ != 0) clock_->Cancel(timer_);
  timer_ = 0;
  ++step_id_;
  arrived_ = 0;
  quorum_closed_ = false;
  timed_out_ = false;
  waited_for_alive_ = false;
  arrived_workers_.clear();
  // in_flight_ pushes finish accumulating (into the old model's shards, after a re-initialization)
  // and then find nothing to apply.
  return waiters;
}

int SyncAccumulator::Quorum() const {
  absl::MutexLock lock(&mu_);
  return QuorumLocked();
}

int SyncAccumulator::QuorumLocked() const {
  const int r = config_.replicas_to_aggregate;
  const int t = config_.total_num_replicas;
  std::set<int> gone = dropped_;
  gone.insert(departed_.begin(), departed_.end());
  // Backup workers (T - R of them) absorb missing workers first; then the quorum shrinks.
  const int missing_beyond_backups = std::max(0, static_cast<int>(gone.size()) - (t - r));
  return std::max(1, r - missing_beyond_backups);
}

void SyncAccumulator::Push(uint64_t epoch, int worker, int64_t step_tag, absl::FunctionRef<void()> accumulate,
                           Done done) {
  absl::Status refused;
  Outcome dropped;
  {
    absl::MutexLock lock(&mu_);
    if (epoch != epoch_) {
      refused = epoch_status_.ok() ? absl::FailedPreconditionError("the model changed") : epoch_status_;
    } else {
      dropped_.erase(worker);  // pushing again: back in the quorum
      departed_.erase(worker);
      dropped.step = step_->load(std::memory_order_acquire);
      // Computed on old parameters, or a backup worker arriving after the quorum: dropped.
      dropped.stale = step_tag < dropped.step || quorum_closed_;
      if (dropped.stale) {
        stale_dropped_.fetch_add(1, std::memory_order_relaxed);
      } else {
        // Tags newer than the step join the current step, as TF's ConditionalAccumulator does.
        const absl::Time now = clock_->Now();
        if (arrived_ == 0) {
          ArmTimeoutLocked(now + config_.timeout);
          first_arrival_ = now;
        }
        ++arrived_;
        ++in_flight_;
        arrived_workers_.insert(worker);
        waiters_.push_back({worker, std::move(done), now});
        if (arrived_ >= QuorumLocked()) quorum_closed_ = true;
      }
    }
  }
  if (!refused.ok()) return done(refused);
  if (dropped.stale) return done(dropped);
  // Accumulate outside mu_ (under each shard's lock) so pushes accumulate concurrently.
  accumulate();
  std::vector<Waiter> released;
  Outcome applied;
  {
    absl::MutexLock lock(&mu_);
    --in_flight_;
    released = MaybeFinishStepLocked();
    applied.step = step_->load(std::memory_order_acquire);
  }
  AnswerStep(std::move(released), applied);
}

std::vector<SyncAccumulator::Waiter> SyncAccumulator::MaybeFinishStepLocked() {
  if (arrived_ == 0 || in_flight_ > 0) return {};
  if (!quorum_closed_ && arrived_ < QuorumLocked()) return {};
  const int64_t step = step_->load(std::memory_order_acquire);
  const absl::Time quorum = clock_->Now();
  if (config_.apply) config_.apply(arrived_, step);
  step_->store(step + 1, std::memory_order_release);
  ++timing_.steps;
  timing_.apply_secs += absl::ToDoubleSeconds(clock_->Now() - quorum);
  timing_.spread_secs += absl::ToDoubleSeconds(quorum - first_arrival_);
  for (const Waiter& w : waiters_) {
    ++timing_.pushes;
    timing_.wait_secs += absl::ToDoubleSeconds(quorum - w.arrived);
  }
  return ForgetStepLocked();
}

void SyncAccumulator::AnswerStep(std::vector<Waiter> waiters, const Outcome& applied) {
  if (waiters.empty()) return;
  const absl::Time start = clock_->Now();
  Answer(std::move(waiters), applied);
  const double secs = absl::ToDoubleSeconds(clock_->Now() - start);
  absl::MutexLock lock(&mu_);
  timing_.answer_secs += secs;
}

SyncAccumulator::Timing SyncAccumulator::timing() const {
  absl::MutexLock lock(&mu_);
  return timing_;
}

void SyncAccumulator::ArmTimeoutLocked(absl::Time deadline) {
  const uint64_t id = step_id_;
  deadline_ = deadline;
  timer_ = clock_->Schedule(deadline, [this, id] { OnTimeout(id); });
}

void SyncAccumulator::OnTimeout(uint64_t step_id) {
  std::vector<Waiter> released;
  Outcome applied;
  std::string line;
  {
    absl::MutexLock lock(&mu_);
    if (step_id != step_id_ || arrived_ == 0 || timed_out_) return;  // that step ended meanwhile
    timer_ = 0;
    const absl::Time now = clock_->Now();
    absl::Time alive_until;
    const std::vector<int> alive = AliveMissingLocked(now, &alive_until);
    if (now - deadline_ > kFrozenSlack) {
      // Woken far past the deadline: this task was frozen, and pushes may wait unread in its
      // sockets. Timing the step out now would drop workers that pushed in time.
      line = absl::StrCat("sync step ", step_->load(), ": this task did not run for ",
                          absl::ToInt64Seconds(now - deadline_), " s or more (frozen?); the step waits ",
                          absl::ToDoubleSeconds(config_.timeout), " s again for its quorum");
      ArmTimeoutLocked(now + config_.timeout);
    } else if (!alive.empty()) {
      // Alive but held up elsewhere (a stalled ps task): dropping them here, and not on the
      // stalled task, would make the ps tasks apply different gradients for this step.
      if (!waited_for_alive_) {
        line = absl::StrCat("sync step ", step_->load(), ": worker(s) ", absl::StrJoin(alive, ", "),
                            " did not push within ", absl::ToDoubleSeconds(config_.timeout),
                            " s but are alive (waiting on another ps task); the step waits for them");
      }
      waited_for_alive_ = true;
      ArmTimeoutLocked(alive_until);
    } else {
      // The quorum did not form in time: apply what arrived and stop waiting for the missing.
      timed_out_ = true;
      quorum_closed_ = true;
      std::vector<int> missing;
      for (int w : config_.expected_workers) {
        if (!arrived_workers_.contains(w) && !departed_.contains(w)) missing.push_back(w);
      }
      dropped_.insert(missing.begin(), missing.end());
      line = absl::StrCat("sync step ", step_->load(), ": applying ", arrived_, " gradient(s) after waiting ",
                          absl::ToDoubleSeconds(config_.timeout), " s for ", config_.replicas_to_aggregate,
                          "; missing worker(s) ", missing.empty() ? "none" : absl::StrJoin(missing, ", "),
                          " (left out of the quorum until they push again)");
      released = MaybeFinishStepLocked();  // nothing while a push still accumulates: it finishes the step
      applied.step = step_->load(std::memory_order_acquire);
    }
  }
  if (log_ && !line.empty()) log_(line);
  AnswerStep(std::move(released), applied);
}

std::vector<int> SyncAccumulator::AliveMissingLocked(absl::Time now, absl::Time* until) const {
  std::vector<int> alive;
  *until = absl::InfinitePast();
  for (int w : config_.expected_workers) {
    if (arrived_workers_.contains(w) || departed_.contains(w) || dropped_.contains(w)) continue;
    auto heard = heard_.find(w);
    if (heard == heard_.end() || now - heard->second >= config_.timeout) continue;
    alive.push_back(w);
    *until = std::max(*until, heard->second + config_.timeout);  // silent for the timeout by then
  }
  return alive;
}

void SyncAccumulator::Heard(int worker) {
  absl::MutexLock lock(&mu_);
  heard_[worker] = clock_->Now();
}

void SyncAccumulator::Depart(int worker) {
  std::vector<Waiter> released;
  Outcome applied;
  {
    absl::MutexLock lock(&mu_);
    departed_.insert(worker);
    released = MaybeFinishStepLocked();
    applied.step = step_->load(std::memory_order_acquire);
  }
  AnswerStep(std::move(released), applied);
}

void SyncAccumulator::Rejoin(int worker) {
  absl::MutexLock lock(&mu_);
  departed_.erase(worker);
}

void SyncAccumulator::Answer(std::vector<Waiter> waiters, const absl::StatusOr<Outcome>& outcome) {
  for (Waiter& w : waiters) w.done(outcome);
}

}  // namespace psflow::ps
