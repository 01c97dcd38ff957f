// regression — a C++ program that trains a model of its own, on data of its own, with a loss of its
// own, on a psflow cluster (docs/cpp-session.md). The model is an 8-32-1 tanh network; the data is
// y = sin(x·u) + x0·x1/2 + noise over 8 features, generated from --seed (every worker makes the
// same set) or read from --csv=FILE (rows "x1,...,x8,y"); the loss is mean squared error. psflow's
// flags come through psflow::cli::ParseFlags; the ps tasks, checkpoints, sync mode, the progress
// lines and the final summary come from psflow::train::WorkerSession. Run alone (the session starts
// a ps task of its own inside the process):
//   ./regression --train_steps=600 --checkpoint_dir=/tmp/reg
// or as a worker of a cluster:
//   psflow local --ps=1 --workers=2 -- ./regression
//   psflow local --ps=1 --workers=2 --sync_replicas --checkpoint_dir=/tmp/reg -- ./regression --csv=data.csv
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "psflow/cli/flags.h"
#include "psflow/data/batcher.h"
#include "psflow/nn/layers.h"
#include "psflow/train/session.h"

namespace {

using psflow::Var;
constexpr int kFeatures = 8;

struct Data {
  std::vector<float> x, y;  // x: rows of kFeatures, y: one target per row
  int64_t rows() const { return static_cast<int64_t>(y.size()); }
};

Data Generate(int64_t rows, uint64_t seed) {
  psflow::Rng rng(seed);
  Data d;
  for (int64_t r = 0; r < rows; ++r) {
    double dot = 0;
    for (int f = 0; f < kFeatures; ++f) {
      d.x.push_back(2 * rng.Uniform() - 1);
      dot += d.x.back() * (f % 2 ? 0.5 : -0.7);
    }
    const float* x = &d.x[static_cast<size_t>(r) * kFeatures];
    d.y.push_back(static_cast<float>(std::sin(dot) + 0.5 * x[0] * x[1] + 0.05 * rng.Normal()));
  }
  return d;
}

// Rows of kFeatures + 1 comma-separated numbers; one clear line on the first bad one.
absl::StatusOr<Data> ReadCsv(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError("cannot open --csv=" + path + "; give a CSV file of rows x1,...,x8,y");
  Data d;
  std::string line;
  for (int n = 1; std::getline(in, line); ++n) {
    std::istringstream fields(line);
    std::string field;
    int count = 0;
    for (; std::getline(fields, field, ','); ++count) {
      char* end = nullptr;
      const float v = std::strtof(field.c_str(), &end);
      if (end == field.c_str())
        return absl::InvalidArgumentError(path + ":" + std::to_string(n) + ": '" + field + "' is not a number");
      (count < kFeatures ? d.x : d.y).push_back(v);
    }
    if (count != kFeatures + 1)
      return absl::InvalidArgumentError(path + ":" + std::to_string(n) + ": expected 9 numbers (x1,...,x8,y)");
  }
  if (d.rows() == 0) return absl::InvalidArgumentError("--csv=" + path + " has no rows");
  return d;
}

// The network's prediction [rows, 1] for `rows` rows of x.
Var Predict(psflow::nn::Layer& net, const float* x, int64_t rows) {
  psflow::Tensor input(psflow::Shape{rows, kFeatures});
  std::copy(x, x + rows * kFeatures, input.data());
  psflow::nn::ForwardContext ctx;
  return net.Forward(psflow::Constant(std::move(input)), ctx);
}

double MeanSquaredError(psflow::nn::Layer& net, const Data& d) {
  return psflow::ops::MeanSquaredError(Predict(net, d.x.data(), d.rows()), d.y)->value[0];
}

int Run(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  // psflow's flags (and `psflow local`'s, through $PSFLOW_FLAGS), over this program's defaults.
  auto flags = psflow::cli::ParseFlags(
      args, {"--optimizer=adam", "--learning_rate=0.01", "--batch_size=32", "--train_steps=600", "--log_every=100"});
  if (!flags.ok()) {
    std::cerr << "regression: " << flags.status().message() << "\n";
    return 2;
  }
  std::string csv;  // the program's own flag
  for (const std::string& a : flags->unparsed) {
    if (a.rfind("--csv=", 0) == 0) {
      csv = a.substr(6);
    } else {
      std::cerr << "regression: unknown argument '" << a << "' (psflow's flags, or --csv=FILE)\n";
      return 2;
    }
  }
  const psflow::train::TrainOptions& o = flags->options;
  absl::StatusOr<Data> all = csv.empty() ? Generate(5000, o.seed) : ReadCsv(csv);
  if (!all.ok()) {
    std::cerr << "regression: " << all.status().message() << "\n";
    return 2;
  }
  // The last fifth is held out for the chief's evaluation at the end.
  const int64_t train_rows = all->rows() - all->rows() / 5;
  Data train{{all->x.begin(), all->x.begin() + train_rows * kFeatures}, {all->y.begin(), all->y.begin() + train_rows}};
  Data test{{all->x.begin() + train_rows * kFeatures, all->x.end()}, {all->y.begin() + train_rows, all->y.end()}};

  // Every worker builds the same initial values from --seed; the chief's become the job's.
  psflow::Rng rng(o.seed);
  psflow::nn::Sequential net;
  net.Emplace<psflow::nn::Dense>("hidden", kFeatures, 32, psflow::nn::WeightInit{}, psflow::ops::Activation::kTanh, rng)
      .Emplace<psflow::nn::Dense>("output", 32, 1, psflow::nn::WeightInit{}, psflow::ops::Activation::kNone, rng);
  std::vector<Var> params;
  net.CollectParameters(&params);
  std::vector<psflow::train::SessionParameter> session_params;
  for (const Var& p : params) session_params.push_back({p->name, &p->value, &p->grad});

  psflow::train::WorkerSession::Options options;
  options.train = o;
  options.model_name = "regression";
  auto session = psflow::train::WorkerSession::Create(options, session_params);
  if (!session.ok()) {
    std::cerr << "regression: " << session.status().message() << "\n";
    return 2;
  }
  auto train_loop = [&](psflow::train::WorkerSession& s) -> absl::StatusOr<psflow::train::RunSummary> {
    if (auto st = s.Open(); !st.ok()) return st;
    const int batch = *s.options().batch_size;
    psflow::data::BatchSampler sampler(train.rows(), batch, s.worker_index(), s.num_workers(), o.seed);
    std::vector<int64_t> rows;
    std::vector<float> x(static_cast<size_t>(batch) * kFeatures), y(static_cast<size_t>(batch));
    while (!s.ShouldStop()) {
      sampler.BatchAt(s.data_step(), &rows);  // sync: this worker's slice of the global batch
      for (int i = 0; i < batch; ++i) {
        std::copy_n(&train.x[static_cast<size_t>(rows[i]) * kFeatures], kFeatures,
                    &x[static_cast<size_t>(i) * kFeatures]);
        y[static_cast<size_t>(i)] = train.y[static_cast<size_t>(rows[i])];
      }
      psflow::ZeroGrad(params);
      Var loss = psflow::ops::MeanSquaredError(Predict(net, x.data(), batch), y);
      psflow::Backward(loss);
      if (auto st = s.Step(loss->value[0]); !st.ok()) return st;  // push, pull the new values
    }
    return s.Close([&]() -> absl::StatusOr<psflow::train::SessionEval> {
      psflow::train::SessionEval eval;  // the chief's, on the final values
      // What predicting the training mean scores on the test rows: the bar a useful model beats.
      double mean = 0, baseline = 0;
      for (float v : train.y) mean += v / static_cast<double>(train.rows());
      for (float v : test.y) baseline += (v - mean) * (v - mean) / static_cast<double>(test.rows());
      eval.scalars = {{"train_mse", MeanSquaredError(net, train)},
                      {"test_mse", MeanSquaredError(net, test)},
                      {"test_mse_of_mean", baseline}};
      return eval;
    });
  };
  auto summary = train_loop(**session);
  if (!summary.ok()) {
    (*session)->Abort(summary.status());
    std::cerr << "regression: " << summary.status().message() << "\n";
    return 1;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) { return Run(argc, argv); }
