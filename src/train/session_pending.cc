// A worker session's deferred push and its data order (train/session_pending.h).
#include "train/session_pending.h"

#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <utility>

namespace psflow::train {

void PendingPush::Begin(int64_t local_step, int64_t global_step, double loss, double accuracy) {
  answer_ = std::make_shared<Answer>();
  local_step_ = local_step;
  global_step_ = global_step;
  loss_ = loss;
  accuracy_ = accuracy;
  tables_.ids.clear();
  tables_.grads.clear();
  tables_.Release();
}

std::vector<ps::Gradient> PendingPush::Keep(const std::vector<ps::Gradient>& grads) {
  size_t dense = 0, sparse = 0;
  for (const ps::Gradient& g : grads) {
    dense += g.dense != nullptr;
    sparse += g.sparse != nullptr;
  }
  // Sized first: the gradients sent point into these vectors' elements.
  dense_.resize(dense);
  sparse_.resize(sparse);
  std::vector<ps::Gradient> kept = grads;
  dense = sparse = 0;
  for (ps::Gradient& g : kept) {
    if (g.dense != nullptr) {
      Tensor& copy = dense_[dense++];
      if (copy.shape() == g.dense->shape()) {
        std::copy_n(g.dense->data(), g.dense->size(), copy.data());  // the buffer of an earlier push
      } else {
        copy = *g.dense;
      }
      g.dense = &copy;
    }
    if (g.sparse != nullptr) {
      sparse_[sparse] = *g.sparse;
      g.sparse = &sparse_[sparse++];
    }
  }
  return kept;
}

std::function<void(absl::StatusOr<ps::PushResult>)> PendingPush::Done(std::function<void(const absl::Status&)> then) {
  return [answer = answer_, then = std::move(then)](absl::StatusOr<ps::PushResult> r) {
    if (then) then(r.status());
    answer->result = std::move(r);
    answer->done.Notify();
  };
}

void PendingPush::Wait() const { answer_->done.WaitForNotification(); }
bool PendingPush::arrived() const { return answer_->done.HasBeenNotified(); }

const absl::StatusOr<ps::PushResult>& PendingPush::Peek() const {
  Wait();
  return answer_->result;
}

absl::StatusOr<ps::PushResult> PendingPush::Take() {
  Wait();
  return std::move(answer_->result);
}

PushSender::PushSender() : thread_([this] { Run(); }) {}

PushSender::~PushSender() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  thread_.join();
}

void PushSender::Post(std::function<void()> send) {
  absl::MutexLock lock(&mu_);
  queue_.push_back(std::move(send));
}

void PushSender::Run() {
  sched_param param{};
  (void)pthread_setschedparam(pthread_self(), SCHED_BATCH, &param);
  (void)pthread_setname_np(pthread_self(), "psflow_behind");
  for (;;) {
    std::function<void()> send;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(
          +[](PushSender* s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s->mu_) { return s->stop_ || !s->queue_.empty(); }, this));
      if (queue_.empty()) return;  // stopped, nothing left
      send = std::move(queue_.front());
      queue_.pop_front();
    }
    send();
  }
}

void DeferredDataOrder::Reset(int64_t base) {
  base_ = base;
  sent_ = answered_ = 0;
}

void DeferredDataOrder::Claimed(int64_t step) {
  claims_[answered_ % 2] = step;
  ++answered_;
}

int64_t DeferredDataOrder::NextBatch(int64_t n, int64_t w) const {
  const int64_t k = sent_;  // the next push's index: its batch is read now
  if (k < 2 || answered_ == 0) return base_ + k * n + w;
  // Push k - 2 was answered before push k - 1 was sent (one push in flight at most).
  const int64_t from = answered_ >= k - 1 ? k - 2 : answered_ - 1;
  return claims_[from % 2] + 2 * n - 1;
}

}  // namespace psflow::train
