// ctr_fm — a C++ program that declares embedding tables in a model of its own (docs/cpp-session.md,
// "Embedding tables"): a factorization machine with a hashed-id logistic regression beside it,
// trained on psflow's synthetic click data (psflow::data::CtrGenerator, whose Bayes log-loss and
// AUC are known), with the tables on the ps tasks:
//   logit = b + w·x + Σ_f wide[h(f, id_f)] + Σ_{f<g} ⟨fm[id_f], fm[id_g]⟩
//   - `wide`: a fixed table [--wide_buckets, 1] split `mod` over the ps tasks, indexed by the
//     hashing trick h(f, id) = Mix64(id + f) % buckets (collisions shared, memory fixed);
//   - `fm`: a dynamic table of dim --fm_dim keyed by the raw int64 ids of every field, with a
//     row life cycle: an id is admitted at its 2nd push, rows not updated for 2000 steps are
//     evicted, and each ps keeps at most its share of --fm_max_rows;
//   - w, b: dense parameters (ps variables like any other).
// Per step the program looks the batch's ids up (session.Lookup: deduplicated; the rows usually
// came back with the previous step's answer), computes the loss with psflow's ops, hands each
// table the gradient of its unique rows, names the next batch's ids (session.Prefetch) and steps.
// The chief reports test log-loss and AUC beside the Bayes values and the base rate's log-loss.
// Run alone (an in-process ps task: ./ctr_fm --train_steps=1200) or as a worker of a cluster:
//   psflow local --ps=2 --workers=2 -- ./ctr_fm
//   psflow local --ps=2 --workers=2 --sync_replicas --checkpoint_dir=/tmp/fm -- ./ctr_fm --fm_dim=16
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <iostream>
#include <string>
#include <utility>
#include <vector>

#include "psflow/cli/flags.h"
#include "psflow/core/ops.h"
#include "psflow/data/ctr.h"
#include "psflow/data/ctr_metrics.h"
#include "psflow/dist/table_routing.h"
#include "psflow/train/session.h"

namespace {

using psflow::Shape;
using psflow::Tensor;
using psflow::Var;
namespace ops = psflow::ops;

// The program's own settings (flags psflow does not know).
struct Settings {
  int64_t wide_buckets = 1 << 18;
  int64_t fm_dim = 8;
  int64_t fm_max_rows = 200000;
  int64_t test_examples = 20000;
};

absl::StatusOr<Settings> ParseSettings(const std::vector<std::string>& args) {
  Settings s;
  for (const std::string& a : args) {
    const size_t eq = a.find('=');
    const std::string name = a.substr(0, eq);
    int64_t* target = name == "--wide_buckets"    ? &s.wide_buckets
                      : name == "--fm_dim"        ? &s.fm_dim
                      : name == "--fm_max_rows"   ? &s.fm_max_rows
                      : name == "--test_examples" ? &s.test_examples
                                                  : nullptr;
    char* end = nullptr;
    const long long v = eq == std::string::npos ? 0 : std::strtoll(a.c_str() + eq + 1, &end, 10);
    if (target == nullptr) {
      return absl::InvalidArgumentError(
          "unknown argument '" + a + "' (psflow's flags, or --wide_buckets, --fm_dim, --fm_max_rows, --test_examples)");
    }
    if (end == nullptr || *end != '\0' || v < 1) return absl::InvalidArgumentError(a + ": must be a positive integer");
    *target = v;
  }
  return s;
}

// The click data: 8 fields of hashed ids (vocabularies from 10 to 10^5 ids, Zipf frequencies) and
// 4 dense features; the teacher is a factorization machine, so this model can reach Bayes.
psflow::data::CtrConfig DataConfig(uint64_t seed) {
  psflow::data::CtrConfig c;
  c.seed = seed;
  c.num_fields = 8;
  c.num_dense = 4;
  c.vocab_sizes = {10, 100, 1000, 10000, 100000, 1000, 100, 30000};
  return c;
}

// One batch of examples and each table's ids (one span per table, in declaration order).
struct Batch {
  int64_t step = -1;
  std::vector<int64_t> ids;   // [n, F], the generator's
  std::vector<float> dense;   // [n, D]
  std::vector<float> labels;  // [n]
  std::vector<int64_t> wide;  // [n, F]: h(f, id) in [0, wide_buckets)
  std::vector<int64_t> fm;    // [n, F]: the raw ids (the dynamic table takes any int64)

  void HashIds(int num_fields, int64_t buckets) {
    wide.resize(ids.size());
    for (size_t i = 0; i < ids.size(); ++i) {
      const uint64_t field = i % static_cast<size_t>(num_fields);
      wide[i] = static_cast<int64_t>(psflow::dist::Mix64(static_cast<uint64_t>(ids[i]) + field) %
                                     static_cast<uint64_t>(buckets));
    }
    fm = ids;
  }
  std::vector<absl::Span<const int64_t>> TableIds() const { return {wide, fm}; }
};

// The model's forward pass for n examples whose tables' unique rows are `wide_rows` [U, 1] and
// `fm_rows` [V, k], picked per (example, field) by the session's index: logits [n, 1].
Var Logits(const Var& w, const Var& b, const Batch& batch, int64_t n, int num_fields, int num_dense,
           const Var& wide_rows, absl::Span<const int64_t> wide_index, const Var& fm_rows,
           absl::Span<const int64_t> fm_index) {
  const int64_t k = fm_rows->value.shape()[1];
  Tensor x(Shape{n, num_dense});
  std::copy_n(batch.dense.data(), n * num_dense, x.data());
  Var linear = ops::BiasAdd(ops::MatMul(psflow::Constant(std::move(x)), w), b);  // [n, 1]
  Var ones = psflow::Constant(Tensor(Shape{num_fields, 1}, 1.0f));
  Var wide = ops::GatherRows(wide_rows, {wide_index.data(), wide_index.size()});     // [n·F, 1]
  Var wide_sum = ops::MatMul(ops::Reshape(wide, Shape{n, num_fields}), ones);        // [n, 1]
  Var embedded = ops::GatherRows(fm_rows, {fm_index.data(), fm_index.size()});       // [n·F, k]
  Var pairs = ops::DotInteraction(ops::Reshape(embedded, Shape{n, num_fields, k}));  // [n, F(F-1)/2]
  const int64_t num_pairs = num_fields * (num_fields - 1) / 2;
  Var fm = ops::MatMul(pairs, psflow::Constant(Tensor(Shape{num_pairs, 1}, 1.0f)));  // [n, 1]
  return ops::Add(ops::Add(linear, wide_sum), fm);
}

// The embedding tables: their rows live on the ps tasks, initialized there from (initializer,
// seed, id).
std::vector<psflow::dist::TableSpec> Tables(const Settings& settings, uint64_t seed) {
  psflow::dist::TableSpec wide;
  wide.name = "wide";
  wide.dim = 1;
  wide.num_embeddings = settings.wide_buckets;
  wide.strategy = psflow::dist::TableStrategy::kMod;  // bucket i on ps i % P
  wide.initializer = psflow::dist::TableInitializer::Zeros();
  psflow::dist::TableSpec fm;
  fm.name = "fm";
  fm.dim = settings.fm_dim;
  fm.kind = psflow::dist::TableKind::kDynamic;  // any int64 id, rows created by their first applied gradient
  fm.initializer = psflow::dist::TableInitializer::TruncatedNormal(0, 0.05f, /*seed=*/seed + 1);
  fm.lifecycle.admit_after = 2;                  // an id's first push is counted, not applied (one-off ids make no row)
  fm.lifecycle.steps_to_live = 2000;             // rows not updated for 2000 global steps are evicted
  fm.lifecycle.max_rows = settings.fm_max_rows;  // each ps keeps at most ⌈max_rows / P⌉ rows
  return {wide, fm};
}

// The model on one worker: the dense parameters (the same initial values on every worker, zeros;
// the chief's become the job's), the data, and the steps that drive a session.
class FmWorker {
 public:
  FmWorker(const Settings& settings, psflow::data::CtrGenerator generator)
      : settings_(settings), generator_(std::move(generator)), F_(generator_.num_fields()), D_(generator_.num_dense()) {
    w_ = psflow::MakeParameter("linear/weights", Tensor(Shape{D_, 1}, 0.0f));
    b_ = psflow::MakeParameter("linear/bias", Tensor(Shape{1}, 0.0f));
  }

  std::vector<psflow::train::SessionParameter> Parameters() const {
    return {{w_->name, &w_->value, &w_->grad}, {b_->name, &b_->value, &b_->grad}};
  }

  // Open, the steps until the session says stop, and Close with the chief's evaluation.
  absl::StatusOr<psflow::train::RunSummary> Train(psflow::train::WorkerSession& session) {
    if (auto s = session.Open(); !s.ok()) return s;
    int64_t steps = 0, prefetched = 0;
    while (!session.ShouldStop()) {
      ++steps;
      absl::StatusOr<bool> more = Step(session, &prefetched);
      if (!more.ok()) return more.status();
      if (!*more) break;  // training finished on the other workers
    }
    std::cout << "ctr_fm: worker " << session.worker_index() << ": " << prefetched << " of " << steps
              << " batches had their rows prefetched" << std::endl;
    return session.Close([&] { return Evaluate(session); });
  }

 private:
  // This worker's stream's batch at `step`, its ids hashed for the tables.
  absl::Status Fill(Batch& batch, int64_t step, int64_t n, int worker) {
    batch.ids.resize(static_cast<size_t>(n * F_));
    batch.dense.resize(static_cast<size_t>(n * D_));
    batch.labels.resize(static_cast<size_t>(n));
    if (auto s = generator_.FillBatch(worker, step, n, batch.ids.data(), batch.dense.data(), batch.labels.data());
        !s.ok()) {
      return s;
    }
    batch.HashIds(F_, settings_.wide_buckets);
    batch.step = step;
    return absl::OkStatus();
  }

  // One training step; false when training finished elsewhere (Lookup said so).
  absl::StatusOr<bool> Step(psflow::train::WorkerSession& session, int64_t* prefetched) {
    const int64_t n = *session.options().batch_size;
    // This worker's batch: its stream's batch at the session's data step (sync: its slice of
    // the global step's batch; async: the next batch of one stream shared by all workers).
    const int64_t at = session.data_step();
    if (next_.step == at) {
      std::swap(current_, next_);
      ++*prefetched;
    } else if (auto s = Fill(current_, at, n, session.data_worker_index()); !s.ok()) {
      return s;
    }
    absl::Status looked = session.Lookup(current_.TableIds());
    if (absl::IsOutOfRange(looked)) return false;
    if (!looked.ok()) return looked;
    // Each table's unique rows become leaves of the graph; after Backward their gradients are
    // the unique ids' gradients, summed over the examples holding them: what the tables take.
    psflow::train::TableBatch& wide_batch = session.table_batch(0);
    psflow::train::TableBatch& fm_batch = session.table_batch(1);
    Var wide_rows = psflow::MakeParameter("wide", std::move(wide_batch.rows));
    Var fm_rows = psflow::MakeParameter("fm", std::move(fm_batch.rows));
    Var logits = Logits(w_, b_, current_, n, F_, D_, wide_rows, wide_batch.index, fm_rows, fm_batch.index);
    Var loss = ops::SigmoidCrossEntropy(logits, current_.labels);
    psflow::ZeroGrad({w_, b_});
    psflow::Backward(loss);
    wide_batch.grads = std::move(wide_rows->grad);
    fm_batch.grads = std::move(fm_rows->grad);
    // The next batch's ids ride on Step's push and their rows come back with its answer. Its
    // step is known in sync mode (data_step + 1); async, where the workers' pushes interleave,
    // it is usually data_step + N. A wrong guess costs one pull in the next Lookup, not a
    // wrong row: Lookup uses prefetched rows only for the ids it was given.
    const int64_t next_step = at + (session.sync() ? 1 : session.num_workers());
    if (auto s = Fill(next_, next_step, n, session.data_worker_index()); !s.ok()) return s;
    if (auto s = session.Prefetch(next_.TableIds()); !s.ok()) return s;
    int64_t correct = 0;
    for (int64_t i = 0; i < n; ++i)
      correct += (logits->value[i] > 0) == (current_.labels[static_cast<size_t>(i)] > 0.5f);
    if (auto s = session.Step(loss->value[0], static_cast<double>(correct) / static_cast<double>(n)); !s.ok()) return s;
    return true;
  }

  // The click probabilities of the test set, with the final rows (looked up from the ps tasks in
  // chunks: the chief never holds a whole table either).
  absl::StatusOr<std::vector<float>> TestProbabilities(psflow::train::WorkerSession& session,
                                                       const psflow::data::CtrExamples& test) {
    std::vector<float> probabilities;
    constexpr int64_t kChunk = 4096;
    Batch chunk;
    for (int64_t first = 0; first < test.num_examples; first += kChunk) {
      const int64_t m = std::min(kChunk, test.num_examples - first);
      chunk.ids.assign(test.ids.begin() + first * F_, test.ids.begin() + (first + m) * F_);
      chunk.dense.assign(test.dense.begin() + first * D_, test.dense.begin() + (first + m) * D_);
      chunk.HashIds(F_, settings_.wide_buckets);
      if (auto s = session.Lookup(chunk.TableIds()); !s.ok()) return s;
      psflow::train::TableBatch& wr = session.table_batch(0);
      psflow::train::TableBatch& fr = session.table_batch(1);
      Var logits = Logits(w_, b_, chunk, m, F_, D_, psflow::Constant(std::move(wr.rows)), wr.index,
                          psflow::Constant(std::move(fr.rows)), fr.index);
      for (int64_t i = 0; i < m; ++i) probabilities.push_back(1.0f / (1.0f + std::exp(-logits->value[i])));
    }
    return probabilities;
  }

  // The chief's evaluation on the generator's fixed test set: log-loss and AUC beside Bayes and
  // the base rate's log-loss.
  absl::StatusOr<psflow::train::SessionEval> Evaluate(psflow::train::WorkerSession& session) {
    auto test = generator_.TestSet(settings_.test_examples);
    if (!test.ok()) return test.status();
    auto bayes = psflow::data::BayesMetrics(*test);
    if (!bayes.ok()) return bayes.status();
    auto probabilities = TestProbabilities(session, *test);
    if (!probabilities.ok()) return probabilities.status();
    auto log_loss = psflow::data::LogLoss(test->labels, *probabilities);
    auto auc = psflow::data::Auc(test->labels, *probabilities);
    if (!log_loss.ok()) return log_loss.status();
    if (!auc.ok()) return auc.status();
    // Predicting the click rate for every example: the log-loss a model must beat to have learnt.
    const double p = bayes->click_rate;
    psflow::train::SessionEval eval;
    eval.scalars = {{"test_log_loss", *log_loss},
                    {"test_auc", *auc},
                    {"bayes_log_loss", bayes->log_loss},
                    {"bayes_auc", bayes->auc},
                    {"base_rate_log_loss", -(p * std::log(p) + (1 - p) * std::log(1 - p))}};
    return eval;
  }

  const Settings settings_;
  psflow::data::CtrGenerator generator_;
  const int F_, D_;
  Var w_, b_;
  Batch current_, next_;
};

// psflow's flags over the program's defaults: adam for w and b, adagrad for the tables' rows (on
// the ps), and fixed tables split in up to 8 shards of at least 64 KiB (placed round robin over
// the ps tasks; `mod`: id i in shard i % shards), which leaves the small dense variables whole.
// Then the program's own settings from what psflow did not parse.
absl::Status ParseCommandLine(int argc, char** argv, psflow::train::TrainOptions* options, Settings* settings) {
  std::vector<std::string> args(argv + 1, argv + argc);
  auto flags = psflow::cli::ParseFlags(
      args, {"--optimizer=adam", "--learning_rate=0.01", "--sparse_optimizer=adagrad", "--sparse_learning_rate=0.5",
             "--batch_size=256", "--partitioner=min_max:8:65536", "--train_steps=3000", "--log_every=500"});
  if (!flags.ok()) return flags.status();
  auto parsed = ParseSettings(flags->unparsed);
  if (!parsed.ok()) return parsed.status();
  *options = flags->options;
  *settings = *parsed;
  return absl::OkStatus();
}

int Run(int argc, char** argv) {
  psflow::train::TrainOptions o;
  Settings settings;
  if (auto s = ParseCommandLine(argc, argv, &o, &settings); !s.ok()) {
    std::cerr << "ctr_fm: " << s.message() << "\n";
    return 2;
  }
  auto generator = psflow::data::CtrGenerator::Create(DataConfig(o.seed));
  if (!generator.ok()) {
    std::cerr << "ctr_fm: " << generator.status().message() << "\n";
    return 2;
  }
  FmWorker worker(settings, *std::move(generator));
  psflow::train::WorkerSession::Options options;
  options.train = o;
  options.model_name = "ctr_fm";
  auto session = psflow::train::WorkerSession::Create(options, worker.Parameters(), Tables(settings, o.seed));
  if (!session.ok()) {
    std::cerr << "ctr_fm: " << session.status().message() << "\n";
    return 2;
  }
  auto summary = worker.Train(**session);
  if (!summary.ok()) {
    (*session)->Abort(summary.status());
    std::cerr << "ctr_fm: " << summary.status().message() << "\n";
    return 1;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) { return Run(argc, argv); }
