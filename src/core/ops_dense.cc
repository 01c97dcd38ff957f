// Dense ops: MatMul (OpenBLAS sgemm), BiasAdd, FusedMatMul, Relu, SoftmaxCrossEntropy and the
// non-differentiable ArgMax / Accuracy.
#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "core/check.h"
#include "core/ops_internal.h"
#include "core/threading_internal.h"
#include "psflow/core/ops.h"
#include "psflow/core/threading.h"

namespace psflow::ops {
namespace internal {

void Gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const float* a, const float* b, float* c,
          bool accumulate) {
  if (m == 0 || n == 0) return;
  if (k == 0) {
    if (!accumulate) std::fill(c, c + m * n, 0.0f);
    return;
  }
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans,
              static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), 1.0f, a, static_cast<int>(trans_a ? m : k),
              b, static_cast<int>(trans_b ? k : n), accumulate ? 1.0f : 0.0f, c, static_cast<int>(n));
}

namespace {
template <bool kRelu>
void MaskAndSumChunk(float* g, const float* y, int64_t r0, int64_t r1, int64_t cols, float* sum) {
  for (int64_t r = r0; r < r1; ++r) {
    float* gr = g + r * cols;
    for (int64_t c = 0; c < cols; ++c) {
      float v = gr[c];
      if constexpr (kRelu) {
        v = y[r * cols + c] > 0.0f ? v : 0.0f;
        gr[c] = v;
      }
      sum[c] += v;
    }
  }
}
}  // namespace

void MaskAndSumColumns(float* g, const float* y, int64_t rows, int64_t cols, bool relu, Tensor* bias_grad) {
  if (bias_grad == nullptr) {
    if (!relu) return;
    ParallelFor(rows * cols, kMinElementsPerBlock, [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i) g[i] = y[i] > 0.0f ? g[i] : 0.0f;
    });
    return;
  }
  const int64_t chunk_rows = std::max<int64_t>(1, 8192 / std::max<int64_t>(cols, 1));
  const int64_t chunks = (rows + chunk_rows - 1) / chunk_rows;
  std::vector<float> partial(chunks * cols, 0.0f);
  const int64_t min_chunks = std::max<int64_t>(1, kMinElementsPerBlock / std::max<int64_t>(chunk_rows * cols, 1));
  ParallelFor(chunks, min_chunks, [&](int64_t c0, int64_t c1) {
    for (int64_t ch = c0; ch < c1; ++ch) {
      const int64_t r0 = ch * chunk_rows;
      const int64_t r1 = std::min(rows, r0 + chunk_rows);
      if (relu) {
        MaskAndSumChunk<true>(g, y, r0, r1, cols, partial.data() + ch * cols);
      } else {
        MaskAndSumChunk<false>(g, y, r0, r1, cols, partial.data() + ch * cols);
      }
    }
  });
  *bias_grad = Tensor({cols});
  for (int64_t ch = 0; ch < chunks; ++ch) {
    for (int64_t c = 0; c < cols; ++c) (*bias_grad)[c] += partial[ch * cols + c];
  }
}

void AddBiasAndActivate(float* y, const float* bias, int64_t rows, int64_t cols, bool relu) {
  ParallelFor(rows, kMinElementsPerBlock / std::max<int64_t>(cols, 1) + 1, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      float* yr = y + r * cols;
      if (relu) {
        for (int64_t c = 0; c < cols; ++c) yr[c] = std::max(yr[c] + bias[c], 0.0f);
      } else {
        for (int64_t c = 0; c < cols; ++c) yr[c] += bias[c];
      }
    }
  });
}

}  // namespace internal

using internal::Gemm;
using internal::GradTarget;
using internal::kMinElementsPerBlock;

Var MatMul(const Var& a, const Var& b, bool transpose_a, bool transpose_b) {
  psflow::internal::PrepareThreadForKernels();
  const Tensor& av = a->value;
  const Tensor& bv = b->value;
  CHECK(av.rank() == 2 && bv.rank() == 2)
      << "MatMul needs rank-2 operands, got " << ShapeToString(av.shape()) << " and " << ShapeToString(bv.shape());
  const int64_t m = transpose_a ? av.dim(1) : av.dim(0);
  const int64_t k = transpose_a ? av.dim(0) : av.dim(1);
  const int64_t n = transpose_b ? bv.dim(0) : bv.dim(1);
  CHECK_EQ(k, transpose_b ? bv.dim(1) : bv.dim(0))
      << "MatMul inner dims: " << ShapeToString(av.shape()) << " x " << ShapeToString(bv.shape());
  Tensor out = Tensor::Uninitialized({m, n});
  Gemm(transpose_a, transpose_b, m, n, k, av.data(), bv.data(), out.data(), false);
  return MakeOpNode("MatMul", std::move(out), {a, b}, [=](Node& self) {
    Node& na = *self.inputs[0];
    Node& nb = *self.inputs[1];
    const float* dc = self.grad.data();
    bool acc;
    if (na.requires_grad) {
      float* da = GradTarget(na, &acc);
      if (!transpose_a) {
        Gemm(false, !transpose_b, m, k, n, dc, nb.value.data(), da, acc);  // dC op(B)^T
      } else {
        Gemm(transpose_b, true, k, m, n, nb.value.data(), dc, da, acc);  // op(B) dC^T
      }
    }
    if (nb.requires_grad) {
      float* db = GradTarget(nb, &acc);
      if (!transpose_b) {
        Gemm(!transpose_a, false, k, n, m, na.value.data(), dc, db, acc);  // op(A)^T dC
      } else {
        Gemm(true, transpose_a, n, k, m, dc, na.value.data(), db, acc);  // dC^T op(A)
      }
    }
  });
}

Var BiasAdd(const Var& x, const Var& bias) {
  psflow::internal::PrepareThreadForKernels();
  const Tensor& xv = x->value;
  const Tensor& bv = bias->value;
  CHECK(bv.rank() == 1 && xv.rank() >= 1 && xv.dim(xv.rank() - 1) == bv.dim(0))
      << "BiasAdd: bias " << ShapeToString(bv.shape()) << " for x " << ShapeToString(xv.shape());
  const int64_t cols = bv.dim(0);
  const int64_t rows = cols == 0 ? 0 : xv.size() / cols;
  Tensor out = Tensor::Uninitialized(xv.shape());
  {
    const float* xp = xv.data();
    const float* bp = bv.data();
    float* op = out.data();
    ParallelFor(rows, kMinElementsPerBlock / std::max<int64_t>(cols, 1) + 1, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        for (int64_t c = 0; c < cols; ++c) op[r * cols + c] = xp[r * cols + c] + bp[c];
      }
    });
  }
  return MakeOpNode("BiasAdd", std::move(out), {x, bias}, [rows, cols](Node& self) {
    Node& nx = *self.inputs[0];
    Node& nb = *self.inputs[1];
    if (nb.requires_grad) {
      Tensor db;
      internal::MaskAndSumColumns(self.grad.data(), nullptr, rows, cols, /*relu=*/false, &db);
      nb.AccumulateGrad(std::move(db));
    }
    if (nx.requires_grad) nx.AccumulateGrad(std::move(self.grad));  // d(x + b)/dx = 1
  });
}

Var FusedMatMul(const Var& x, const Var& w, const Var& bias, Activation activation) {
  psflow::internal::PrepareThreadForKernels();
  const Tensor& xv = x->value;
  const Tensor& wv = w->value;
  CHECK(xv.rank() == 2 && wv.rank() == 2 && xv.dim(1) == wv.dim(0))
      << "FusedMatMul: x " << ShapeToString(xv.shape()) << ", w " << ShapeToString(wv.shape());
  CHECK(bias->value.rank() == 1 && bias->value.dim(0) == wv.dim(1))
      << "FusedMatMul: bias " << ShapeToString(bias->value.shape()) << " for w " << ShapeToString(wv.shape());
  const int64_t m = xv.dim(0), k = xv.dim(1), n = wv.dim(1);
  const bool relu = activation == Activation::kRelu;
  // ReLU is applied with the bias in one sweep; the other activations in a second one, keeping
  // the pre-activation when their derivative needs it.
  const bool separate = activation != Activation::kNone && !relu;
  Tensor out = Tensor::Uninitialized({m, n});
  Gemm(false, false, m, n, k, xv.data(), wv.data(), out.data(), false);
  internal::AddBiasAndActivate(out.data(), bias->value.data(), m, n, relu);
  Tensor pre_activation;
  if (separate) {
    if (internal::ActivationNeedsInput(activation)) pre_activation = out;
    internal::ActivateInPlace(activation, out.data(), out.size());
  }
  return MakeOpNode("FusedMatMul", std::move(out), {x, w, bias},
                    [m, n, k, relu, separate, activation, pre_activation = std::move(pre_activation)](Node& self) {
                      Node& nx = *self.inputs[0];
                      Node& nw = *self.inputs[1];
                      Node& nb = *self.inputs[2];
                      if (separate) {
                        internal::ActivationGradInPlace(activation, self.grad.data(), self.value.data(),
                                                        pre_activation.data(), self.grad.size());
                      }
                      Tensor db;
                      internal::MaskAndSumColumns(self.grad.data(), self.value.data(), m, n, relu,
                                                  nb.requires_grad ? &db : nullptr);
                      if (nb.requires_grad) nb.AccumulateGrad(std::move(db));
                      const float* dz = self.grad.data();
                      bool acc;
                      if (nx.requires_grad) {
                        float* dx = GradTarget(nx, &acc);
                        Gemm(false, true, m, k, n, dz, nw.value.data(), dx, acc);  // dZ W^T
                      }
                      if (nw.requires_grad) {
                        float* dw = GradTarget(nw, &acc);
                        Gemm(true, false, k, n, m, nx.value.data(), dz, dw, acc);  // X^T dZ
                      }
                    });
}

Var Relu(const Var& x) {
  psflow::internal::PrepareThreadForKernels();
  const Tensor& xv = x->value;
  Tensor out = Tensor::Uninitialized(xv.shape());
  const float* xp = xv.data();
  float* op = out.data();
  ParallelFor(xv.size(), kMinElementsPerBlock, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) op[i] = std::max(xp[i], 0.0f);
  });
  return MakeOpNode("Relu", std::move(out), {x}, [](Node& self) {
    // Masks the incoming gradient in place and hands the buffer to the input.
    float* g = self.grad.data();
    const float* y = self.value.data();
    ParallelFor(self.grad.size(), kMinElementsPerBlock, [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i) g[i] = y[i] > 0.0f ? g[i] : 0.0f;
    });
    self.inputs[0]->AccumulateGrad(std::move(self.grad));
  });
}

Var SoftmaxCrossEntropy(const Var& logits, std::span<const int32_t> labels) {
  psflow::internal::PrepareThreadForKernels();
  const Tensor& lv = logits->value;
  CHECK(lv.rank() == 2) << "SoftmaxCrossEntropy logits must be [batch, classes], got " << ShapeToString(lv.shape());
  const int64_t batch = lv.dim(0);
  const int64_t classes = lv.dim(1);
  CHECK_EQ(static_cast<int64_t>(labels.size()), batch) << "SoftmaxCrossEntropy: labels for each row";
  std::vector<int32_t> label_copy(labels.begin(), labels.end());
  // probs holds softmax(logits), kept for the gradient softmax - onehot.
  Tensor probs = Tensor::Uninitialized(lv.shape());
  double total = 0.0;
  for (int64_t r = 0; r < batch; ++r) {
    const int32_t label = label_copy[r];
    CHECK(label >= 0 && label < classes) << "label " << label << " outside [0, " << classes << ")";
    const float* row = lv.data() + r * classes;
    float* p = probs.data() + r * classes;
    const float max = *std::max_element(row, row + classes);
    float sum = 0.0f;
    for (int64_t c = 0; c < classes; ++c) {
      p[c] = std::exp(row[c] - max);
      sum += p[c];
    }
    const float inv = 1.0f / sum;
    for (int64_t c = 0; c < classes; ++c) p[c] *= inv;
    // -log softmax[label] = log(sum) - (x_label - max), free of overflow and of log(0).
    total += std::log(static_cast<double>(sum)) - (static_cast<double>(row[label]) - max);
  }
  const float loss = batch == 0 ? 0.0f : static_cast<float>(total / batch);
  return MakeOpNode("SoftmaxCrossEntropy", Tensor::Scalar(loss), {logits},
                    [probs = std::move(probs), label_copy = std::move(label_copy), batch, classes](Node& self) {
                      const float scale = self.grad[0] / static_cast<float>(batch);
                      Tensor d = Tensor::Uninitialized(probs.shape());
                      for (int64_t r = 0; r < batch; ++r) {
                        const float* p = probs.data() + r * classes;
                        float* dr = d.data() + r * classes;
                        for (int64_t c = 0; c < classes; ++c) dr[c] = scale * p[c];
                        dr[label_copy[r]] -= scale;
                      }
                      self.inputs[0]->AccumulateGrad(std::move(d));
                    });
}

std::vector<int32_t> ArgMax(const Tensor& logits) {
  CHECK(logits.rank() == 2) << "ArgMax of " << ShapeToString(logits.shape());
  const int64_t classes = logits.dim(1);
  std::vector<int32_t> out(logits.dim(0));
  for (int64_t r = 0; r < logits.dim(0); ++r) {
    const float* row = logits.data() + r * classes;
    out[r] = static_cast<int32_t>(std::max_element(row, row + classes) - row);
  }
  return out;
}

double Accuracy(const Tensor& logits, std::span<const int32_t> labels) {
  const std::vector<int32_t> predicted = ArgMax(logits);
  CHECK_EQ(predicted.size(), labels.size());
  if (predicted.empty()) return 0.0;
  int64_t correct = 0;
  for (size_t i = 0; i < predicted.size(); ++i) correct += predicted[i] == labels[i];
  return static_cast<double>(correct) / static_cast<double>(predicted.size());
}

}  // namespace psflow::ops
