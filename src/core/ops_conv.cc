// Conv2D: the op and its autodiff wiring. The kernels are oneDNN's (conv_onednn.cc), with
// im2col + sgemm (conv_im2col.cc) as a fallback for geometries oneDNN refuses.
#include <algorithm>
#include <atomic>

#include "core/ops_internal.h"
#include "psflow/core/check.h"
#include "psflow/core/ops.h"
#include "core/threading_internal.h"

namespace psflow::ops {
namespace internal {
namespace {
std::atomic<int64_t> g_onednn_calls{0};
std::atomic<int64_t> g_im2col_calls{0};
std::atomic<bool> g_force_im2col{false};
}  // namespace

ConvBackendCounts GetConvBackendCounts() { return {g_onednn_calls.load(), g_im2col_calls.load()}; }
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

ConvGeometry MakeConvGeometry(const Shape& input, const Shape& filter, int stride_h, int stride_w,
                              Padding padding) {
  CHECK(input.size() == 4 && filter.size() == 4)
      << "Conv2D needs x [n,h,w,c] and filter [kh,kw,c,oc], got " << ShapeToString(input) << " and "
      << ShapeToString(filter);
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

enum class ConvKernel { kForward, kBackwardData, kBackwardFilter };

// Runs one kernel on oneDNN, or on im2col when oneDNN declines (or a test forces it).
void RunConv(ConvKernel kernel, const ConvGeometry& g, const float* a, const float* b, float* out) {
  if (!internal::g_force_im2col.load(std::memory_order_relaxed)) {
    bool ok = false;
    switch (kernel) {
      case ConvKernel::kForward: ok = internal::OneDnnConvForward(g, a, b, out); break;
      case ConvKernel::kBackwardData: ok = internal::OneDnnConvBackwardData(g, a, b, out); break;
      case ConvKernel::kBackwardFilter: ok = internal::OneDnnConvBackwardFilter(g, a, b, out); break;
    }
    if (ok) {
      internal::g_onednn_calls.fetch_add(1, std::memory_order_relaxed);
      return;
    }
  }
  internal::g_im2col_calls.fetch_add(1, std::memory_order_relaxed);
  switch (kernel) {
    case ConvKernel::kForward: internal::Im2ColConvForward(g, a, b, out); break;
    case ConvKernel::kBackwardData: internal::Im2ColConvBackwardData(g, a, b, out); break;
    case ConvKernel::kBackwardFilter: internal::Im2ColConvBackwardFilter(g, a, b, out); break;
  }
}

// The kernels overwrite their output; a gradient that already holds something gets the kernel's
// result added instead.
void AccumulateConvGrad(ConvKernel kernel, const ConvGeometry& g, const float* a, const float* b, Node& input) {
  if (input.grad.empty()) {
    input.grad = Tensor::Uninitialized(input.value.shape());
    RunConv(kernel, g, a, b, input.grad.data());
    return;
  }
  Tensor tmp = Tensor::Uninitialized(input.value.shape());
  RunConv(kernel, g, a, b, tmp.data());
  input.AccumulateGrad(tmp);
}
}  // namespace

Var Conv2D(const Var& x, const Var& filter, int stride_h, int stride_w, Padding padding) {
  psflow::internal::PrepareThreadForKernels();
  const ConvGeometry g = internal::MakeConvGeometry(x->value.shape(), filter->value.shape(), stride_h, stride_w, padding);
  Tensor out = Tensor::Uninitialized({g.batch, g.out_h, g.out_w, g.out_c});
  RunConv(ConvKernel::kForward, g, x->value.data(), filter->value.data(), out.data());
  return MakeOpNode("Conv2D", std::move(out), {x, filter}, [g](Node& self) {
    Node& nx = *self.inputs[0];
    Node& nf = *self.inputs[1];
    // Images never require a gradient, so the (costly) data gradient is skipped for them.
    if (nx.requires_grad) {
      AccumulateConvGrad(ConvKernel::kBackwardData, g, self.grad.data(), nf.value.data(), nx);
    }
    if (nf.requires_grad) {
      AccumulateConvGrad(ConvKernel::kBackwardFilter, g, nx.value.data(), self.grad.data(), nf);
    }
  });
}

}  // namespace psflow::ops
