// ps/server/sync_accumulator.h — SyncReplicasOptimizer's semantics on one ps task, as one unit: which
// pushes a sync step counts, when the step is applied, and who is answered with what.
//
//   - Every push is tagged with the global step its gradient was computed at. One tagged older
//     than the current step is stale: dropped, counted, and answered at once (stale = true).
//   - R = replicas_to_aggregate pushes complete a step: the mean of their gradients is applied
//     (by the `apply` callback: ps/server/shard.h's ApplyAccumulated on every shard), the step advances
//     by one and the held pushes are answered with the new step.
//   - T = total_num_replicas > R: the T - R extra workers are backups; a push arriving after the
//     quorum closed is dropped like a stale one.
//   - A step waiting `timeout` since its first push applies what arrived, logs the missing
//     workers and drops them from the quorum (backups absorb them first, then R shrinks, never
//     below 1); a dropped worker is back in the quorum when it pushes again. A worker that said
//     Goodbye is left out the same way (no timeout needed), and is back after a Hello (Rejoin).
//   - A missing worker that was heard from within `timeout` (Heard: its heartbeat while it waits
//     on another ps task, whose answer it needs before it can push here) is alive, not lost: the
//     step waits for it instead of dropping it. Only a worker silent for the whole timeout is
//     dropped, so every ps task counts the same workers in each step when one of them stalls.
//   - A timeout that fires more than kFrozenSlack late means this task did not run (SIGSTOP, a
//     paused VM) and the pushes that reached it meanwhile wait unread in its sockets: the step
//     waits `timeout` again instead of dropping workers that pushed in time (docs/failures.md).
//   - Reconfigure (the chief's Initialize, also a restore) and Release (shutdown, stop) answer the
//     held pushes with the given status (kNotInitializedMessage for a re-initialization, which
//     workers take as "wait for the chief, then pull") and forget the step. A push admitted under
//     an older configuration (a race with Initialize) is answered with that status too.
//
// Where it sits in the push path (ps_push.cc): HandlePush parses and validates the push (the
// push deduplication of retried calls, ps/server/push_dedup.h, wraps the Responder at that entry,
// before anything here runs), then PushInSyncMode calls Push() with the epoch of the model it
// validated against, a function that adds the push's gradients into the shards' accumulators,
// and the completion that answers the call (PushAnswer). Async mode never comes here.
//
// The step counter is the ps task's (borrowed: readers load it without this class's lock); only
// this class advances it in sync mode. Time comes from an injected Clock (ps/common/clock.h), so the
// unit tests (sync_accumulator_test.cc) drive timeouts with a ManualClock, without sleeping.
//
// Thread-safe. One mutex (mu_) guards the step's bookkeeping; `apply` runs under it (it takes
// the shards' own mutexes: lock order mu_ -> Shard::mu_); `accumulate` and every completion run
// outside it, so pushes accumulate concurrently and answering never blocks the step.
#ifndef PSFLOW_PS_SERVER_SYNC_ACCUMULATOR_H_
#define PSFLOW_PS_SERVER_SYNC_ACCUMULATOR_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/functional/any_invocable.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "ps/common/clock.h"

namespace psflow::ps {

class SyncAccumulator {
 public:
  // What a push is answered with: the step it completed (or the current one, when dropped).
  struct Outcome {
    int64_t step = 0;
    bool stale = false;  // dropped: tagged older than the step, or a backup after the quorum
  };
  // Answers one push's call; called exactly once per Push, outside the lock.
  using Done = absl::AnyInvocable<void(absl::StatusOr<Outcome>)>;
  // Applies the mean of `count` accumulated gradients as step `step` (under mu_).
  using ApplyFn = std::function<void(int count, int64_t step)>;

  struct Config {
    int replicas_to_aggregate = 1;  // R
    int total_num_replicas = 1;     // T >= R
    absl::Duration timeout = absl::Seconds(30);
    std::vector<int> expected_workers;  // the workers a timed-out step reports missing
    ApplyFn apply;
  };

  // `step` is borrowed (the ps task's step counter) and must outlive this; `log` gets one line
  // per timed-out step.
  SyncAccumulator(std::atomic<int64_t>* step, std::function<void(const std::string&)> log,
                  std::unique_ptr<Clock> clock);
  ~SyncAccumulator();
  SyncAccumulator(const SyncAccumulator&) = delete;
  SyncAccumulator& operator=(const SyncAccumulator&) = delete;

  // Answers the held pushes with `status`, forgets the step (and the dropped workers) and takes
  // `config` for the steps to come. Returns the new epoch, to pass to Push.
  uint64_t Reconfigure(Config config, const absl::Status& status);
  // Answers the held pushes with `status` and forgets the step; the configuration stays.
  void Release(const absl::Status& status);

  // One push from `worker`, computed at `step_tag`, validated against the model of `epoch`.
  // Unless it is dropped, runs `accumulate` (outside the lock) and then counts it; `done` is
  // called when its step is applied, at once when dropped, or with the status of a Release.
  void Push(uint64_t epoch, int worker, int64_t step_tag, absl::FunctionRef<void()> accumulate, Done done);

  // Goodbye: `worker` no longer counts towards the quorum (the step may complete now).
  void Depart(int worker);
  // Hello: a worker that comes back counts again.
  void Rejoin(int worker);
  // A heartbeat: `worker` is alive (waiting on another ps task), so a timeout does not drop it.
  void Heard(int worker);

  static constexpr absl::Duration kFrozenSlack = absl::Seconds(1);

  int64_t stale_dropped() const { return stale_dropped_.load(std::memory_order_relaxed); }
  // Where the applied steps' time went (by the clock: zero under a ManualClock that stands still).
  struct Timing {
    int64_t steps = 0;       // steps applied
    int64_t pushes = 0;      // pushes counted in them
    double wait_secs = 0;    // the pushes' waits, from each one's arrival to its step's quorum
    double spread_secs = 0;  // the steps' first arrival to their quorum (the slowest worker's lag)
    double apply_secs = 0;   // the steps' apply (the mean onto every shard)
    double answer_secs = 0;  // answering the steps' pushes (their answers built and handed over)
  };
  Timing timing() const;
  // The quorum the current step needs (R, less the missing workers beyond the backups).
  int Quorum() const;
  Clock& clock() { return *clock_; }

 private:
  struct Waiter {
    int worker;
    Done done;
    absl::Time arrived;  // when the push was counted
  };

  int QuorumLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Applies the step if its quorum is complete (or timed out) and no push is still accumulating;
  // returns the pushes to answer with the new step (after unlocking).
  std::vector<Waiter> MaybeFinishStepLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Forgets the current step; returns its waiters.
  std::vector<Waiter> ForgetStepLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The missing workers of the current step heard from within the timeout; `until`: when the
  // last of them will have been silent for the timeout.
  std::vector<int> AliveMissingLocked(absl::Time now, absl::Time* until) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Schedules the current step's timeout.
  void ArmTimeoutLocked(absl::Time deadline) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The clock's callback for the step that began as `step_id`.
  void OnTimeout(uint64_t step_id);
  static void Answer(std::vector<Waiter> waiters, const absl::StatusOr<Outcome>& outcome);
  // Answers a step's pushes (released by MaybeFinishStepLocked) and counts the time it took.
  void AnswerStep(std::vector<Waiter> waiters, const Outcome& applied);

  std::atomic<int64_t>* const step_;  // borrowed
  const std::function<void(const std::string&)> log_;
  std::atomic<int64_t> stale_dropped_{0};

  mutable absl::Mutex mu_;
  Config config_ ABSL_GUARDED_BY(mu_);
  uint64_t epoch_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status epoch_status_ ABSL_GUARDED_BY(mu_);   // what pushes of an older epoch are told
  uint64_t step_id_ ABSL_GUARDED_BY(mu_) = 0;        // changes whenever a step ends or is forgotten
  int arrived_ ABSL_GUARDED_BY(mu_) = 0;             // pushes counted for the current step
  int in_flight_ ABSL_GUARDED_BY(mu_) = 0;           // counted pushes still accumulating
  bool quorum_closed_ ABSL_GUARDED_BY(mu_) = false;  // reached, or timed out
  bool timed_out_ ABSL_GUARDED_BY(mu_) = false;
  bool waited_for_alive_ ABSL_GUARDED_BY(mu_) = false;  // this step logged that it waits for them
  Clock::TimerId timer_ ABSL_GUARDED_BY(mu_) = 0;       // the current step's timeout, or 0
  absl::Time deadline_ ABSL_GUARDED_BY(mu_);            // when it is due
  std::vector<Waiter> waiters_ ABSL_GUARDED_BY(mu_);
  absl::Time first_arrival_ ABSL_GUARDED_BY(mu_);  // the current step's first counted push
  Timing timing_ ABSL_GUARDED_BY(mu_);
  std::set<int> arrived_workers_ ABSL_GUARDED_BY(mu_);
  std::set<int> dropped_ ABSL_GUARDED_BY(mu_);            // missed a timed-out step; back when they push
  std::set<int> departed_ ABSL_GUARDED_BY(mu_);           // said Goodbye; back after a Hello or a push
  std::map<int, absl::Time> heard_ ABSL_GUARDED_BY(mu_);  // each worker's last heartbeat

  // Last: destroyed first, so no timeout callback runs once the rest is being torn down.
  std::unique_ptr<Clock> clock_;
};

}  // namespace psflow::ps

#endif  // PSFLOW_PS_SERVER_SYNC_ACCUMULATOR_H_
