// The tape itself: accumulation, graph order, leaves keeping their gradients, deep graphs.
#include "psflow/core/autodiff.h"

#include <gtest/gtest.h>

#include "psflow/core/ops.h"

namespace psflow {
namespace {

// d(sum(x * w))/dx = w, as a node.
Var WeightedSum(const Var& x, Tensor w) {
  double s = 0;
  for (int64_t i = 0; i < w.size(); ++i) s += x->value[i] * w[i];
  return MakeOpNode("WeightedSum", Tensor::Scalar(static_cast<float>(s)), {x},
                    [w](Node& self) { self.inputs[0]->AccumulateGrad(w); });
}

TEST(AutodiffTest, DiamondAccumulatesBothPaths) {
  // loss = sum(relu(x)) + sum(reshape(x)): x feeds two consumers.
  Var x = MakeParameter("x", Tensor({2, 2}, {1, -2, 3, -4}));
  Var a = WeightedSum(ops::Relu(x), Tensor({2, 2}, 1.0f));
  Var b = WeightedSum(ops::Reshape(x, {4}), Tensor({4}, 10.0f));
  Var loss = MakeOpNode("Add", Tensor::Scalar(a->value[0] + b->value[0]), {a, b}, [](Node& self) {
    self.inputs[0]->AccumulateGrad(self.grad);
    self.inputs[1]->AccumulateGrad(self.grad);
  });
  Backward(loss);
  const std::vector<float> want = {11, 10, 11, 10};
  for (int i = 0; i < 4; ++i) EXPECT_EQ(x->grad[i], want[i]) << i;
  EXPECT_TRUE(a->grad.empty()) << "op-node gradients are consumed by Backward";
}

TEST(AutodiffTest, ConstantsGetNoGradientAndOpsOnConstantsNeedNone) {
  Var c = Constant(Tensor({2}, {1, 2}));
  Var r = ops::Relu(c);
  EXPECT_FALSE(r->requires_grad);
  EXPECT_FALSE(static_cast<bool>(r->backward));
  Var p = MakeParameter("p", Tensor({2}, {3, 4}));
  Var loss = WeightedSum(ops::BiasAdd(r, p), Tensor({2}, {1, 1}));
  Backward(loss);
  EXPECT_TRUE(c->grad.empty());
  EXPECT_EQ(p->grad[0], 1.0f);
  EXPECT_EQ(p->grad[1], 1.0f);
}

TEST(AutodiffTest, GradientsAccumulateAcrossBackwardCallsUntilZeroGrad) {
  Var p = MakeParameter("p", Tensor({3}, 1.0f));
  Backward(WeightedSum(p, Tensor({3}, {1, 2, 3})));
  Backward(WeightedSum(p, Tensor({3}, {1, 2, 3})));
  EXPECT_EQ(p->grad[2], 6.0f);
  ZeroGrad({p});
  EXPECT_TRUE(p->grad.empty());
  EXPECT_FALSE(p->sparse_grad.has_value());
}

TEST(AutodiffTest, MutableGradAndAccumulateGrad) {
  Node n;
  n.value = Tensor({2}, 5.0f);
  EXPECT_EQ(n.MutableGrad().shape(), (Shape{2}));
  EXPECT_EQ(n.grad[0], 0.0f);
  n.AccumulateGrad(Tensor({2}, {1, 2}));
  Tensor g({2}, {3, 4});
  n.AccumulateGrad(std::move(g));
  EXPECT_EQ(n.grad[0], 4.0f);
  EXPECT_EQ(n.grad[1], 6.0f);
}

TEST(AutodiffTest, SparseGradientsMergeRows) {
  Node n;
  n.value = Tensor({5, 2});
  n.AccumulateSparseGrad({{1, 3}, Tensor({2, 2}, {1, 1, 3, 3})});
  n.AccumulateSparseGrad({{0, 3, 4}, Tensor({3, 2}, {10, 10, 30, 30, 40, 40})});
  ASSERT_TRUE(n.sparse_grad.has_value());
  EXPECT_EQ(n.sparse_grad->rows, (std::vector<int64_t>{0, 1, 3, 4}));
  const std::vector<float> want = {10, 10, 1, 1, 33, 33, 40, 40};
  for (int i = 0; i < 8; ++i) EXPECT_EQ(n.sparse_grad->values[i], want[i]) << i;
}

TEST(AutodiffTest, DeepChainNeitherRecursesInBackwardNorInDestruction) {
  Var p = MakeParameter("p", Tensor({1}, 2.0f));
  Var x = p;
  for (int i = 0; i < 100000; ++i) x = ops::Reshape(x, {1});
  Backward(WeightedSum(x, Tensor({1}, 3.0f)));
  EXPECT_EQ(p->grad[0], 3.0f);
  x.reset();  // releases the 100000-node chain
}

}  // namespace
}  // namespace psflow
