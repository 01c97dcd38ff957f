// psflow/train/summary.h — the final summary of a run (docs/design.md#command-line-and-summary):
// printed at the end and written as JSON by --metrics_json. A plain value type.
#ifndef PSFLOW_TRAIN_SUMMARY_H_
#define PSFLOW_TRAIN_SUMMARY_H_

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "psflow/io/env.h"

namespace psflow::train {

// One embedding table's part on one ps task (ps::TableTaskStats): rows and bytes held, and the
// cumulative rows pulled and pushed, admissions and evictions.
struct TableTraffic {
  std::string table;  // the shard's name (NAME/part_I or NAME)
  int64_t rows = 0, bytes = 0, rows_pulled = 0, rows_pushed = 0, admissions = 0, evictions = 0;
  // Storage (docs/table-storage.md): "memory" or "disk"; a disk table's `bytes` are its rows in the
  // ps's cache, and the JSON adds the cache and disk counters below (0 for memory tables).
  std::string storage = "memory";
  int64_t cache_hits = 0, cache_misses = 0, disk_bytes = 0, disk_rows_read = 0, disk_rows_written = 0;
};

struct PsTraffic {
  int task = 0;
  int64_t bytes_in = 0, bytes_out = 0, num_params = 0;
  std::vector<TableTraffic> tables;  // "tables" in the JSON only when the job has tables
};

// The ctr model's figures: test log-loss and AUC beside the generator's Bayes values on the same
// test set (docs/tables.md#semantics), and the rows its tables hold at the end.
struct CtrFigures {
  int64_t test_examples = 0;
  double test_log_loss = 0, test_auc = 0;
  double bayes_log_loss = 0, bayes_auc = 0;
  int64_t table_rows = 0;
};

struct RunSummary {
  std::string model;
  std::string mode;  // single | async | sync
  int workers = 1, ps = 0;
  int64_t global_step = 0;
  double train_seconds = 0, examples_per_sec = 0;
  // Absent when not measured (a PyTorch evaluate() may return only some): left out of the summary
  // line and the JSON, never printed as 0.
  std::optional<double> test_accuracy, validation_accuracy;
  std::optional<double> validation_cross_entropy, test_cross_entropy;
  int64_t stale_gradients_dropped = 0;
  // Async: pushes by staleness τ (ps::PsTaskStats::staleness_counts of the global step's ps): the
  // summary's "staleness" block (pushes, mean, p50, p90, p99, max, counts). Empty: no block.
  std::vector<int64_t> staleness_counts;
  std::vector<PsTraffic> ps_traffic;
  // The evaluation's other scalars (SessionEval::scalars), by their own names, after the fixed
  // fields on the summary line and as top-level keys of the JSON.
  std::vector<std::pair<std::string, double>> metrics;
  std::optional<CtrFigures> ctr;  // --model=ctr only
};

// OK when `name` can be a metric of the summary: non-empty, of letters, digits and "_./-", and
// not a key the summary has already (model, global_step, ...; the four accuracy / cross-entropy
// names are the summary's own fields and are accepted). InvalidArgument naming it otherwise.
absl::Status CheckMetricName(const std::string& name);

// Measured figures are rounded to 7 significant digits (float32's precision: no "0.9696000218391418").
std::string SummaryToJson(const RunSummary& summary);
// Human-readable block ("final: model=mlp mode=async ... test_accuracy=0.9791") plus the JSON.
std::string FormatSummary(const RunSummary& summary);
// Writes the JSON atomically through `env` (io::WriteFileAtomically: the previous file stays
// whole on failure); one line naming the path and the cause on failure.
absl::Status WriteSummaryJson(const RunSummary& summary, const std::string& path, io::Env* env = io::Env::Default());

}  // namespace psflow::train

#endif  // PSFLOW_TRAIN_SUMMARY_H_
