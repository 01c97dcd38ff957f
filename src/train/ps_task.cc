// A parameter-server task: serve the variables placed on it until the chief reports the end of
// training, then return so the process exits 0 (TF's server.join() never returned).
#include "train/ps_task.h"

#include <algorithm>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/notification.h"
#include "psflow/ps/ps_server.h"
#include "psflow/train/train.h"
#include "train/cluster_setup.h"
#include "train/telemetry.h"

namespace psflow::train {
namespace {

// The traffic as the chief's table shows it (its final Stats call; ps_server.h, ReportedStats):
// the calls after it (that Stats answer, the Shutdown, Goodbyes: a few dozen bytes) are left out,
// so that the two agree for a reader.
std::string TrafficText(const ps::PsTaskStats& now, const std::optional<ps::PsTaskStats>& reported) {
  const ps::PsTaskStats& shown = reported.has_value() ? *reported : now;
  return absl::StrCat(shown.bytes_in, " bytes in, ", shown.bytes_out, " bytes out");
}

// Sync: where this task's steps spent their time (bench/ctr_many_workers.py reads the line).
std::string SyncTimingText(int task, const ps::PsServer::SyncTiming& s) {
  const double steps = static_cast<double>(s.steps), pushes = static_cast<double>(std::max<int64_t>(1, s.pushes));
  return absl::StrFormat(
      "ps task %d sync timing: %d steps of %.1f pushes; a push waited for its step's quorum %.2f ms on average, the "
      "step's first push %.2f ms (first arrival to quorum); apply %.2f ms, answering the step's pushes %.2f ms "
      "per step",
      task, s.steps, static_cast<double>(s.pushes) / steps, 1e3 * s.wait_secs / pushes, 1e3 * s.spread_secs / steps,
      1e3 * s.apply_secs / steps, 1e3 * s.answer_secs / steps);
}

}  // namespace

absl::Status RunParameterServer(const TrainOptions& options, const LogSink& log) {
  return RunParameterServer(options, log, nullptr);
}

absl::Status RunParameterServer(const TrainOptions& options, const LogSink& log, PsTaskControl* control) {
  auto setup = SetUpTask(options, control != nullptr ? control->tf_config : std::nullopt);
  if (!setup.ok()) return setup.status();
  ps::PsServer::Options server_options;
  server_options.listen_address = setup->cluster.address(setup->task);
  server_options.task_index = setup->task.index;
  server_options.cluster = setup->cluster;
  server_options.security = setup->security;
  server_options.init_timeout_secs = options.init_timeout_secs;
  server_options.idle_timeout_secs = options.worker_timeout_secs;
  // A ps task given a --table_dir opens its disk tier: the tables that declare storage=disk (the
  // --table_storage flag's, or a PyTorch table's own) keep their rows there.
  server_options.table_storage = options.table_dir.empty() ? "memory" : "disk";
  server_options.table_dir = options.table_dir;
  server_options.table_cache_bytes = options.table_cache_bytes;
  server_options.table_scan_timeout_secs = options.table_scan_timeout_secs;
  auto server = ps::PsServer::Start(server_options);
  if (!server.ok()) return server.status();
  log(absl::StrCat("ps task ", setup->task.index, " serving on ", server_options.listen_address));
  if (control != nullptr) control->serving = true;
  auto telemetry = Telemetry::Create(options, /*write_events=*/true, absl::StrCat("ps_", setup->task.index), log);
  if (!telemetry.ok()) return telemetry.status();

  // Sample the traffic counters once a second for TensorBoard and /metrics until training ends
  // (and, embedded in Python, look for a stop request every 0.1 s).
  absl::Notification done;
  bool stopped = false;  // written by the sampler only; read after it is joined
  std::thread sampler([&] {
    const absl::Duration period = control != nullptr ? absl::Milliseconds(100) : absl::Seconds(1);
    absl::Time next_sample = absl::Now() + absl::Seconds(1);
    while (!done.WaitForNotificationWithTimeout(period)) {
      if (control != nullptr && control->stop.load() && !stopped) {
        stopped = true;
        (*server)->Stop();
      }
      if (absl::Now() < next_sample) continue;
      next_sample += absl::Seconds(1);
      const ps::PsTaskStats s = (*server)->Stats();
      (*telemetry)
          ->OnPsStats(s.task, s.global_step, s.bytes_in, s.bytes_out, s.stale_gradients_dropped, s.pushes_refused,
                      s.connected_workers);
      (*telemetry)->OnPsTableStats(s.task, s.global_step, s.tables);
    }
  });
  absl::Status status = (*server)->Wait();
  done.Notify();
  sampler.join();
  if (stopped) return absl::CancelledError(absl::StrCat("ps task ", setup->task.index, " interrupted"));
  const ps::PsTaskStats stats = (*server)->Stats();
  (*telemetry)
      ->OnPsStats(stats.task, stats.global_step, stats.bytes_in, stats.bytes_out, stats.stale_gradients_dropped,
                  stats.pushes_refused, stats.connected_workers);
  (*telemetry)->OnPsTableStats(stats.task, stats.global_step, stats.tables);
  if (status.ok()) {
    log(absl::StrCat("ps task ", setup->task.index, " done at global step ", stats.global_step, ": ", stats.num_params,
                     " params, ", TrafficText(stats, (*server)->ReportedStats())));
    if (const ps::PsServer::SyncTiming t = (*server)->sync_timing(); t.steps > 0) {
      log(SyncTimingText(setup->task.index, t));
    }
  }
  return status;
}

}  // namespace psflow::train
