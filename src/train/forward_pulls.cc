#include "train/forward_pulls.h"

#include "absl/synchronization/mutex.h"

namespace psflow::train {

struct ForwardPulls::State {
  absl::Mutex mu;
  bool active ABSL_GUARDED_BY(mu) = false;
  std::vector<bool> done ABSL_GUARDED_BY(mu);
  int next ABSL_GUARDED_BY(mu) = 0;       // the next group to launch
  int in_flight ABSL_GUARDED_BY(mu) = 0;  // groups launched and not answered
  absl::Status status ABSL_GUARDED_BY(mu);
  // Sync: heartbeats while the pull runs (a stalled task must not get this worker dropped from
  // the others' quorum while its forward waits), released when the last group is in.
  std::shared_ptr<void> keep_alive ABSL_GUARDED_BY(mu);
};

ForwardPulls::ForwardPulls(ps::PsClient* client, std::vector<std::pair<std::string, Tensor*>> out)
    : client_(client), state_(std::make_shared<State>()) {
  int64_t bytes = 0;
  for (auto& entry : out) {
    const int64_t b = static_cast<int64_t>(entry.second->bytes());
    if (groups_.empty() || (bytes > 0 && bytes + b > kGroupBytes)) {
      groups_.emplace_back();
      bytes = 0;
    }
    groups_.back().push_back(std::move(entry));
    group_of_.push_back(static_cast<int>(groups_.size()) - 1);
    bytes += b;
  }
  absl::MutexLock lock(&state_->mu);
  state_->done.assign(groups_.size(), true);
  state_->next = static_cast<int>(groups_.size());
}

ForwardPulls::~ForwardPulls() { (void)Settle(); }

void ForwardPulls::Start() {
  Arm();
  Fire(absl::OkStatus());
}

void ForwardPulls::Arm() {
  std::shared_ptr<void> keep_alive = client_->KeepAlive();
  absl::MutexLock lock(&state_->mu);
  state_->keep_alive = std::move(keep_alive);
  state_->active = true;
  state_->status = absl::OkStatus();
  state_->done.assign(groups_.size(), false);
  state_->next = 0;
}

void ForwardPulls::Fire(const absl::Status& push) {
  std::vector<int> launch;
  std::shared_ptr<void> keep_alive;  // released outside the lock
  {
    absl::MutexLock lock(&state_->mu);
    if (!push.ok()) {  // nothing is pulled: the waiters are released, Settle returns the failure
      state_->status = push;
      state_->done.assign(groups_.size(), true);
      state_->next = num_groups();
      keep_alive = std::move(state_->keep_alive);
    } else {
      while (state_->next < num_groups() && state_->in_flight < kWindow) {
        launch.push_back(state_->next++);
        ++state_->in_flight;
      }
      if (launch.empty() && state_->in_flight == 0) keep_alive = std::move(state_->keep_alive);
    }
  }
  keep_alive.reset();
  for (int g : launch) Launch(g);
}

void ForwardPulls::Launch(int group) {
  client_->PullAsync(groups_[group], [this, state = state_, group](absl::StatusOr<int64_t> r) {
    int next = -1;
    std::shared_ptr<void> keep_alive;  // released outside the lock once every group is in
    {
      absl::MutexLock lock(&state->mu);
      state->done[group] = true;
      --state->in_flight;
      if (!r.ok() && state->status.ok()) state->status = r.status();
      // After a failure the rest is not asked for (the session pulls everything again).
      if (state->status.ok() && state->next < static_cast<int>(state->done.size())) {
        next = state->next++;
        ++state->in_flight;
      } else if (!state->status.ok()) {
        for (int g = state->next; g < static_cast<int>(state->done.size()); ++g) state->done[g] = true;
        state->next = static_cast<int>(state->done.size());
      }
      if (next < 0 && state->in_flight == 0) keep_alive = std::move(state->keep_alive);
    }
    keep_alive.reset();
    if (next >= 0) Launch(next);
  });
}

void ForwardPulls::Wait(int index) {
  if (index < 0 || index >= static_cast<int>(group_of_.size())) return;
  const int group = group_of_[index];
  State* s = state_.get();
  absl::MutexLock lock(&s->mu);
  std::pair<State*, int> arg(s, group);
  s->mu.Await(absl::Condition(
      +[](std::pair<State*, int>* a)
           ABSL_NO_THREAD_SAFETY_ANALYSIS { return static_cast<bool>(a->first->done[a->second]); },
      &arg));
}

absl::Status ForwardPulls::Settle() {
  State* s = state_.get();
  absl::MutexLock lock(&s->mu);
  s->mu.Await(absl::Condition(
      +[](State* st) ABSL_NO_THREAD_SAFETY_ANALYSIS {
        return st->in_flight == 0 && st->next >= static_cast<int>(st->done.size());
      },
      s));
  std::shared_ptr<void> keep_alive = std::move(s->keep_alive);
  absl::Status status = s->active ? s->status : absl::OkStatus();
  s->active = false;
  s->status = absl::OkStatus();
  s->done.assign(s->done.size(), true);
  s->next = static_cast<int>(s->done.size());
  return status;
}

bool ForwardPulls::active() const {
  absl::MutexLock lock(&state_->mu);
  return state_->active;
}

bool ForwardPulls::failed() const {
  absl::MutexLock lock(&state_->mu);
  return !state_->status.ok();
}

}  // namespace psflow::train
