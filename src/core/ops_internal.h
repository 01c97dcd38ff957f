// src/core/ops_internal.h — helpers shared by the op kernels of src/core (not a public API).
#ifndef PSFLOW_SRC_CORE_OPS_INTERNAL_H_
#define PSFLOW_SRC_CORE_OPS_INTERNAL_H_

#include <cstdint>

#include "psflow/core/autodiff.h"
#include "psflow/core/ops.h"

namespace psflow::ops::internal {

// Element counts below which element-wise kernels stay on the calling thread (waking pool
// threads costs more than the work).
inline constexpr int64_t kMinElementsPerBlock = 32 * 1024;

// For kernels that can overwrite or accumulate (sgemm's beta): the input's dense gradient
// buffer, allocated uninitialised when empty; *accumulate tells whether it already holds a
// gradient to add to.
inline float* GradTarget(Node& input, bool* accumulate) {
  *accumulate = !input.grad.empty();
  if (!*accumulate) input.grad = Tensor::Uninitialized(input.value.shape());
  return input.grad.data();
}

// One sweep over the gradient g [rows, cols] of activation(z + bias) with output y: in place,
// g *= (y > 0) when relu; and when bias_grad is not null, it receives the column sums of the
// masked g (summed over fixed chunks of rows, so the result does not depend on the thread count).
// y is read only when relu is set (it may be null otherwise).
void MaskAndSumColumns(float* g, const float* y, int64_t rows, int64_t cols, bool relu, Tensor* bias_grad);

// y[r, c] = activation(y[r, c] + bias[c]) in place.
void AddBiasAndActivate(float* y, const float* bias, int64_t rows, int64_t cols, bool relu);

// x[i] = activation(x[i]) in place, for i in [0, n) (threaded over the intra-op threads).
void ActivateInPlace(Activation activation, float* x, int64_t n);
// g[i] *= activation'(z[i]) in place: the derivative is taken from the activation's output y for
// kRelu, kTanh and kSigmoid (z may be null), from the pre-activation z for kGelu (y may be null).
// kNone leaves g unchanged.
void ActivationGradInPlace(Activation activation, float* g, const float* y, const float* z, int64_t n);
// Whether the activation's derivative needs the pre-activation (only kGelu).
inline bool ActivationNeedsInput(Activation activation) { return activation == Activation::kGelu; }

// C[m,n] (= beta * C) + op(A) op(B), row-major; op(X) is X or its transpose as stored.
void Gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const float* a, const float* b, float* c,
          bool accumulate);

// Geometry of one 2-D convolution in NHWC / HWIO, with TensorFlow's padding resolved.
struct ConvGeometry {
  int64_t batch, in_h, in_w, in_c;
  int64_t k_h, k_w, out_c;
  int64_t stride_h, stride_w;
  int64_t out_h, out_w;
  int64_t pad_top, pad_left, pad_bottom, pad_right;
};
ConvGeometry MakeConvGeometry(const Shape& input, const Shape& filter, int stride_h, int stride_w, Padding padding);
// TensorFlow's output size and leading pad for one spatial dim (shared by conv and pooling).
void TfPadding(int64_t in, int64_t k, int64_t stride, Padding padding, int64_t* out, int64_t* pad_before,
               int64_t* pad_after);

// The oneDNN kernels (conv_onednn.cc). Each returns false if oneDNN cannot run this geometry, in
// which case nothing was written. Outputs are overwritten. The forward adds `bias` [oc] when it is
// not null, then applies relu when asked.
bool OneDnnConvForward(const ConvGeometry& g, const float* x, const float* filter, const float* bias, bool relu,
                       float* out);
bool OneDnnConvBackwardData(const ConvGeometry& g, const float* d_out, const float* filter, float* d_x);
bool OneDnnConvBackwardFilter(const ConvGeometry& g, const float* x, const float* d_out, float* d_filter);

// The fallback kernels: im2col + sgemm (conv_im2col.cc). Outputs are overwritten.
void Im2ColConvForward(const ConvGeometry& g, const float* x, const float* filter, const float* bias, bool relu,
                       float* out);
void Im2ColConvBackwardData(const ConvGeometry& g, const float* d_out, const float* filter, float* d_x);
void Im2ColConvBackwardFilter(const ConvGeometry& g, const float* x, const float* d_out, float* d_filter);

// Which convolution implementation Conv2D uses; tests check that oneDNN is the one in use and
// can force the fallback to test it too.
enum class ConvBackend { kOneDnn, kIm2Col };
struct ConvBackendCounts {
  int64_t onednn_calls = 0;  // kernel invocations (forward, backward data, backward filter)
  int64_t im2col_calls = 0;
  int64_t onednn_primitive_builds = 0;  // geometries (and fused variants) compiled so far
};
ConvBackendCounts GetConvBackendCounts();
int64_t OneDnnPrimitiveBuilds();  // conv_onednn.cc
void ForceIm2ColConvForTesting(bool force);

}  // namespace psflow::ops::internal

#endif  // PSFLOW_SRC_CORE_OPS_INTERNAL_H_
