// LogLoss and Auc against hand computations and a brute-force pairwise AUC.
#include "psflow/data/ctr_metrics.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace psflow::data {
namespace {

using ::testing::HasSubstr;

// The definition: over all (positive, negative) pairs, 1 if the positive scores higher, 1/2 if tied.
double PairwiseAuc(const std::vector<float>& labels, const std::vector<double>& scores) {
  double wins = 0, pairs = 0;
  for (size_t i = 0; i < labels.size(); ++i) {
    if (labels[i] != 1) continue;
    for (size_t j = 0; j < labels.size(); ++j) {
      if (labels[j] != 0) continue;
      pairs += 1;
      wins += scores[i] > scores[j] ? 1.0 : scores[i] == scores[j] ? 0.5 : 0.0;
    }
  }
  return wins / pairs;
}

TEST(AucTest, EqualsPairwiseCountWithTies) {
  std::mt19937_64 rng(7);
  for (int n : {2, 3, 10, 57, 400}) {
    for (int levels : {2, 5, 1000000}) {  // few distinct scores: many ties; many: almost none
      std::vector<float> labels(n);
      std::vector<double> scores(n);
      for (int i = 0; i < n; ++i) {
        labels[i] = static_cast<float>(rng() % 3 == 0);
        scores[i] = static_cast<double>(rng() % levels) / levels + 0.3 * labels[i] * (rng() % 2);
      }
      labels[0] = 1;
      labels[1] = 0;
      const double expected = PairwiseAuc(labels, scores);
      EXPECT_NEAR(*Auc(labels, scores), expected, 1e-12) << "n=" << n << " levels=" << levels;
      const std::vector<float> float_scores(scores.begin(), scores.end());
      std::vector<double> rounded(float_scores.begin(), float_scores.end());
      EXPECT_NEAR(*Auc(labels, float_scores), PairwiseAuc(labels, rounded), 1e-12);
    }
  }
}

TEST(AucTest, KnownValues) {
  const std::vector<float> labels = {0, 0, 1, 1};
  EXPECT_DOUBLE_EQ(*Auc(labels, std::vector<float>{0.1f, 0.2f, 0.3f, 0.4f}), 1.0);
  EXPECT_DOUBLE_EQ(*Auc(labels, std::vector<float>{0.4f, 0.3f, 0.2f, 0.1f}), 0.0);
  EXPECT_DOUBLE_EQ(*Auc(labels, std::vector<float>{0.5f, 0.5f, 0.5f, 0.5f}), 0.5);
  // Pairs (pos, neg): (0.3, 0.1) win, (0.3, 0.35) loss, (0.4, 0.1) win, (0.4, 0.35) win -> 3/4.
  EXPECT_DOUBLE_EQ(*Auc(labels, std::vector<float>{0.1f, 0.35f, 0.3f, 0.4f}), 0.75);
  // Infinite logits are ordinary scores.
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_DOUBLE_EQ(*Auc(labels, std::vector<float>{-inf, 0.0f, 1.0f, inf}), 1.0);
}

TEST(LogLossTest, HandComputed) {
  // -(ln 0.8 + ln(1 - 0.3) + ln 0.5) / 3 = (0.2231435513 + 0.3566749439 + 0.6931471806) / 3
  EXPECT_NEAR(*LogLoss(std::vector<float>{1, 0, 1}, std::vector<float>{0.8f, 0.3f, 0.5f}), 0.4243218919, 1e-8);
  EXPECT_NEAR(*LogLoss(std::vector<float>{1, 0, 1}, std::vector<double>{0.8, 0.3, 0.5}), 0.42432189194, 1e-10);
  // A certain mistake costs -ln(1e-15) = 34.538776394910684 (clipped), a certain hit 1e-15.
  EXPECT_NEAR(*LogLoss(std::vector<float>{1}, std::vector<double>{0.0}), 34.538776394910684, 1e-9);
  EXPECT_NEAR(*LogLoss(std::vector<float>{0}, std::vector<double>{0.0}), 0.0, 1e-14);
}

TEST(CtrMetricsTest, BadInputIsOneLine) {
  const std::vector<float> labels = {0, 1};
  auto status = Auc(labels, std::vector<float>{0.5f}).status();
  EXPECT_THAT(status.message(), HasSubstr("2 labels but 1 scores"));
  status = LogLoss(std::vector<float>{0, 2}, std::vector<float>{0.5f, 0.5f}).status();
  EXPECT_THAT(status.message(), HasSubstr("label 1 is 2; labels must be 0 or 1"));
  status = Auc(labels, std::vector<double>{0.5, std::nan("")}).status();
  EXPECT_THAT(status.message(), HasSubstr("score 1 is NaN"));
  status = LogLoss(labels, std::vector<float>{0.5f, 1.5f}).status();
  EXPECT_THAT(status.message(), HasSubstr("probability 1 is 1.5"));
  status = Auc(std::vector<float>{1, 1}, std::vector<float>{0.5f, 0.7f}).status();
  EXPECT_THAT(status.message(), HasSubstr("AUC needs both classes"));
  status = LogLoss(std::vector<float>{}, std::vector<float>{}).status();
  EXPECT_THAT(status.message(), HasSubstr("no examples"));
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace psflow::data
