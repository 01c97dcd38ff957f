// GatherRows and DotInteraction through the op-test harness: forward values against naive double
// references written from their definitions, gradients against central differences of those.
#include <gtest/gtest.h>

#include <vector>

#include "absl/strings/str_cat.h"
#include "core/op_test_harness.h"
#include "psflow/core/ops.h"

namespace psflow::ops {
namespace {

using testing::CheckOp;
using testing::DTensor;
using testing::OpCase;

// out[i, :] = rows[index[i], :]; repeated indices make the gradient a sum over the repeats, and an
// unpicked row must get a zero gradient.
OpCase GatherRowsCase(int64_t unique, int64_t dim, std::vector<int64_t> index) {
  OpCase c;
  c.name = absl::StrCat("GatherRows_", unique, "x", dim, "_n", index.size());
  c.input_shapes = {{unique, dim}};
  c.build = [index](const std::vector<Var>& v) { return GatherRows(v[0], index); };
  c.reference = [index, dim](const std::vector<DTensor>& in) {
    DTensor out({static_cast<int64_t>(index.size()), dim});
    for (size_t i = 0; i < index.size(); ++i) {
      for (int64_t k = 0; k < dim; ++k) out[i * dim + k] = in[0][index[i] * dim + k];
    }
    return out;
  };
  return c;
}

TEST(GatherRowsTest, RepeatsSumAndUnpickedRowsGetZero) {
  CheckOp(GatherRowsCase(4, 3, {2, 0, 2, 2, 0}));  // row 1 and 3 never picked
  CheckOp(GatherRowsCase(1, 5, {0, 0, 0}));
  CheckOp(GatherRowsCase(6, 16, {5, 4, 3, 2, 1, 0, 0, 5}));
}

TEST(GatherRowsTest, TwoGathersOfOneLeafAddTheirGradients) {
  Var rows = MakeParameter("rows", Tensor({2, 2}, std::vector<float>{1, 2, 3, 4}));
  Var a = GatherRows(rows, std::vector<int64_t>{1, 1, 0});
  Var b = GatherRows(rows, std::vector<int64_t>{0});
  Var both = Concat({a, b}, 0);  // [4, 2]
  Var total = MakeOpNode("Seed", Tensor::Scalar(0), {both}, [](Node& self) {
    self.inputs[0]->AccumulateGrad(Tensor({4, 2}, std::vector<float>{1, 2, 3, 4, 5, 6, 7, 8}));
  });
  Backward(total);
  // row 0 is picked by a's third row and b's only row; row 1 by a's first two rows.
  const std::vector<float> want = {5 + 7, 6 + 8, 1 + 3, 2 + 4};
  ASSERT_EQ(rows->grad.size(), 4);
  for (int i = 0; i < 4; ++i) EXPECT_FLOAT_EQ(rows->grad[i], want[i]) << i;
  EXPECT_FALSE(rows->sparse_grad.has_value());
}

// out[b, p] = sum_k x[b, i, k] x[b, j, k] for the p-th pair i < j in row-major order.
OpCase DotInteractionCase(int64_t batch, int64_t n, int64_t dim) {
  OpCase c;
  c.name = absl::StrCat("DotInteraction_", batch, "x", n, "x", dim);
  c.input_shapes = {{batch, n, dim}};
  c.build = [](const std::vector<Var>& v) { return DotInteraction(v[0]); };
  c.reference = [batch, n, dim](const std::vector<DTensor>& in) {
    const int64_t pairs = n * (n - 1) / 2;
    DTensor out({batch, pairs});
    for (int64_t b = 0; b < batch; ++b) {
      int64_t p = 0;
      for (int64_t i = 0; i < n; ++i) {
        for (int64_t j = i + 1; j < n; ++j, ++p) {
          double s = 0;
          for (int64_t k = 0; k < dim; ++k) s += in[0][(b * n + i) * dim + k] * in[0][(b * n + j) * dim + k];
          out[b * pairs + p] = s;
        }
      }
    }
    return out;
  };
  c.max_gradient_checks = 300;
  return c;
}

TEST(DotInteractionTest, AgainstReference) {
  CheckOp(DotInteractionCase(3, 4, 5));
  CheckOp(DotInteractionCase(2, 2, 1));
  CheckOp(DotInteractionCase(5, 27, 16));  // the ctr model's shape: 26 fields + the dense vector
}

TEST(DotInteractionTest, OneVectorHasNoPairs) {
  Var x = Constant(Tensor({3, 1, 4}));
  EXPECT_EQ(ShapeToString(DotInteraction(x)->value.shape()), ShapeToString(Shape{3, 0}));
}

}  // namespace
}  // namespace psflow::ops
