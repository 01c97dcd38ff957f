// Losses besides SoftmaxCrossEntropy (ops_dense.cc): SigmoidCrossEntropy for binary labels and
// MeanSquaredError for regression. Both are means over every element and return scalar Vars; the
// labels / targets are copied into the backward closure, so the caller's span may die after the
// call. The element-wise terms are Eigen float expressions (vectorized exp / log1p / logistic);
// they are summed in float over blocks of 1024 elements and the blocks in double, so a batch of a
// million terms keeps float precision.
#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <vector>

#include "core/check.h"
#include "psflow/core/ops.h"

namespace psflow::ops {
namespace {

using ConstArrayMap = Eigen::Map<const Eigen::ArrayXf>;
using ArrayMap = Eigen::Map<Eigen::ArrayXf>;
constexpr int64_t kBlock = 1024;

// Σ term(x[i0:i1], z[i0:i1]) over blocks of kBlock, blocks summed in double.
template <typename Term>
double BlockedSum(const float* x, const float* z, int64_t n, Term&& term) {
  double total = 0.0;
  for (int64_t i = 0; i < n; i += kBlock) {
    const int64_t len = std::min(kBlock, n - i);
    total += static_cast<double>(term(ConstArrayMap(x + i, len), ConstArrayMap(z + i, len)).sum());
  }
  return total;
}

}  // namespace

Var SigmoidCrossEntropy(const Var& logits, std::span<const float> labels) {
  const Tensor& lv = logits->value;
  CHECK_EQ(static_cast<int64_t>(labels.size()), lv.size())
      << "SigmoidCrossEntropy: " << labels.size() << " labels for logits " << ShapeToString(lv.shape());
  const int64_t n = lv.size();
  // max(x, 0) - x z + log(1 + exp(-|x|)): no overflow for large |x|, no log(0). log(1 + e) rather
  // than Eigen's log1p, which is scalar: for e below float epsilon it gives 0 instead of e, an
  // absolute error under 1e-7 per term.
  const double total = BlockedSum(lv.data(), labels.data(), n, [](const auto& x, const auto& z) {
    return (x.max(0.0f) - x * z + (1.0f + (-x.abs()).exp()).log()).eval();
  });
  const float loss = n == 0 ? 0.0f : static_cast<float>(total / static_cast<double>(n));
  std::vector<float> label_copy(labels.begin(), labels.end());
  return MakeOpNode(
      "SigmoidCrossEntropy", Tensor::Scalar(loss), {logits}, [label_copy = std::move(label_copy)](Node& self) {
        Node& input = *self.inputs[0];
        const int64_t count = input.value.size();
        const float scale = self.grad[0] / static_cast<float>(count);
        Tensor d = Tensor::Uninitialized(input.value.shape());
        // d/dx = sigmoid(x) - z (Eigen's logistic saturates without overflow).
        ArrayMap(d.data(), count) =
            scale * (ConstArrayMap(input.value.data(), count).logistic() - ConstArrayMap(label_copy.data(), count));
        input.AccumulateGrad(std::move(d));
      });
}

Var MeanSquaredError(const Var& predictions, std::span<const float> targets) {
  const Tensor& pv = predictions->value;
  CHECK_EQ(static_cast<int64_t>(targets.size()), pv.size())
      << "MeanSquaredError: " << targets.size() << " targets for predictions " << ShapeToString(pv.shape());
  const int64_t n = pv.size();
  const double total =
      BlockedSum(pv.data(), targets.data(), n, [](const auto& p, const auto& t) { return (p - t).square().eval(); });
  const float loss = n == 0 ? 0.0f : static_cast<float>(total / static_cast<double>(n));
  std::vector<float> target_copy(targets.begin(), targets.end());
  return MakeOpNode("MeanSquaredError", Tensor::Scalar(loss), {predictions},
                    [target_copy = std::move(target_copy)](Node& self) {
                      Node& input = *self.inputs[0];
                      const int64_t count = input.value.size();
                      const float scale = 2.0f * self.grad[0] / static_cast<float>(count);
                      Tensor d = Tensor::Uninitialized(input.value.shape());
                      ArrayMap(d.data(), count) =
                          scale * (ConstArrayMap(input.value.data(), count) - ConstArrayMap(target_copy.data(), count));
                      input.AccumulateGrad(std::move(d));
                    });
}

}  // namespace psflow::ops
