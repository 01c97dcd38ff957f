// The synthetic CTR generator against independent expectations: bit-for-bit streams, Zipf
// frequencies against the pmf summed here (chi-square), the teacher's logit against the pairwise
// FM sum, the base rate, and the Bayes metrics against a trivial model and a dense-only logistic
// regression fitted here.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <numeric>
#include <unordered_set>
#include <utility>
#include <vector>

#include "data/heap_allocations_testing.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "psflow/data/ctr.h"
#include "psflow/data/ctr_metrics.h"

namespace psflow::data {
namespace {

using ::testing::HasSubstr;

struct Batch {
  std::vector<int64_t> ids;
  std::vector<float> dense, labels;
  std::vector<double> probabilities;
  bool operator==(const Batch&) const = default;
};

Batch MakeBatch(const CtrGenerator& gen, int64_t worker, int64_t step, int64_t n) {
  Batch b;
  b.ids.resize(n * gen.num_fields());
  b.dense.resize(n * gen.num_dense());
  b.labels.resize(n);
  b.probabilities.resize(n);
  EXPECT_TRUE(
      gen.FillBatch(worker, step, n, b.ids.data(), b.dense.data(), b.labels.data(), b.probabilities.data()).ok());
  return b;
}

template <typename Edit>
CtrConfig Config(Edit edit) {
  CtrConfig config;
  edit(config);
  return config;
}

CtrGenerator Make(CtrConfig config) {
  absl::StatusOr<CtrGenerator> gen = CtrGenerator::Create(std::move(config));
  EXPECT_TRUE(gen.ok()) << gen.status();
  return *std::move(gen);
}

TEST(CtrGeneratorTest, SameSeedWorkerStepSameBits) {
  const CtrGenerator a = Make(Config([&](CtrConfig&c) { c.seed = 5; })),
                     b = Make(Config([&](CtrConfig&c) { c.seed = 5; }));
  const Batch batch = MakeBatch(a, 1, 7, 64);
  EXPECT_EQ(batch, MakeBatch(b, 1, 7, 64));
  EXPECT_EQ(batch, MakeBatch(a, 1, 7, 64));  // asking again
  // A smaller batch is a prefix of a larger one: example j depends on (seed, worker, step, j).
  const Batch small = MakeBatch(a, 1, 7, 10);
  EXPECT_TRUE(std::equal(small.ids.begin(), small.ids.end(), batch.ids.begin()));
  EXPECT_TRUE(std::equal(small.labels.begin(), small.labels.end(), batch.labels.begin()));
  // Other workers, steps and seeds are other streams: no example in common.
  for (const Batch& other : {MakeBatch(a, 0, 7, 64), MakeBatch(a, 2, 7, 64), MakeBatch(a, 1, 8, 64),
                             MakeBatch(Make(Config([&](CtrConfig& c) { c.seed = 6; })), 1, 7, 64)}) {
    int same_rows = 0;
    for (int i = 0; i < 64; ++i) {
      for (int j = 0; j < 64; ++j) {
        same_rows +=
            std::equal(other.dense.begin() + i * 13, other.dense.begin() + (i + 1) * 13, batch.dense.begin() + j * 13);
      }
    }
    EXPECT_EQ(same_rows, 0);
  }
  // The test set is its own stream, fixed by the seed.
  const CtrExamples test = *a.TestSet(64);
  EXPECT_EQ(test.ids, b.TestSet(64)->ids);
  EXPECT_NE(test.ids, batch.ids);
  Batch tail;
  tail.ids.resize(10 * 26);
  tail.dense.resize(10 * 13);
  tail.labels.resize(10);
  ASSERT_TRUE(a.FillTest(54, 10, tail.ids.data(), tail.dense.data(), tail.labels.data()).ok());
  EXPECT_TRUE(std::equal(tail.ids.begin(), tail.ids.end(), test.ids.begin() + 54 * 26));
}

// --ctr_preset: "criteo" is CtrConfig's defaults; "learnable" caps every field's vocabulary and
// raises the FM scale, which raises the Bayes AUC (more signal per example); another name is refused.
TEST(CtrGeneratorTest, PresetsCriteoAndLearnable) {
  CtrConfig criteo, learnable, bad;
  criteo.seed = learnable.seed = 3;
  ASSERT_TRUE(ApplyCtrPreset("criteo", &criteo).ok());
  ASSERT_TRUE(ApplyCtrPreset("learnable", &learnable).ok());
  EXPECT_EQ(criteo.vocab_sizes, DefaultCtrVocabSizes(26));
  EXPECT_EQ(criteo.interaction_std, CtrConfig{}.interaction_std);
  ASSERT_EQ(learnable.vocab_sizes.size(), 26u);
  for (size_t f = 0; f < 26; ++f) {
    EXPECT_EQ(learnable.vocab_sizes[f], std::min(criteo.vocab_sizes[f], kLearnableVocabCap)) << f;
  }
  EXPECT_EQ(learnable.interaction_std, kLearnableInteractionStd);
  EXPECT_EQ(learnable.seed, 3u);
  const absl::Status refused = ApplyCtrPreset("kaggle", &bad);
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(refused.message()), ::testing::HasSubstr("--ctr_preset=kaggle"));
  auto bayes = [](CtrConfig config) {
    auto gen = CtrGenerator::Create(std::move(config));
    EXPECT_TRUE(gen.ok()) << gen.status();
    auto test = gen->TestSet(20000);
    EXPECT_TRUE(test.ok()) << test.status();
    return BayesMetrics(*test)->auc;
  };
  EXPECT_GT(bayes(learnable), bayes(criteo) + 0.05);
}

TEST(CtrGeneratorTest, FillingABatchAllocatesNothing) {
  const CtrGenerator gen = Make({});
  Batch b = MakeBatch(gen, 0, 0, 256);
  const int64_t before = testing::HeapAllocations();
  ASSERT_TRUE(gen.FillBatch(0, 1, 256, b.ids.data(), b.dense.data(), b.labels.data(), b.probabilities.data()).ok());
  EXPECT_EQ(testing::HeapAllocations() - before, 0);
}

TEST(CtrGeneratorTest, IdsAreABijectionOfRanksIntoNonNegativeInt64) {
  const CtrGenerator gen = Make(Config([&](CtrConfig& c) {
    c.num_fields = 2;
    c.vocab_sizes = {200000, 3};
  }));
  std::unordered_set<int64_t> seen;
  for (int64_t r = 1; r <= 200000; ++r) {
    const int64_t id = gen.IdOfRank(0, r);
    EXPECT_GE(id, 0);
    EXPECT_TRUE(seen.insert(id).second) << "rank " << r;
  }
  // Spread over the whole range: the largest of 200000 ids is near 2^63.
  EXPECT_GT(*std::max_element(seen.begin(), seen.end()), int64_t{1} << 62);
  const Batch b = MakeBatch(gen, 0, 0, 1000);
  for (int i = 0; i < 1000; ++i) {
    EXPECT_TRUE(seen.count(b.ids[2 * i]));
    const int64_t small = b.ids[2 * i + 1];
    EXPECT_TRUE(small == gen.IdOfRank(1, 1) || small == gen.IdOfRank(1, 2) || small == gen.IdOfRank(1, 3));
  }
}

// Upper critical value of chi-square with `df` degrees of freedom at z standard deviations
// (Wilson-Hilferty); z = 4 is a tail probability of about 3e-5.
double ChiSquareCritical(double df, double z = 4.0) {
  const double h = 2.0 / (9.0 * df);
  return df * std::pow(1 - h + z * std::sqrt(h), 3);
}

TEST(CtrGeneratorTest, ZipfFrequenciesMatchThePmf) {
  // Field 0: every rank its own bin (cells of one rank, then up to 46);
  // field 1: 2^20 ranks in bins of single ranks then doubling ranges (Euler-Maclaurin cells).
  const int64_t v0 = 3000, v1 = int64_t{1} << 20;
  const CtrGenerator gen = Make(Config([&](CtrConfig& c) {
    c.seed = 11;
    c.num_fields = 2;
    c.num_dense = 0;
    c.vocab_sizes = {v0, v1};
  }));
  std::vector<std::pair<int64_t, int64_t>> id_to_rank1(v1);
  for (int64_t r = 1; r <= v1; ++r) id_to_rank1[r - 1] = {gen.IdOfRank(1, r), r};
  std::sort(id_to_rank1.begin(), id_to_rank1.end());
  std::vector<std::pair<int64_t, int64_t>> id_to_rank0(v0);
  for (int64_t r = 1; r <= v0; ++r) id_to_rank0[r - 1] = {gen.IdOfRank(0, r), r};
  std::sort(id_to_rank0.begin(), id_to_rank0.end());
  auto rank_of = [](const std::vector<std::pair<int64_t, int64_t>>& table, int64_t id) {
    auto it = std::lower_bound(table.begin(), table.end(), std::make_pair(id, int64_t{0}));
    EXPECT_TRUE(it != table.end() && it->first == id);
    return it->second;
  };
  // Bins of field 1: ranks 1..64 alone, then [2^j, 2^(j+1)).
  auto bin1 = [](int64_t r) { return r <= 64 ? static_cast<int>(r - 1) : 64 + static_cast<int>(std::log2(r)) - 6; };
  const int bins1 = bin1(v1) + 1;

  const int64_t n = 1'000'000, batch = 10'000;
  std::vector<double> count0(v0), count1(bins1);
  std::vector<int64_t> ids(batch * 2);
  std::vector<float> labels(batch);
  for (int64_t step = 0; step < n / batch; ++step) {
    ASSERT_TRUE(gen.FillBatch(0, step, batch, ids.data(), nullptr, labels.data()).ok());
    for (int64_t i = 0; i < batch; ++i) {
      count0[rank_of(id_to_rank0, ids[2 * i]) - 1] += 1;
      count1[bin1(rank_of(id_to_rank1, ids[2 * i + 1]))] += 1;
    }
  }
  // The pmf, summed term by term here.
  auto pmf = [](int64_t v) {
    std::vector<double> p(v);
    double total = 0;
    for (int64_t r = v; r >= 1; --r) total += p[r - 1] = std::pow(static_cast<double>(r), -1.1);
    for (double& x : p) x /= total;
    return p;
  };
  const std::vector<double> p0 = pmf(v0), p1 = pmf(v1);
  std::vector<double> expected1(bins1);
  for (int64_t r = 1; r <= v1; ++r) expected1[bin1(r)] += p1[r - 1];
  double chi0 = 0, chi1 = 0;
  for (int64_t r = 0; r < v0; ++r) chi0 += std::pow(count0[r] - n * p0[r], 2) / (n * p0[r]);
  for (int b = 0; b < bins1; ++b) chi1 += std::pow(count1[b] - n * expected1[b], 2) / (n * expected1[b]);
  EXPECT_LT(chi0, ChiSquareCritical(v0 - 1)) << "3000 ranks";
  EXPECT_LT(chi1, ChiSquareCritical(bins1 - 1)) << bins1 << " bins of 2^20 ranks";
  // And not vacuous: the head is heavy as Zipf(1.1) says (rank 1 alone ~ 1/6.2 of field 0).
  EXPECT_NEAR(count0[0] / n, p0[0], 0.002);
  EXPECT_GT(p0[0], 0.15);
}

TEST(CtrGeneratorTest, HugeVocabulariesHaveHeadAndTail) {
  // 10^12 ranks: nothing is tabulated per rank. Rank 1's share is the pmf's (its normalizer summed
  // here: 10^6 terms, then the integral and Euler-Maclaurin's end correction), and the long tail
  // makes most ids of a sample distinct.
  const CtrGenerator gen = Make(Config([&](CtrConfig& c) {
    c.num_fields = 1;
    c.num_dense = 0;
    c.vocab_sizes = {1'000'000'000'000};
  }));
  const int64_t n = 200'000;
  std::vector<int64_t> ids(n);
  std::vector<float> labels(n);
  ASSERT_TRUE(gen.FillBatch(0, 0, n, ids.data(), nullptr, labels.data()).ok());
  double total = 0;  // Σ_{r<=1e12} r^-1.1 by Euler-Maclaurin beyond 10^6 terms
  for (int64_t r = 1; r <= 1'000'000; ++r) total += std::pow(static_cast<double>(r), -1.1);
  total += (std::pow(1e6, -0.1) - std::pow(1e12, -0.1)) / 0.1 - 0.5 * std::pow(1e6, -1.1);
  const int64_t top = gen.IdOfRank(0, 1);
  const double share = static_cast<double>(std::count(ids.begin(), ids.end(), top)) / n;
  const double expected = 1 / total;
  EXPECT_NEAR(share, expected, 5 * std::sqrt(expected * (1 - expected) / n));
  std::unordered_set<int64_t> distinct(ids.begin(), ids.end());
  EXPECT_GT(distinct.size(), static_cast<size_t>(n / 4));  // a long tail of ids seen once
}

TEST(CtrGeneratorTest, TeacherLogitIsThePairwiseFactorizationMachine) {
  const CtrGenerator gen = Make(Config([&](CtrConfig& c) {
    c.seed = 3;
    c.num_fields = 6;
    c.num_dense = 5;
    c.teacher_dim = 7;
  }));
  const Batch b = MakeBatch(gen, 0, 0, 50);
  std::vector<std::vector<float>> e(6, std::vector<float>(7));
  for (int i = 0; i < 50; ++i) {
    for (int f = 0; f < 6; ++f) gen.TeacherEmbedding(f, b.ids[i * 6 + f], e[f].data());
    double logit = gen.bias();
    for (int d = 0; d < 5; ++d) logit += gen.dense_weights()[d] * static_cast<double>(b.dense[i * 5 + d]);
    for (int f = 0; f < 6; ++f) {
      for (int g = f + 1; g < 6; ++g) {
        for (int j = 0; j < 7; ++j) logit += static_cast<double>(e[f][j]) * e[g][j];
      }
    }
    EXPECT_NEAR(gen.TrueLogit(&b.ids[i * 6], &b.dense[i * 5]), logit, 1e-9);
    EXPECT_NEAR(b.probabilities[i], 1 / (1 + std::exp(-logit)), 1e-12);
  }
  // E*_f[id] depends on (seed, field, id) only.
  std::vector<float> x(7), y(7);
  gen.TeacherEmbedding(2, 12345, x.data());
  Make(Config([&](CtrConfig& c) {
    c.seed = 3;
    c.num_fields = 6;
    c.num_dense = 5;
    c.teacher_dim = 7;
  })).TeacherEmbedding(2, 12345, y.data());
  EXPECT_EQ(x, y);
  gen.TeacherEmbedding(3, 12345, y.data());
  EXPECT_NE(x, y);
}

// Dense features are log(1 + c) of integer counts c = floor(exp(1 + 1.5 z)), z ~ N(0, 1) (what a
// reader of Criteo's layout makes of the integers in a file), and w*·x has sd dense_std.
TEST(CtrGeneratorTest, DenseFeaturesAreLogCounts) {
  const CtrGenerator gen = Make(Config([&](CtrConfig& c) { c.seed = 9; }));
  const Batch b = MakeBatch(gen, 0, 0, 20000);
  double zero = 0, at_most_one = 0, at_most_nine = 0;
  for (float x : b.dense) {
    const int64_t c = CtrGenerator::DenseCount(x);
    ASSERT_GE(c, 0) << x;
    ASSERT_EQ(static_cast<float>(std::log1p(static_cast<double>(c))), x);
    zero += c == 0;
    at_most_one += c <= 1;
    at_most_nine += c <= 9;
  }
  const double n = static_cast<double>(b.dense.size());
  // P(c < t) = P(exp(1 + 1.5 z) < t) = Φ((ln t − 1) / 1.5).
  EXPECT_NEAR(zero / n, 0.2524925375469229, 4 * std::sqrt(0.19 / n));
  EXPECT_NEAR(at_most_one / n, 0.41895461604176243, 4 * std::sqrt(0.25 / n));
  EXPECT_NEAR(at_most_nine / n, 0.8074095832722965, 4 * std::sqrt(0.16 / n));
  // sd(w*·x) over examples is dense_std.
  double sum = 0, sum2 = 0;
  for (int64_t i = 0; i < 20000; ++i) {
    double z = 0;
    for (int d = 0; d < 13; ++d) z += static_cast<double>(gen.dense_weights()[d]) * b.dense[i * 13 + d];
    sum += z;
    sum2 += z * z;
  }
  const double sd = std::sqrt(sum2 / 20000 - (sum / 20000) * (sum / 20000));
  EXPECT_NEAR(sd, 0.5, 0.5 * 4 / std::sqrt(2 * 20000.0));  // dense_std, within 4 sd of its estimate
}

TEST(CtrGeneratorTest, BaseRateNearTarget) {
  for (double target : {0.25, 0.05}) {
    const CtrGenerator gen = Make(Config([&](CtrConfig& c) {
      c.seed = 21;
      c.base_ctr = target;
    }));
    const CtrExamples test = *gen.TestSet(100000);
    const double mean_p = std::accumulate(test.probabilities.begin(), test.probabilities.end(), 0.0) / 1e5;
    const double rate = std::accumulate(test.labels.begin(), test.labels.end(), 0.0) / 1e5;
    EXPECT_NEAR(mean_p, target, 0.01 * target / 0.25 + 0.002) << target;
    // Labels are Bernoulli(p): their mean is within 4 sd of the mean probability.
    EXPECT_NEAR(rate, mean_p, 4 * std::sqrt(mean_p / 1e5)) << target;
  }
}

// Logistic regression on the dense features by Newton's method (D+1 parameters).
std::vector<double> FitDenseLogisticRegression(const std::vector<float>& dense, const std::vector<float>& labels,
                                               int d) {
  const int p = d + 1;
  std::vector<double> w(p, 0.0);
  const size_t n = labels.size();
  for (int iteration = 0; iteration < 12; ++iteration) {
    std::vector<double> grad(p, 0.0), hess(p * p, 0.0), x(p);
    for (size_t i = 0; i < n; ++i) {
      x[0] = 1;
      for (int j = 0; j < d; ++j) x[j + 1] = dense[i * d + j];
      const double z = std::inner_product(w.begin(), w.end(), x.begin(), 0.0);
      const double q = 1 / (1 + std::exp(-z));
      for (int a = 0; a < p; ++a) {
        grad[a] += (q - labels[i]) * x[a];
        for (int c = 0; c < p; ++c) hess[a * p + c] += q * (1 - q) * x[a] * x[c];
      }
    }
    // Solve hess · step = grad (Gaussian elimination; hess is positive definite).
    for (int col = 0; col < p; ++col) {
      for (int row = col + 1; row < p; ++row) {
        const double f = hess[row * p + col] / hess[col * p + col];
        for (int c = col; c < p; ++c) hess[row * p + c] -= f * hess[col * p + c];
        grad[row] -= f * grad[col];
      }
    }
    for (int row = p - 1; row >= 0; --row) {
      double s = grad[row];
      for (int c = row + 1; c < p; ++c) s -= hess[row * p + c] * grad[c];
      grad[row] = s / hess[row * p + row];
    }
    for (int a = 0; a < p; ++a) w[a] -= grad[a];
  }
  return w;
}

TEST(CtrGeneratorTest, BayesBeatsTrivialAndDenseOnlyModels) {
  const CtrGenerator gen = Make(Config([&](CtrConfig& c) { c.seed = 1; }));
  const CtrExamples test = *gen.TestSet(50000);
  const CtrBayesMetrics bayes = *BayesMetrics(test);
  const Batch train = MakeBatch(gen, 0, 0, 50000);
  const std::vector<double> w = FitDenseLogisticRegression(train.dense, train.labels, 13);
  std::vector<double> lr(test.num_examples);
  for (int64_t i = 0; i < test.num_examples; ++i) {
    double z = w[0];
    for (int j = 0; j < 13; ++j) z += w[j + 1] * test.dense[i * 13 + j];
    lr[i] = 1 / (1 + std::exp(-z));
  }
  const double lr_auc = *Auc(test.labels, lr), lr_loss = *LogLoss(test.labels, lr);
  // The trivial model: the training click rate for everyone (AUC 1/2, log-loss its entropy).
  const double rate = std::accumulate(train.labels.begin(), train.labels.end(), 0.0) / 50000;
  const std::vector<double> trivial(test.num_examples, rate);
  const double trivial_auc = *Auc(test.labels, trivial), trivial_loss = *LogLoss(test.labels, trivial);
  EXPECT_DOUBLE_EQ(trivial_auc, 0.5);
  // The dense part carries signal, the interactions more: trivial < dense-only LR < Bayes.
  EXPECT_GT(lr_auc, trivial_auc + 0.05);
  EXPECT_GT(bayes.auc, lr_auc + 0.05);
  EXPECT_LT(lr_loss, trivial_loss);
  EXPECT_LT(bayes.log_loss, lr_loss - 0.02);
  // The empirical log-loss of the true probabilities is near its expectation.
  EXPECT_NEAR(bayes.log_loss, bayes.expected_log_loss, 0.01);
  EXPECT_NEAR(bayes.click_rate, 0.25, 0.01);
  RecordProperty("bayes_auc", std::to_string(bayes.auc));
  RecordProperty("dense_lr_auc", std::to_string(lr_auc));
  std::printf("Bayes AUC %.4f log-loss %.4f; dense-only LR AUC %.4f log-loss %.4f; trivial log-loss %.4f\n", bayes.auc,
              bayes.log_loss, lr_auc, lr_loss, trivial_loss);
}

TEST(CtrGeneratorTest, BadConfigAndArgumentsAreOneLine) {
  EXPECT_THAT(CtrGenerator::Create(Config([&](CtrConfig& c) { c.num_fields = 0; })).status().message(),
              HasSubstr("num_fields is 0"));
  EXPECT_THAT(CtrGenerator::Create(Config([&](CtrConfig& c) {
                c.num_fields = 2;
                c.vocab_sizes = {5};
              }))
                  .status()
                  .message(),
              HasSubstr("1 vocabulary sizes for 2 fields"));
  EXPECT_THAT(CtrGenerator::Create(Config([&](CtrConfig& c) {
                c.num_fields = 1;
                c.vocab_sizes = {0};
              }))
                  .status()
                  .message(),
              HasSubstr("field 0's vocabulary size is 0"));
  EXPECT_THAT(CtrGenerator::Create(Config([&](CtrConfig& c) { c.zipf_alpha = 0; })).status().message(),
              HasSubstr("zipf_alpha is 0"));
  EXPECT_THAT(CtrGenerator::Create(Config([&](CtrConfig& c) { c.teacher_dim = 0; })).status().message(),
              HasSubstr("teacher_dim is 0"));
  EXPECT_THAT(CtrGenerator::Create(Config([&](CtrConfig& c) { c.base_ctr = 1; })).status().message(),
              HasSubstr("base_ctr is 1"));
  const CtrGenerator gen = Make({});
  int64_t ids[26];
  float dense[13], label;
  EXPECT_THAT(gen.FillBatch(-1, 0, 1, ids, dense, &label).message(), HasSubstr("none may be negative"));
  EXPECT_THAT(gen.FillBatch(0, 0, 1, nullptr, dense, &label).message(), HasSubstr("is null"));
  EXPECT_THAT(gen.FillTest(0, -1, ids, dense, &label).message(), HasSubstr("neither may be negative"));
  EXPECT_THAT(gen.TestSet(0).status().message(), HasSubstr("at least 1"));
}

}  // namespace
}  // namespace psflow::data
