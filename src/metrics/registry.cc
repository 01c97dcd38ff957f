#include <charconv>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/check.h"
#include "psflow/metrics/metrics_server.h"

namespace psflow::metrics {
namespace {

bool IsMetricName(std::string_view name) {
  if (name.empty()) return false;
  for (size_t i = 0; i < name.size(); ++i) {
    const char c = name[i];
    const bool ok =
        (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == ':' || (i > 0 && c >= '0' && c <= '9');
    if (!ok) return false;
  }
  return true;
}

bool IsLabelName(std::string_view name) {
  return IsMetricName(name) && name.find(':') == std::string_view::npos && !name.starts_with("__");
}

// Escapes as the text format asks: backslash and newline everywhere, double quote in label values.
std::string Escape(std::string_view text, bool quote) {
  std::string out;
  out.reserve(text.size());
  for (const char c : text) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '"' && quote) {
      out += "\\\"";
    } else {
      out += c;
    }
  }
  return out;
}

// Prometheus parses values with Go's ParseFloat: the shortest round-trip form, and +Inf/-Inf/NaN.
std::string FormatValue(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "+Inf" : "-Inf";
  char buffer[32];
  const std::to_chars_result result = std::to_chars(buffer, buffer + sizeof(buffer), value);
  return std::string(buffer, result.ptr);
}

}  // namespace

absl::Status MetricsRegistry::Declare(const std::string& name, Type type, const std::string& help,
                                      std::vector<std::string> label_names) {
  if (!IsMetricName(name)) {
    return absl::InvalidArgumentError(absl::StrCat("invalid metric name \"", name,
                                                   "\": use letters, digits, '_' and ':', not starting with a digit"));
  }
  for (const std::string& label : label_names) {
    if (!IsLabelName(label)) {
      return absl::InvalidArgumentError(absl::StrCat("invalid label name \"", label, "\" for metric ", name,
                                                     ": use letters, digits and '_', not starting with a digit or __"));
    }
  }
  absl::MutexLock lock(&mu_);
  auto it = families_.find(name);
  if (it != families_.end()) {
    const Family& f = it->second;
    if (f.type == type && f.help == help && f.label_names == label_names) return absl::OkStatus();
    return absl::AlreadyExistsError(
        absl::StrCat("metric ", name, " is already declared with another type, help or labels"));
  }
  Family& family = families_[name];
  family.type = type;
  family.help = help;
  family.label_names = std::move(label_names);
  if (family.label_names.empty()) family.samples[{}] = 0;
  return absl::OkStatus();
}

void MetricsRegistry::SetGauge(std::string_view name, const Labels& labels, double value) {
  Update(name, labels, value, Op::kSetGauge);
}

void MetricsRegistry::AddCounter(std::string_view name, const Labels& labels, double delta) {
  CHECK(delta >= 0) << "counter " << name << " can only go up, got delta " << delta;
  Update(name, labels, delta, Op::kAddCounter);
}

void MetricsRegistry::SetCounter(std::string_view name, const Labels& labels, double total) {
  Update(name, labels, total, Op::kSetCounter);
}

void MetricsRegistry::Update(std::string_view name, const Labels& labels, double value, Op op) {
  absl::MutexLock lock(&mu_);
  auto it = families_.find(name);
  CHECK(it != families_.end()) << "metric " << name << " was not declared";
  Family& family = it->second;
  CHECK(op == Op::kSetAny || (op == Op::kSetGauge) == (family.type == Type::kGauge))
      << "metric " << name << " is a " << (family.type == Type::kGauge ? "gauge" : "counter");
  CHECK_EQ(labels.size(), family.label_names.size())
      << "metric " << name << " takes labels {" << absl::StrJoin(family.label_names, ",") << "}";
  std::vector<std::string> values;
  values.reserve(labels.size());
  for (size_t i = 0; i < labels.size(); ++i) {
    CHECK_EQ(labels[i].first, family.label_names[i])
        << "metric " << name << " takes labels {" << absl::StrJoin(family.label_names, ",") << "} in that order";
    values.push_back(labels[i].second);
  }
  double& sample = family.samples[std::move(values)];
  sample = op == Op::kAddCounter ? sample + value : value;
}

int MetricsRegistry::RegisterCallback(Callback callback) {
  absl::MutexLock lock(&callbacks_mu_);
  const int id = next_callback_id_++;
  callbacks_.emplace(id, std::move(callback));
  return id;
}

void MetricsRegistry::UnregisterCallback(int id) {
  absl::MutexLock lock(&callbacks_mu_);
  callbacks_.erase(id);
}

std::string MetricsRegistry::Render() {
  {
    // The callbacks run without mu_ held, so they may call the setters (or take their own locks).
    absl::MutexLock lock(&callbacks_mu_);
    Snapshot snapshot;
    for (auto& [id, callback] : callbacks_) callback(snapshot);
    for (const Snapshot::Value& v : snapshot.values_) Update(v.name, v.labels, v.value, Op::kSetAny);
  }
  std::string out;
  absl::MutexLock lock(&mu_);
  for (const auto& [name, family] : families_) {
    if (family.samples.empty()) continue;
    absl::StrAppend(&out, "# HELP ", name, " ", Escape(family.help, /*quote=*/false), "\n");
    absl::StrAppend(&out, "# TYPE ", name, " ", family.type == Type::kGauge ? "gauge" : "counter", "\n");
    for (const auto& [label_values, value] : family.samples) {
      out += name;
      if (!label_values.empty()) {
        out += '{';
        for (size_t i = 0; i < label_values.size(); ++i) {
          absl::StrAppend(&out, i ? "," : "", family.label_names[i], "=\"", Escape(label_values[i], /*quote=*/true),
                          "\"");
        }
        out += '}';
      }
      absl::StrAppend(&out, " ", FormatValue(value), "\n");
    }
  }
  return out;
}

absl::Status DeclarePsflowMetrics(MetricsRegistry& registry) {
  using Type = MetricsRegistry::Type;
  const struct {
    const char* name;
    Type type;
    const char* help;
    std::vector<std::string> labels;
  } kMetrics[] = {
      {kGlobalStep, Type::kGauge, "Global step of the training job as last seen by this task.", {}},
      {kStepsPerSecond, Type::kGauge, "Global steps per second over the last measurement interval.", {}},
      {kPsBytesIn, Type::kCounter, "Bytes received by parameter-server task ps.", {"ps"}},
      {kPsBytesOut, Type::kCounter, "Bytes sent by parameter-server task ps.", {"ps"}},
      {kStaleGradientsDropped, Type::kCounter, "Gradients dropped for being too stale.", {}},
      {kPushesRefused, Type::kCounter, "Gradient pushes refused by the parameter servers.", {}},
      {kConnectedWorkers, Type::kGauge, "Workers currently connected.", {}},
      {kTrainingMode, Type::kGauge, "1 for this worker's training mode: async, sync or hybrid (sync dense, async tables).",
       {"mode"}},
      {kTableRows, Type::kGauge, "Rows of an embedding table held by parameter-server task ps.", {"ps", "table"}},
      {kTableBytes, Type::kGauge, "Bytes of an embedding table held by parameter-server task ps.", {"ps", "table"}},
      {kTableRowsPulled, Type::kCounter, "Embedding table rows answered to pulls by task ps.", {"ps", "table"}},
      {kTableRowsPushed, Type::kCounter, "Embedding table gradient rows received by task ps.", {"ps", "table"}},
      {kTableAdmissions, Type::kCounter, "Embedding table rows created on task ps.", {"ps", "table"}},
      {kTableEvictions, Type::kCounter, "Embedding table rows removed by eviction on task ps.", {"ps", "table"}},
      {kTableCacheHits, Type::kCounter, "Disk table rows found in task ps's row cache.", {"ps", "table"}},
      {kTableCacheMisses, Type::kCounter, "Disk table rows looked up on disk by task ps.", {"ps", "table"}},
      {kTableDiskBytes, Type::kGauge, "Bytes of a disk table's files on task ps.", {"ps", "table"}},
      {kTableDiskRowsRead, Type::kCounter, "Disk table rows read from disk into task ps's cache.", {"ps", "table"}},
      {kTableDiskRowsWritten, Type::kCounter, "Disk table rows written back to disk by task ps.", {"ps", "table"}},
  };
  for (const auto& m : kMetrics) {
    if (absl::Status status = registry.Declare(m.name, m.type, m.help, m.labels); !status.ok()) return status;
  }
  return absl::OkStatus();
}

}  // namespace psflow::metrics
