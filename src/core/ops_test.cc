// Dense, embedding and dropout ops through the op-test harness, plus the checks that do not fit
// it (stability at huge logits, the sparse gradient's layout, dropout's randomness).
#include "psflow/core/ops.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "core/op_test_harness.h"

namespace psflow::ops {
namespace {

using testing::CheckOp;
using testing::DTensor;
using testing::OpCase;

// out[i][j] = sum_k A[i][k] B[k][j] with A, B the (possibly transposed) stored operands.
DTensor RefMatMul(const DTensor& a, const DTensor& b, bool ta, bool tb) {
  const int64_t m = ta ? a.shape[1] : a.shape[0];
  const int64_t k = ta ? a.shape[0] : a.shape[1];
  const int64_t n = tb ? b.shape[0] : b.shape[1];
  DTensor out({m, n});
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double s = 0;
      for (int64_t p = 0; p < k; ++p) {
        const double av = ta ? a[p * m + i] : a[i * k + p];
        const double bv = tb ? b[j * k + p] : b[p * n + j];
        s += av * bv;
      }
      out[i * n + j] = s;
    }
  }
  return out;
}

std::vector<OpCase> DenseCases() {
  std::vector<OpCase> cases;
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      for (auto [m, k, n] : {std::tuple<int64_t, int64_t, int64_t>{3, 4, 5}, {7, 1, 2}, {16, 33, 9}}) {
        OpCase c;
        c.name = "MatMul_ta" + std::to_string(ta) + "_tb" + std::to_string(tb) + "_" + std::to_string(m) + "x" +
                 std::to_string(k) + "x" + std::to_string(n);
        c.input_shapes = {ta ? Shape{k, m} : Shape{m, k}, tb ? Shape{n, k} : Shape{k, n}};
        c.build = [ta, tb](const std::vector<Var>& v) { return MatMul(v[0], v[1], ta, tb); };
        c.reference = [ta, tb](const std::vector<DTensor>& in) { return RefMatMul(in[0], in[1], ta, tb); };
        cases.push_back(c);
      }
    }
  }
  {
    OpCase c;  // one Var on both sides: the two gradient contributions must add up
    c.name = "MatMul_SameOperand_AAt";
    c.input_shapes = {{4, 6}};
    c.build = [](const std::vector<Var>& v) { return MatMul(v[0], v[0], false, true); };
    c.reference = [](const std::vector<DTensor>& in) { return RefMatMul(in[0], in[0], false, true); };
    cases.push_back(c);
  }
  {
    OpCase c;  // the image-like operand is a Constant: no gradient may be made for it
    c.name = "MatMul_ConstantLeft";
    c.input_shapes = {{5, 8}, {8, 3}};
    c.requires_grad = {false, true};
    c.build = [](const std::vector<Var>& v) { return MatMul(v[0], v[1]); };
    c.reference = [](const std::vector<DTensor>& in) { return RefMatMul(in[0], in[1], false, false); };
    cases.push_back(c);
  }
  for (Shape shape : {Shape{4, 3}, Shape{2, 3, 4, 5}, Shape{300, 64}, Shape{7}}) {
    OpCase c;
    c.name = "BiasAdd_" + ShapeToString(shape);
    c.input_shapes = {shape, {shape.back()}};
    c.build = [](const std::vector<Var>& v) { return BiasAdd(v[0], v[1]); };
    c.reference = [](const std::vector<DTensor>& in) {
      DTensor out(in[0].shape);
      const int64_t n = in[1].size();
      for (int64_t i = 0; i < out.size(); ++i) out[i] = in[0][i] + in[1][i % n];
      return out;
    };
    c.max_gradient_checks = 300;
    cases.push_back(c);
  }
  for (auto [m, k, n] : {std::tuple<int64_t, int64_t, int64_t>{3, 4, 5}, {100, 30, 20}}) {
    for (Activation act : {Activation::kRelu, Activation::kNone}) {
      for (bool x_trainable : {true, false}) {
        OpCase c;
        c.name = "FusedMatMul_" + std::to_string(m) + "x" + std::to_string(k) + "x" + std::to_string(n) +
                 (act == Activation::kRelu ? "_Relu" : "_NoActivation") + (x_trainable ? "" : "_ConstantX");
        c.input_shapes = {{m, k}, {k, n}, {n}};
        c.requires_grad = {x_trainable, true, true};
        c.build = [act](const std::vector<Var>& v) { return FusedMatMul(v[0], v[1], v[2], act); };
        c.reference = [act](const std::vector<DTensor>& in) {
          DTensor out = RefMatMul(in[0], in[1], false, false);
          for (int64_t i = 0; i < out.size(); ++i) {
            out[i] += in[2][i % in[2].size()];
            if (act == Activation::kRelu) out[i] = std::max(out[i], 0.0);
          }
          return out;
        };
        c.max_gradient_checks = 300;
        cases.push_back(c);
      }
    }
  }
  for (Shape shape : {Shape{5, 7}, Shape{2, 3, 4, 5}, Shape{200, 300}}) {
    OpCase c;
    c.name = "Relu_" + ShapeToString(shape);
    c.input_shapes = {shape};
    c.build = [](const std::vector<Var>& v) { return Relu(v[0]); };
    c.reference = [](const std::vector<DTensor>& in) {
      DTensor out(in[0].shape);
      for (int64_t i = 0; i < out.size(); ++i) out[i] = in[0][i] > 0 ? in[0][i] : 0.0;
      return out;
    };
    c.max_gradient_checks = 300;
    cases.push_back(c);
  }
  // Lambdas below capture structured bindings as [x = x]: clang 14 cannot capture them by name.
  for (auto [batch, classes, scale] : {std::tuple<int64_t, int64_t, double>{4, 5, 1.0}, {3, 10, 8.0}, {1, 2, 1.0}}) {
    std::vector<int32_t> labels;
    for (int64_t i = 0; i < batch; ++i) labels.push_back(static_cast<int32_t>((i * 7 + 3) % classes));
    OpCase c;
    c.name = "SoftmaxCrossEntropy_" + std::to_string(batch) + "x" + std::to_string(classes);
    c.input_shapes = {{batch, classes}};
    c.fill = [scale = scale](int, DTensor& in, Rng& rng) {
      for (double& v : in.data) v = scale * (2.0 * rng.Uniform() - 1.0);
    };
    c.build = [labels](const std::vector<Var>& v) { return SoftmaxCrossEntropy(v[0], labels); };
    c.reference = [labels, batch = batch, classes = classes](const std::vector<DTensor>& in) {
      DTensor out(Shape{});
      for (int64_t r = 0; r < batch; ++r) {
        double z = 0;
        for (int64_t j = 0; j < classes; ++j) z += std::exp(in[0][r * classes + j]);
        out[0] += -std::log(std::exp(in[0][r * classes + labels[r]]) / z) / batch;
      }
      return out;
    };
    cases.push_back(c);
  }
  for (auto [from, to] : {std::pair<Shape, Shape>{{2, 3, 4}, {6, 4}}, {{2, 3, 4}, {-1, 2}}, {{5}, {1, 5, 1}}}) {
    OpCase c;
    c.name = "Reshape_" + ShapeToString(from) + "_to_" + ShapeToString(to);
    c.input_shapes = {from};
    c.build = [to = to](const std::vector<Var>& v) { return Reshape(v[0], to); };
    c.reference = [to = to](const std::vector<DTensor>& in) {
      DTensor out = in[0];
      out.shape = to;
      for (int64_t& d : out.shape) {
        if (d == -1) d = in[0].size() / -NumElements(to);
      }
      return out;
    };
    cases.push_back(c);
  }
  for (Shape shape : {Shape{2, 3, 4, 5}, Shape{3, 7}}) {
    OpCase c;
    c.name = "Flatten_" + ShapeToString(shape);
    c.input_shapes = {shape};
    c.build = [](const std::vector<Var>& v) { return Flatten(v[0]); };
    c.reference = [](const std::vector<DTensor>& in) {
      DTensor out = in[0];
      out.shape = {in[0].shape[0], in[0].size() / in[0].shape[0]};
      return out;
    };
    cases.push_back(c);
  }
  for (auto [table, ids] :
       {std::pair<Shape, std::vector<int64_t>>{{6, 3}, {1, 4, 1, 0, 4, 4}}, {{10, 2, 2}, {9, 0, 9}}, {{4, 5}, {3}}}) {
    OpCase c;
    c.name = "EmbeddingLookup_" + ShapeToString(table) + "_" + std::to_string(ids.size()) + "ids";
    c.input_shapes = {table};
    c.build = [ids = ids](const std::vector<Var>& v) { return EmbeddingLookup(v[0], ids); };
    c.reference = [ids = ids](const std::vector<DTensor>& in) {
      Shape shape = in[0].shape;
      shape[0] = static_cast<int64_t>(ids.size());
      DTensor out(shape);
      const int64_t row = in[0].size() / in[0].shape[0];
      for (size_t i = 0; i < ids.size(); ++i) {
        for (int64_t k = 0; k < row; ++k) out[i * row + k] = in[0][ids[i] * row + k];
      }
      return out;
    };
    cases.push_back(c);
  }
  {
    OpCase c;  // the table feeds a lookup (sparse gradient) and a matmul (dense): both count
    c.name = "EmbeddingLookup_PlusDenseUse";
    c.input_shapes = {{5, 3}, {3, 2}};
    const std::vector<int64_t> ids = {2, 2, 4};
    c.reference = [ids](const std::vector<DTensor>& in) {
      DTensor rows({3, 3});
      for (int i = 0; i < 3; ++i) {
        for (int k = 0; k < 3; ++k) rows[i * 3 + k] = in[0][ids[i] * 3 + k];
      }
      DTensor first = RefMatMul(in[0], in[1], false, false);  // [5,2]
      DTensor first3({3, 2});
      for (int i = 0; i < 6; ++i) first3[i] = first[i];
      // rows [3,3] x (table x w)[0:3] [3,2]
      return RefMatMul(rows, first3, false, false);
    };
    c.build = [ids](const std::vector<Var>& v) {
      Var looked_up = EmbeddingLookup(v[0], ids);
      Var projected = MatMul(v[0], v[1]);  // [5,2]; only its first 3 rows are used below
      Var first3 = MatMul(Constant(Tensor({3, 5}, {1, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 1, 0, 0})), projected);
      return MatMul(looked_up, first3);
    };
    cases.push_back(c);
  }
  return cases;
}

class DenseOpTest : public ::testing::TestWithParam<OpCase> {};

TEST_P(DenseOpTest, MatchesReferenceAndFiniteDifferences) { CheckOp(GetParam()); }

INSTANTIATE_TEST_SUITE_P(Ops, DenseOpTest, ::testing::ValuesIn(DenseCases()),
                         [](const ::testing::TestParamInfo<OpCase>& info) {
                           std::string name;
                           for (char ch : info.param.name)
                             name += std::isalnum(static_cast<unsigned char>(ch)) ? ch : '_';
                           return name;
                         });

TEST(SoftmaxCrossEntropyTest, StableAtHugeLogits) {
  Var logits = MakeParameter("logits", Tensor({3, 3}, {1e4f, 0, -1e4f, 1e4f, 0, -1e4f, -1e4f, -1e4f, -1e4f}));
  const std::vector<int32_t> labels = {0, 1, 2};
  Var loss = SoftmaxCrossEntropy(logits, labels);
  // Row 0: its label holds the max, loss 0. Row 1: 1e4 below the max. Row 2: uniform, log 3.
  EXPECT_NEAR(loss->value[0], (0.0 + 1e4 + std::log(3.0)) / 3.0, 1e-2);
  Backward(loss);
  for (int i = 0; i < 9; ++i) ASSERT_TRUE(std::isfinite(logits->grad[i])) << i;
  // d/dlogits = (softmax - onehot) / batch.
  EXPECT_NEAR(logits->grad[0], 0.0, 1e-6);
  EXPECT_NEAR(logits->grad[3], 1.0 / 3.0, 1e-6);
  EXPECT_NEAR(logits->grad[4], -1.0 / 3.0, 1e-6);
  EXPECT_NEAR(logits->grad[8], (1.0 / 3.0 - 1.0) / 3.0, 1e-6);
}

TEST(EmbeddingLookupTest, SparseGradientHasUniqueAscendingRowsSummedOverRepeats) {
  Var table = MakeParameter("emb", Tensor({6, 2}, {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}));
  const std::vector<int64_t> ids = {4, 1, 4, 4};
  Var rows = EmbeddingLookup(table, ids);
  ASSERT_EQ(rows->value.shape(), (Shape{4, 2}));
  EXPECT_EQ(rows->value[0], 8.0f);
  EXPECT_EQ(rows->value[3], 3.0f);
  // Output gradient of row i is (i+1, 10*(i+1)) through a fixed weighting.
  Var loss = MakeOpNode("seed", Tensor::Scalar(0), {rows}, [](Node& self) {
    Tensor g({4, 2});
    for (int i = 0; i < 4; ++i) {
      g[2 * i] = i + 1;
      g[2 * i + 1] = 10 * (i + 1);
    }
    self.inputs[0]->AccumulateGrad(std::move(g));
  });
  Backward(loss);
  EXPECT_TRUE(table->grad.empty()) << "the lookup must not make a dense gradient";
  ASSERT_TRUE(table->sparse_grad.has_value());
  EXPECT_EQ(table->sparse_grad->rows, (std::vector<int64_t>{1, 4}));
  ASSERT_EQ(table->sparse_grad->values.shape(), (Shape{2, 2}));
  EXPECT_EQ(table->sparse_grad->values[0], 2.0f);  // id 1 at position 1
  EXPECT_EQ(table->sparse_grad->values[1], 20.0f);
  EXPECT_EQ(table->sparse_grad->values[2], 1.0f + 3.0f + 4.0f);  // id 4 at positions 0, 2, 3
  EXPECT_EQ(table->sparse_grad->values[3], 80.0f);
}

TEST(EmbeddingLookupTest, TwoLookupsMergeIntoOneSparseGradient) {
  Var table = MakeParameter("emb", Tensor({5, 1}, {0, 1, 2, 3, 4}));
  const std::vector<int64_t> a = {3, 0}, b = {2, 3};
  // A node consuming both lookups, seeding their output gradients with fixed values.
  Var total =
      MakeOpNode("sum", Tensor::Scalar(0), {EmbeddingLookup(table, a), EmbeddingLookup(table, b)}, [](Node& self) {
        self.inputs[0]->AccumulateGrad(Tensor({2, 1}, {1, 2}));
        self.inputs[1]->AccumulateGrad(Tensor({2, 1}, {10, 20}));
      });
  Backward(total);
  ASSERT_TRUE(table->sparse_grad.has_value());
  EXPECT_EQ(table->sparse_grad->rows, (std::vector<int64_t>{0, 2, 3}));
  EXPECT_EQ(table->sparse_grad->values[0], 2.0f);
  EXPECT_EQ(table->sparse_grad->values[1], 10.0f);
  EXPECT_EQ(table->sparse_grad->values[2], 1.0f + 20.0f);
}

TEST(DropoutTest, TrainingKeepsAboutOneMinusRateAndScalesKeptValues) {
  Rng rng(42);
  const int64_t n = 200000;
  Var x = MakeParameter("x", Tensor({n}, 2.0f));
  const float rate = 0.3f;
  Var y = Dropout(x, rate, /*training=*/true, rng);
  int64_t kept = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (y->value[i] != 0.0f) {
      ++kept;
      ASSERT_FLOAT_EQ(y->value[i], 2.0f / (1.0f - rate));
    }
  }
  // Binomial std of the kept fraction is ~0.001 here; 0.005 is five of them.
  EXPECT_NEAR(static_cast<double>(kept) / n, 1.0 - rate, 0.005);
  // The gradient goes through the same mask with the same scale.
  Tensor upstream({n});
  for (int64_t i = 0; i < n; ++i) upstream[i] = static_cast<float>(i % 7);
  Var loss =
      MakeOpNode("seed", Tensor::Scalar(0), {y}, [upstream](Node& self) { self.inputs[0]->AccumulateGrad(upstream); });
  Backward(loss);
  for (int64_t i = 0; i < n; ++i) {
    const float expected = y->value[i] != 0.0f ? upstream[i] / (1.0f - rate) : 0.0f;
    ASSERT_FLOAT_EQ(x->grad[i], expected) << i;
  }
}

TEST(DropoutTest, EvaluationIsIdentity) {
  Rng rng(1);
  Var x = MakeParameter("x", Tensor({3, 2}, {1, -2, 3, -4, 5, -6}));
  Var y = Dropout(x, 0.5f, /*training=*/false, rng);
  for (int i = 0; i < 6; ++i) EXPECT_EQ(y->value[i], x->value[i]);
  Var loss = MakeOpNode("seed", Tensor::Scalar(0), {y}, [](Node& self) {
    self.inputs[0]->AccumulateGrad(Tensor({3, 2}, 1.5f));
  });
  Backward(loss);
  for (int i = 0; i < 6; ++i) EXPECT_EQ(x->grad[i], 1.5f);
}

TEST(DropoutTest, SameSeedSameMask) {
  Rng a(7), b(7);
  Var x = Constant(Tensor({1000}, 1.0f));
  Var ya = Dropout(x, 0.5f, true, a);
  Var yb = Dropout(x, 0.5f, true, b);
  for (int i = 0; i < 1000; ++i) ASSERT_EQ(ya->value[i], yb->value[i]);
}

TEST(ArgMaxTest, FirstMaxPerRowAndAccuracy) {
  const Tensor logits({3, 4}, {0, 5, 5, 1, -1, -2, -3, -0.5f, 2, 1, 0, 2});
  EXPECT_EQ(ArgMax(logits), (std::vector<int32_t>{1, 3, 0}));
  const std::vector<int32_t> labels = {1, 0, 0};
  EXPECT_DOUBLE_EQ(Accuracy(logits, labels), 2.0 / 3.0);
}

}  // namespace
}  // namespace psflow::ops
