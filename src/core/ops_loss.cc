// Losses besides SoftmaxCrossEntropy (ops_dense.cc): SigmoidCrossEntropy for binary labels and
// MeanSquaredError for regression. Both are means over every element and return scalar Vars; the
// labels / targets are copied into the backward closure, so the caller's span may die after the
// call. Sums are accumulated in double (a batch of a million terms keeps float precision).
#include <algorithm>
#include <cmath>
#include <vector>

#include "core/check.h"
#include "psflow/core/ops.h"

namespace psflow::ops {

Var SigmoidCrossEntropy(const Var& logits, std::span<const float> labels) {
  const Tensor& lv = logits->value;
  CHECK_EQ(static_cast<int64_t>(labels.size()), lv.size())
      << "SigmoidCrossEntropy: " << labels.size() << " labels for logits " << ShapeToString(lv.shape());
  const int64_t n = lv.size();
  double total = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    const float x = lv[i];
    const float z = labels[static_cast<size_t>(i)];
    // max(x, 0) - x z + log(1 + exp(-|x|)): no overflow for large |x|, no log(0).
    total += std::max(x, 0.0f) - static_cast<double>(x) * z + std::log1p(std::exp(-std::abs(static_cast<double>(x))));
  }
  const float loss = n == 0 ? 0.0f : static_cast<float>(total / static_cast<double>(n));
  std::vector<float> label_copy(labels.begin(), labels.end());
  return MakeOpNode("SigmoidCrossEntropy", Tensor::Scalar(loss), {logits},
                    [label_copy = std::move(label_copy)](Node& self) {
                      Node& input = *self.inputs[0];
                      const int64_t count = input.value.size();
                      const float scale = self.grad[0] / static_cast<float>(count);
                      Tensor d = Tensor::Uninitialized(input.value.shape());
                      for (int64_t i = 0; i < count; ++i) {
                        // d/dx = sigmoid(x) - z, with the sigmoid computed without overflow.
                        const float x = input.value[i];
                        const float e = std::exp(-std::abs(x));
                        const float sigmoid = x >= 0.0f ? 1.0f / (1.0f + e) : e / (1.0f + e);
                        d[i] = scale * (sigmoid - label_copy[static_cast<size_t>(i)]);
                      }
                      input.AccumulateGrad(std::move(d));
                    });
}

Var MeanSquaredError(const Var& predictions, std::span<const float> targets) {
  const Tensor& pv = predictions->value;
  CHECK_EQ(static_cast<int64_t>(targets.size()), pv.size())
      << "MeanSquaredError: " << targets.size() << " targets for predictions " << ShapeToString(pv.shape());
  const int64_t n = pv.size();
  double total = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    const double diff = static_cast<double>(pv[i]) - targets[static_cast<size_t>(i)];
    total += diff * diff;
  }
  const float loss = n == 0 ? 0.0f : static_cast<float>(total / static_cast<double>(n));
  std::vector<float> target_copy(targets.begin(), targets.end());
  return MakeOpNode("MeanSquaredError", Tensor::Scalar(loss), {predictions},
                    [target_copy = std::move(target_copy)](Node& self) {
                      Node& input = *self.inputs[0];
                      const int64_t count = input.value.size();
                      const float scale = 2.0f * self.grad[0] / static_cast<float>(count);
                      Tensor d = Tensor::Uninitialized(input.value.shape());
                      for (int64_t i = 0; i < count; ++i) {
                        d[i] = scale * (input.value[i] - target_copy[static_cast<size_t>(i)]);
                      }
                      input.AccumulateGrad(std::move(d));
                    });
}

}  // namespace psflow::ops
