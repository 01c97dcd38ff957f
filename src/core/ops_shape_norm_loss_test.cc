// Concat / Split, LayerNorm and the losses through the op-test harness, the losses' stability at
// huge logits, and the public gradient check (psflow/core/gradient_check.h) on a right and a
// wrong backward. "Bench_" cases are the sizes bench/ops_vs_torch.py times beside PyTorch.
#include <gtest/gtest.h>

#include <cmath>
#include <numeric>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/op_test_harness.h"
#include "psflow/core/gradient_check.h"
#include "psflow/core/ops.h"

namespace psflow::ops {
namespace {

using testing::CheckOp;
using testing::DTensor;
using testing::OpCase;

std::string CaseName(const std::string& name) {
  std::string out;
  for (char ch : name) out += std::isalnum(static_cast<unsigned char>(ch)) ? ch : '_';
  return out;
}

// Concatenation of parts along axis, from the definition out[o, at + r, i] = part[o, r, i].
DTensor RefConcat(const std::vector<DTensor>& parts, int axis) {
  Shape shape = parts[0].shape;
  shape[axis] = 0;
  for (const DTensor& p : parts) shape[axis] += p.shape[axis];
  int64_t outer = 1, inner = 1;
  for (int i = 0; i < axis; ++i) outer *= shape[i];
  for (size_t i = axis + 1; i < shape.size(); ++i) inner *= shape[i];
  DTensor out(shape);
  int64_t at = 0;
  for (const DTensor& p : parts) {
    for (int64_t o = 0; o < outer; ++o) {
      for (int64_t r = 0; r < p.shape[axis]; ++r) {
        for (int64_t i = 0; i < inner; ++i) {
          out[(o * shape[axis] + at + r) * inner + i] = p[(o * p.shape[axis] + r) * inner + i];
        }
      }
    }
    at += p.shape[axis];
  }
  return out;
}

OpCase ConcatCase(std::vector<Shape> shapes, int axis) {
  OpCase c;
  c.name = absl::StrCat("Concat_axis", axis);
  for (const Shape& s : shapes) absl::StrAppend(&c.name, "_", ShapeToString(s));
  c.input_shapes = shapes;
  const int rank = static_cast<int>(shapes[0].size());
  c.build = [axis](const std::vector<Var>& v) { return Concat(v, axis); };
  c.reference = [axis, rank](const std::vector<DTensor>& in) { return RefConcat(in, axis < 0 ? axis + rank : axis); };
  c.max_gradient_checks = 200;
  return c;
}

// Split x into parts of `sizes` along axis, then concatenates them in reverse order: checks every
// part's values and that their gradients land in the right blocks of x's.
OpCase SplitCase(Shape shape, int axis, std::vector<int64_t> sizes) {
  OpCase c;
  c.name = absl::StrCat("Split_axis", axis, "_", ShapeToString(shape), "_", sizes.size());
  c.input_shapes = {shape};
  c.build = [axis, sizes](const std::vector<Var>& v) {
    std::vector<Var> parts = Split(v[0], axis, sizes);
    return Concat(std::vector<Var>(parts.rbegin(), parts.rend()), axis);
  };
  c.reference = [axis, sizes](const std::vector<DTensor>& in) {
    const DTensor& x = in[0];
    int64_t outer = 1, inner = 1;
    for (int i = 0; i < axis; ++i) outer *= x.shape[i];
    for (size_t i = axis + 1; i < x.shape.size(); ++i) inner *= x.shape[i];
    std::vector<DTensor> parts;
    int64_t at = 0;
    for (int64_t size : sizes) {
      Shape s = x.shape;
      s[axis] = size;
      DTensor p(s);
      for (int64_t o = 0; o < outer; ++o) {
        for (int64_t k = 0; k < size * inner; ++k) p[o * size * inner + k] = x[(o * x.shape[axis] + at) * inner + k];
      }
      parts.push_back(p);
      at += size;
    }
    return RefConcat(std::vector<DTensor>(parts.rbegin(), parts.rend()), axis);
  };
  c.max_gradient_checks = 200;
  return c;
}

OpCase LayerNormCase(Shape shape, double offset, float epsilon) {
  OpCase c;
  c.name = absl::StrCat("LayerNorm_", ShapeToString(shape), offset != 0 ? "_Offset" : "");
  const int64_t d = shape.back();
  c.input_shapes = {shape, {d}, {d}};
  c.fill = [offset](int index, DTensor& in, Rng& rng) {
    for (double& v : in.data) v = (index == 0 ? offset : index == 1 ? 1.0 : 0.0) + 2.0 * rng.Uniform() - 1.0;
  };
  c.build = [epsilon](const std::vector<Var>& v) { return LayerNorm(v[0], v[1], v[2], epsilon); };
  c.reference = [epsilon](const std::vector<DTensor>& in) {
    const DTensor& x = in[0];
    const int64_t d = in[1].size();
    DTensor out(x.shape);
    for (int64_t r = 0; r < x.size() / d; ++r) {
      double mean = 0, var = 0;
      for (int64_t k = 0; k < d; ++k) mean += x[r * d + k] / d;
      for (int64_t k = 0; k < d; ++k) var += (x[r * d + k] - mean) * (x[r * d + k] - mean) / d;
      for (int64_t k = 0; k < d; ++k) {
        out[r * d + k] = (x[r * d + k] - mean) / std::sqrt(var + epsilon) * in[1][k] + in[2][k];
      }
    }
    return out;
  };
  c.max_gradient_checks = 200;
  return c;
}

std::vector<float> Labels(int64_t n, bool binary) {
  std::vector<float> labels(n);
  Rng rng(11);
  for (float& z : labels) z = binary ? (rng.Uniform() < 0.5f ? 0.0f : 1.0f) : 2.0f * rng.Uniform() - 1.0f;
  return labels;
}

OpCase SigmoidCrossEntropyCase(Shape shape, double scale) {
  OpCase c;
  c.name = absl::StrCat("SigmoidCrossEntropy_", ShapeToString(shape));
  c.input_shapes = {shape};
  const std::vector<float> labels = Labels(NumElements(shape), /*binary=*/true);
  c.fill = [scale](int, DTensor& in, Rng& rng) {
    for (double& v : in.data) v = scale * (2.0 * rng.Uniform() - 1.0);
  };
  c.build = [labels](const std::vector<Var>& v) { return SigmoidCrossEntropy(v[0], labels); };
  c.reference = [labels](const std::vector<DTensor>& in) {
    DTensor out(Shape{});
    for (int64_t i = 0; i < in[0].size(); ++i) {  // -z log p - (1 - z) log(1 - p), p = sigmoid(x)
      const double p = 1.0 / (1.0 + std::exp(-in[0][i]));
      out[0] -= (labels[i] * std::log(p) + (1 - labels[i]) * std::log(1 - p)) / in[0].size();
    }
    return out;
  };
  c.max_gradient_checks = 100;
  return c;
}

OpCase MeanSquaredErrorCase(Shape shape) {
  OpCase c;
  c.name = absl::StrCat("MeanSquaredError_", ShapeToString(shape));
  c.input_shapes = {shape};
  const std::vector<float> targets = Labels(NumElements(shape), /*binary=*/false);
  c.build = [targets](const std::vector<Var>& v) { return MeanSquaredError(v[0], targets); };
  c.reference = [targets](const std::vector<DTensor>& in) {
    DTensor out(Shape{});
    for (int64_t i = 0; i < in[0].size(); ++i) out[0] += std::pow(in[0][i] - targets[i], 2) / in[0].size();
    return out;
  };
  c.max_gradient_checks = 100;
  return c;
}

std::vector<OpCase> ShapeNormLossCases() {
  std::vector<OpCase> cases;
  cases.push_back(ConcatCase({{2, 3}, {4, 3}}, 0));
  cases.push_back(ConcatCase({{2, 3}, {2, 1}, {2, 5}}, 1));
  cases.push_back(ConcatCase({{2, 3, 4}, {2, 2, 4}}, 1));
  cases.push_back(ConcatCase({{2, 3, 4}, {2, 3, 1}}, -1));
  cases.push_back(SplitCase({5, 6}, 1, {1, 2, 3}));
  cases.push_back(SplitCase({4, 3, 2}, 0, {3, 0, 1}));
  cases.push_back(SplitCase({2, 5, 3}, 1, {4, 1}));
  cases.push_back(LayerNormCase({4, 6}, 0.0, 1e-5f));
  cases.push_back(LayerNormCase({2, 3, 8}, 0.0, 1e-3f));
  cases.push_back(LayerNormCase({300, 128}, 0.0, 1e-5f));
  cases.push_back(LayerNormCase({5, 16}, 100.0, 1e-5f));  // a large mean must not cost precision
  cases.push_back(SigmoidCrossEntropyCase({8, 1}, 1.0));
  cases.push_back(SigmoidCrossEntropyCase({6, 5}, 10.0));
  cases.push_back(MeanSquaredErrorCase({7}));
  cases.push_back(MeanSquaredErrorCase({4, 3}));

  auto bench = [&cases](OpCase c, const std::string& name) {
    c.name = absl::StrCat("Bench_", name);
    c.max_gradient_checks = 10;
    cases.push_back(std::move(c));
  };
  bench(ConcatCase({{256, 512}, {256, 512}}, 1), "Concat");
  {
    OpCase c;
    c.input_shapes = {{256, 1024}};
    c.build = [](const std::vector<Var>& v) { return Split(v[0], 1, std::vector<int64_t>{512, 512})[0]; };
    c.reference = [](const std::vector<DTensor>& in) {
      DTensor out({256, 512});
      for (int64_t r = 0; r < 256; ++r) {
        for (int64_t k = 0; k < 512; ++k) out[r * 512 + k] = in[0][r * 1024 + k];
      }
      return out;
    };
    bench(c, "Split");
  }
  {
    OpCase c;
    c.input_shapes = {{256, 1024}};
    c.build = [](const std::vector<Var>& v) { return Reshape(v[0], {1024, 256}); };
    c.reference = [](const std::vector<DTensor>& in) {
      DTensor out = in[0];
      out.shape = {1024, 256};
      return out;
    };
    bench(c, "Reshape");
  }
  bench(LayerNormCase({256, 1024}, 0.0, 1e-5f), "LayerNorm");
  bench(SigmoidCrossEntropyCase({256, 1024}, 3.0), "SigmoidCrossEntropy");
  bench(MeanSquaredErrorCase({256, 1024}), "MeanSquaredError");
  {
    std::vector<int32_t> labels(256);
    for (int i = 0; i < 256; ++i) labels[i] = (i * 37) % 1000;
    OpCase c;
    c.input_shapes = {{256, 1000}};
    c.build = [labels](const std::vector<Var>& v) { return SoftmaxCrossEntropy(v[0], labels); };
    c.reference = [labels](const std::vector<DTensor>& in) {
      DTensor out(Shape{});
      for (int64_t r = 0; r < 256; ++r) {
        double z = 0;
        for (int64_t j = 0; j < 1000; ++j) z += std::exp(in[0][r * 1000 + j]);
        out[0] += (std::log(z) - in[0][r * 1000 + labels[r]]) / 256;
      }
      return out;
    };
    bench(c, "SoftmaxCrossEntropy");
  }
  return cases;
}

class ShapeNormLossOpTest : public ::testing::TestWithParam<OpCase> {};

TEST_P(ShapeNormLossOpTest, MatchesReferenceAndFiniteDifferences) { CheckOp(GetParam()); }

INSTANTIATE_TEST_SUITE_P(Ops, ShapeNormLossOpTest, ::testing::ValuesIn(ShapeNormLossCases()),
                         [](const ::testing::TestParamInfo<OpCase>& info) { return CaseName(info.param.name); });

TEST(SigmoidCrossEntropyTest, StableAtHugeLogits) {
  Var logits = MakeParameter("logits", Tensor({4}, {1e4f, -1e4f, 1e4f, -1e4f}));
  const std::vector<float> labels = {1, 0, 0, 1};
  Var loss = SigmoidCrossEntropy(logits, labels);
  // Right with certainty costs 0; wrong costs |x|: (0 + 0 + 1e4 + 1e4) / 4.
  EXPECT_NEAR(loss->value[0], 5e3, 1e-2);
  Backward(loss);
  const float want[] = {0.0f, 0.0f, 0.25f, -0.25f};  // (sigmoid(x) - z) / n
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(logits->grad[i], want[i], 1e-7) << i;
}

TEST(SplitTest, UnusedPartsGiveZeroGradient) {
  Var x = MakeParameter("x", Tensor({2, 4}, {1, 2, 3, 4, 5, 6, 7, 8}));
  std::vector<Var> parts = Split(x, -1, std::vector<int64_t>{1, 3});
  ASSERT_EQ(parts[1]->value.shape(), (Shape{2, 3}));
  EXPECT_EQ(parts[1]->value[3], 6.0f);
  Backward(MakeOpNode("seed", Tensor::Scalar(0), {parts[1]}, [](Node& self) {
    self.inputs[0]->AccumulateGrad(Tensor({2, 3}, 1.0f));
  }));
  EXPECT_EQ(x->grad[0], 0.0f);
  EXPECT_EQ(x->grad[4], 0.0f);
  EXPECT_EQ(x->grad[1], 1.0f);
  EXPECT_EQ(x->grad[7], 1.0f);
}

// A custom op written on MakeOpNode: y = x^3 with a right or a deliberately wrong backward.
Var Cube(const Var& x, float backward_factor) {
  Tensor y = x->value;
  for (int64_t i = 0; i < y.size(); ++i) y[i] = y[i] * y[i] * y[i];
  return MakeOpNode("Cube", std::move(y), {x}, [backward_factor](Node& self) {
    Node& in = *self.inputs[0];
    Tensor d = self.grad;
    for (int64_t i = 0; i < d.size(); ++i) d[i] *= backward_factor * in.value[i] * in.value[i];
    in.AccumulateGrad(std::move(d));
  });
}

TEST(GradientCheckTest, PassesARightBackwardAndNamesTheElementsOfAWrongOne) {
  const Tensor x({2, 3}, {0.5f, -1.0f, 0.25f, 2.0f, -0.75f, 1.5f});
  EXPECT_TRUE(CheckGradients([](const std::vector<Var>& v) { return Cube(v[0], 3.0f); }, {x}).ok());
  const absl::Status wrong = CheckGradients([](const std::vector<Var>& v) { return Cube(v[0], 2.0f); }, {x});
  EXPECT_EQ(wrong.code(), absl::StatusCode::kInternal);
  EXPECT_NE(wrong.message().find("elements off by more than tolerance"), std::string::npos) << wrong.message();
  EXPECT_NE(wrong.message().find("input 0 element 0"), std::string::npos) << wrong.message();
}

TEST(GradientCheckTest, ChecksPsflowOpsOnFloatsIncludingSparseGradients) {
  Rng rng(5);
  Tensor table({6, 3}), gain({3}, 1.0f), bias({3});
  for (int64_t i = 0; i < table.size(); ++i) table[i] = 2.0f * rng.Uniform() - 1.0f;
  const std::vector<int64_t> ids = {4, 1, 4};
  GradientCheckOptions options;
  options.max_elements = 10;
  const absl::Status status = CheckGradients(
      [&ids](const std::vector<Var>& v) { return LayerNorm(Tanh(EmbeddingLookup(v[0], ids)), v[1], v[2]); },
      {table, gain, bias}, options);
  EXPECT_TRUE(status.ok()) << status.message();
}

}  // namespace
}  // namespace psflow::ops
