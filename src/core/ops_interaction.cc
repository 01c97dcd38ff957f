// GatherRows (a batch's rows from a table's unique rows, with a segment-sum backward) and
// DotInteraction (DLRM's pairwise dot products of a batch's feature vectors): the two ops a
// CTR model's embedding side needs beyond the dense ones. Both are loops over rows of d floats;
// per-row work is independent, so the backward sums run in a fixed order whatever the thread count.
#include <cstring>
#include <vector>

#include "core/check.h"
#include "core/ops_internal.h"
#include "core/threading_internal.h"
#include "psflow/core/ops.h"
#include "psflow/core/threading.h"

namespace psflow::ops {

Var GatherRows(const Var& rows, std::span<const int64_t> index) {
  const Tensor& rv = rows->value;
  CHECK(rv.rank() == 2) << "GatherRows needs rows [U, d], got " << ShapeToString(rv.shape());
  const int64_t unique = rv.dim(0), dim = rv.dim(1);
  const int64_t n = static_cast<int64_t>(index.size());
  Tensor out = Tensor::Uninitialized({n, dim});
  for (int64_t i = 0; i < n; ++i) {
    CHECK(index[i] >= 0 && index[i] < unique) << "GatherRows index " << index[i] << " outside [0, " << unique << ")";
    std::memcpy(out.data() + i * dim, rv.data() + index[i] * dim, dim * sizeof(float));
  }
  std::vector<int64_t> idx(index.begin(), index.end());
  return MakeOpNode("GatherRows", std::move(out), {rows}, [idx = std::move(idx), dim](Node& self) {
    Tensor& g = self.inputs[0]->MutableGrad();
    const float* src = self.grad.data();
    for (size_t i = 0; i < idx.size(); ++i) {
      float* dst = g.data() + idx[i] * dim;
      const float* row = src + static_cast<int64_t>(i) * dim;
      for (int64_t k = 0; k < dim; ++k) dst[k] += row[k];
    }
  });
}

Var DotInteraction(const Var& x) {
  psflow::internal::PrepareThreadForKernels();
  const Tensor& xv = x->value;
  CHECK(xv.rank() == 3) << "DotInteraction needs x [B, n, d], got " << ShapeToString(xv.shape());
  const int64_t batch = xv.dim(0), n = xv.dim(1), dim = xv.dim(2);
  const int64_t pairs = n * (n - 1) / 2;
  Tensor out = Tensor::Uninitialized({batch, pairs});
  const int64_t grain = internal::kMinElementsPerBlock / std::max<int64_t>(pairs * dim, 1) + 1;
  ParallelFor(batch, grain, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      const float* v = xv.data() + b * n * dim;
      float* o = out.data() + b * pairs;
      for (int64_t i = 0; i < n; ++i) {
        for (int64_t j = i + 1; j < n; ++j) {
          float s = 0.0f;
          for (int64_t k = 0; k < dim; ++k) s += v[i * dim + k] * v[j * dim + k];
          *o++ = s;
        }
      }
    }
  });
  return MakeOpNode("DotInteraction", std::move(out), {x}, [n, dim, pairs, grain](Node& self) {
    Node& input = *self.inputs[0];
    bool accumulate = false;
    float* gx = internal::GradTarget(input, &accumulate);
    const float* xv = input.value.data();
    const float* g = self.grad.data();
    const int64_t batch = input.value.dim(0);
    // d/dx[b, i, :] = sum over pairs (i, j) of g[b, p] x[b, j, :] (and symmetrically for j).
    ParallelFor(batch, grain, [&](int64_t b0, int64_t b1) {
      for (int64_t b = b0; b < b1; ++b) {
        const float* v = xv + b * n * dim;
        const float* gb = g + b * pairs;
        float* out = gx + b * n * dim;
        if (!accumulate) std::memset(out, 0, n * dim * sizeof(float));
        int64_t p = 0;
        for (int64_t i = 0; i < n; ++i) {
          for (int64_t j = i + 1; j < n; ++j, ++p) {
            const float w = gb[p];
            for (int64_t k = 0; k < dim; ++k) {
              out[i * dim + k] += w * v[j * dim + k];
              out[j * dim + k] += w * v[i * dim + k];
            }
          }
        }
      }
    });
  });
}

}  // namespace psflow::ops
