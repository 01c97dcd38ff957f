// train/session_pending.h — a worker session's deferred push (async with --overlap other than none
// and a caller that waits for values: docs/sync-async.md#overlap). Step sends the push and returns;
// the push's answer (the global step it claimed, or its failure) is collected by the next call that
// needs it — the next Step before its own push, Close, a Lookup that must pull — so at most one
// push per worker is in flight.
//
// PendingPush holds what such a push reads until it is answered, made its own at the send: the
// dense and row-sparse gradients copied (the caller's gradient memory is reused by the next
// backward at once), the tables' ids and gradients moved in (gradients the caller lent: their
// owners, let go of once the push is answered). Its answer arrives on a transport
// thread (Done); the session's one thread waits for it (Wait) and takes it (Take).
//
// DeferredDataOrder is the async data order of such a session (WorkerSession::data_step): the
// batch a worker takes next can no longer come from the step its last push claimed (that answer
// is still in flight when the next batch is read), so it comes from the one before: batch
// S + 2N - 1 for the push that claimed S, read two pushes later, and batches B + w and B + N + w
// (worker w of N, B the global step pulled at Open or after a ps restart) for the first two. Each
// claimed step is distinct, so the workers' batches stay disjoint; one worker (N = 1) takes the
// very batches it takes without deferral (S_k = B + k + 1).
#ifndef PSFLOW_TRAIN_SESSION_PENDING_H_
#define PSFLOW_TRAIN_SESSION_PENDING_H_

#include <array>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "psflow/core/row_sparse.h"
#include "psflow/core/tensor.h"
#include "psflow/ps/ps_client.h"
#include "train/session_tables.h"

namespace psflow::train {

class PendingPush {
 public:
  // The step it belongs to (for the line that reports its failure) and what Step was given.
  void Begin(int64_t local_step, int64_t global_step, double loss, double accuracy);
  // `grads` with every dense and row-sparse gradient replaced by a copy held here (buffers reused
  // from the last push this object carried).
  std::vector<ps::Gradient> Keep(const std::vector<ps::Gradient>& grads);
  // Where the tables' pushed ids, gradients and lent gradients' owners are moved
  // (SessionTables::StepCall's `kept`).
  KeptTables* tables() { return &tables_; }
  // The push was answered (or dropped): the owners of the gradients it lent are let go of.
  void ReleaseTables() { tables_.Release(); }
  // The push's completion callback (runs on a transport thread, or at once on a refused push);
  // `then` (may be null) is called first with the push's status (ForwardPulls::Fire).
  std::function<void(absl::StatusOr<ps::PushResult>)> Done(std::function<void(const absl::Status&)> then = nullptr);
  // Waits until the answer arrived.
  void Wait() const;
  bool arrived() const;
  // Waits for the answer and reads it (it stays until Take).
  const absl::StatusOr<ps::PushResult>& Peek() const;
  // The answer, waited for; once.
  absl::StatusOr<ps::PushResult> Take();

  int64_t local_step() const { return local_step_; }
  int64_t global_step() const { return global_step_; }
  double loss() const { return loss_; }
  double accuracy() const { return accuracy_; }

 private:
  struct Answer {
    absl::Notification done;
    absl::StatusOr<ps::PushResult> result;  // written before done
  };
  std::shared_ptr<Answer> answer_;
  int64_t local_step_ = 0, global_step_ = 0;
  double loss_ = 0, accuracy_ = 0;
  std::vector<Tensor> dense_;
  std::vector<RowSparse> sparse_;
  KeptTables tables_;
};

// The thread a deferred Step hands its push's send to (the routing of the tables' rows to their
// ps tasks, the encoding, the early parts' wait), so that Step returns without that CPU on the
// caller's thread. One send at a time, in order; Post from the session's thread. The thread is
// named psflow_behind (bench/ctr_vs_pytorch.py counts its CPU as work beside the compute) and runs
// SCHED_BATCH: woken by a Post it takes a free core but does not preempt the caller's compute.
class PushSender {
 public:
  PushSender();
  ~PushSender();  // after the sends posted
  PushSender(const PushSender&) = delete;
  PushSender& operator=(const PushSender&) = delete;
  void Post(std::function<void()> send);

 private:
  void Run();
  absl::Mutex mu_;
  std::deque<std::function<void()>> queue_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;  // last: started once the rest is built
};

class DeferredDataOrder {
 public:
  // At Open, or after a ps restart: the global step pulled.
  void Reset(int64_t base);
  // A push was sent (deferred or not).
  void Sent() { ++sent_; }
  // The oldest push not yet answered claimed global step `step`.
  void Claimed(int64_t step);
  // The batch the worker takes next (worker `w` of `n`).
  int64_t NextBatch(int64_t n, int64_t w) const;

 private:
  int64_t base_ = 0;
  int64_t sent_ = 0, answered_ = 0;  // pushes since the last Reset
  std::array<int64_t, 2> claims_{};  // push k's claim at k % 2 (the last two answered)
};

}  // namespace psflow::train

#endif  // PSFLOW_TRAIN_SESSION_PENDING_H_
