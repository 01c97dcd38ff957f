// Log-loss and exact AUC (include/psflow/data/ctr_metrics.h).
#include "psflow/data/ctr_metrics.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace psflow::data {
namespace {

constexpr double kClip = 1e-15;

template <typename T>
absl::Status CheckInputs(const char* what, absl::Span<const float> labels, absl::Span<const T> values) {
  if (labels.size() != values.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": ", labels.size(), " labels but ", values.size(), " scores; pass one score per label"));
  }
  if (labels.empty()) return absl::InvalidArgumentError(absl::StrCat(what, ": no examples; pass at least one"));
  for (size_t i = 0; i < labels.size(); ++i) {
    if (labels[i] != 0.0f && labels[i] != 1.0f) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": label ", i, " is ", labels[i], "; labels must be 0 or 1"));
    }
    if (std::isnan(values[i])) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": score ", i, " is NaN"));
    }
  }
  return absl::OkStatus();
}

template <typename T>
absl::StatusOr<double> LogLossImpl(absl::Span<const float> labels, absl::Span<const T> probabilities) {
  if (absl::Status s = CheckInputs("log_loss", labels, probabilities); !s.ok()) return s;
  double sum = 0;
  for (size_t i = 0; i < labels.size(); ++i) {
    const double p = probabilities[i];
    if (!(p >= 0.0 && p <= 1.0)) {
      return absl::InvalidArgumentError(absl::StrCat("log_loss: probability ", i, " is ", p,
                                                     "; probabilities must be in [0, 1] (pass sigmoid(logit))"));
    }
    const double clipped = std::clamp(p, kClip, 1.0 - kClip);
    sum -= labels[i] == 1.0f ? std::log(clipped) : std::log1p(-clipped);
  }
  return sum / static_cast<double>(labels.size());
}

template <typename T>
absl::StatusOr<double> AucImpl(absl::Span<const float> labels, absl::Span<const T> scores) {
  if (absl::Status s = CheckInputs("auc", labels, scores); !s.ok()) return s;
  const size_t n = labels.size();
  std::vector<size_t> order(n);
  std::iota(order.begin(), order.end(), size_t{0});
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return scores[a] < scores[b]; });
  // Sum of the positives' ranks (1-based), a run of equal scores sharing its average rank.
  double positive_rank_sum = 0;
  double positives = 0;
  for (size_t i = 0; i < n;) {
    size_t j = i;
    double run_positives = 0;
    while (j < n && scores[order[j]] == scores[order[i]]) run_positives += labels[order[j++]];
    const double average_rank = 0.5 * static_cast<double>(i + 1 + j);  // mean of i+1 .. j
    positive_rank_sum += run_positives * average_rank;
    positives += run_positives;
    i = j;
  }
  const double negatives = static_cast<double>(n) - positives;
  if (positives == 0 || negatives == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("auc: all ", n, " labels are ", positives == 0 ? 0 : 1, "; AUC needs both classes"));
  }
  return (positive_rank_sum - positives * (positives + 1) / 2) / (positives * negatives);
}

}  // namespace

absl::StatusOr<double> LogLoss(absl::Span<const float> labels, absl::Span<const float> probabilities) {
  return LogLossImpl(labels, probabilities);
}
absl::StatusOr<double> LogLoss(absl::Span<const float> labels, absl::Span<const double> probabilities) {
  return LogLossImpl(labels, probabilities);
}
absl::StatusOr<double> Auc(absl::Span<const float> labels, absl::Span<const float> scores) {
  return AucImpl(labels, scores);
}
absl::StatusOr<double> Auc(absl::Span<const float> labels, absl::Span<const double> scores) {
  return AucImpl(labels, scores);
}

}  // namespace psflow::data
