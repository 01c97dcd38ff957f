// LayerNorm over the last axis with a gain and a bias. The forward pass keeps the normalized
// input x̂ and each row's 1/σ for the backward pass, which is the usual closed form
//   dx = (1/σ) (dx̂ - mean(dx̂) - x̂ mean(dx̂ x̂)),  dx̂ = g · gain,
//   dgain = Σ_rows g x̂,  dbias = Σ_rows g.
// Rows are independent and split over the intra-op threads; the column sums go through fixed row
// chunks (MaskAndSumColumns), so results do not depend on the thread count. Rows are Eigen float
// arrays (vectorized sums); the variance is taken of the centered row, so a row far from zero
// keeps its precision.
#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <vector>

#include "core/check.h"
#include "core/ops_internal.h"
#include "core/threading_internal.h"
#include "psflow/core/ops.h"
#include "psflow/core/threading.h"

namespace psflow::ops {
namespace {
using Row = Eigen::Map<Eigen::ArrayXf>;
using ConstRow = Eigen::Map<const Eigen::ArrayXf>;
}  // namespace

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
  const ConstRow gain_row(gain->value.data(), d), bias_row(bias->value.data(), d);
  const int64_t min_rows = internal::kMinElementsPerBlock / std::max<int64_t>(d, 1) + 1;
  ParallelFor(rows, min_rows, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const ConstRow xr(xv.data() + r * d, d);
      const float mean = xr.mean();
      Row nr(normalized.data() + r * d, d);
      nr = xr - mean;  // centered first: the variance of a row far from 0 keeps its precision
      const float rstd = 1.0f / std::sqrt(nr.square().mean() + epsilon);
      inv_std[static_cast<size_t>(r)] = rstd;
      nr *= rstd;
      Row(out.data() + r * d, d) = nr * gain_row + bias_row;
    }
  });
  return MakeOpNode("LayerNorm", std::move(out), {x, gain, bias},
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
                        const int64_t n = product.size();
                        Row(product.data(), n) = ConstRow(g, n) * ConstRow(xh, n);
                        Tensor dg;
                        internal::MaskAndSumColumns(product.data(), nullptr, rows, d, /*relu=*/false, &dg);
                        ngain.AccumulateGrad(std::move(dg));
                      }
                      if (!nx.requires_grad) return;
                      const ConstRow gain_row(ngain.value.data(), d);
                      ParallelFor(rows, min_rows, [&](int64_t r0, int64_t r1) {
                        for (int64_t r = r0; r < r1; ++r) {
                          Row gr(g + r * d, d);
                          const ConstRow xr(xh + r * d, d);
                          gr *= gain_row;  // dx̂, in place
                          const float a = gr.mean();
                          const float b = (gr * xr).mean();
                          gr = inv_std[static_cast<size_t>(r)] * (gr - a - xr * b);
                        }
                      });
                      nx.AccumulateGrad(std::move(self.grad));
                    });
}

}  // namespace psflow::ops
