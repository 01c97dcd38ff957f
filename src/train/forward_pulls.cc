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
  slices_ = client_->PullBackSlices(out);
  int64_t bytes = 0;
  for (auto& entry : out) {
    const int64_t b = static_cast<int64_t>(entry.second->bytes());
    if (groups_.empty() || (bytes > 0 && bytes + b > kGroupBytes)) {
      groups_.emplace_back();
      group_params_.emplace_back();
      bytes = 0;
    }
    group_params_.back().push_back(static_cast<int>(group_of_.size()));
    groups_.back().push_back(std::move(entry));
    group_of_.push_back(static_cast<int>(groups_.size()) - 1);
    bytes += b;
  }
  current_ = groups_;
  by_slices_.assign(group_of_.size(), false);
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
  // The variables whose values the step's early parts are bringing back slice by slice: left out
  // of the groups (a group left empty is done at once).
  by_slices_.assign(group_of_.size(), false);
  if (slices_ != nullptr) {
    for (int i : slices_->TakeStarted()) by_slices_[i] = true;
  }
  for (size_t g = 0; g < groups_.size(); ++g) {
    current_[g].clear();
    for (size_t j = 0; j < groups_[g].size(); ++j) {
      if (!by_slices_[group_params_[g][j]]) current_[g].push_back(groups_[g][j]);
    }
  }
  std::shared_ptr<void> keep_alive = client_->KeepAlive();
  absl::MutexLock lock(&state_->mu);
  state_->keep_alive = std::move(keep_alive);
  state_->active = true;
  state_->status = absl::OkStatus();
  for (int g = 0; g < num_groups(); ++g) state_->done[g] = current_[g].empty();
  state_->next = NextToPull(0);
}

int ForwardPulls::NextToPull(int group) const {
  while (group < num_groups() && current_[group].empty()) ++group;
  return group;
}

std::vector<int> ForwardPulls::sliced() const {
  std::vector<int> out;
  for (size_t i = 0; i < by_slices_.size(); ++i) {
    if (by_slices_[i]) out.push_back(static_cast<int>(i));
  }
  return out;
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
        launch.push_back(state_->next);
        state_->next = NextToPull(state_->next + 1);
        ++state_->in_flight;
      }
      if (launch.empty() && state_->in_flight == 0) keep_alive = std::move(state_->keep_alive);
    }
  }
  keep_alive.reset();
  for (int g : launch) Launch(g);
}

void ForwardPulls::Launch(int group) {
  client_->PullAsync(current_[group], [this, state = state_, group](absl::StatusOr<int64_t> r) {
    int next = -1;
    std::shared_ptr<void> keep_alive;  // released outside the lock once every group is in
    {
      absl::MutexLock lock(&state->mu);
      state->done[group] = true;
      --state->in_flight;
      if (!r.ok() && state->status.ok()) state->status = r.status();
      // After a failure the rest is not asked for (the session pulls everything again).
      if (state->status.ok() && state->next < static_cast<int>(state->done.size())) {
        next = state->next;
        state->next = NextToPull(next + 1);
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
  if (by_slices_[index]) return slices_->Wait(index);
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
  absl::Status status;
  {
    State* s = state_.get();
    absl::MutexLock lock(&s->mu);
    s->mu.Await(absl::Condition(
        +[](State* st) ABSL_NO_THREAD_SAFETY_ANALYSIS {
          return st->in_flight == 0 && st->next >= static_cast<int>(st->done.size());
        },
        s));
    std::shared_ptr<void> keep_alive = std::move(s->keep_alive);
    status = s->active ? s->status : absl::OkStatus();
    s->active = false;
    s->status = absl::OkStatus();
    s->done.assign(s->done.size(), true);
    s->next = static_cast<int>(s->done.size());
  }
  if (slices_ != nullptr) {  // the slices' pulls of the variables the running pull left to them
    absl::Status sliced = slices_->Settle();
    if (status.ok()) status = sliced;
  }
  return status;
}

bool ForwardPulls::active() const {
  absl::MutexLock lock(&state_->mu);
  return state_->active;
}

bool ForwardPulls::failed() const {
  if (slices_ != nullptr && slices_->failed()) return true;
  absl::MutexLock lock(&state_->mu);
  return !state_->status.ok();
}

}  // namespace psflow::train
