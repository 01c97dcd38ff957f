// psflow/data/ctr_metrics.h — the two numbers a click-through-rate model is judged by, for any
// binary classifier: log-loss (mean cross-entropy) and ROC AUC, computed exactly.
//
// Labels are 0 or 1. Log-loss clips each probability to [1e-15, 1 - 1e-15] (as scikit-learn did)
// so that a confident mistake costs 34.5 nats rather than infinity. AUC is the probability that a
// random positive scores above a random negative, ties counting one half: sorted once
// (O(n log n)), tied scores share their average rank (the Mann-Whitney U statistic).
// Functions of their arguments only; thread-safe. Each returns InvalidArgument with one line
// naming what is wrong (lengths that differ, an empty input, a label that is not 0 or 1, a NaN,
// a probability outside [0, 1], one class only for AUC).
#ifndef PSFLOW_DATA_CTR_METRICS_H_
#define PSFLOW_DATA_CTR_METRICS_H_

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace psflow::data {

// Mean over examples of -(y·log p + (1-y)·log(1-p)), in double.
absl::StatusOr<double> LogLoss(absl::Span<const float> labels, absl::Span<const float> probabilities);
absl::StatusOr<double> LogLoss(absl::Span<const float> labels, absl::Span<const double> probabilities);

// ROC AUC of `scores` (probabilities, logits or any monotone score) against `labels`.
absl::StatusOr<double> Auc(absl::Span<const float> labels, absl::Span<const float> scores);
absl::StatusOr<double> Auc(absl::Span<const float> labels, absl::Span<const double> scores);

}  // namespace psflow::data

#endif  // PSFLOW_DATA_CTR_METRICS_H_
