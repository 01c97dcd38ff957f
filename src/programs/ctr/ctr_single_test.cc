// The ctr model trained in one process (programs/ctr/ctr_single.h): a short run on small vocabularies
// learns the factorization machine's interactions (test AUC clearly above what any dense-only
// model can reach, and near the Bayes AUC), a run is bit-reproducible from its seed, fixed tables
// hold their N rows, and the CLI entry refuses what it cannot do with one line.
#include "programs/ctr/ctr_single.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <vector>

#include "psflow/ckpt/checkpoint.h"
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
  std::printf(
      "ctr 1500 steps: test AUC %.4f, log-loss %.4f; Bayes AUC %.4f, log-loss %.4f; dense-only Bayes AUC %.4f\n",
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
  for (const Var& p : trainer.model().parameters())
    out.insert(out.end(), p->value.data(), p->value.data() + p->value.size());
  auto test = trainer.generator().TestSet(64);
  EXPECT_TRUE(test.ok());
  for (size_t f = 0; f < trainer.tables().size(); ++f) {
    std::vector<int64_t> ids;
    for (int64_t i = 0; i < 64; ++i) ids.push_back(test->ids[i * test->num_fields + f]);
    std::sort(ids.begin(), ids.end());
    if (trainer.tables()[f]->config().spec.kind == ps::table::TableKind::kFixed) {
      for (int64_t& id : ids) id %= trainer.tables()[f]->config().layout().num_embeddings;
    }
    std::sort(ids.begin(), ids.end());
    ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
    std::vector<float> rows(ids.size() * trainer.tables()[f]->config().spec.dim);
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

// The --table_<field> flags (made from dist::TableFields()) reach every ctr table's spec; left out,
// the ctr template's values; a bad one is refused naming the flag, and storage=disk by the table
// (no disk tier in this build) naming the table.
TEST(CtrSingleTest, TableSettingsReachTheTablesAndBadOnesAreRefused) {
  TrainOptions o = CtrOptions(1);
  dist::TableSpec plain = CtrTableSpec(o, 0);
  EXPECT_EQ(plain.initializer.ToString(), "truncated_normal:0:0.05");
  EXPECT_EQ(plain.lifecycle, dist::TableLifecycle{});
  EXPECT_EQ(plain.storage, dist::TableStorage::kMemory);

  TrainOptions given;
  given.model = "ctr";
  given.seed = o.seed;
  given.table_options = {{"admit_after", "3"}, {"evict_every", "7"}, {"initializer", "zeros"}};
  ASSERT_TRUE(ResolveTrainOptions(&given).ok());
  dist::TableSpec spec = CtrTableSpec(given, 2);
  EXPECT_EQ(spec.lifecycle.admit_after, 3);
  EXPECT_EQ(spec.lifecycle.evict_every, 7);
  EXPECT_EQ(spec.initializer.kind, dist::InitKind::kZeros);
  EXPECT_EQ(spec.initializer.seed, CtrTableSpec(o, 2).initializer.seed);  // still the field's own seed

  TrainOptions bad;
  bad.model = "ctr";
  bad.table_options = {{"storage", "tape"}};
  absl::Status s = ResolveTrainOptions(&bad);
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_EQ(s.message(), "--table_storage=tape must be memory or disk");

  TrainOptions disk = CtrOptions(1);
  disk.table_options["storage"] = "disk";
  auto trainer = CtrTrainer::Create(disk);
  ASSERT_FALSE(trainer.ok());
  EXPECT_NE(trainer.status().message().find("table '"), std::string::npos) << trainer.status();
  EXPECT_NE(trainer.status().message().find("storage=disk needs a disk tier"), std::string::npos);
}

// Checkpoints in one process: the tables' rows in the file are the trainer's own (every admitted
// row of each dynamic table, ids ascending, values equal to a lookup of the trained shard), and a
// trainer restored from it holds the same rows and dense values.
TEST(CtrSingleTest, CheckpointHoldsTheTablesAndRestoresThem) {
  TrainOptions options = CtrOptions(3);
  options.ctr_fields = 2;
  options.checkpoint_dir =
      (std::filesystem::temp_directory_path() / ("ctr_single_ckpt_" + std::to_string(getpid()))).string();
  std::filesystem::remove_all(options.checkpoint_dir);
  auto trainer = CtrTrainer::Create(options);
  ASSERT_TRUE(trainer.ok()) << trainer.status();
  for (int64_t step = 0; step < 20; ++step) ASSERT_TRUE((*trainer)->Step(step).ok());
  auto path = (*trainer)->SaveCheckpoint(20);
  ASSERT_TRUE(path.ok()) << path.status();
  auto ck = ckpt::ReadCheckpoint(*path);
  ASSERT_TRUE(ck.ok()) << ck.status();
  auto restored = CtrTrainer::Create(options);
  ASSERT_TRUE(restored.ok());
  auto step = (*restored)->RestoreCheckpoint([](const std::string&) {});
  ASSERT_TRUE(step.ok()) << step.status();
  EXPECT_EQ(*step, 20);
  for (int f = 0; f < 2; ++f) {
    const std::string name = nn::CtrModel::TableName(f);
    const std::vector<int64_t>& ids = ck->contents.int64s.at(name + "/ids");
    const Tensor& rows = ck->contents.tensors.at(name);
    ASSERT_EQ(static_cast<int64_t>(ids.size()), (*trainer)->tables()[f]->stats().rows);
    ASSERT_TRUE(std::is_sorted(ids.begin(), ids.end()));
    std::vector<float> saved(ids.size() * 8), back(ids.size() * 8);
    ASSERT_TRUE((*trainer)->tables()[f]->Gather(ids, absl::MakeSpan(saved)).ok());
    ASSERT_TRUE((*restored)->tables()[f]->Gather(ids, absl::MakeSpan(back)).ok());
    for (size_t i = 0; i < saved.size(); ++i) {
      ASSERT_EQ(rows[static_cast<int64_t>(i)], saved[i]);
      ASSERT_EQ(back[i], saved[i]);
    }
    EXPECT_EQ((*restored)->tables()[f]->stats().rows, static_cast<int64_t>(ids.size()));
  }
  for (size_t i = 0; i < (*trainer)->model().parameters().size(); ++i) {
    const Tensor& a = (*trainer)->model().parameters()[i]->value;
    const Tensor& b = (*restored)->model().parameters()[i]->value;
    ASSERT_EQ(a.size(), b.size());
    for (int64_t k = 0; k < a.size(); ++k) ASSERT_EQ(a[k], b[k]);
  }
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
