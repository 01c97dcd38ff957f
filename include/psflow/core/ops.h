// psflow/core/ops.h — differentiable ops on Vars (see autodiff.h). Each returns a new Var whose
// backward closure accumulates gradients into the inputs that require them (and skips the rest:
// no gradient is computed for inputs such as images). Layout conventions follow TensorFlow:
// images are NHWC, convolution filters HWIO ([kh, kw, in_channels, out_channels]).
// Heavy kernels (matmul, conv) run on OpenBLAS / oneDNN; see src/core for the reasons.
// Shape mismatches are programmer errors (CHECK). Thread-safety: ops may be called concurrently
// on disjoint graphs (e.g. one replica per thread); results do not depend on which thread runs
// them, and for a fixed intra-op thread count they are bit-for-bit repeatable.
#ifndef PSFLOW_CORE_OPS_H_
#define PSFLOW_CORE_OPS_H_

#include <cstdint>
#include <span>
#include <vector>

#include "psflow/core/autodiff.h"
#include "psflow/core/random.h"

namespace psflow::ops {

enum class Padding { kSame, kValid };

// [m,k] x [k,n] -> [m,n] (with optional transposes of the operands as stored).
Var MatMul(const Var& a, const Var& b, bool transpose_a = false, bool transpose_b = false);
// x [..., n] + bias [n], broadcast over leading dims.
Var BiasAdd(const Var& x, const Var& bias);
Var Relu(const Var& x);
// Mean over the batch of -log softmax(logits)[label]; logits [batch, classes], labels in
// [0, classes). Numerically stable (max-shifted log-sum-exp). Returns a scalar Var.
Var SoftmaxCrossEntropy(const Var& logits, std::span<const int32_t> labels);
// x [n,h,w,c] conv filter [kh,kw,c,oc] -> [n,oh,ow,oc]. SAME pads as TensorFlow does (extra on
// the bottom/right); VALID pads nothing.
Var Conv2D(const Var& x, const Var& filter, int stride_h, int stride_w, Padding padding);

// Activations, applied by Activate below and inside the fused ops and nn::Dense.
//   kRelu     max(x, 0)
//   kTanh     tanh(x)
//   kSigmoid  1 / (1 + exp(-x))
//   kGelu     the tanh approximation 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), as PyTorch's
//             gelu(approximate='tanh') and TensorFlow's gelu(approximate=True) (not the erf form)
enum class Activation { kNone, kRelu, kTanh, kSigmoid, kGelu };
Var Activate(const Var& x, Activation activation);
Var Tanh(const Var& x);
Var Sigmoid(const Var& x);
Var Gelu(const Var& x);
// activation(Conv2D(x, filter, ...) + bias), bias [oc], as one op: oneDNN adds the bias and applies
// the activation inside the convolution kernel, and the backward pass masks the gradient and sums
// it for the bias in one sweep. Same values and gradients as Relu(BiasAdd(Conv2D(...), bias)),
// with three fewer passes over the (large) activation; prefer it for conv layers. (Activations
// other than kNone and kRelu run as a separate Activate after the fused kernel.)
Var FusedConv2D(const Var& x, const Var& filter, const Var& bias, int stride_h, int stride_w, Padding padding,
                Activation activation = Activation::kRelu);
// activation(MatMul(x, w) + bias) for x [m,k], w [k,n], bias [n], as one op: the bias and any
// activation are applied in one sweep over the product, and the backward pass multiplies the
// gradient by the activation's derivative and sums it for the bias in one sweep.
Var FusedMatMul(const Var& x, const Var& w, const Var& bias, Activation activation = Activation::kRelu);

// Max over [kh,kw] windows of x [n,h,w,c]; the gradient goes to the (first) max of each window.
// SAME padding as Conv2D; padded cells never win (a window of negatives has a negative max).
Var MaxPool(const Var& x, int kh, int kw, int stride_h, int stride_w, Padding padding);
// Inverted dropout: when training, zeroes each element with probability `rate` and scales the
// rest by 1/(1-rate); identity when not training. rate in [0, 1). Draws one uniform per element
// from `rng` (when training), so a seed fixes the mask whatever the thread count.
Var Dropout(const Var& x, float rate, bool training, Rng& rng);
// Same data with another shape of equal element count; one dim may be -1 (inferred).
Var Reshape(const Var& x, Shape shape);
// [n, ...] -> [n, prod(...)].
Var Flatten(const Var& x);
// Concatenation along `axis` (negative counts from the end); every other dim must match.
Var Concat(const std::vector<Var>& parts, int axis);
// The inverse: consecutive parts of x along `axis` of the given sizes (which must sum to the dim).
// Each part is its own Var; the gradients of the parts used downstream add into x's gradient.
std::vector<Var> Split(const Var& x, int axis, std::span<const int64_t> sizes);

// Element-wise a + b, a - b, a * b. b has a's shape, or is a row vector broadcast over a's rows:
// b's elements are a's last dim ([n], [1,n], ...); its gradient is then summed over the rows.
Var Add(const Var& a, const Var& b);
Var Subtract(const Var& a, const Var& b);
Var Multiply(const Var& a, const Var& b);
// Row-wise dot product: a, b [n, d] -> [n, 1] (sum over d of a * b; [n, 1] so it feeds
// BiasAdd, Add and the losses as one logit per row). Wide-and-deep / two-tower scores.
Var RowDot(const Var& a, const Var& b);
// Layer normalization over the last axis of x [..., d] with gain and bias [d]:
// (x - mean) / sqrt(var + epsilon) * gain + bias, var the biased variance (as PyTorch/TF).
Var LayerNorm(const Var& x, const Var& gain, const Var& bias, float epsilon = 1e-5f);

// Losses (scalar Vars). Mean over all elements of max(x, 0) - x z + log(1 + exp(-|x|)), the
// sigmoid cross-entropy of logits x against labels z in [0, 1] (TensorFlow's
// sigmoid_cross_entropy_with_logits / PyTorch's BCEWithLogitsLoss): stable at any |x|.
// labels.size() must equal the element count of logits.
Var SigmoidCrossEntropy(const Var& logits, std::span<const float> labels);
// Mean over all elements of (predictions - targets)^2; targets.size() equals the element count.
Var MeanSquaredError(const Var& predictions, std::span<const float> targets);
// Rows of table [vocab, dim] gathered by ids -> [ids.size(), dim]. The table's gradient is
// row-sparse (Node::sparse_grad): only the touched rows, each once, summed over repeats; it is
// merged with the sparse gradients of other lookups of the same table, and coexists with a dense
// `grad` when the table is also used by dense ops.
Var EmbeddingLookup(const Var& table, std::span<const int64_t> ids);

// Not differentiable helpers used by training and evaluation.
// Row-wise argmax of logits [batch, classes].
std::vector<int32_t> ArgMax(const Tensor& logits);
// Fraction of rows whose argmax equals the label.
double Accuracy(const Tensor& logits, std::span<const int32_t> labels);

}  // namespace psflow::ops

#endif  // PSFLOW_CORE_OPS_H_
