// psflow/train/summary.h — the final summary of a run (docs/design.md#command-line-and-summary):
// printed at the end and written as JSON by --metrics_json. A plain value type.
#ifndef PSFLOW_TRAIN_SUMMARY_H_
#define PSFLOW_TRAIN_SUMMARY_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "psflow/io/env.h"

namespace psflow::train {

struct PsTraffic {
  int task = 0;
  int64_t bytes_in = 0, bytes_out = 0, num_params = 0;
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
  std::vector<PsTraffic> ps_traffic;
};

// Measured figures are rounded to 7 significant digits (float32's precision: no "0.9696000218391418").
std::string SummaryToJson(const RunSummary& summary);
// Human-readable block ("final: model=mlp mode=async ... test_accuracy=0.9791") plus the JSON.
std::string FormatSummary(const RunSummary& summary);
// Writes the JSON atomically through `env` (io::WriteFileAtomically: the previous file stays
// whole on failure); one line naming the path and the cause on failure.
absl::Status WriteSummaryJson(const RunSummary& summary, const std::string& path, io::Env* env = io::Env::Default());

}  // namespace psflow::train

#endif  // PSFLOW_TRAIN_SUMMARY_H_
