// Conv2D: the op and its autodiff wiring. The kernels are oneDNN's (conv_onednn.cc), with
// im2col + sgemm (conv_im2col.cc) as a fallback for geometries oneDNN refuses.
#include <algorithm>
#include <atomic>

#include "core/check.h"
#include "core/ops_internal.h"
#include "core/threading_internal.h"
#include "psflow/core/ops.h"

namespace psflow::ops {
namespace internal {
namespace {
std::atomic<int64_t> g_onednn_calls{0};
std::atomic<int64_t> g_im2col_calls{0};
std::atomic<bool> g_force_im2col{false};
}  // namespace

ConvBackendCounts GetConvBackendCounts() {
  return {g_onednn_calls.load(), g_im2col_calls.load(), OneDnnPrimitiveBuilds()};
}
void ForceIm2ColConvForTesting(bool force) { g_force_im2col.store(force); }

void TfPadding(int64_t in, int64_t k, int64_t stride, Padding padding, int64_t* out, int64_t* pad_before,
               int64_t* pad_after) {
  CHECK(stride >= 1 && k >= 1) << "stride " << stride << ", window " << k;
  if (padding == Padding::kValid) {
    CHECK(in >= k) << "VALID window " << k << " larger than input " << in;
    *out = (in - k) / stride + 1;
    *pad_before = *pad_after = 0;
    return;
  }
  *out = (in + stride - 1) / stride;
  // TensorFlow puts the odd pixel of padding at the bottom / right.
  const int64_t total = std::max<int64_t>((*out - 1) * stride + k - in, 0);
  *pad_before = total / 2;
  *pad_after = total - *pad_before;
}

ConvGeometry MakeConvGeometry(const Shape& input, const Shape& filter, int stride_h, int stride_w, Padding padding) {
  CHECK(input.size() == 4 && filter.size() == 4) << "Conv2D needs x [n,h,w,c] and filter [kh,kw,c,oc], got "
                                                 << ShapeToString(input) << " and " << ShapeToString(filter);
  CHECK_EQ(input[3], filter[2]) << "Conv2D channels: x " << ShapeToString(input) << ", filter "
                                << ShapeToString(filter);
  ConvGeometry g;
  g.batch = input[0];
  g.in_h = input[1];
  g.in_w = input[2];
  g.in_c = input[3];
  g.k_h = filter[0];
  g.k_w = filter[1];
  g.out_c = filter[3];
  g.stride_h = stride_h;
  g.stride_w = stride_w;
  TfPadding(g.in_h, g.k_h, stride_h, padding, &g.out_h, &g.pad_top, &g.pad_bottom);
  TfPadding(g.in_w, g.k_w, stride_w, padding, &g.out_w, &g.pad_left, &g.pad_right);
  return g;
}

}  // namespace internal

namespace {
using internal::ConvGeometry;

bool UseOneDnn() { return !internal::g_force_im2col.load(std::memory_order_relaxed); }
void CountOneDnn() { internal::g_onednn_calls.fetch_add(1, std::memory_order_relaxed); }
void CountIm2Col() { internal::g_im2col_calls.fetch_add(1, std::memory_order_relaxed); }

// Each kernel runs on oneDNN, or on im2col when oneDNN declines (or a test forces it).
void RunForward(const ConvGeometry& g, const float* x, const float* filter, const float* bias, bool relu, float* out) {
  if (UseOneDnn() && internal::OneDnnConvForward(g, x, filter, bias, relu, out)) return CountOneDnn();
  CountIm2Col();
  internal::Im2ColConvForward(g, x, filter, bias, relu, out);
}

// The backward kernels overwrite their output, which then becomes the gradient (moved in) or is
// added to the gradient already there.
void AccumulateDataGrad(const ConvGeometry& g, const float* d_out, const float* filter, Node& x) {
  Tensor tmp = Tensor::Uninitialized(x.value.shape());
  if (UseOneDnn() && internal::OneDnnConvBackwardData(g, d_out, filter, tmp.data())) {
    CountOneDnn();
  } else {
    CountIm2Col();
    internal::Im2ColConvBackwardData(g, d_out, filter, tmp.data());
  }
  x.AccumulateGrad(std::move(tmp));
}

void AccumulateFilterGrad(const ConvGeometry& g, const float* x, const float* d_out, Node& filter) {
  Tensor tmp = Tensor::Uninitialized(filter.value.shape());
  if (UseOneDnn() && internal::OneDnnConvBackwardFilter(g, x, d_out, tmp.data())) {
    CountOneDnn();
  } else {
    CountIm2Col();
    internal::Im2ColConvBackwardFilter(g, x, d_out, tmp.data());
  }
  filter.AccumulateGrad(std::move(tmp));
}

// Propagates the gradient of the convolution's output (d_out) to x and the filter. Images never
// require a gradient, so the (costly) data gradient is skipped for them.
void ConvBackward(const ConvGeometry& g, const float* d_out, Node& x, Node& filter) {
  if (x.requires_grad) AccumulateDataGrad(g, d_out, filter.value.data(), x);
  if (filter.requires_grad) AccumulateFilterGrad(g, x.value.data(), d_out, filter);
}
}  // namespace

Var Conv2D(const Var& x, const Var& filter, int stride_h, int stride_w, Padding padding) {
  psflow::internal::PrepareThreadForKernels();
  const ConvGeometry g =
      internal::MakeConvGeometry(x->value.shape(), filter->value.shape(), stride_h, stride_w, padding);
  Tensor out = Tensor::Uninitialized({g.batch, g.out_h, g.out_w, g.out_c});
  RunForward(g, x->value.data(), filter->value.data(), nullptr, false, out.data());
  return MakeOpNode("Conv2D", std::move(out), {x, filter},
                    [g](Node& self) { ConvBackward(g, self.grad.data(), *self.inputs[0], *self.inputs[1]); });
}

Var FusedConv2D(const Var& x, const Var& filter, const Var& bias, int stride_h, int stride_w, Padding padding,
                Activation activation) {
  if (activation != Activation::kNone && activation != Activation::kRelu) {
    return Activate(FusedConv2D(x, filter, bias, stride_h, stride_w, padding, Activation::kNone), activation);
  }
  psflow::internal::PrepareThreadForKernels();
  const ConvGeometry g =
      internal::MakeConvGeometry(x->value.shape(), filter->value.shape(), stride_h, stride_w, padding);
  CHECK(bias->value.rank() == 1 && bias->value.dim(0) == g.out_c)
      << "FusedConv2D: bias " << ShapeToString(bias->value.shape()) << " for " << g.out_c << " output channels";
  const bool relu = activation == Activation::kRelu;
  Tensor out = Tensor::Uninitialized({g.batch, g.out_h, g.out_w, g.out_c});
  RunForward(g, x->value.data(), filter->value.data(), bias->value.data(), relu, out.data());
  return MakeOpNode("FusedConv2D", std::move(out), {x, filter, bias}, [g, relu](Node& self) {
    Node& nb = *self.inputs[2];
    Tensor db;
    internal::MaskAndSumColumns(self.grad.data(), self.value.data(), g.batch * g.out_h * g.out_w, g.out_c, relu,
                                nb.requires_grad ? &db : nullptr);
    if (nb.requires_grad) nb.AccumulateGrad(std::move(db));
    ConvBackward(g, self.grad.data(), *self.inputs[0], *self.inputs[1]);
  });
}

}  // namespace psflow::ops
