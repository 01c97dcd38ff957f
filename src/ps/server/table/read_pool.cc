// The disk tier's read threads (read_pool.h).
#include "ps/server/table/read_pool.h"

#include <utility>

namespace psflow::ps::table {

// One RunParts call: its parts and how many are left.
struct ReadPool::Job {
  explicit Job(absl::FunctionRef<void(size_t)> f) : part(f) {}
  absl::FunctionRef<void(size_t)> part;
  absl::Mutex mu;
  size_t left ABSL_GUARDED_BY(mu) = 0;
};

ReadPool::ReadPool(int threads) {
  for (int t = 0; t < threads; ++t) threads_.emplace_back([this] { Loop(); });
}

ReadPool::~ReadPool() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  for (std::thread& t : threads_) t.join();
}

void ReadPool::Loop() {
  for (;;) {
    std::pair<Job*, size_t> work;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(
          +[](ReadPool* p) ABSL_EXCLUSIVE_LOCKS_REQUIRED(p->mu_) { return p->stopping_ || !p->queue_.empty(); }, this));
      if (queue_.empty()) return;  // stopping, nothing left
      work = queue_.front();
      queue_.pop_front();
    }
    work.first->part(work.second);
    absl::MutexLock lock(&work.first->mu);
    --work.first->left;
  }
}

void ReadPool::RunParts(size_t parts, absl::FunctionRef<void(size_t)> part) {
  if (parts == 0) return;
  if (threads_.empty() || parts == 1) {
    for (size_t k = 0; k < parts; ++k) part(k);
    return;
  }
  Job job(part);
  {
    absl::MutexLock lock(&job.mu);
    job.left = parts - 1;
  }
  {
    absl::MutexLock lock(&mu_);
    for (size_t k = 1; k < parts; ++k) queue_.emplace_back(&job, k);
  }
  part(0);
  // The parts no thread has taken yet run here too (the threads may all be busy with other calls).
  for (;;) {
    std::pair<Job*, size_t> mine{nullptr, 0};
    {
      absl::MutexLock lock(&mu_);
      for (auto it = queue_.begin(); it != queue_.end(); ++it) {
        if (it->first == &job) {
          mine = *it;
          queue_.erase(it);
          break;
        }
      }
    }
    if (mine.first == nullptr) break;
    part(mine.second);
    absl::MutexLock lock(&job.mu);
    --job.left;
  }
  absl::MutexLock lock(&job.mu);
  job.mu.Await(absl::Condition(
      +[](Job* j) ABSL_EXCLUSIVE_LOCKS_REQUIRED(j->mu) { return j->left == 0; }, &job));
}

}  // namespace psflow::ps::table
