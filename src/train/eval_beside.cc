// The chief's evaluation beside training (train/eval_beside.h).
#include "train/eval_beside.h"

#include <sys/resource.h>
#include <unistd.h>

#include <chrono>
#include <utility>

namespace psflow::train {

EvalBeside::EvalBeside(EvaluateFile evaluate) : evaluate_(std::move(evaluate)), thread_([this] { Run(); }) {}

EvalBeside::~EvalBeside() {
  {
    absl::MutexLock lock(&mu_);
    waiting_.reset();  // (an evaluation under way is waited for)
    stop_ = true;
  }
  thread_.join();
}

void EvalBeside::Submit(int64_t global_step, const std::string& path) {
  absl::MutexLock lock(&mu_);
  if (waiting_.has_value()) ++replaced_;
  waiting_ = std::make_pair(global_step, path);
}

std::vector<EvalBeside::Result> EvalBeside::TakeResults() {
  absl::MutexLock lock(&mu_);
  std::vector<Result> out = std::move(done_);
  done_.clear();
  return out;
}

void EvalBeside::Finish() {
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(
      +[](EvalBeside* self) ABSL_EXCLUSIVE_LOCKS_REQUIRED(self->mu_) { return !self->waiting_ && !self->busy_; },
      this));
}

void EvalBeside::Run() {
  // Below the training threads (Linux: per thread): on a busy machine the evaluation takes the CPU
  // they leave. Best effort (not permitted: the evaluation keeps the process's priority).
  (void)setpriority(PRIO_PROCESS, static_cast<id_t>(gettid()), kNiceness);
  for (;;) {
    std::pair<int64_t, std::string> next;
    int64_t replaced = 0;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(
          +[](EvalBeside* self) ABSL_EXCLUSIVE_LOCKS_REQUIRED(self->mu_) { return self->waiting_ || self->stop_; },
          this));
      if (!waiting_) return;  // stopped, nothing left
      next = *std::move(waiting_);
      waiting_.reset();
      replaced = replaced_;
      replaced_ = 0;
      busy_ = true;
    }
    const auto start = std::chrono::steady_clock::now();
    absl::StatusOr<SessionEval> eval = evaluate_(next.second);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    absl::MutexLock lock(&mu_);
    done_.push_back({next.first, std::move(next.second), std::move(eval), seconds, replaced});
    busy_ = false;
  }
}

}  // namespace psflow::train
