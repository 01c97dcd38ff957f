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

TEST(AutodiffTest, LeafDoneComesOncePerLeafInReverseLayerOrderWithItsFinalGradient) {
  // Two layers, the first parameter also feeding the loss through a second path: w1 is final only
  // after both of its consumers ran, and the later layer's parameters are reported first.
  Var x = Constant(Tensor({1, 2}, {1, 2}));
  Var w1 = MakeParameter("w1", Tensor({2, 2}, {1, 0, 0, 1}));
  Var b1 = MakeParameter("b1", Tensor({2}, 0.5f));
  Var w2 = MakeParameter("w2", Tensor({2, 1}, {1, -1}));
  Var h = ops::Relu(ops::BiasAdd(ops::MatMul(x, w1), b1));
  Var y = ops::MatMul(h, w2);
  Var loss = MakeOpNode("Add", Tensor::Scalar(0),
                        {WeightedSum(y, Tensor({1, 1}, 1.0f)), WeightedSum(ops::Reshape(w1, {4}), Tensor({4}, 1.0f))},
                        [](Node& self) {
                          self.inputs[0]->AccumulateGrad(self.grad);
                          self.inputs[1]->AccumulateGrad(self.grad);
                        });
  std::vector<std::string> done;
  std::vector<Tensor> at_done;
  Backward(loss, [&](Node& leaf) {
    done.push_back(leaf.name);
    at_done.push_back(leaf.grad);  // a copy
  });
  ASSERT_EQ(done.size(), 3u);
  EXPECT_EQ(done[0], "w2");
  EXPECT_EQ(done[1], "b1");
  EXPECT_EQ(done[2], "w1");
  // What each callback saw is the gradient Backward leaves.
  const std::vector<Var> leaves = {w2, b1, w1};
  for (size_t i = 0; i < leaves.size(); ++i) {
    ASSERT_EQ(at_done[i].size(), leaves[i]->grad.size());
    for (int64_t j = 0; j < at_done[i].size(); ++j) EXPECT_EQ(at_done[i][j], leaves[i]->grad[j]) << done[i] << j;
  }
  // And the same gradients as Backward without a callback.
  Var w1b = MakeParameter("w1", Tensor({2, 2}, {1, 0, 0, 1}));
  Var loss_b =
      MakeOpNode("Add", Tensor::Scalar(0),
                 {WeightedSum(ops::MatMul(ops::Relu(ops::BiasAdd(ops::MatMul(x, w1b), b1)), w2), Tensor({1, 1}, 1.0f)),
                  WeightedSum(ops::Reshape(w1b, {4}), Tensor({4}, 1.0f))},
                 [](Node& self) {
                   self.inputs[0]->AccumulateGrad(self.grad);
                   self.inputs[1]->AccumulateGrad(self.grad);
                 });
  ZeroGrad({b1, w2});
  Backward(loss_b);
  for (int64_t j = 0; j < 4; ++j) EXPECT_EQ(w1b->grad[j], w1->grad[j]) << j;
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
