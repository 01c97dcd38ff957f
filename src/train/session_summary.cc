// The data work of a worker session's report (train/session_summary.h).
#include "train/session_summary.h"

#include <cmath>
#include <optional>

#include "absl/strings/str_cat.h"
#include "train/worker_roster.h"

namespace psflow::train {

std::string ScalarsText(const std::vector<std::pair<std::string, double>>& scalars) {
  std::string text;
  for (const auto& [name, value] : scalars) absl::StrAppend(&text, text.empty() ? "" : " ", name, "=", value);
  return text;
}

absl::Status CheckEval(const SessionEval& eval) {
  for (const auto& [name, value] : eval.scalars) {
    if (auto s = CheckMetricName(name); !s.ok()) return s;
  }
  return absl::OkStatus();
}

void AddEvalToSummary(const SessionEval& eval, RunSummary* summary) {
  double validation_accuracy = eval.validation_accuracy, validation_cross_entropy = eval.validation_cross_entropy;
  double test_accuracy = eval.test_accuracy, test_cross_entropy = eval.test_cross_entropy;
  // The summary's four fields by name; every other scalar as the caller named it.
  for (const auto& [name, v] : eval.scalars) {
    if (name == "validation_accuracy") {
      validation_accuracy = v;
    } else if (name == "validation_cross_entropy") {
      validation_cross_entropy = v;
    } else if (name == "test_accuracy") {
      test_accuracy = v;
    } else if (name == "test_cross_entropy") {
      test_cross_entropy = v;
    } else {
      summary->metrics.emplace_back(name, v);
    }
  }
  // NaN: not measured, absent from the summary.
  auto value = [](double v) { return std::isnan(v) ? std::nullopt : std::optional<double>(v); };
  summary->validation_accuracy = value(validation_accuracy);
  summary->validation_cross_entropy = value(validation_cross_entropy);
  summary->test_accuracy = value(test_accuracy);
  summary->test_cross_entropy = value(test_cross_entropy);
  summary->ctr = eval.ctr;
}

void AddPsStatsToSummary(const std::vector<ps::PsTaskStats>& stats, int global_step_ps, RunSummary* summary) {
  for (const ps::PsTaskStats& s : stats) {
    std::vector<TableTraffic> tables;
    for (const ps::TableTaskStats& t : s.tables) {
      tables.push_back({t.table, t.rows, t.bytes, t.rows_pulled, t.rows_pushed, t.admissions, t.evictions, t.storage,
                        t.cache_hits, t.cache_misses, t.disk_bytes, t.disk_rows_read, t.disk_rows_written});
    }
    if (summary->ctr.has_value()) {
      for (const ps::TableTaskStats& t : s.tables) summary->ctr->table_rows += t.rows;
    }
    summary->ps_traffic.push_back({s.task, s.bytes_in, s.bytes_out, s.num_params, std::move(tables)});
    // Every ps drops the same stale push; count it once, where the global step lives.
    if (s.task == global_step_ps) {
      summary->stale_gradients_dropped = s.stale_gradients_dropped;
      summary->staleness_counts = s.staleness_counts;
    }
  }
}

void CountWorkersThatPushed(const std::vector<ps::PsTaskStats>& stats, int num_workers,
                            const std::function<void(const std::string&)>& log, RunSummary* summary) {
  if (const int pushed = WorkerRoster::PushedWorkers(stats); pushed > 0) summary->workers = pushed;
  if (const std::string never = WorkerRoster::NeverPushed(stats, num_workers); !never.empty()) {
    log(absl::StrCat("chief: ", never, " never pushed a gradient; the summary counts the ", summary->workers,
                     " worker(s) that did"));
  }
}

absl::Status ReportSummary(const RunSummary& summary, const std::string& metrics_json,
                           const std::function<void(const std::string&)>& log) {
  std::string text = FormatSummary(summary);
  if (!text.empty() && text.back() == '\n') text.pop_back();
  log(text);
  return metrics_json.empty() ? absl::OkStatus() : WriteSummaryJson(summary, metrics_json);
}

}  // namespace psflow::train
