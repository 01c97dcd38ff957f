// psflow/ps/ps_server.h — one parameter-server task: holds the shards of the variables placed on
// it (plan.ShardsOn(task)), applies the workers' gradients with the shared optimizer code
// (optim::Optimizer), keeps the global step when it is plan.global_step_ps, and aggregates
// gradients in sync mode (SyncReplicasOptimizer semantics, docs/design.md#sync-mode).
//
// Async: each push is applied on arrival under its shard's mutex (different shards update
// concurrently); the global step advances by one per push; the learning rate decays with the
// push's step tag. Sync: a push tagged older than the task's step is dropped (stale); when R pushes
// for the step arrived their mean is applied, the step advances and the waiting pushes are answered
// together; after sync_timeout_secs what arrived is applied and missing workers are logged.
// Bad pushes (NaN/Inf, unknown shards, wrong shapes, rows out of range) are refused and counted.
//
// Thread-safe. The server is owned by its creator; Wait() returns once the chief's Shutdown came
// and every connected worker said Goodbye (or shutdown_grace_secs passed), so the task exits 0.
// It returns an error instead — so the task exits non-zero, never hangs — when the chief aborted
// the job, when every worker left and one of them gave up on the job (Goodbye with a failure), when
// the chief did not initialize this task within init_timeout_secs, or when no worker called for
// idle_timeout_secs. Pushes carry ids: a retried push is applied once (src/ps/server/push_dedup.h).
#ifndef PSFLOW_PS_PS_SERVER_H_
#define PSFLOW_PS_PS_SERVER_H_

#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "psflow/dist/cluster.h"
#include "psflow/ps/ps_types.h"

namespace psflow::ps {

class PsServer {
 public:
  struct Options {
    std::string listen_address;  // "host:port"; port 0 picks a free port (tests)
    int task_index = 0;
    // The cluster this task belongs to; workers with a different one are refused on Connect. An
    // empty cluster accepts any worker (tests and benchmarks that listen on port 0).
    dist::ClusterSpec cluster;
    rpc::TransportOptions security;
    double shutdown_grace_secs = 10;
    // Bounds on waiting for the workers (0: wait for ever): for the chief's initialization (at
    // start-up, and after a restart), and for any call at all once initialized.
    double init_timeout_secs = 0;
    double idle_timeout_secs = 0;
    // Where the task reports events (sync timeouts and the workers missing). Default: stderr.
    std::function<void(const std::string&)> log;
    // Where dynamic tables keep their rows (docs/table-storage.md): "memory", or "disk": RocksDB
    // under table_dir/ps_<task_index>/<table> (created, locked while the task serves, wiped at
    // start: a cache of the checkpoint), behind a hot-row cache of table_cache_bytes shared by the
    // task's disk tables. Fixed tables stay in memory. A disk failure (a full disk, a cache smaller
    // than one batch) ends the task: Wait() returns it, naming the ps and the table.
    std::string table_storage = "memory";
    std::string table_dir;
    int64_t table_cache_bytes = int64_t{1} << 30;
    // A checkpoint's table scan left open (its snapshot keeps the rows changed since it opened) is
    // dropped, with a log line, when its client made no scan call to this task for this long (0:
    // never), and at once when its client's worker is replaced by a new process (a restarted chief).
    double table_scan_timeout_secs = 300;
  };

  // Starts serving. Errors: cannot listen (names the address), unreadable TLS files, a bad
  // table_storage, with disk a table_dir missing, not writable or held by a running task. (Refusing a
  // non-loopback address without a secret is the caller's policy: see train's SetUpTask.)
  static absl::StatusOr<std::unique_ptr<PsServer>> Start(Options options);
  ~PsServer();

  // Blocks until training finished: the chief's Shutdown, then every worker that connected said
  // Goodbye (or shutdown_grace_secs passed). Stops serving before returning. Also returns after Stop().
  // Errors (each naming what was waited for): Aborted (the chief aborted the job, with its
  // reason; or every worker left, one of them giving up, with its reason), DeadlineExceeded (not initialized within
  // init_timeout_secs; no call within idle_timeout_secs).
  absl::Status Wait();
  // Answers every held call with Unavailable and stops serving (tests). Idempotent.
  void Stop();
  // The counters now. bytes_in and bytes_out include each call's request once it arrived and its
  // answer once it was sent, so a Stats call's own answer is not in the stats it carries.
  PsTaskStats Stats() const;
  // What this task last answered a Stats call with (the chief's traffic table; its final Stats
  // call comes before its Shutdown), or nullopt. Stats() minus these is exactly that answer, the
  // Shutdown and any call after it.
  std::optional<PsTaskStats> ReportedStats() const;
  // Sync mode: where this task's applied steps spent their time, summed over the steps (seconds):
  // each counted push's wait from its arrival to its step's quorum (the barrier), each step's first
  // arrival to its quorum (the slowest worker's lag), the steps' apply, and answering their pushes.
  // All zero in async mode. (Local only: not in the Stats call's answer.)
  struct SyncTiming {
    int64_t steps = 0, pushes = 0;
    double wait_secs = 0, spread_secs = 0, apply_secs = 0, answer_secs = 0;
  };
  SyncTiming sync_timing() const;
  int port() const;  // the bound port

 private:
  class Impl;  // the implementation (src/)
  explicit PsServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace psflow::ps

#endif  // PSFLOW_PS_PS_SERVER_H_
