// A worker's view of the job's workers (train/session.cc), from the ps tasks' Stats answers:
// which workers are connected (each worker's /metrics psflow_connected_workers), which have not
// connected — said once a worker is missing past a grace period, again when the set changes or
// at most once a minute, and "all N workers connected" when the last one arrives — and how many
// pushed (the summary's workers). The chief logs its lines; every worker exports the gauge. A value
// type used by one worker's training thread only.
#ifndef PSFLOW_TRAIN_WORKER_ROSTER_H_
#define PSFLOW_TRAIN_WORKER_ROSTER_H_

#include <string>
#include <vector>

#include "psflow/ps/ps_types.h"

namespace psflow::train {

class WorkerRoster {
 public:
  // `self`: the index of the worker that asks (connected, whatever the ps tasks say).
  explicit WorkerRoster(int num_workers, int self = 0, double grace_secs = 10, double repeat_secs = 60)
      : num_workers_(num_workers), self_(self), grace_secs_(grace_secs), repeat_secs_(repeat_secs) {}

  // The ps tasks' stats, `elapsed_secs` after the chief opened its session; returns the line to
  // log ("" for none).
  std::string Update(const std::vector<ps::PsTaskStats>& stats, double elapsed_secs);
  // Workers connected at the last Update (the asking worker included).
  int connected() const { return connected_; }

  // Workers that pushed to any ps task (the union over the tasks); 0 when no task tells.
  static int PushedWorkers(const std::vector<ps::PsTaskStats>& stats);
  // "worker 1" / "workers 1, 3" of those in 0..num_workers-1 that never pushed; "" when all did.
  static std::string NeverPushed(const std::vector<ps::PsTaskStats>& stats, int num_workers);

 private:
  int num_workers_;
  int self_;
  double grace_secs_, repeat_secs_;
  int connected_ = 1;
  std::vector<int> reported_missing_;  // as last said
  double reported_at_ = -1;
};

}  // namespace psflow::train

#endif  // PSFLOW_TRAIN_WORKER_ROSTER_H_
