#include "train/telemetry.h"

#include "absl/strings/str_cat.h"

namespace psflow::train {

absl::StatusOr<std::unique_ptr<Telemetry>> Telemetry::Create(const TrainOptions& options, bool write_events,
                                                             const std::string& events_subdir, const LogSink& log) {
  std::unique_ptr<Telemetry> t(new Telemetry());
  t->log_ = &log;
  t->summary_every_ = std::max<int64_t>(1, options.save_summaries_steps);
  if (auto s = metrics::DeclarePsflowMetrics(t->registry_); !s.ok()) return s;
  if (options.metrics_port > 0) {
    auto server = metrics::MetricsServer::Start(&t->registry_, options.metrics_port);
    if (!server.ok()) return server.status();
    t->server_ = std::move(server).value();
    log(absl::StrCat("serving Prometheus metrics on http://127.0.0.1:", t->server_->port(), "/metrics"));
  }
  if (write_events && !options.logdir.empty()) {
    const std::string dir = events_subdir.empty() ? options.logdir : options.logdir + "/" + events_subdir;
    auto writer = tboard::EventWriter::Create(dir, options.env);
    if (!writer.ok()) return writer.status();
    t->events_ = std::move(writer).value();
  }
  return t;
}

void Telemetry::SetTrainingMode(const std::string& mode) {
  registry_.SetGauge(metrics::kTrainingMode, {{"mode", mode}}, 1);
}

Telemetry::~Telemetry() {
  if (server_) server_->Stop();
  if (events_) (void)events_->Close();
}

void Telemetry::WriteScalars(const std::vector<std::pair<std::string, float>>& scalars, int64_t step) {
  if (!events_ || events_failed_) return;
  if (auto s = events_->AddScalars(scalars, step); !s.ok()) {
    // A full disk must not stop training; say so once.
    events_failed_ = true;
    (*log_)(absl::StrCat("TensorBoard events disabled: ", s.message()));
  }
}

void Telemetry::OnStep(int64_t global_step, double loss, double accuracy, float learning_rate,
                       int64_t examples_per_step) {
  loss_sum_ += loss;
  accuracy_sum_ += accuracy;
  ++samples_;
  registry_.SetGauge(metrics::kGlobalStep, {}, double(global_step));
  if (last_step_ < 0) {
    last_step_ = global_step;
    last_time_ = Clock::now();
    return;
  }
  if (global_step / summary_every_ == last_step_ / summary_every_) return;
  const auto now = Clock::now();
  const double secs = std::chrono::duration<double>(now - last_time_).count();
  const double steps_per_sec = secs > 0 ? (global_step - last_step_) / secs : 0;
  registry_.SetGauge(metrics::kStepsPerSecond, {}, steps_per_sec);
  WriteScalars({{"loss", float(loss_sum_ / samples_)},
                {"accuracy/batch", float(accuracy_sum_ / samples_)},
                {"learning_rate", learning_rate},
                {"global_step/sec", float(steps_per_sec)},
                {"examples/sec", float(steps_per_sec * examples_per_step)}},
               global_step);
  loss_sum_ = accuracy_sum_ = 0;
  samples_ = 0;
  last_step_ = global_step;
  last_time_ = now;
}

void Telemetry::OnFinal(int64_t global_step, std::optional<double> validation_accuracy,
                        std::optional<double> test_accuracy) {
  registry_.SetGauge(metrics::kGlobalStep, {}, double(global_step));
  std::vector<std::pair<std::string, float>> scalars;
  if (validation_accuracy.has_value()) scalars.emplace_back("accuracy/validation", float(*validation_accuracy));
  if (test_accuracy.has_value()) scalars.emplace_back("accuracy/test", float(*test_accuracy));
  if (!scalars.empty()) WriteScalars(scalars, global_step);
  if (events_) (void)events_->Flush();
}

void Telemetry::OnScalars(const std::vector<std::pair<std::string, double>>& scalars, int64_t global_step) {
  std::vector<std::pair<std::string, float>> values;
  for (const auto& [name, value] : scalars) values.emplace_back(name, float(value));
  WriteScalars(values, global_step);
  if (events_) (void)events_->Flush();
}

void Telemetry::OnPsStats(int task, int64_t global_step, int64_t bytes_in, int64_t bytes_out, int64_t stale,
                          int64_t refused, int64_t connected_workers) {
  registry_.SetGauge(metrics::kConnectedWorkers, {}, double(connected_workers));
  const metrics::MetricsRegistry::Labels ps = {{"ps", absl::StrCat(task)}};
  registry_.SetCounter(metrics::kPsBytesIn, ps, double(bytes_in));
  registry_.SetCounter(metrics::kPsBytesOut, ps, double(bytes_out));
  registry_.SetCounter(metrics::kStaleGradientsDropped, {}, double(stale));
  registry_.SetCounter(metrics::kPushesRefused, {}, double(refused));
  registry_.SetGauge(metrics::kGlobalStep, {}, double(global_step));
  const auto now = Clock::now();
  const double secs = std::chrono::duration<double>(now - last_time_).count();
  if (last_step_ >= 0 && secs > 0) {
    WriteScalars({{"ps/bytes_in_per_sec", float((bytes_in - last_bytes_in_) / secs)},
                  {"ps/bytes_out_per_sec", float((bytes_out - last_bytes_out_) / secs)}},
                 global_step);
  }
  last_step_ = global_step;
  last_time_ = now;
  last_bytes_in_ = bytes_in;
  last_bytes_out_ = bytes_out;
}

void Telemetry::OnPsTableStats(int task, int64_t global_step, const std::vector<ps::TableTaskStats>& tables) {
  if (tables.empty()) return;
  const auto now = Clock::now();
  const double secs = std::chrono::duration<double>(now - tables_time_).count();
  std::vector<std::pair<std::string, float>> scalars;
  for (const ps::TableTaskStats& t : tables) {
    const metrics::MetricsRegistry::Labels labels = {{"ps", absl::StrCat(task)}, {"table", t.table}};
    registry_.SetGauge(metrics::kTableRows, labels, double(t.rows));
    registry_.SetGauge(metrics::kTableBytes, labels, double(t.bytes));
    registry_.SetCounter(metrics::kTableRowsPulled, labels, double(t.rows_pulled));
    registry_.SetCounter(metrics::kTableRowsPushed, labels, double(t.rows_pushed));
    registry_.SetCounter(metrics::kTableAdmissions, labels, double(t.admissions));
    registry_.SetCounter(metrics::kTableEvictions, labels, double(t.evictions));
    scalars.push_back({absl::StrCat("table/", t.table, "/rows"), float(t.rows)});
    const bool disk = t.storage == "disk";
    if (disk) {
      registry_.SetCounter(metrics::kTableCacheHits, labels, double(t.cache_hits));
      registry_.SetCounter(metrics::kTableCacheMisses, labels, double(t.cache_misses));
      registry_.SetGauge(metrics::kTableDiskBytes, labels, double(t.disk_bytes));
      registry_.SetCounter(metrics::kTableDiskRowsRead, labels, double(t.disk_rows_read));
      registry_.SetCounter(metrics::kTableDiskRowsWritten, labels, double(t.disk_rows_written));
      scalars.push_back({absl::StrCat("table/", t.table, "/cache_bytes"), float(t.bytes)});
      scalars.push_back({absl::StrCat("table/", t.table, "/disk_bytes"), float(t.disk_bytes)});
    }
    auto [it, first] = table_rows_moved_.try_emplace(t.table, TableCounters{});
    TableCounters& last = it->second;
    if (!first && secs > 0) {
      scalars.push_back(
          {absl::StrCat("table/", t.table, "/rows_pulled_per_sec"), float((t.rows_pulled - last.rows_pulled) / secs)});
      scalars.push_back(
          {absl::StrCat("table/", t.table, "/rows_pushed_per_sec"), float((t.rows_pushed - last.rows_pushed) / secs)});
      if (disk) {
        const int64_t lookups = (t.cache_hits - last.cache_hits) + (t.cache_misses - last.cache_misses);
        if (lookups > 0) {
          scalars.push_back({absl::StrCat("table/", t.table, "/cache_hit_rate"),
                             float(double(t.cache_hits - last.cache_hits) / double(lookups))});
        }
        scalars.push_back({absl::StrCat("table/", t.table, "/disk_rows_read_per_sec"),
                           float((t.disk_rows_read - last.disk_rows_read) / secs)});
        scalars.push_back({absl::StrCat("table/", t.table, "/disk_rows_written_per_sec"),
                           float((t.disk_rows_written - last.disk_rows_written) / secs)});
      }
    }
    last = {t.rows_pulled, t.rows_pushed, t.cache_hits, t.cache_misses, t.disk_rows_read, t.disk_rows_written};
  }
  tables_time_ = now;
  WriteScalars(scalars, global_step);
}

}  // namespace psflow::train
