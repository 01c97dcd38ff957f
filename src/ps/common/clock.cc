// Clocks and their timer queue (ps/common/clock.h).
#include "ps/common/clock.h"

#include <algorithm>

namespace psflow::ps {

Clock::TimerId TimerQueue::Add(absl::Time when, absl::AnyInvocable<void()> fn) {
  const Clock::TimerId id = next_id_++;
  pending_.emplace(std::make_pair(when, id), std::move(fn));
  due_.emplace(id, when);
  return id;
}

void TimerQueue::Remove(Clock::TimerId id) {
  auto it = due_.find(id);
  if (it == due_.end()) return;
  pending_.erase(std::make_pair(it->second, id));
  due_.erase(it);
}

absl::AnyInvocable<void()> TimerQueue::PopFirst() {
  auto first = pending_.begin();
  absl::AnyInvocable<void()> fn = std::move(first->second);
  due_.erase(first->first.second);
  pending_.erase(first);
  return fn;
}

// --- SystemClock ---------------------------------------------------------------------------------

SystemClock::~SystemClock() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
    queue_.Clear();
  }
  if (thread_.joinable()) thread_.join();
}

Clock::TimerId SystemClock::Schedule(absl::Time when, absl::AnyInvocable<void()> fn) {
  absl::MutexLock lock(&mu_);
  const TimerId id = queue_.Add(when, std::move(fn));
  if (!started_) {
    started_ = true;
    thread_ = std::thread([this] { Loop(); });
  }
  return id;
}

void SystemClock::Cancel(TimerId id) {
  absl::MutexLock lock(&mu_);
  queue_.Remove(id);
}

absl::AnyInvocable<void()> SystemClock::NextDue() {
  for (;;) {
    mu_.Await(absl::Condition(this, &SystemClock::StopOrWork));
    if (stop_) return nullptr;
    const absl::Time due = queue_.next_due();
    if (absl::Now() >= due) return queue_.PopFirst();
    // Wakes early on stop or when an earlier callback is added; then looks again.
    waiting_until_ = due;
    mu_.AwaitWithDeadline(absl::Condition(this, &SystemClock::StopOrEarlier), due);
  }
}

void SystemClock::Loop() {
  for (;;) {
    absl::AnyInvocable<void()> fn;
    {
      absl::MutexLock lock(&mu_);
      fn = NextDue();
    }
    if (fn == nullptr) return;
    fn();  // outside the lock: it may schedule or cancel
  }
}

// --- ManualClock ---------------------------------------------------------------------------------

absl::Time ManualClock::Now() const {
  absl::MutexLock lock(&mu_);
  return now_;
}

Clock::TimerId ManualClock::Schedule(absl::Time when, absl::AnyInvocable<void()> fn) {
  absl::MutexLock lock(&mu_);
  return queue_.Add(when, std::move(fn));
}

void ManualClock::Cancel(TimerId id) {
  absl::MutexLock lock(&mu_);
  queue_.Remove(id);
}

void ManualClock::Advance(absl::Duration d) {
  absl::Time target;
  {
    absl::MutexLock lock(&mu_);
    target = now_ + d;
  }
  for (;;) {
    absl::AnyInvocable<void()> fn;
    {
      absl::MutexLock lock(&mu_);
      if (queue_.empty() || queue_.next_due() > target) {
        now_ = target;
        return;
      }
      now_ = std::max(now_, queue_.next_due());
      fn = queue_.PopFirst();
    }
    fn();  // outside the lock: it may read the time, schedule or cancel
  }
}

void ManualClock::Jump(absl::Duration d) {
  absl::MutexLock lock(&mu_);
  now_ += d;
}

int ManualClock::pending() const {
  absl::MutexLock lock(&mu_);
  return queue_.size();
}

}  // namespace psflow::ps
