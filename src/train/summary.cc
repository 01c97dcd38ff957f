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

// The summary's own keys, which a metric may not take.
constexpr const char* kSummaryKeys[] = {"model",       "mode",          "workers",          "ps",
                                        "global_step", "train_seconds", "examples_per_sec", "stale_gradients_dropped",
                                        "ps_traffic",  "staleness"};

}  // namespace

absl::Status CheckMetricName(const std::string& name) {
  if (name.empty()) return absl::InvalidArgumentError("a metric has an empty name; name every returned scalar");
  for (char c : name) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
                    c == '.' || c == '/' || c == '-';
    if (!ok) {
      return absl::InvalidArgumentError(
          absl::StrCat("metric name '", name, "' has a character other than letters, digits and _./-"));
    }
  }
  for (const char* key : kSummaryKeys) {
    if (name == key) {
      return absl::InvalidArgumentError(
          absl::StrCat("metric name '", name, "' is a key of the summary itself; choose another name"));
    }
  }
  return absl::OkStatus();
}

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
  for (const auto& [name, value] :
       {std::pair{"validation_accuracy", s.validation_accuracy},
        std::pair{"validation_cross_entropy", s.validation_cross_entropy}, std::pair{"test_accuracy", s.test_accuracy},
        std::pair{"test_cross_entropy", s.test_cross_entropy}}) {
    if (value.has_value()) out.emplace_back(name, *value);
  }
  return out;
}

// The staleness distribution of `counts` (element i: pushes of staleness i, the last: at least i).
struct Staleness {
  int64_t pushes = 0;
  double mean = 0;
  int64_t p50 = 0, p90 = 0, p99 = 0, max = 0;
  bool max_is_open = false;  // max is the last bucket's lower bound
};
Staleness StalenessOf(const std::vector<int64_t>& counts) {
  Staleness s;
  double sum = 0;
  for (size_t i = 0; i < counts.size(); ++i) {
    s.pushes += counts[i];
    sum += double(counts[i]) * double(i);
    if (counts[i] > 0) s.max = int64_t(i), s.max_is_open = i + 1 == counts.size();
  }
  if (s.pushes == 0) return s;
  s.mean = sum / double(s.pushes);
  auto quantile = [&](double q) {
    int64_t seen = 0;
    for (size_t i = 0; i < counts.size(); ++i) {
      seen += counts[i];
      if (double(seen) >= q * double(s.pushes)) return int64_t(i);
    }
    return int64_t(counts.size()) - 1;
  };
  s.p50 = quantile(0.5), s.p90 = quantile(0.9), s.p99 = quantile(0.99);
  return s;
}

}  // namespace

std::string SummaryToJson(const RunSummary& s) {
  nlohmann::json traffic = nlohmann::json::array();
  for (const PsTraffic& t : s.ps_traffic) {
    nlohmann::json entry = {
        {"task", t.task}, {"bytes_in", t.bytes_in}, {"bytes_out", t.bytes_out}, {"num_params", t.num_params}};
    if (!t.tables.empty()) {
      nlohmann::json tables = nlohmann::json::array();
      for (const TableTraffic& x : t.tables) {
        nlohmann::json table = {{"table", x.table},
                                {"rows", x.rows},
                                {"bytes", x.bytes},
                                {"rows_pulled", x.rows_pulled},
                                {"rows_pushed", x.rows_pushed},
                                {"admissions", x.admissions},
                                {"evictions", x.evictions}};
        if (x.storage == "disk") {
          const int64_t lookups = x.cache_hits + x.cache_misses;
          table["storage"] = x.storage;
          table["cache_hits"] = x.cache_hits;
          table["cache_misses"] = x.cache_misses;
          table["cache_hit_rate"] = lookups > 0 ? Rounded(double(x.cache_hits) / double(lookups)) : 0.0;
          table["cache_bytes"] = x.bytes;  // its rows in the ps task's cache, and its index
          table["disk_bytes"] = x.disk_bytes;
          table["disk_rows_read"] = x.disk_rows_read;
          table["disk_rows_written"] = x.disk_rows_written;
          // Over the training time (the curves in TensorBoard give them per interval).
          table["disk_rows_read_per_sec"] =
              s.train_seconds > 0 ? Rounded(double(x.disk_rows_read) / s.train_seconds) : 0.0;
          table["disk_rows_written_per_sec"] =
              s.train_seconds > 0 ? Rounded(double(x.disk_rows_written) / s.train_seconds) : 0.0;
        }
        tables.push_back(std::move(table));
      }
      entry["tables"] = std::move(tables);
    }
    traffic.push_back(std::move(entry));
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
  for (const auto& [name, value] : s.metrics) j[name] = Rounded(value);
  if (!s.staleness_counts.empty()) {
    const Staleness st = StalenessOf(s.staleness_counts);
    std::vector<int64_t> counts(s.staleness_counts.begin(), s.staleness_counts.begin() + st.max + 1);
    j["staleness"] = {{"pushes", st.pushes},
                      {"mean", Rounded(st.mean)},
                      {"p50", st.p50},
                      {"p90", st.p90},
                      {"p99", st.p99},
                      {"max", st.max},
                      {"max_is_lower_bound", st.max_is_open},
                      {"counts", counts}};
  }
  if (s.ctr.has_value()) {
    const CtrFigures& c = *s.ctr;
    j["ctr"] = {{"test_examples", c.test_examples},  {"test_log_loss", Rounded(c.test_log_loss)},
                {"test_auc", Rounded(c.test_auc)},   {"bayes_log_loss", Rounded(c.bayes_log_loss)},
                {"bayes_auc", Rounded(c.bayes_auc)}, {"table_rows", c.table_rows}};
  }
  return j.dump();
}

std::string FormatSummary(const RunSummary& s) {
  std::string out = absl::StrFormat(
      "final: model=%s mode=%s workers=%d ps=%d global_step=%d train_seconds=%.2f "
      "global_examples_per_sec=%.0f",
      s.model, s.mode, s.workers, s.ps, s.global_step, s.train_seconds, s.examples_per_sec);
  // The line shows the accuracies and cross-entropies that were measured (absent ones are left
  // out), then the evaluation's own scalars.
  for (const auto& [name, value] : Measured(s)) absl::StrAppendFormat(&out, " %s=%.4f", name, value);
  absl::StrAppendFormat(&out, " stale_gradients_dropped=%d", s.stale_gradients_dropped);
  for (const auto& [name, value] : s.metrics) absl::StrAppendFormat(&out, " %s=%.6g", name, value);
  out += "\n";
  if (!s.staleness_counts.empty()) {
    const Staleness st = StalenessOf(s.staleness_counts);
    absl::StrAppendFormat(&out,
                          "  staleness (global steps between pull and apply): pushes=%d mean=%.2f p50=%d p90=%d "
                          "p99=%d max=%d%s\n",
                          st.pushes, st.mean, st.p50, st.p90, st.p99, st.max, st.max_is_open ? "+" : "");
  }
  for (const PsTraffic& t : s.ps_traffic) {
    absl::StrAppendFormat(&out, "  ps %d: params=%d bytes_in=%d bytes_out=%d\n", t.task, t.num_params, t.bytes_in,
                          t.bytes_out);
    for (const TableTraffic& x : t.tables) {
      absl::StrAppendFormat(&out,
                            "    table %s: rows=%d bytes=%d rows_pulled=%d rows_pushed=%d admissions=%d "
                            "evictions=%d",
                            x.table, x.rows, x.bytes, x.rows_pulled, x.rows_pushed, x.admissions, x.evictions);
      if (x.storage == "disk") {
        const int64_t lookups = x.cache_hits + x.cache_misses;
        absl::StrAppendFormat(&out, " disk: cache_hit_rate=%.3f disk_bytes=%d disk_rows_read=%d disk_rows_written=%d",
                              lookups > 0 ? double(x.cache_hits) / double(lookups) : 0.0, x.disk_bytes,
                              x.disk_rows_read, x.disk_rows_written);
      }
      out += "\n";
    }
  }
  if (s.ctr.has_value()) {
    const CtrFigures& c = *s.ctr;
    absl::StrAppendFormat(
        &out, "  ctr: test_log_loss=%.5f (bayes %.5f) test_auc=%.5f (bayes %.5f) on %d examples; table_rows=%d\n",
        c.test_log_loss, c.bayes_log_loss, c.test_auc, c.bayes_auc, c.test_examples, c.table_rows);
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
