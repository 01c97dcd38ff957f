// train/in_process_ps.h (internal) — a worker session that runs alone: when the options name no
// cluster (no --job_name, --ps_hosts, --worker_hosts or --slurm_jobs, and no $TF_CONFIG), the
// session is worker 0 (the chief) of a one-worker loopback cluster whose ps task 0 runs on a thread
// of this process: the same ps task `psflow train --job_name=ps` runs (RunParameterServer), reached
// over loopback gRPC as any ps task is. So a PyTorch script (python/psflow) and a C++ session
// program (examples/cpp_session) train alone with every behaviour of a cluster: checkpoints,
// resuming, the summary, sync mode with one worker.
//
// Owned by the WorkerSession (session.cc): Standalone() rewrites the session's options to the
// loopback cluster at Create; Start() at Open, before connecting; Join() once the job ended (the
// chief's Close shut the task down) and Stop() after an abort (the task stops within ~0.1 s even if
// the abort did not reach it). Not thread-safe: the session's thread drives it.
#ifndef PSFLOW_TRAIN_IN_PROCESS_PS_H_
#define PSFLOW_TRAIN_IN_PROCESS_PS_H_

#include <atomic>
#include <memory>
#include <thread>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "psflow/train/options.h"
#include "psflow/train/train.h"
#include "train/ps_task.h"

namespace psflow::train {

class InProcessPs {
 public:
  // Whether `options` name no cluster: the session then runs alone.
  static bool Wanted(const TrainOptions& options);
  // Picks two free loopback ports and rewrites `worker` (resolved options) to be worker 0 of the
  // cluster {ps: [127.0.0.1:P], worker: [127.0.0.1:W]}; the ps task gets the same options as ps
  // task 0 (no --metrics_port: the worker's session serves it). Lines of the task go to `log`.
  // Called again on the rewritten options, picks fresh ports (after Start's PortTaken).
  static absl::StatusOr<std::unique_ptr<InProcessPs>> Make(TrainOptions* worker, LogSink log);
  // Whether Start's error says the ps task could not listen on its port (another process took it
  // after Make picked it). The port is not bound by Make: the worker's cluster spec, checked by
  // the ps task's Hello through its fingerprint, must name the port before the task binds it, so
  // the task cannot take port 0 and report what it got.
  static bool PortTaken(const absl::Status& start_error);
  ~InProcessPs();  // stops and joins a task still running
  InProcessPs(const InProcessPs&) = delete;
  InProcessPs& operator=(const InProcessPs&) = delete;

  int port() const { return port_; }
  // Starts the task and returns once it serves, or the error it ended with (a port taken meanwhile),
  // or Unavailable after `timeout_secs`.
  absl::Status Start(double timeout_secs = 30);
  // Waits for the task's end; the error it ended with (OK after the chief's Close shut it down).
  absl::Status Join();
  // Asks the task to stop (after an abort) and waits for it.
  void Stop();

 private:
  InProcessPs(TrainOptions ps, int port, LogSink log);

  const TrainOptions ps_options_;
  const int port_;
  const LogSink log_;
  PsTaskControl control_;
  std::thread thread_;
  absl::Status result_;             // written by thread_, read after joining it
  std::atomic<bool> ended_{false};  // set by thread_ when the task returned
};

}  // namespace psflow::train

#endif  // PSFLOW_TRAIN_IN_PROCESS_PS_H_
