// bench/table_worker.h — what the table benches' worker programs share (table_scale_worker,
// disk_tier_40gb_worker, disk_tier_ps_worker): their own `--key=N` arguments beside psflow's
// flags, the session of one table beside a dense bias, the job's --table_* flags on a table, and a
// WorkerSession's loop run to its end. Header-only; each worker owns its session.
#ifndef PSFLOW_BENCH_TABLE_WORKER_H_
#define PSFLOW_BENCH_TABLE_WORKER_H_

#include <cstdint>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "psflow/core/tensor.h"
#include "psflow/dist/table_spec.h"
#include "psflow/train/session.h"

namespace psflow::bench {

// Sets each `--key=N` of `unparsed` (N a non-negative integer) through `ints`. An argument that is
// not one of them goes to `other` (may be null), which returns nullopt when it does not know the
// key either. Anything unknown or malformed is refused naming it, then `usage`.
inline absl::Status ParseIntArgs(
    const std::vector<std::string>& unparsed, const std::map<std::string, int64_t*>& ints,
    const std::function<std::optional<absl::Status>(const std::string& key, const std::string& value)>& other,
    const std::string& usage) {
  for (const std::string& arg : unparsed) {
    const size_t eq = arg.find('=');
    const std::string key = arg.substr(0, eq), value = eq == std::string::npos ? "" : arg.substr(eq + 1);
    const auto it = ints.find(key);
    if (it != ints.end() && !value.empty() && value.size() < 19 &&
        value.find_first_not_of("0123456789") == std::string::npos) {
      *it->second = std::stoll(value);
      continue;
    }
    if (it == ints.end() && other) {
      if (std::optional<absl::Status> s = other(key, value); s.has_value()) {
        if (!s->ok()) return *s;
        continue;
      }
    }
    return absl::InvalidArgumentError("unknown or bad argument '" + arg + "'; give " + usage);
  }
  return absl::OkStatus();
}

// The job's --table_* flags (--table_storage=disk, ...) on `spec`, by the one setter the models use
// (dist::SetTableField). InvalidArgument naming a bad one.
inline absl::Status ApplyTableFlags(const train::TrainOptions& options, dist::TableSpec* spec) {
  for (const auto& [name, text] : options.table_options) {
    if (absl::Status s = dist::SetTableField(spec, name, text); !s.ok()) return s;
  }
  return absl::OkStatus();
}

// A worker session of `table` and a dense bias beside it, as in any model (its gradient stays
// zero), reporting as `model_name`. The table takes the job's --seed and --table_* flags
// (ApplyTableFlags); a bad flag is InvalidArgument naming it. The bias lives here, beside the
// session that points at it.
struct TableSession {
  Tensor bias = Tensor({1}, 0.0f);
  Tensor bias_grad = Tensor({1}, 0.0f);
  std::unique_ptr<train::WorkerSession> session;
};
inline absl::StatusOr<std::unique_ptr<TableSession>> OpenTableSession(const train::TrainOptions& options,
                                                                      dist::TableSpec table,
                                                                      const std::string& model_name) {
  table.initializer.seed = options.seed;
  if (absl::Status s = ApplyTableFlags(options, &table); !s.ok()) return s;
  auto t = std::make_unique<TableSession>();
  train::WorkerSession::Options session_options;
  session_options.train = options;
  session_options.model_name = model_name;
  auto session = train::WorkerSession::Create(session_options, {{"bias", &t->bias, &t->bias_grad}}, {table});
  if (!session.ok()) return session.status();
  t->session = *std::move(session);
  return t;
}

// Runs `loop` (which opens the session and steps it), aborts the session on its error, then closes
// it. Returns the program's exit code: 0, or 1 after a line `program: what went wrong` on stderr.
inline int RunToEnd(const char* program, train::WorkerSession& s, const std::function<absl::Status()>& loop) {
  if (absl::Status st = loop(); !st.ok()) {
    s.Abort(st);
    std::cerr << program << ": " << st.message() << "\n";
    return 1;
  }
  if (auto summary = s.Close(); !summary.ok()) {
    std::cerr << program << ": " << summary.status().message() << "\n";
    return 1;
  }
  return 0;
}

}  // namespace psflow::bench

#endif  // PSFLOW_BENCH_TABLE_WORKER_H_
