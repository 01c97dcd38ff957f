// LayerNorm over the last axis with a gain and a bias. The forward pass keeps the normalized
// input x̂ and each row's 1/σ for the backward pass, which is the usual closed form
//   dx = (1/σ) (dx̂ - mean(dx̂) - x̂ mean(dx̂ x̂)),  dx̂ = g · gain,
//   dgain = Σ_rows g x̂,  dbias = Σ_rows g.
// Rows are independent and split over the intra-op threads; the column sums go through fixed row
// chunks (MaskAndSumColumns), so results do not depend on the thread count. Row statistics are
// accumulated in double: a row of a few thousand floats keeps its mean exact to float precision.
#include <algorithm>
#include <cmath>
#include <vector>

#include "core/check.h"
#include "core/ops_internal.h"
#include "core/threading_internal.h"
#include "psflow/core/ops.h"
#include "psflow/core/threading.h"

namespace psflow::ops {

Var LayerNorm(const Var& x, const Var& gain, const Var& bias, float epsilon) {
  psflow::internal::PrepareThreadForKernels();
  const Tensor& xv = x->value;
  CHECK(xv.rank() >= 1) << "LayerNorm of a scalar";
  const int64_t d = xv.dim(xv.rank() - 1);
  CHECK(gain->value.shape() == Shape{d} && bias->value.shape() == Shape{d})
      << "LayerNorm: gain " << ShapeToString(gain->value.shape()) << " and bias " << ShapeToString(bias->value.shape())
      << " must both be [" << d << "] for x " << ShapeToString(xv.shape());
  CHECK(epsilon >= 0.0f) << "LayerNorm: epsilon " << epsilon << " must be >= 0";
  const int64_t rows = d == 0 ? 0 : xv.size() / d;
  Tensor normalized = Tensor::Uninitialized(xv.shape());
  Tensor out = Tensor::Uninitialized(xv.shape());
  std::vector<float> inv_std(static_cast<size_t>(rows));
  const float* gp = gain->value.data();
  const float* bp = bias->value.data();
  const int64_t min_rows = internal::kMinElementsPerBlock / std::max<int64_t>(d, 1) + 1;
  ParallelFor(rows, min_rows, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* xr = xv.data() + r * d;
      double sum = 0.0;
      for (int64_t c = 0; c < d; ++c) sum += xr[c];
      const double mean = sum / static_cast<double>(d);
      double squares = 0.0;
      for (int64_t c = 0; c < d; ++c) squares += (xr[c] - mean) * (xr[c] - mean);
      const float rstd = static_cast<float>(1.0 / std::sqrt(squares / static_cast<double>(d) + epsilon));
      const float mean_f = static_cast<float>(mean);
      inv_std[static_cast<size_t>(r)] = rstd;
      float* nr = normalized.data() + r * d;
      float* yr = out.data() + r * d;
      for (int64_t c = 0; c < d; ++c) {
        nr[c] = (xr[c] - mean_f) * rstd;
        yr[c] = nr[c] * gp[c] + bp[c];
      }
    }
  });
  return MakeOpNode(
      "LayerNorm", std::move(out), {x, gain, bias},
      [rows, d, min_rows, normalized = std::move(normalized), inv_std = std::move(inv_std)](Node& self) {
        Node& nx = *self.inputs[0];
        Node& ngain = *self.inputs[1];
        Node& nbias = *self.inputs[2];
        float* g = self.grad.data();
        const float* xh = normalized.data();
        if (nbias.requires_grad) {
          Tensor db;
          internal::MaskAndSumColumns(g, nullptr, rows, d, /*relu=*/false, &db);
          nbias.AccumulateGrad(std::move(db));
        }
        if (ngain.requires_grad) {
          Tensor product = Tensor::Uninitialized(self.grad.shape());
          for (int64_t i = 0; i < product.size(); ++i) product[i] = g[i] * xh[i];
          Tensor dg;
          internal::MaskAndSumColumns(product.data(), nullptr, rows, d, /*relu=*/false, &dg);
          ngain.AccumulateGrad(std::move(dg));
        }
        if (!nx.requires_grad) return;
        const float* gp = ngain.value.data();
        ParallelFor(rows, min_rows, [&](int64_t r0, int64_t r1) {
          for (int64_t r = r0; r < r1; ++r) {
            float* gr = g + r * d;
            const float* xr = xh + r * d;
            double mean_dxh = 0.0, mean_dxh_xh = 0.0;
            for (int64_t c = 0; c < d; ++c) {
              const double dxh = static_cast<double>(gr[c]) * gp[c];
              mean_dxh += dxh;
              mean_dxh_xh += dxh * xr[c];
            }
            const float a = static_cast<float>(mean_dxh / static_cast<double>(d));
            const float b = static_cast<float>(mean_dxh_xh / static_cast<double>(d));
            const float rstd = inv_std[static_cast<size_t>(r)];
            for (int64_t c = 0; c < d; ++c) gr[c] = rstd * (gr[c] * gp[c] - a - xr[c] * b);  // in place
          }
        });
        nx.AccumulateGrad(std::move(self.grad));
      });
}

}  // namespace psflow::ops
