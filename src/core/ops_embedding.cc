// EmbeddingLookup: gathers rows of a table; its gradient is row-sparse on the table.
#include <algorithm>
#include <cstring>
#include <numeric>
#include <vector>

#include "core/check.h"
#include "psflow/core/ops.h"

namespace psflow::ops {

Var EmbeddingLookup(const Var& table, std::span<const int64_t> ids) {
  const Tensor& tv = table->value;
  CHECK(tv.rank() >= 1) << "EmbeddingLookup of a scalar table";
  const int64_t vocab = tv.dim(0);
  const int64_t row_size = vocab == 0 ? 0 : tv.size() / vocab;
  Shape out_shape = tv.shape();
  out_shape[0] = static_cast<int64_t>(ids.size());
  Tensor out = Tensor::Uninitialized(out_shape);
  for (size_t i = 0; i < ids.size(); ++i) {
    CHECK(ids[i] >= 0 && ids[i] < vocab) << "embedding id " << ids[i] << " outside [0, " << vocab << ")";
    std::memcpy(out.data() + i * row_size, tv.data() + ids[i] * row_size, row_size * sizeof(float));
  }
  std::vector<int64_t> id_copy(ids.begin(), ids.end());
  return MakeOpNode("EmbeddingLookup", std::move(out), {table}, [id_copy = std::move(id_copy), row_size](Node& self) {
    // Positions ordered by id (stable, so repeats are summed in input order).
    std::vector<int64_t> order(id_copy.size());
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return id_copy[a] < id_copy[b]; });
    RowSparse grad;
    for (size_t i = 0; i < order.size(); ++i) {
      if (i == 0 || id_copy[order[i]] != id_copy[order[i - 1]]) grad.rows.push_back(id_copy[order[i]]);
    }
    Shape shape = self.inputs[0]->value.shape();
    shape[0] = static_cast<int64_t>(grad.rows.size());
    grad.values = Tensor(shape);
    int64_t slot = -1;
    for (size_t i = 0; i < order.size(); ++i) {
      if (i == 0 || id_copy[order[i]] != id_copy[order[i - 1]]) ++slot;
      float* dst = grad.values.data() + slot * row_size;
      const float* src = self.grad.data() + order[i] * row_size;
      for (int64_t k = 0; k < row_size; ++k) dst[k] += src[k];
    }
    self.inputs[0]->AccumulateSparseGrad(std::move(grad));
  });
}

}  // namespace psflow::ops
