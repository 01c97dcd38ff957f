// disk_tier_ps_worker — the worker of bench/disk_tier_ps.py: the in-process disk bench's table and
// ids (bench/disk_table_bench.cc) driven through a real ps task over gRPC, so rows/s pulled and
// pushed are what a worker sees (memory tier vs disk tier at a given cache hit rate).
//
//   fill     steps [0, rows / batch): step s pulls and pushes the rows [s·batch, (s+1)·batch)
//            (every row created; most leave the disk tier's cache for RocksDB);
//   warm     --warm_steps steps pulling and pushing the hot set (every (rows / hot)-th row);
//   measure  the remaining --train_steps: each step takes --batch unique ids, each with probability
//            --hot_percent/100 from the hot set, else uniform over the table; Lookup (one Pull per
//            ps) and Step (the push, one PushAndPull per ps) are timed apart.
// Ids are row · 0x9e3779b97f4a7c1 (mod 2^64), spread as hashed ids are. It prints "phase measure
// begins" and "phase measure ends" (and sleeps 2 s after each) so the driver can read the ps
// task's counters and CPU time at both, then "measure: ..." with the rates. Any psflow flag applies.
#include <chrono>
#include <cstdint>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include "psflow/cli/flags.h"
#include "psflow/core/random.h"
#include "psflow/train/session.h"
#include "table_worker.h"

namespace {

struct Args {
  int64_t rows = int64_t{1} << 18, hot = 16384, hot_percent = 97, batch = 4096, warm_steps = 16;
};

absl::StatusOr<Args> ParseArgs(const std::vector<std::string>& unparsed) {
  Args a;
  const absl::Status parsed = psflow::bench::ParseIntArgs(
      unparsed,
      {{"--rows", &a.rows},
       {"--hot", &a.hot},
       {"--hot_percent", &a.hot_percent},
       {"--batch", &a.batch},
       {"--warm_steps", &a.warm_steps}},
      nullptr, "--rows=N, --hot=N, --hot_percent=0..100, --batch=N, --warm_steps=N (non-negative integers)");
  if (!parsed.ok()) return parsed;
  if (a.rows < 1 || a.hot < 1 || a.hot > a.rows || a.batch < 1 || a.batch > a.rows || a.hot_percent > 100) {
    return absl::InvalidArgumentError("need 1 <= --hot <= --rows, 1 <= --batch <= --rows, --hot_percent <= 100");
  }
  return a;
}

int64_t IdOf(int64_t r) { return static_cast<int64_t>(static_cast<uint64_t>(r) * 0x9e3779b97f4a7c1u); }

int Run(int argc, char** argv) {
  auto flags = psflow::cli::ParseFlags(argc, argv);
  if (!flags.ok()) {
    std::cerr << "disk_tier_ps_worker: " << flags.status().message() << "\n";
    return 2;
  }
  auto args = ParseArgs(flags->unparsed);
  if (!args.ok()) {
    std::cerr << "disk_tier_ps_worker: " << args.status().message() << "\n";
    return 2;
  }
  const psflow::train::TrainOptions& o = flags->options;
  psflow::dist::TableSpec table;
  table.name = "bench";
  table.dim = 64;
  table.kind = psflow::dist::TableKind::kDynamic;
  auto opened = psflow::bench::OpenTableSession(
      o, table, "disk_tier_ps");  // the table beside a dense bias; --table_storage=disk, ...
  if (!opened.ok()) {
    std::cerr << "disk_tier_ps_worker: " << opened.status().message() << "\n";
    return 2;
  }
  psflow::train::WorkerSession& s = *(*opened)->session;
  const Args& a = *args;
  const int64_t fill_steps = (a.rows + a.batch - 1) / a.batch;
  const int64_t stride = a.rows / a.hot;
  using Clock = std::chrono::steady_clock;
  auto loop = [&]() -> absl::Status {
    if (auto st = s.Open(); !st.ok()) return st;
    std::vector<int64_t> ids;
    std::vector<int64_t> taken(static_cast<size_t>(a.rows), -1);  // the step that took a row
    double pull_s = 0, push_s = 0;
    int64_t measured_rows = 0, measured_steps = 0;
    bool measuring = false;
    while (!s.ShouldStop()) {
      const int64_t step = s.data_step();
      ids.clear();
      if (step < fill_steps) {
        for (int64_t r = step * a.batch; r < std::min(a.rows, (step + 1) * a.batch); ++r) ids.push_back(IdOf(r));
      } else if (step < fill_steps + a.warm_steps) {
        const int64_t first = (step - fill_steps) * a.batch;
        for (int64_t k = 0; k < std::min(a.batch, a.hot); ++k) ids.push_back(IdOf(((first + k) % a.hot) * stride));
      } else {
        if (!measuring) {
          measuring = true;
          std::cout << "phase measure begins" << std::endl;
          std::this_thread::sleep_for(std::chrono::seconds(2));
        }
        psflow::Rng rng(psflow::Rng::Mix(o.seed, static_cast<uint64_t>(step)));
        while (static_cast<int64_t>(ids.size()) < a.batch) {
          const bool hot = static_cast<int64_t>(rng.UniformInt(100)) < a.hot_percent;
          const int64_t r = hot ? static_cast<int64_t>(rng.UniformInt(static_cast<uint64_t>(a.hot))) * stride
                                : static_cast<int64_t>(rng.UniformInt(static_cast<uint64_t>(a.rows)));
          if (taken[static_cast<size_t>(r)] == step) continue;
          taken[static_cast<size_t>(r)] = step;
          ids.push_back(IdOf(r));
        }
      }
      const Clock::time_point t0 = Clock::now();
      if (auto st = s.Lookup({ids}); !st.ok()) return st;
      const Clock::time_point t1 = Clock::now();
      psflow::train::TableBatch& b = s.table_batch(0);
      b.grads = psflow::Tensor(b.rows.shape(), 0.01f);
      const Clock::time_point t2 = Clock::now();
      if (auto st = s.Step(0.0); !st.ok()) return st;
      if (measuring) {
        pull_s += std::chrono::duration<double>(t1 - t0).count();
        push_s += std::chrono::duration<double>(Clock::now() - t2).count();
        measured_rows += static_cast<int64_t>(b.ids.size());
        ++measured_steps;
      }
    }
    if (measuring) {
      std::cout << "phase measure ends" << std::endl;
      std::this_thread::sleep_for(std::chrono::seconds(2));
      std::cout << "measure: " << measured_steps << " steps, " << measured_rows << " rows; pull "
                << static_cast<double>(measured_rows) / pull_s << " rows/s, push "
                << static_cast<double>(measured_rows) / push_s << " rows/s, pull+push "
                << static_cast<double>(measured_rows) / (pull_s + push_s) << " rows/s" << std::endl;
    }
    return absl::OkStatus();
  };
  return psflow::bench::RunToEnd("disk_tier_ps_worker", s, loop);
}

}  // namespace

int main(int argc, char** argv) { return Run(argc, argv); }
