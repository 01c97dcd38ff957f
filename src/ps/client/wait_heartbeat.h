// ps/client/wait_heartbeat.h — while a sync push waits on some ps tasks, the tasks that already answered
// hear every few seconds that this worker is alive (Hello with `heartbeat`).
//
// Why: in sync mode a worker cannot push step s+1 to any ps task until every task answered its
// step-s push (it needs all the new values). When one task stalls (frozen, link down) after the
// others answered, the others' step s+1 would time this worker out (--sync_timeout_secs) and apply
// other gradients than the stalled task applies once it is back. Heartbeats keep the worker in
// their quorum (SyncAccumulator::Heard) until it pushes, or gives up on the stalled task and says
// Goodbye; a worker that is really gone, or cut off from every task, sends none and is dropped.
//
// Owned by the push's fan-out (shared with its timer). Thread-safe.
#ifndef PSFLOW_PS_CLIENT_WAIT_HEARTBEAT_H_
#define PSFLOW_PS_CLIENT_WAIT_HEARTBEAT_H_

#include <memory>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "proto/psflow.pb.h"
#include "ps/client/fan_out.h"
#include "rpc/transport.h"

namespace psflow::ps {

class WaitHeartbeat : public std::enable_shared_from_this<WaitHeartbeat> {
 public:
  // Beats every `every_secs` (the first after `every_secs`) on the timer thread of `runner`
  // (the client's Retrier, which outlives every beat), until Stop(). Each beat is one Hello per
  // answered channel, with `rpc_timeout_secs` and no retry (the next beat is the retry).
  static std::shared_ptr<WaitHeartbeat> Start(std::vector<rpc::ClientChannel*> channels, wire::HelloRequest hello,
                                              double every_secs, double rpc_timeout_secs, Retrier* runner);

  // Call i of the fan-out got its answer: it gets heartbeats from now on.
  void Answered(int i);
  // The fan-out ended: no more beats (the pending one is cancelled, so a fast sync step leaves no
  // timer behind).
  void Stop();

  WaitHeartbeat(std::vector<rpc::ClientChannel*> channels, wire::HelloRequest hello, double every_secs,
                double rpc_timeout_secs, Retrier* runner);

 private:
  void Beat();

  const std::vector<rpc::ClientChannel*> channels_;
  const wire::HelloRequest hello_;
  const double every_secs_;
  const double rpc_timeout_secs_;
  Retrier* const runner_;

  absl::Mutex mu_;
  std::vector<bool> answered_ ABSL_GUARDED_BY(mu_);
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
  Clock::TimerId next_beat_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace psflow::ps

#endif  // PSFLOW_PS_CLIENT_WAIT_HEARTBEAT_H_
