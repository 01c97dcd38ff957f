// disk_tier_40gb_worker — the worker of bench/disk_tier_40gb.py: one dynamic table of --dim on the
// ps tasks (adagrad: value + accumulator), filled fast, then trained with Zipf-distributed ids.
//
//   fill  steps [0, ⌈rows / fill_batch⌉): step s pulls and pushes ids [s·fill_batch, (s+1)·fill_batch)
//         (sequential ids, one large batch a step: every push creates its rows; each ps receives its
//         share in ascending id order, so RocksDB's files come out sorted and are moved down the
//         levels without rewriting);
//   zipf  the remaining --train_steps: each step draws --zipf_draws ranks k in [1, rows] from
//         Zipf(--zipf_s) (rejection-inversion, Hörmann & Derflinger 1996) and uses the ids
//         (k − 1)·A mod rows (A = 2654435761, prime, so the map is a bijection: the hot rows are spread
//         over the id space and over the ps tasks, not the first rows created). The session
//         de-duplicates the draws; the unique ids are pulled and pushed.
// It prints "phase zipf begins" (and "phase fill: N rows in S s") so the driver can split its
// counters. Any psflow flag applies (--table_storage=disk, --table_dir, --table_cache_bytes, the
// cluster's flags, --train_steps = fill steps + Zipf steps).
#include <algorithm>
#include <chrono>
#include <cmath>
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
  int64_t rows = 1000000, dim = 64, fill_batch = 32768, zipf_draws = 8192;
  double zipf_s = 1.1;
};

absl::StatusOr<Args> ParseArgs(const std::vector<std::string>& unparsed) {
  Args a;
  const absl::Status parsed = psflow::bench::ParseIntArgs(
      unparsed,
      {{"--rows", &a.rows}, {"--dim", &a.dim}, {"--fill_batch", &a.fill_batch}, {"--zipf_draws", &a.zipf_draws}},
      [&a](const std::string& key, const std::string& value) -> std::optional<absl::Status> {
        if (key != "--zipf_s" || value.empty()) return std::nullopt;
        char* end = nullptr;
        a.zipf_s = std::strtod(value.c_str(), &end);
        if (*end != '\0' || !(a.zipf_s > 1.0)) return absl::InvalidArgumentError("--zipf_s must be a number > 1");
        return absl::OkStatus();
      },
      "--rows=N, --dim=N, --fill_batch=N, --zipf_draws=N, --zipf_s=X");
  if (!parsed.ok()) return parsed;
  if (a.rows < 1 || a.dim < 1 || a.fill_batch < 1 || a.zipf_draws < 1) {
    return absl::InvalidArgumentError("--rows, --dim, --fill_batch and --zipf_draws must be positive");
  }
  return a;
}

// Zipf(s) over [1, n] by rejection-inversion (W. Hörmann, G. Derflinger, "Rejection-inversion to
// generate variates from monotone discrete distributions", 1996), as Apache Commons RNG's sampler.
class Zipf {
 public:
  Zipf(int64_t n, double s) : n_(static_cast<double>(n)), s_(s) {
    h_x1_ = H(1.5) - 1.0;
    h_n_ = H(n_ + 0.5);
    t_ = 2.0 - HInv(H(2.5) - std::exp(-s_ * std::log(2.0)));
  }
  int64_t operator()(psflow::Rng& rng) const {
    for (;;) {
      const double u01 = static_cast<double>(rng.UniformInt(uint64_t{1} << 53)) * 0x1p-53;  // 53 bits: the tail
      const double u = h_n_ + u01 * (h_x1_ - h_n_);
      const double x = HInv(u);
      double k = std::floor(x + 0.5);
      if (k < 1) k = 1;
      if (k > n_) k = n_;
      if (k - x <= t_ || u >= H(k + 0.5) - std::exp(-s_ * std::log(k))) return static_cast<int64_t>(k);
    }
  }

 private:
  // H(x) = ((x^(1-s)) - 1) / (1 - s), its inverse; helpers as in the paper.
  double H(double x) const { return Helper2((1.0 - s_) * std::log(x)) * std::log(x); }
  double HInv(double x) const {
    double t = x * (1.0 - s_);
    if (t < -1.0) t = -1.0;
    return std::exp(Helper1(t) * x);
  }
  static double Helper1(double x) { return std::abs(x) > 1e-8 ? std::log1p(x) / x : 1.0 - x * (0.5 - x / 3.0); }
  static double Helper2(double x) { return std::abs(x) > 1e-8 ? std::expm1(x) / x : 1.0 + x * 0.5 * (1.0 + x / 3.0); }
  double n_, s_, h_x1_, h_n_, t_;
};

int Run(int argc, char** argv) {
  auto flags = psflow::cli::ParseFlags(argc, argv);
  if (!flags.ok()) {
    std::cerr << "disk_tier_40gb_worker: " << flags.status().message() << "\n";
    return 2;
  }
  auto args = ParseArgs(flags->unparsed);
  if (!args.ok()) {
    std::cerr << "disk_tier_40gb_worker: " << args.status().message() << "\n";
    return 2;
  }
  const psflow::train::TrainOptions& o = flags->options;
  psflow::dist::TableSpec table;
  table.name = "big";
  table.dim = args->dim;
  table.kind = psflow::dist::TableKind::kDynamic;
  auto opened = psflow::bench::OpenTableSession(
      o, table, "disk_tier_40gb");  // the table beside a dense bias; --table_storage=disk, ...
  if (!opened.ok()) {
    std::cerr << "disk_tier_40gb_worker: " << opened.status().message() << "\n";
    return 2;
  }
  psflow::train::WorkerSession& s = *(*opened)->session;
  const int64_t fill_steps = (args->rows + args->fill_batch - 1) / args->fill_batch;
  const Zipf zipf(args->rows, args->zipf_s);
  constexpr uint64_t kSpread = 2654435761u;  // prime: k -> k·A mod rows is a bijection
  using Clock = std::chrono::steady_clock;
  auto loop = [&]() -> absl::Status {
    if (auto st = s.Open(); !st.ok()) return st;
    std::vector<int64_t> ids;
    const Clock::time_point start = Clock::now();
    Clock::time_point zipf_start;
    int64_t zipf_rows = 0, zipf_steps = 0;
    bool in_zipf = false;
    while (!s.ShouldStop()) {
      const int64_t step = s.data_step();
      ids.clear();
      if (step < fill_steps) {
        for (int64_t id = step * args->fill_batch; id < std::min(args->rows, (step + 1) * args->fill_batch); ++id) {
          ids.push_back(id);
        }
      } else {
        if (!in_zipf) {
          in_zipf = true;
          zipf_start = Clock::now();
          std::cout << "phase fill: " << args->rows << " rows in "
                    << std::chrono::duration<double>(zipf_start - start).count() << " s" << std::endl;
          // The ps tasks publish their counters every second and the driver polls every 2:
          // a pause, so the counters it reads at this line are the fill's.
          std::this_thread::sleep_for(std::chrono::seconds(5));
          std::cout << "phase zipf begins" << std::endl;
          std::this_thread::sleep_for(std::chrono::seconds(5));
          zipf_start = Clock::now();
        }
        psflow::Rng rng(psflow::Rng::Mix(o.seed, static_cast<uint64_t>(step)));
        for (int64_t i = 0; i < args->zipf_draws; ++i) {
          const uint64_t k = static_cast<uint64_t>(zipf(rng)) - 1;
          ids.push_back(static_cast<int64_t>((k * kSpread) % static_cast<uint64_t>(args->rows)));
        }
      }
      if (auto st = s.Lookup({ids}); !st.ok()) return st;
      psflow::train::TableBatch& b = s.table_batch(0);
      if (in_zipf) {
        zipf_rows += static_cast<int64_t>(b.ids.size());
        ++zipf_steps;
      }
      b.grads = psflow::Tensor(b.rows.shape(), 0.01f);
      if (auto st = s.Step(0.0); !st.ok()) return st;
    }
    if (in_zipf) {
      const double secs = std::chrono::duration<double>(Clock::now() - zipf_start).count();
      std::cout << "phase zipf: " << zipf_steps << " steps, " << zipf_rows << " unique rows pulled and pushed in "
                << secs << " s (" << static_cast<double>(zipf_rows) / secs << " rows/s, "
                << static_cast<double>(zipf_rows) / static_cast<double>(zipf_steps) << " unique of " << args->zipf_draws
                << " draws a step)" << std::endl;
    }
    return absl::OkStatus();
  };
  return psflow::bench::RunToEnd("disk_tier_40gb_worker", s, loop);
}

}  // namespace

int main(int argc, char** argv) { return Run(argc, argv); }
