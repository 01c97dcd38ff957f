// What a task reports while it runs: TensorBoard scalars under --logdir (the chief's training
// curves; each ps task's traffic in its own ps_N/ subdirectory) and Prometheus metrics on
// --metrics_port. Either may be off. Owned by the task's runner; OnStep is called from the
// training thread only, the metrics server scrapes from its own thread through the registry.
#ifndef PSFLOW_TRAIN_TELEMETRY_H_
#define PSFLOW_TRAIN_TELEMETRY_H_

#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "psflow/metrics/metrics_server.h"
#include "psflow/ps/ps_types.h"
#include "psflow/tboard/event_writer.h"
#include "psflow/train/options.h"
#include "psflow/train/train.h"

namespace psflow::train {

class Telemetry {
 public:
  // `events_subdir` is appended to --logdir ("" for the chief, "ps_0" for ps task 0); events are
  // written only when `write_events` (non-chief workers leave the curves to the chief).
  static absl::StatusOr<std::unique_ptr<Telemetry>> Create(const TrainOptions& options, bool write_events,
                                                           const std::string& events_subdir, const LogSink& log);
  ~Telemetry();

  // A worker's step: updates gauges, and every --save_summaries_steps global steps writes loss,
  // batch accuracy, learning rate, global_step/sec and examples/sec.
  void OnStep(int64_t global_step, double loss, double accuracy, float learning_rate, int64_t examples_per_step);
  // Final accuracies (chief / single process); absent ones are not written.
  void OnFinal(int64_t global_step, std::optional<double> validation_accuracy, std::optional<double> test_accuracy);
  // The caller's own scalars (an evaluation, WorkerSession::LogScalars) at `global_step`, flushed.
  void OnScalars(const std::vector<std::pair<std::string, double>>& scalars, int64_t global_step);
  // A ps task's counters: traffic rates as TensorBoard curves, totals as Prometheus counters.
  void OnPsStats(int task, int64_t global_step, int64_t bytes_in, int64_t bytes_out, int64_t stale, int64_t refused,
                 int64_t connected_workers);

  // A ps task's tables (rows, bytes, cumulative rows pulled/pushed, admissions, evictions): gauges
  // and counters per table, and TensorBoard curves table/NAME/{rows,rows_pulled_per_sec,
  // rows_pushed_per_sec}.
  void OnPsTableStats(int task, int64_t global_step, const std::vector<ps::TableTaskStats>& tables);

  // A worker's training mode ("async", "sync" or "hybrid"): psflow_training_mode{mode="..."} 1.
  void SetTrainingMode(const std::string& mode);

  metrics::MetricsRegistry& registry() { return registry_; }

 private:
  Telemetry() = default;
  void WriteScalars(const std::vector<std::pair<std::string, float>>& scalars, int64_t step);

  const LogSink* log_ = nullptr;
  int64_t summary_every_ = 100;
  metrics::MetricsRegistry registry_;
  std::unique_ptr<metrics::MetricsServer> server_;
  std::unique_ptr<tboard::EventWriter> events_;
  bool events_failed_ = false;
  // Rates over the interval since the last summary.
  using Clock = std::chrono::steady_clock;
  Clock::time_point last_time_ = Clock::now();
  int64_t last_step_ = -1;  // step of the last summary written (or of the first step seen)
  int64_t last_bytes_in_ = 0, last_bytes_out_ = 0;
  // Tables: each shard's counters at the last OnPsTableStats (rows pulled and pushed; a disk
  // table's cache hits and misses, rows read and written), and when.
  struct TableCounters {
    int64_t rows_pulled = 0, rows_pushed = 0, cache_hits = 0, cache_misses = 0, disk_rows_read = 0,
            disk_rows_written = 0;
  };
  Clock::time_point tables_time_ = Clock::now();
  std::map<std::string, TableCounters> table_rows_moved_;
  double loss_sum_ = 0, accuracy_sum_ = 0;
  int64_t samples_ = 0;
};

}  // namespace psflow::train

#endif  // PSFLOW_TRAIN_TELEMETRY_H_
