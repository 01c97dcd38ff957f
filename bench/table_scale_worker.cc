// table_scale_worker — the worker of bench/table_scale.py: one embedding table on the ps tasks,
// driven at full speed by one worker that holds only each step's rows. It measures what a table's
// size costs the tasks (peak RSS, read by the driver) and how fast a dynamic table creates rows.
//
//   --table=fixed    a fixed [--rows, --dim] div table; each step looks up --ids_per_step ids drawn
//                    uniformly from [0, rows) (a stream of (seed, step)) and pushes a gradient row
//                    for each: the update rule touches rows all over the table.
//   --table=dynamic  a dynamic table of --dim with --max_rows and --evict_every; each step's ids are
//                    new ids never seen before (step·U + i, scrambled so they spread over the ps
//                    tasks like hashed ids): every push creates U rows, eviction keeps each ps's
//                    share at most ⌈max_rows/P⌉ (+ the rows created between two passes).
// Any psflow flag applies (--sparse_optimizer, --train_steps, the cluster's flags). The chief's
// summary (--metrics_json) carries the tables' rows, evictions and rows pushed per ps.
#include <cstdint>
#include <iostream>
#include <string>
#include <vector>

#include "psflow/cli/flags.h"
#include "psflow/core/random.h"
#include "psflow/dist/table_routing.h"
#include "psflow/train/session.h"
#include "table_worker.h"

namespace {

struct Args {
  std::string table = "fixed";
  int64_t rows = 100000, dim = 64, ids_per_step = 4096, max_rows = 0, evict_every = 100;
};

// The program's own flags (psflow's are parsed by ParseFlags); one line on a bad one.
absl::StatusOr<Args> ParseArgs(const std::vector<std::string>& unparsed) {
  Args a;
  const absl::Status parsed = psflow::bench::ParseIntArgs(
      unparsed,
      {{"--rows", &a.rows},
       {"--dim", &a.dim},
       {"--ids_per_step", &a.ids_per_step},
       {"--max_rows", &a.max_rows},
       {"--evict_every", &a.evict_every}},
      [&a](const std::string& key, const std::string& value) -> std::optional<absl::Status> {
        if (key != "--table" || (value != "fixed" && value != "dynamic")) return std::nullopt;
        a.table = value;
        return absl::OkStatus();
      },
      "--table=fixed|dynamic, --rows=N, --dim=N, --ids_per_step=N, --max_rows=N, --evict_every=N "
      "(non-negative integers)");
  if (!parsed.ok()) return parsed;
  if (a.rows < 1 || a.dim < 1 || a.ids_per_step < 1) {
    return absl::InvalidArgumentError("--rows, --dim and --ids_per_step must be positive");
  }
  return a;
}

int Run(int argc, char** argv) {
  auto flags = psflow::cli::ParseFlags(argc, argv);
  if (!flags.ok()) {
    std::cerr << "table_scale_worker: " << flags.status().message() << "\n";
    return 2;
  }
  auto args = ParseArgs(flags->unparsed);
  if (!args.ok()) {
    std::cerr << "table_scale_worker: " << args.status().message() << "\n";
    return 2;
  }
  const psflow::train::TrainOptions& o = flags->options;
  psflow::dist::TableSpec table;
  table.name = "scale";
  table.dim = args->dim;
  table.kind = args->table == "dynamic" ? psflow::dist::TableKind::kDynamic : psflow::dist::TableKind::kFixed;
  table.num_embeddings = table.dynamic() ? 0 : args->rows;
  table.lifecycle.max_rows = args->max_rows;
  table.lifecycle.evict_every = args->evict_every;

  auto opened = psflow::bench::OpenTableSession(o, table, "table_scale");  // the table beside a dense bias
  if (!opened.ok()) {
    std::cerr << "table_scale_worker: " << opened.status().message() << "\n";
    return 2;
  }
  psflow::train::WorkerSession& s = *(*opened)->session;
  auto loop = [&]() -> absl::Status {
    if (auto st = s.Open(); !st.ok()) return st;
    std::vector<int64_t> ids(static_cast<size_t>(args->ids_per_step));
    int64_t pushes = 0;  // this worker's: dynamic ids are new on every push
    while (!s.ShouldStop()) {
      const int64_t step = s.data_step();
      psflow::Rng rng(psflow::Rng::Mix(o.seed, static_cast<uint64_t>(step)));
      for (size_t i = 0; i < ids.size(); ++i) {
        if (table.dynamic()) {
          const uint64_t n = static_cast<uint64_t>(pushes) * ids.size() + i;
          ids[i] = static_cast<int64_t>(psflow::dist::Mix64(n));  // distinct: Mix64 is a bijection
        } else {
          ids[i] = static_cast<int64_t>(rng.UniformInt(static_cast<uint64_t>(args->rows)));
        }
      }
      ++pushes;
      if (auto st = s.Lookup({ids}); !st.ok()) return st;
      psflow::train::TableBatch& b = s.table_batch(0);
      b.grads = psflow::Tensor(b.rows.shape(), 0.01f);
      if (auto st = s.Step(0.0); !st.ok()) return st;
    }
    return absl::OkStatus();
  };
  return psflow::bench::RunToEnd("table_scale_worker", s, loop);
}

}  // namespace

int main(int argc, char** argv) { return Run(argc, argv); }
