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

// Activations that the fused ops below apply inside their kernel.
enum class Activation { kNone, kRelu };
// activation(Conv2D(x, filter, ...) + bias), bias [oc], as one op: oneDNN adds the bias and applies
// the activation inside the convolution kernel, and the backward pass masks the gradient and sums
// it for the bias in one sweep. Same values and gradients as Relu(BiasAdd(Conv2D(...), bias)),
// with three fewer passes over the (large) activation; prefer it for conv layers.
Var FusedConv2D(const Var& x, const Var& filter, const Var& bias, int stride_h, int stride_w, Padding padding,
                Activation activation = Activation::kRelu);
// activation(MatMul(x, w) + bias) for x [m,k], w [k,n], bias [n], as one op (see FusedConv2D).
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
