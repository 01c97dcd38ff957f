// Element-wise ops through the op-test harness: Add / Subtract / Multiply (same shape and row
// broadcast), the activations, FusedMatMul with every activation, RowDot. The "Bench_" cases are
// the sizes bench/ops_vs_torch.py times beside PyTorch (PSFLOW_OP_TIMING=1); they are checked
// like the others.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/op_test_harness.h"
#include "psflow/core/ops.h"

namespace psflow::ops {
namespace {

using testing::CheckOp;
using testing::DTensor;
using testing::OpCase;
using testing::RefActivate;

std::string CaseName(const std::string& name) {
  std::string out;
  for (char ch : name) out += std::isalnum(static_cast<unsigned char>(ch)) ? ch : '_';
  return out;
}

enum class Kind { kAdd, kSubtract, kMultiply };

OpCase BinaryCase(Kind kind, Shape a, Shape b, bool same_var = false) {
  static const char* kNames[] = {"Add", "Subtract", "Multiply"};
  OpCase c;
  c.name = absl::StrCat(kNames[static_cast<int>(kind)], "_", ShapeToString(a), "_", ShapeToString(b),
                        same_var ? "_SameVar" : "");
  c.input_shapes = same_var ? std::vector<Shape>{a} : std::vector<Shape>{a, b};
  c.build = [kind, same_var](const std::vector<Var>& v) {
    const Var& rhs = same_var ? v[0] : v[1];
    switch (kind) {
      case Kind::kAdd:
        return Add(v[0], rhs);
      case Kind::kSubtract:
        return Subtract(v[0], rhs);
      case Kind::kMultiply:
        break;
    }
    return Multiply(v[0], rhs);
  };
  c.reference = [kind, same_var](const std::vector<DTensor>& in) {
    const DTensor& x = in[0];
    const DTensor& y = same_var ? in[0] : in[1];
    DTensor out(x.shape);
    for (int64_t i = 0; i < x.size(); ++i) {
      const double bv = y[i % y.size()];  // same shape, or a row vector repeating every row
      out[i] = kind == Kind::kAdd ? x[i] + bv : kind == Kind::kSubtract ? x[i] - bv : x[i] * bv;
    }
    return out;
  };
  c.max_gradient_checks = 200;
  return c;
}

OpCase ActivationCase(Activation act, Shape shape, double scale) {
  OpCase c;
  c.name = absl::StrCat("Activate", testing::ActivationSuffix(act), "_", ShapeToString(shape));
  c.input_shapes = {shape};
  c.fill = [scale](int, DTensor& in, Rng& rng) {
    for (double& v : in.data) v = scale * (2.0 * rng.Uniform() - 1.0);
  };
  c.build = [act](const std::vector<Var>& v) {
    switch (act) {
      case Activation::kTanh:
        return Tanh(v[0]);
      case Activation::kSigmoid:
        return Sigmoid(v[0]);
      case Activation::kGelu:
        return Gelu(v[0]);
      default:
        return Activate(v[0], act);
    }
  };
  c.reference = [act](const std::vector<DTensor>& in) {
    DTensor out(in[0].shape);
    for (int64_t i = 0; i < out.size(); ++i) out[i] = RefActivate(act, in[0][i]);
    return out;
  };
  c.max_gradient_checks = 300;
  return c;
}

std::vector<OpCase> ElementwiseCases() {
  std::vector<OpCase> cases;
  for (Kind kind : {Kind::kAdd, Kind::kSubtract, Kind::kMultiply}) {
    cases.push_back(BinaryCase(kind, {3, 4}, {3, 4}));
    cases.push_back(BinaryCase(kind, {2, 3, 5}, {5}));     // row vector
    cases.push_back(BinaryCase(kind, {6, 7}, {1, 7}));     // row vector as [1, n]
    cases.push_back(BinaryCase(kind, {300, 130}, {130}));  // several threads' worth of rows
    cases.push_back(BinaryCase(kind, {4, 5}, {}, /*same_var=*/true));
  }
  {
    OpCase c = BinaryCase(Kind::kMultiply, {5, 6}, {5, 6});
    c.name += "_ConstantRight";
    c.requires_grad = {true, false};
    cases.push_back(c);
  }
  for (Activation act : {Activation::kTanh, Activation::kSigmoid, Activation::kGelu, Activation::kNone}) {
    cases.push_back(ActivationCase(act, {4, 9}, 1.0));
    cases.push_back(ActivationCase(act, {300, 200}, 4.0));  // saturating ranges, threaded
  }
  cases.push_back(ActivationCase(Activation::kRelu, {7, 3}, 1.0));  // Activate(kRelu) is Relu
  for (Activation act : {Activation::kTanh, Activation::kSigmoid, Activation::kGelu}) {
    for (bool x_trainable : {true, false}) {
      OpCase c;
      c.name = absl::StrCat("FusedMatMul_5x6x4", testing::ActivationSuffix(act), x_trainable ? "" : "_ConstantX");
      c.input_shapes = {{5, 6}, {6, 4}, {4}};
      c.requires_grad = {x_trainable, true, true};
      c.build = [act](const std::vector<Var>& v) { return FusedMatMul(v[0], v[1], v[2], act); };
      c.reference = [act](const std::vector<DTensor>& in) {
        DTensor out({5, 4});
        for (int64_t i = 0; i < 5; ++i) {
          for (int64_t j = 0; j < 4; ++j) {
            double s = in[2][j];
            for (int64_t p = 0; p < 6; ++p) s += in[0][i * 6 + p] * in[1][p * 4 + j];
            out[i * 4 + j] = RefActivate(act, s);
          }
        }
        return out;
      };
      cases.push_back(c);
    }
  }
  for (Shape shape : {Shape{4, 3}, Shape{200, 170}}) {
    OpCase c;
    c.name = absl::StrCat("RowDot_", ShapeToString(shape));
    c.input_shapes = {shape, shape};
    c.build = [](const std::vector<Var>& v) { return RowDot(v[0], v[1]); };
    c.reference = [](const std::vector<DTensor>& in) {
      const int64_t rows = in[0].shape[0], cols = in[0].shape[1];
      DTensor out({rows, 1});
      for (int64_t i = 0; i < in[0].size(); ++i) out[i / cols] += in[0][i] * in[1][i];
      return out;
    };
    c.max_gradient_checks = 200;
    cases.push_back(c);
  }
  // The sizes of the PyTorch comparison (few finite differences: they are big).
  auto bench = [&cases](OpCase c, const std::string& name) {
    c.name = absl::StrCat("Bench_", name);
    c.max_gradient_checks = 10;
    cases.push_back(std::move(c));
  };
  bench(BinaryCase(Kind::kAdd, {256, 1024}, {256, 1024}), "Add");
  bench(BinaryCase(Kind::kAdd, {256, 1024}, {1024}), "AddRow");
  bench(BinaryCase(Kind::kSubtract, {256, 1024}, {256, 1024}), "Subtract");
  bench(BinaryCase(Kind::kMultiply, {256, 1024}, {256, 1024}), "Multiply");
  bench(ActivationCase(Activation::kRelu, {256, 1024}, 3.0), "Relu");
  bench(ActivationCase(Activation::kTanh, {256, 1024}, 3.0), "Tanh");
  bench(ActivationCase(Activation::kSigmoid, {256, 1024}, 3.0), "Sigmoid");
  bench(ActivationCase(Activation::kGelu, {256, 1024}, 3.0), "Gelu");
  {
    OpCase c;
    c.input_shapes = {{4096, 64}, {4096, 64}};
    c.build = [](const std::vector<Var>& v) { return RowDot(v[0], v[1]); };
    c.reference = [](const std::vector<DTensor>& in) {
      DTensor out({4096, 1});
      for (int64_t i = 0; i < in[0].size(); ++i) out[i / 64] += in[0][i] * in[1][i];
      return out;
    };
    bench(c, "RowDot");
  }
  return cases;
}

class ElementwiseOpTest : public ::testing::TestWithParam<OpCase> {};

TEST_P(ElementwiseOpTest, MatchesReferenceAndFiniteDifferences) { CheckOp(GetParam()); }

INSTANTIATE_TEST_SUITE_P(Ops, ElementwiseOpTest, ::testing::ValuesIn(ElementwiseCases()),
                         [](const ::testing::TestParamInfo<OpCase>& info) { return CaseName(info.param.name); });

TEST(ActivationTest, SaturatesWithoutNaNsAtHugeInputs) {
  Var x = MakeParameter("x", Tensor({4}, {-1e4f, -90.0f, 90.0f, 1e4f}));
  for (Activation act : {Activation::kTanh, Activation::kSigmoid, Activation::kGelu}) {
    ZeroGrad({x});
    Var y = Activate(x, act);
    Backward(MakeOpNode("sum", Tensor::Scalar(0), {y},
                        [](Node& self) { self.inputs[0]->AccumulateGrad(Tensor({4}, 1.0f)); }));
    for (int i = 0; i < 4; ++i) {
      ASSERT_TRUE(std::isfinite(y->value[i]) && std::isfinite(x->grad[i])) << testing::ActivationSuffix(act) << i;
      EXPECT_NEAR(y->value[i], RefActivate(act, x->value[i]), 1e-3 * (1 + std::abs(x->value[i])));
    }
  }
}

TEST(FusedMatMulTest, SeparateActivationMatchesFusedConvOrder) {
  // FusedConv2D applies the activations other than ReLU after its kernel: the same values and
  // gradients as Activate(FusedConv2D(kNone)), bit for bit.
  Rng rng(3);
  Tensor xv({2, 5, 5, 3}), fv({3, 3, 3, 4}), bv({4});
  for (Tensor* t : {&xv, &fv, &bv}) {
    for (int64_t i = 0; i < t->size(); ++i) (*t)[i] = 2.0f * rng.Uniform() - 1.0f;
  }
  Var x = MakeParameter("x", xv), f = MakeParameter("f", fv), b = MakeParameter("b", bv);
  Var fused = FusedConv2D(x, f, b, 1, 1, Padding::kSame, Activation::kGelu);
  Var separate = Gelu(FusedConv2D(x, f, b, 1, 1, Padding::kSame, Activation::kNone));
  ASSERT_EQ(fused->value.shape(), separate->value.shape());
  for (int64_t i = 0; i < fused->value.size(); ++i) ASSERT_EQ(fused->value[i], separate->value[i]) << i;
}

}  // namespace
}  // namespace psflow::ops
