#include "psflow/train/summary.h"

#include <cmath>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "nlohmann/json.hpp"

namespace psflow::train {

namespace {

// 7 significant digits: float32's precision, and what the figures mean; nlohmann prints the
// shortest text of the rounded double ("0.9696", not "0.9696000218391418").
double Rounded(double v) {
  if (!std::isfinite(v) || v == 0) return v;
  return std::stod(absl::StrFormat("%.7g", v));
}

// The measured metrics present, in print order.
std::vector<std::pair<const char*, double>> Measured(const RunSummary& s) {
  std::vector<std::pair<const char*, double>> out;
  for (const auto& [name, value] : {std::pair{"validation_accuracy", s.validation_accuracy},
                                    std::pair{"validation_cross_entropy", s.validation_cross_entropy},
                                    std::pair{"test_accuracy", s.test_accuracy},
                                    std::pair{"test_cross_entropy", s.test_cross_entropy}}) {
    if (value.has_value()) out.emplace_back(name, *value);
  }
  return out;
}

}  // namespace

std::string SummaryToJson(const RunSummary& s) {
  nlohmann::json traffic = nlohmann::json::array();
  for (const PsTraffic& t : s.ps_traffic) {
    traffic.push_back({{"task", t.task}, {"bytes_in", t.bytes_in}, {"bytes_out", t.bytes_out},
                       {"num_params", t.num_params}});
  }
  nlohmann::json j = {{"model", s.model},
                      {"mode", s.mode},
                      {"workers", s.workers},
                      {"ps", s.ps},
                      {"global_step", s.global_step},
                      {"train_seconds", Rounded(s.train_seconds)},
                      {"examples_per_sec", Rounded(s.examples_per_sec)},
                      {"stale_gradients_dropped", s.stale_gradients_dropped},
                      {"ps_traffic", traffic}};
  for (const auto& [name, value] : Measured(s)) j[name] = Rounded(value);
  return j.dump();
}

std::string FormatSummary(const RunSummary& s) {
  std::string out = absl::StrFormat("final: model=%s mode=%s workers=%d ps=%d global_step=%d train_seconds=%.2f "
                                    "examples_per_sec=%.0f",
                                    s.model, s.mode, s.workers, s.ps, s.global_step, s.train_seconds,
                                    s.examples_per_sec);
  // The line shows accuracies and the validation cross-entropy; the JSON has every metric.
  for (const auto& [name, value] : Measured(s)) {
    if (std::string_view(name) != "test_cross_entropy") absl::StrAppendFormat(&out, " %s=%.4f", name, value);
  }
  absl::StrAppendFormat(&out, " stale_gradients_dropped=%d\n", s.stale_gradients_dropped);
  for (const PsTraffic& t : s.ps_traffic) {
    absl::StrAppendFormat(&out, "  ps %d: params=%d bytes_in=%d bytes_out=%d\n", t.task, t.num_params,
                          t.bytes_in, t.bytes_out);
  }
  return out + "summary_json: " + SummaryToJson(s) + "\n";
}

absl::Status WriteSummaryJson(const RunSummary& summary, const std::string& path, io::Env* env) {
  const std::string json = SummaryToJson(summary) + "\n";
  if (absl::Status s = io::WriteFileAtomically(env, path, {json}); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat("cannot write --metrics_json=", path, ": ", s.message()));
  }
  return absl::OkStatus();
}

}  // namespace psflow::train
