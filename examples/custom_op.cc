// custom_op — an op of one's own on psflow::MakeOpNode, checked by finite differences.
//
// Swish(x) = x * sigmoid(beta * x) with a trainable scalar beta (Ramachandran et al. 2017), an
// activation psflow does not ship. The forward computes the value; the backward closure receives
// the node itself, reads its output gradient (self.grad) and accumulates d loss / d input into each
// input that needs one. psflow::CheckGradients (psflow/core/gradient_check.h) then compares those
// gradients with central differences of the op, which is how every op should be tested before it
// trains anything (docs/custom-models.md, "An op of your own"). Exits 0 when both checks pass.
//
//   build/examples/custom_op
#include <cmath>
#include <cstdio>
#include <vector>

#include "psflow/core/autodiff.h"
#include "psflow/core/gradient_check.h"
#include "psflow/core/ops.h"
#include "psflow/core/random.h"

namespace {

using psflow::Node;
using psflow::Tensor;
using psflow::Var;

// x [any shape], beta [] (a scalar) -> x * sigmoid(beta x), same shape as x.
Var Swish(const Var& x, const Var& beta) {
  const Tensor& xv = x->value;
  const float b = beta->value[0];
  // The forward pass: the output value only. Whatever the backward needs later (here sigmoid(b x))
  // is either recomputed or captured by value in the closure; never keep references to locals.
  Tensor y = Tensor::Uninitialized(xv.shape());
  Tensor sig = Tensor::Uninitialized(xv.shape());
  for (int64_t i = 0; i < xv.size(); ++i) {
    sig[i] = 1.0f / (1.0f + std::exp(-b * xv[i]));
    y[i] = xv[i] * sig[i];
  }
  // MakeOpNode takes the value, the inputs (kept alive by the node) and the backward closure. The
  // closure runs once, during Backward, only if some input requires a gradient and only when the
  // node received one; it must not assume that every input requires one.
  return psflow::MakeOpNode("Swish", std::move(y), {x, beta}, [sig = std::move(sig)](Node& self) {
    Node& nx = *self.inputs[0];
    Node& nbeta = *self.inputs[1];
    const Tensor& g = self.grad;  // d loss / d y, y's shape
    const float b = nbeta.value[0];
    if (nbeta.requires_grad) {
      // dy/dbeta = x^2 s (1 - s), summed over every element into the scalar.
      double sum = 0.0;
      for (int64_t i = 0; i < g.size(); ++i) {
        const double xi = nx.value[i];
        sum += g[i] * xi * xi * sig[i] * (1.0 - sig[i]);
      }
      nbeta.AccumulateGrad(Tensor::Scalar(static_cast<float>(sum)));
    }
    if (nx.requires_grad) {
      // dy/dx = s + b x s (1 - s), element-wise.
      Tensor dx = Tensor::Uninitialized(g.shape());
      for (int64_t i = 0; i < g.size(); ++i) {
        dx[i] = g[i] * (sig[i] + b * nx.value[i] * sig[i] * (1.0f - sig[i]));
      }
      nx.AccumulateGrad(std::move(dx));  // moves the buffer in when x has no gradient yet
    }
  });
}

}  // namespace

int main() {
  psflow::Rng rng(7);
  Tensor x({4, 5});
  for (int64_t i = 0; i < x.size(); ++i) x[i] = 4.0f * rng.Uniform() - 2.0f;
  const Tensor beta = Tensor::Scalar(1.5f);

  // 1. The op alone: gradients of x and beta against finite differences.
  absl::Status alone =
      psflow::CheckGradients([](const std::vector<Var>& in) { return Swish(in[0], in[1]); }, {x, beta});
  std::printf("Swish alone: %s\n", alone.ok() ? "gradients match finite differences" : alone.ToString().c_str());

  // 2. Inside a small graph with psflow's ops, as a layer would use it: a loss of
  //    MeanSquaredError(RowDot(Swish(x W), x W), targets).
  Tensor w({5, 5});
  for (int64_t i = 0; i < w.size(); ++i) w[i] = rng.Uniform() - 0.5f;
  const std::vector<float> targets = {0.5f, -1.0f, 0.25f, 2.0f};
  absl::Status in_graph = psflow::CheckGradients(
      [&targets](const std::vector<Var>& in) {
        Var h = psflow::ops::MatMul(in[0], in[1]);
        return psflow::ops::MeanSquaredError(psflow::ops::RowDot(Swish(h, in[2]), h), targets);
      },
      {x, w, beta});
  std::printf("Swish in a graph: %s\n",
              in_graph.ok() ? "gradients match finite differences" : in_graph.ToString().c_str());
  return alone.ok() && in_graph.ok() ? 0 : 1;
}
