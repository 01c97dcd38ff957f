// Conv2D and MaxPool through the op-test harness (oneDNN and the im2col fallback), TensorFlow's
// padding checked by hand, and a check that oneDNN is the backend actually in use.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/op_test_harness.h"
#include "core/ops_internal.h"
#include "psflow/core/ops.h"

namespace psflow::ops {
namespace {

using testing::CheckOp;
using testing::DTensor;
using testing::OpCase;

// Output size and leading pad of one dim, spelled out from TensorFlow's documentation.
void RefPadding(int64_t in, int64_t k, int64_t s, bool same, int64_t* out, int64_t* before) {
  if (same) {
    *out = (in + s - 1) / s;
    *before = std::max<int64_t>((*out - 1) * s + k - in, 0) / 2;
  } else {
    *out = (in - k) / s + 1;
    *before = 0;
  }
}

DTensor RefConv(const DTensor& x, const DTensor& f, int sh, int sw, bool same) {
  const int64_t n = x.shape[0], h = x.shape[1], w = x.shape[2], c = x.shape[3];
  const int64_t kh = f.shape[0], kw = f.shape[1], oc = f.shape[3];
  int64_t oh, ow, pt, pl;
  RefPadding(h, kh, sh, same, &oh, &pt);
  RefPadding(w, kw, sw, same, &ow, &pl);
  DTensor out({n, oh, ow, oc});
  for (int64_t b = 0; b < n; ++b)
    for (int64_t oy = 0; oy < oh; ++oy)
      for (int64_t ox = 0; ox < ow; ++ox)
        for (int64_t o = 0; o < oc; ++o) {
          double s = 0;
          for (int64_t ky = 0; ky < kh; ++ky)
            for (int64_t kx = 0; kx < kw; ++kx)
              for (int64_t ci = 0; ci < c; ++ci) {
                const int64_t iy = oy * sh + ky - pt, ix = ox * sw + kx - pl;
                if (iy < 0 || iy >= h || ix < 0 || ix >= w) continue;
                s += x[((b * h + iy) * w + ix) * c + ci] * f[((ky * kw + kx) * c + ci) * oc + o];
              }
          out[((b * oh + oy) * ow + ox) * oc + o] = s;
        }
  return out;
}

DTensor RefMaxPool(const DTensor& x, int kh, int kw, int sh, int sw, bool same) {
  const int64_t n = x.shape[0], h = x.shape[1], w = x.shape[2], c = x.shape[3];
  int64_t oh, ow, pt, pl;
  RefPadding(h, kh, sh, same, &oh, &pt);
  RefPadding(w, kw, sw, same, &ow, &pl);
  DTensor out({n, oh, ow, c});
  for (int64_t b = 0; b < n; ++b)
    for (int64_t oy = 0; oy < oh; ++oy)
      for (int64_t ox = 0; ox < ow; ++ox)
        for (int64_t ci = 0; ci < c; ++ci) {
          double m = -std::numeric_limits<double>::infinity();  // padded cells never win
          for (int64_t ky = 0; ky < kh; ++ky)
            for (int64_t kx = 0; kx < kw; ++kx) {
              const int64_t iy = oy * sh + ky - pt, ix = ox * sw + kx - pl;
              if (iy < 0 || iy >= h || ix < 0 || ix >= w) continue;
              m = std::max(m, x[((b * h + iy) * w + ix) * c + ci]);
            }
          out[((b * oh + oy) * ow + ox) * c + ci] = m;
        }
  return out;
}

struct ConvSpec {
  Shape x, filter;
  int sh, sw;
  bool same;
  bool image_needs_grad;
};

OpCase ConvCase(const ConvSpec& s);

std::vector<OpCase> ConvCases() {
  const std::vector<ConvSpec> specs = {
      {{2, 5, 5, 3}, {3, 3, 3, 4}, 1, 1, true, true},
      {{2, 6, 5, 2}, {3, 2, 2, 3}, 1, 1, false, true},
      {{1, 6, 6, 3}, {3, 3, 3, 2}, 2, 2, true, true},  // SAME, pad 0 before / 1 after
      {{1, 7, 7, 2}, {4, 4, 2, 3}, 1, 1, true, true},  // even kernel: pad 1 before / 2 after
      {{2, 7, 8, 3}, {3, 3, 3, 5}, 2, 2, false, true},
      {{2, 9, 7, 1}, {5, 5, 1, 4}, 1, 2, true, false},    // the MNIST first layer, image constant
      {{1, 5, 5, 16}, {3, 3, 16, 32}, 1, 1, true, true},  // multi-channel, blocked-friendly
      {{1, 7, 7, 8}, {5, 5, 8, 16}, 1, 1, true, true},
      {{3, 5, 5, 8}, {1, 1, 8, 16}, 2, 1, false, true},
  };
  std::vector<OpCase> cases;
  for (const ConvSpec& s : specs) {
    OpCase c = ConvCase(s);
    cases.push_back(c);
  }
  // FusedConv2D: relu(conv + bias) and conv + bias, on some of the geometries.
  // The other activations run after the fused kernel: one geometry each.
  for (int i : {0, 2, 5, 6}) {
    for (Activation act :
         {Activation::kRelu, Activation::kNone, Activation::kTanh, Activation::kSigmoid, Activation::kGelu}) {
      if (i != 2 && act != Activation::kRelu && act != Activation::kNone) continue;
      const ConvSpec& s = specs[i];
      OpCase c = ConvCase(s);
      c.name = absl::StrCat("Fused", c.name, testing::ActivationSuffix(act));
      c.input_shapes.push_back({s.filter[3]});
      c.requires_grad.push_back(true);
      c.build = [s, act](const std::vector<Var>& v) {
        return FusedConv2D(v[0], v[1], v[2], s.sh, s.sw, s.same ? Padding::kSame : Padding::kValid, act);
      };
      c.reference = [s, act](const std::vector<DTensor>& in) {
        DTensor out = RefConv(in[0], in[1], s.sh, s.sw, s.same);
        const int64_t oc = in[2].size();
        for (int64_t i = 0; i < out.size(); ++i) {
          out[i] = testing::RefActivate(act, out[i] + in[2][i % oc]);
        }
        return out;
      };
      cases.push_back(c);
    }
  }
  return cases;
}

OpCase ConvCase(const ConvSpec& s) {
  {
    OpCase c;
    c.name = "Conv2D_x" + ShapeToString(s.x) + "_f" + ShapeToString(s.filter) + "_s" + std::to_string(s.sh) +
             std::to_string(s.sw) + (s.same ? "_SAME" : "_VALID") + (s.image_needs_grad ? "" : "_ConstImage");
    c.input_shapes = {s.x, s.filter};
    c.requires_grad = {s.image_needs_grad, true};
    c.build = [s](const std::vector<Var>& v) {
      return Conv2D(v[0], v[1], s.sh, s.sw, s.same ? Padding::kSame : Padding::kValid);
    };
    c.reference = [s](const std::vector<DTensor>& in) { return RefConv(in[0], in[1], s.sh, s.sw, s.same); };
    c.max_gradient_checks = 60;
    c.forward_tolerance = 2e-4;
    return c;
  }
}

struct PoolSpec {
  Shape x;
  int kh, kw, sh, sw;
  bool same;
};

std::vector<OpCase> PoolCases() {
  const std::vector<PoolSpec> specs = {
      {{2, 4, 4, 3}, 2, 2, 2, 2, false}, {{2, 5, 5, 3}, 2, 2, 2, 2, true},  {{1, 7, 6, 2}, 3, 3, 2, 2, true},
      {{1, 5, 6, 4}, 3, 3, 1, 1, true},  {{2, 7, 5, 1}, 3, 2, 2, 1, false}, {{1, 6, 6, 2}, 3, 3, 3, 3, false},
  };
  std::vector<OpCase> cases;
  for (const PoolSpec& s : specs) {
    for (bool negative : {false, true}) {
      OpCase c;
      c.name = "MaxPool_x" + ShapeToString(s.x) + "_k" + std::to_string(s.kh) + std::to_string(s.kw) + "_s" +
               std::to_string(s.sh) + std::to_string(s.sw) + (s.same ? "_SAME" : "_VALID") +
               (negative ? "_AllNegative" : "");
      c.input_shapes = {s.x};
      if (negative) {  // a zero from padding would win if padded cells took part
        c.fill = [](int, DTensor& in, Rng& rng) {
          for (double& v : in.data) v = -0.1 - rng.Uniform();
        };
      }
      c.build = [s](const std::vector<Var>& v) {
        return MaxPool(v[0], s.kh, s.kw, s.sh, s.sw, s.same ? Padding::kSame : Padding::kValid);
      };
      c.reference = [s](const std::vector<DTensor>& in) { return RefMaxPool(in[0], s.kh, s.kw, s.sh, s.sw, s.same); };
      cases.push_back(c);
    }
  }
  return cases;
}

std::string CaseName(const ::testing::TestParamInfo<OpCase>& info) {
  std::string name;
  for (char ch : info.param.name) name += std::isalnum(static_cast<unsigned char>(ch)) ? ch : '_';
  return name;
}

class ConvOpTest : public ::testing::TestWithParam<OpCase> {};

TEST_P(ConvOpTest, OneDnnMatchesReferenceAndFiniteDifferences) {
  const auto before = internal::GetConvBackendCounts();
  CheckOp(GetParam());
  const auto after = internal::GetConvBackendCounts();
  EXPECT_EQ(after.im2col_calls, before.im2col_calls) << "oneDNN declined this geometry";
  EXPECT_GE(after.onednn_calls - before.onednn_calls, 2);  // forward + at least the filter gradient
}

TEST_P(ConvOpTest, Im2ColFallbackMatchesReferenceAndFiniteDifferences) {
  internal::ForceIm2ColConvForTesting(true);
  const auto before = internal::GetConvBackendCounts();
  CheckOp(GetParam());
  const auto after = internal::GetConvBackendCounts();
  internal::ForceIm2ColConvForTesting(false);
  EXPECT_EQ(after.onednn_calls, before.onednn_calls);
  EXPECT_GE(after.im2col_calls - before.im2col_calls, 2);
}

INSTANTIATE_TEST_SUITE_P(Ops, ConvOpTest, ::testing::ValuesIn(ConvCases()), CaseName);

class PoolOpTest : public ::testing::TestWithParam<OpCase> {};
TEST_P(PoolOpTest, MatchesReferenceAndFiniteDifferences) { CheckOp(GetParam()); }
INSTANTIATE_TEST_SUITE_P(Ops, PoolOpTest, ::testing::ValuesIn(PoolCases()), CaseName);

TEST(MaxPoolTest, TiesSendTheGradientToTheFirstMaxInScanOrder) {
  Var x = MakeParameter("x", Tensor({1, 2, 2, 1}, {3, 3, 1, 3}));
  Var y = MaxPool(x, 2, 2, 2, 2, Padding::kValid);
  EXPECT_EQ(y->value[0], 3.0f);
  Backward(MakeOpNode("seed", Tensor::Scalar(0), {y}, [](Node& self) {
    self.inputs[0]->AccumulateGrad(Tensor({1, 1, 1, 1}, 5.0f));
  }));
  const std::vector<float> want = {5, 0, 0, 0};
  for (int i = 0; i < 4; ++i) EXPECT_EQ(x->grad[i], want[i]) << i;
}

TEST(TfPaddingTest, HandComputedValues) {
  int64_t out, before, after;
  internal::TfPadding(28, 5, 1, Padding::kSame, &out, &before, &after);  // MNIST conv1
  EXPECT_EQ(out, 28);
  EXPECT_EQ(before, 2);
  EXPECT_EQ(after, 2);
  internal::TfPadding(6, 3, 2, Padding::kSame, &out, &before, &after);  // (3-1)*2+3-6 = 1
  EXPECT_EQ(out, 3);
  EXPECT_EQ(before, 0);
  EXPECT_EQ(after, 1);
  internal::TfPadding(7, 2, 2, Padding::kSame, &out, &before, &after);  // 3*2+2-7 = 1
  EXPECT_EQ(out, 4);
  EXPECT_EQ(before, 0);
  EXPECT_EQ(after, 1);
  internal::TfPadding(5, 1, 2, Padding::kSame, &out, &before, &after);  // negative total clamps to 0
  EXPECT_EQ(out, 3);
  EXPECT_EQ(before + after, 0);
  internal::TfPadding(7, 3, 2, Padding::kValid, &out, &before, &after);
  EXPECT_EQ(out, 3);
  EXPECT_EQ(before + after, 0);
}

TEST(Conv2DTest, HandComputedSamePaddingPutsTheExtraRowAtTheBottom) {
  // A 2x2 all-ones filter over a 3x3 ramp with SAME: the window at (i, j) covers (i..i+1, j..j+1).
  Var x = Constant(Tensor({1, 3, 3, 1}, {1, 2, 3, 4, 5, 6, 7, 8, 9}));
  Var f = Constant(Tensor({2, 2, 1, 1}, 1.0f));
  Var y = Conv2D(x, f, 1, 1, Padding::kSame);
  const std::vector<float> want = {12, 16, 9, 24, 28, 15, 15, 17, 9};
  ASSERT_EQ(y->value.shape(), (Shape{1, 3, 3, 1}));
  for (int i = 0; i < 9; ++i) EXPECT_EQ(y->value[i], want[i]) << i;
}

TEST(Conv2DTest, PrimitivesAreBuiltOncePerGeometry) {
  auto step = [] {
    Var x = Constant(Tensor({3, 9, 9, 2}, 0.5f));
    Var f = MakeParameter("f", Tensor({3, 3, 2, 5}, 0.1f));
    Var y = Conv2D(x, f, 2, 2, Padding::kSame);
    Backward(MakeOpNode("seed", Tensor::Scalar(0), {y}, [](Node& self) {
      self.inputs[0]->AccumulateGrad(Tensor(self.inputs[0]->value.shape(), 1.0f));
    }));
  };
  const int64_t before = internal::GetConvBackendCounts().onednn_primitive_builds;
  step();
  const int64_t after_first = internal::GetConvBackendCounts().onednn_primitive_builds;
  step();
  step();
  EXPECT_EQ(after_first - before, 1);
  EXPECT_EQ(internal::GetConvBackendCounts().onednn_primitive_builds, after_first);
}

TEST(Conv2DTest, ImageGradientIsNeverComputedForConstants) {
  const auto before = internal::GetConvBackendCounts();
  Var x = Constant(Tensor({2, 6, 6, 1}, 0.5f));
  Var f = MakeParameter("f", Tensor({3, 3, 1, 2}, 0.1f));
  Var y = Conv2D(x, f, 1, 1, Padding::kSame);
  Backward(MakeOpNode("seed", Tensor::Scalar(0), {y},
                      [](Node& self) { self.inputs[0]->AccumulateGrad(Tensor(self.inputs[0]->value.shape(), 1.0f)); }));
  const auto after = internal::GetConvBackendCounts();
  EXPECT_TRUE(x->grad.empty());
  EXPECT_FALSE(f->grad.empty());
  EXPECT_EQ(after.onednn_calls - before.onednn_calls, 2);  // forward and filter gradient only
}

}  // namespace
}  // namespace psflow::ops

namespace psflow::ops {
namespace {

// Kernels write outputs into uninitialised (recycled) blocks: poison the recycled blocks of the
// exact output sizes with NaN first, and check that nothing of it shows through.
void PoisonBlocksOfSize(const Shape& shape, int copies) {
  std::vector<Tensor> poison;
  for (int i = 0; i < copies; ++i) poison.emplace_back(shape, std::nanf(""));
}  // freed here, into the block cache

bool AllFinite(const Tensor& t) {
  for (float v : t.span()) {
    if (!std::isfinite(v)) return false;
  }
  return true;
}

TEST(UninitializedOutputsTest, KernelsOverwriteEveryElement) {
  const Shape x_shape = {4, 32, 32, 16}, f_shape = {3, 3, 16, 16}, y_shape = {4, 32, 32, 16};
  for (const Shape& s : {x_shape, y_shape, Shape{512, 256}, Shape{256, 256}}) PoisonBlocksOfSize(s, 4);
  Var x = MakeParameter("x", Tensor(x_shape, 0.5f));
  Var f = MakeParameter("f", Tensor(f_shape, 0.1f));
  Var b = MakeParameter("b", Tensor({16}, 0.1f));
  Var y = MaxPool(FusedConv2D(Relu(BiasAdd(Conv2D(x, f, 1, 1, Padding::kSame), b)), f, b, 1, 1, Padding::kSame), 2, 2,
                  1, 1, Padding::kSame);
  Var a = MakeParameter("a", Tensor({512, 256}, 0.25f));
  Var w = MakeParameter("w", Tensor({256, 256}, 0.5f));
  Var z = MatMul(a, w);
  Backward(MakeOpNode("seed", Tensor::Scalar(0), {y, z}, [](Node& self) {
    self.inputs[0]->AccumulateGrad(Tensor(self.inputs[0]->value.shape(), 1.0f));
    self.inputs[1]->AccumulateGrad(Tensor(self.inputs[1]->value.shape(), 1.0f));
  }));
  for (const Var& v : {y, z}) EXPECT_TRUE(AllFinite(v->value));
  for (const Var& v : {x, f, b, a, w}) EXPECT_TRUE(AllFinite(v->grad)) << v->name;
}

}  // namespace
}  // namespace psflow::ops
