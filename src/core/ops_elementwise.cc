// Element-wise ops: the activations (Activate, Tanh, Sigmoid, Gelu and the kernels the fused ops
// share), Add / Subtract / Multiply with an optional row-vector broadcast, and RowDot.
//
// The transcendental kernels are Eigen array expressions: Eigen evaluates tanh, the logistic and
// exp with vectorized polynomial approximations (a few ulp from the exact value), several times
// faster than libm's scalar tanhf/expf. Work is split over the intra-op threads with ParallelFor
// in blocks that depend only on the size and the thread count; column sums (the gradient of a
// broadcast operand) go through MaskAndSumColumns' fixed row chunks, so results do not depend on
// the thread count.
#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <vector>

#include "core/check.h"
#include "core/ops_internal.h"
#include "core/threading_internal.h"
#include "psflow/core/ops.h"
#include "psflow/core/threading.h"

namespace psflow::ops {
namespace {

using ArrayMap = Eigen::Map<Eigen::ArrayXf>;
using ConstArrayMap = Eigen::Map<const Eigen::ArrayXf>;
using RowMajorMatrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kGeluCubic = 0.044715f;

// Runs fn(begin, end) over [0, n) on the intra-op threads.
template <typename Fn>
void ForBlocks(int64_t n, Fn&& fn) {
  ParallelFor(n, internal::kMinElementsPerBlock, [&](int64_t i0, int64_t i1) { fn(i0, i1); });
}

const char* ActivationName(Activation activation) {
  switch (activation) {
    case Activation::kNone:
      return "Identity";
    case Activation::kRelu:
      return "Relu";
    case Activation::kTanh:
      return "Tanh";
    case Activation::kSigmoid:
      return "Sigmoid";
    case Activation::kGelu:
      return "Gelu";
  }
  return "Activation";
}

}  // namespace

namespace internal {

void ActivateInPlace(Activation activation, float* x, int64_t n) {
  ForBlocks(n, [&](int64_t i0, int64_t i1) {
    ArrayMap v(x + i0, i1 - i0);
    switch (activation) {
      case Activation::kNone:
        break;
      case Activation::kRelu:
        v = v.max(0.0f);
        break;
      case Activation::kTanh:
        v = v.tanh();
        break;
      case Activation::kSigmoid:
        v = v.logistic();
        break;
      case Activation::kGelu:
        v = 0.5f * v * (1.0f + (kGeluScale * (v + kGeluCubic * v.cube())).tanh());
        break;
    }
  });
}

void ActivationGradInPlace(Activation activation, float* g, const float* y, const float* z, int64_t n) {
  if (activation == Activation::kNone) return;
  CHECK(ActivationNeedsInput(activation) ? z != nullptr : y != nullptr) << "ActivationGradInPlace: missing operand";
  ForBlocks(n, [&](int64_t i0, int64_t i1) {
    ArrayMap gv(g + i0, i1 - i0);
    switch (activation) {
      case Activation::kNone:
        break;
      case Activation::kRelu:
        for (int64_t i = i0; i < i1; ++i) g[i] = y[i] > 0.0f ? g[i] : 0.0f;
        break;
      case Activation::kTanh: {
        ConstArrayMap yv(y + i0, i1 - i0);
        gv *= 1.0f - yv.square();
        break;
      }
      case Activation::kSigmoid: {
        ConstArrayMap yv(y + i0, i1 - i0);
        gv *= yv * (1.0f - yv);
        break;
      }
      case Activation::kGelu: {
        // d/dz 0.5 z (1 + t), t = tanh(u), u = s (z + c z^3):
        //   0.5 (1 + t) + 0.5 z (1 - t^2) s (1 + 3 c z^2).
        ConstArrayMap zv(z + i0, i1 - i0);
        const Eigen::ArrayXf t = (kGeluScale * (zv + kGeluCubic * zv.cube())).tanh();
        gv *=
            0.5f * (1.0f + t) + 0.5f * zv * (1.0f - t.square()) * kGeluScale * (1.0f + 3.0f * kGeluCubic * zv.square());
        break;
      }
    }
  });
}

}  // namespace internal

Var Activate(const Var& x, Activation activation) {
  if (activation == Activation::kRelu) return Relu(x);
  psflow::internal::PrepareThreadForKernels();
  Tensor out = x->value;
  internal::ActivateInPlace(activation, out.data(), out.size());
  return MakeOpNode(ActivationName(activation), std::move(out), {x}, [activation](Node& self) {
    const float* z = internal::ActivationNeedsInput(activation) ? self.inputs[0]->value.data() : nullptr;
    internal::ActivationGradInPlace(activation, self.grad.data(), self.value.data(), z, self.grad.size());
    self.inputs[0]->AccumulateGrad(std::move(self.grad));
  });
}

Var Tanh(const Var& x) { return Activate(x, Activation::kTanh); }
Var Sigmoid(const Var& x) { return Activate(x, Activation::kSigmoid); }
Var Gelu(const Var& x) { return Activate(x, Activation::kGelu); }

namespace {

enum class BinaryOp { kAdd, kSubtract, kMultiply };

// Column sums of g [rows, cols] (fixed row chunks: independent of the thread count).
Tensor SumRows(float* g, int64_t rows, int64_t cols) {
  Tensor sums;
  internal::MaskAndSumColumns(g, nullptr, rows, cols, /*relu=*/false, &sums);
  return sums;
}

Var Binary(BinaryOp op, const char* name, const Var& a, const Var& b) {
  psflow::internal::PrepareThreadForKernels();
  const Tensor& av = a->value;
  const Tensor& bv = b->value;
  const bool same_shape = av.shape() == bv.shape();
  const int64_t cols = av.rank() == 0 ? 1 : av.dim(av.rank() - 1);
  CHECK(same_shape || (av.rank() >= 1 && bv.size() == cols && bv.rank() <= av.rank() &&
                       (bv.rank() == 0 || bv.dim(bv.rank() - 1) == cols)))
      << name << ": b " << ShapeToString(bv.shape()) << " must have a's shape " << ShapeToString(av.shape())
      << " or be a row vector of its last dim";
  // Broadcast: b repeats every `cols` elements of a; otherwise it is aligned with a.
  const int64_t period = same_shape ? av.size() : cols;
  const int64_t rows = period == 0 ? 0 : av.size() / period;
  Tensor out = Tensor::Uninitialized(av.shape());
  {
    const float* ap = av.data();
    const float* bp = bv.data();
    float* op_out = out.data();
    ForBlocks(av.size(), [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1;) {
        const int64_t row_end = std::min(i1, (i / period + 1) * period);
        const int64_t n = row_end - i;
        ConstArrayMap x(ap + i, n), y(bp + i % period, n);
        ArrayMap o(op_out + i, n);
        switch (op) {
          case BinaryOp::kAdd:
            o = x + y;
            break;
          case BinaryOp::kSubtract:
            o = x - y;
            break;
          case BinaryOp::kMultiply:
            o = x * y;
            break;
        }
        i = row_end;
      }
    });
  }
  return MakeOpNode(name, std::move(out), {a, b}, [op, rows, period, same_shape](Node& self) {
    Node& na = *self.inputs[0];
    Node& nb = *self.inputs[1];
    const int64_t n = self.grad.size();
    // b's gradient first: it only reads self.grad, which a's may take over.
    if (nb.requires_grad) {
      Tensor db;
      if (op == BinaryOp::kMultiply) {
        db = Tensor::Uninitialized(self.grad.shape());
        const float* g = self.grad.data();
        const float* ap = na.value.data();
        float* d = db.data();
        ForBlocks(n, [&](int64_t i0, int64_t i1) {
          ArrayMap(d + i0, i1 - i0) = ConstArrayMap(g + i0, i1 - i0) * ConstArrayMap(ap + i0, i1 - i0);
        });
        if (!same_shape) db = SumRows(db.data(), rows, period);
      } else {
        db = same_shape ? self.grad : SumRows(self.grad.data(), rows, period);
        if (op == BinaryOp::kSubtract) ArrayMap(db.data(), db.size()) = -ArrayMap(db.data(), db.size());
      }
      nb.AccumulateGrad(std::move(db));
    }
    if (na.requires_grad) {
      if (op == BinaryOp::kMultiply) {
        float* g = self.grad.data();
        const float* bp = nb.value.data();
        ForBlocks(n, [&](int64_t i0, int64_t i1) {
          for (int64_t i = i0; i < i1;) {
            const int64_t row_end = std::min(i1, (i / period + 1) * period);
            ArrayMap(g + i, row_end - i) *= ConstArrayMap(bp + i % period, row_end - i);
            i = row_end;
          }
        });
      }
      na.AccumulateGrad(std::move(self.grad));
    }
  });
}

}  // namespace

Var Add(const Var& a, const Var& b) { return Binary(BinaryOp::kAdd, "Add", a, b); }
Var Subtract(const Var& a, const Var& b) { return Binary(BinaryOp::kSubtract, "Subtract", a, b); }
Var Multiply(const Var& a, const Var& b) { return Binary(BinaryOp::kMultiply, "Multiply", a, b); }

Var RowDot(const Var& a, const Var& b) {
  psflow::internal::PrepareThreadForKernels();
  const Tensor& av = a->value;
  const Tensor& bv = b->value;
  CHECK(av.rank() == 2 && av.shape() == bv.shape())
      << "RowDot needs two [n, d] operands of one shape, got " << ShapeToString(av.shape()) << " and "
      << ShapeToString(bv.shape());
  const int64_t rows = av.dim(0), cols = av.dim(1);
  Tensor out = Tensor::Uninitialized({rows, 1});
  ParallelFor(rows, internal::kMinElementsPerBlock / std::max<int64_t>(cols, 1) + 1, [&](int64_t r0, int64_t r1) {
    Eigen::Map<const RowMajorMatrix> x(av.data() + r0 * cols, r1 - r0, cols), y(bv.data() + r0 * cols, r1 - r0, cols);
    Eigen::Map<Eigen::VectorXf>(out.data() + r0, r1 - r0) = x.cwiseProduct(y).rowwise().sum();
  });
  return MakeOpNode("RowDot", std::move(out), {a, b}, [rows, cols](Node& self) {
    const float* g = self.grad.data();
    // d/da[r, :] = g[r] b[r, :] and d/db[r, :] = g[r] a[r, :].
    for (int side = 0; side < 2; ++side) {
      Node& target = *self.inputs[side];
      if (!target.requires_grad) continue;
      const float* other = self.inputs[1 - side]->value.data();
      Tensor d = Tensor::Uninitialized({rows, cols});
      ParallelFor(rows, internal::kMinElementsPerBlock / std::max<int64_t>(cols, 1) + 1, [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) {
          ArrayMap(d.data() + r * cols, cols) = g[r] * ConstArrayMap(other + r * cols, cols);
        }
      });
      target.AccumulateGrad(std::move(d));
    }
  });
}

}  // namespace psflow::ops
