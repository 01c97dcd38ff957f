// The ctr model trained in one process (train/ctr_single.h): a short run on small vocabularies
// learns the factorization machine's interactions (test AUC clearly above what any dense-only
// model can reach, and near the Bayes AUC), a run is bit-reproducible from its seed, fixed tables
// hold their N rows, and the CLI entry refuses what it cannot do with one line.
#include "train/ctr_single.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <vector>

#include "psflow/data/ctr_metrics.h"
#include "psflow/train/train.h"

namespace psflow::train {
namespace {

TrainOptions CtrOptions(uint64_t seed) {
  TrainOptions o;
  o.model = "ctr";
  o.seed = seed;
  o.ctr_fields = 6;
  o.ctr_dim = 8;
  o.batch_size = 256;
  o.sparse_learning_rate = 5.0f;  // adagrad (TF's, accumulator from 0.1) on a mean loss: small gradients
  o.learning_rate = 0.003f;
  EXPECT_TRUE(ResolveTrainOptions(&o).ok());
  return o;
}

// The best AUC of any model that sees the dense features only: the click probability given x
// alone is E[σ(b + w*·x + FM)] over the ids, which is increasing in w*·x (the ids are independent
// of x), so ranking by the teacher's w*·x is the dense-only Bayes ranking.
double DenseOnlyBayesAuc(const data::CtrGenerator& generator, const data::CtrExamples& test) {
  std::vector<double> score(test.num_examples);
  const auto w = generator.dense_weights();
  for (int64_t i = 0; i < test.num_examples; ++i) {
    for (int d = 0; d < test.num_dense; ++d) score[i] += w[d] * test.dense[i * test.num_dense + d];
  }
  return *data::Auc(test.labels, score);
}

// 1500 steps of 256 on 6 fields of 300 ids each, dim 8.
TEST(CtrSingleTest, LearnsTheInteractionsWithinReachOfBayes) {
  const TrainOptions options = CtrOptions(5);
  auto trainer = CtrTrainer::Create(options, std::vector<int64_t>(options.ctr_fields, 300));
  ASSERT_TRUE(trainer.ok()) << trainer.status();
  for (int64_t step = 0; step < 1500; ++step) {
    auto result = (*trainer)->Step(step);
    ASSERT_TRUE(result.ok()) << result.status();
  }
  const int64_t n = 16384;
  auto figures = (*trainer)->Evaluate(n);
  ASSERT_TRUE(figures.ok()) << figures.status();
  auto test = (*trainer)->generator().TestSet(n);
  ASSERT_TRUE(test.ok());
  const double dense_only = DenseOnlyBayesAuc((*trainer)->generator(), *test);
  std::printf("ctr 1500 steps: test AUC %.4f, log-loss %.4f; Bayes AUC %.4f, log-loss %.4f; dense-only Bayes AUC %.4f\n",
              figures->test_auc, figures->test_log_loss, figures->bayes_auc, figures->bayes_log_loss, dense_only);
  EXPECT_GT(figures->test_auc, dense_only + 0.05);
  // Measured: AUC 0.72 against Bayes 0.77 (seed 5); it keeps closing the gap with more steps.
  EXPECT_GT(figures->test_auc, figures->bayes_auc - 0.08);
  EXPECT_LT(figures->test_log_loss, figures->bayes_log_loss + 0.06);
  EXPECT_GE(figures->test_log_loss, 0.0);
  EXPECT_LE(figures->table_rows, options.ctr_fields * 300);  // a dynamic row exists once pushed
}

// Everything the run computes, as bytes: the dense parameters and the rows of each field's
// first test ids.
std::vector<float> Fingerprint(const CtrTrainer& trainer) {
  std::vector<float> out;
  for (const Var& p : trainer.model().parameters()) out.insert(out.end(), p->value.data(), p->value.data() + p->value.size());
  auto test = trainer.generator().TestSet(64);
  EXPECT_TRUE(test.ok());
  for (size_t f = 0; f < trainer.tables().size(); ++f) {
    std::vector<int64_t> ids;
    for (int64_t i = 0; i < 64; ++i) ids.push_back(test->ids[i * test->num_fields + f]);
    std::sort(ids.begin(), ids.end());
    if (trainer.tables()[f]->config().kind == ps::table::TableKind::kFixed) {
      for (int64_t& id : ids) id %= trainer.tables()[f]->config().layout.num_embeddings;
    }
    std::sort(ids.begin(), ids.end());
    ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
    std::vector<float> rows(ids.size() * trainer.tables()[f]->config().dim);
    EXPECT_TRUE(trainer.tables()[f]->Gather(ids, absl::Span<float>(rows)).ok());
    out.insert(out.end(), rows.begin(), rows.end());
  }
  return out;
}

std::vector<float> RunAndFingerprint(uint64_t seed, int64_t vocab) {
  TrainOptions options = CtrOptions(seed);
  options.ctr_vocab = vocab;
  auto trainer = CtrTrainer::Create(options);
  EXPECT_TRUE(trainer.ok()) << trainer.status();
  for (int64_t step = 0; step < 20; ++step) EXPECT_TRUE((*trainer)->Step(step).ok());
  return Fingerprint(**trainer);
}

bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

TEST(CtrSingleTest, BitReproducibleFromTheSeed) {
  for (int64_t vocab : {0, 5000}) {
    SCOPED_TRACE(vocab == 0 ? "dynamic tables" : "fixed tables");
    const std::vector<float> a = RunAndFingerprint(7, vocab), b = RunAndFingerprint(7, vocab);
    EXPECT_TRUE(SameBits(a, b));
    EXPECT_FALSE(SameBits(a, RunAndFingerprint(8, vocab)));
  }
}

TEST(CtrSingleTest, FixedTablesHoldTheirRows) {
  TrainOptions options = CtrOptions(1);
  options.ctr_vocab = 1000;
  auto trainer = CtrTrainer::Create(options);
  ASSERT_TRUE(trainer.ok());
  ASSERT_TRUE((*trainer)->Step(0).ok());
  auto figures = (*trainer)->Evaluate(2048);
  ASSERT_TRUE(figures.ok());
  EXPECT_EQ(figures->table_rows, 1000 * options.ctr_fields);
}

TEST(CtrSingleTest, CliEntryRefusesCheckpointsInOneLine) {
  TrainOptions options = CtrOptions(1);
  options.checkpoint_dir = "/tmp/unused";
  auto summary = TrainSingleProcess(options, [](const std::string&) {});
  ASSERT_FALSE(summary.ok());
  EXPECT_EQ(summary.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_EQ(std::string(summary.status().message()).find('\n'), std::string::npos);
}

TEST(CtrSingleTest, BadSparseOptimizerNamesTheFlag) {
  TrainOptions options;
  options.model = "ctr";
  options.sparse_optimizer = "adadelta";
  const absl::Status s = ResolveTrainOptions(&options);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(s.message()).find("--sparse_optimizer=adadelta"), std::string::npos) << s;
}

}  // namespace
}  // namespace psflow::train
