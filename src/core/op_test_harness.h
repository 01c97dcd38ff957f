// src/core/op_test_harness.h — the one harness every op test of psflow_core goes through.
//
// An OpCase declares the op's input shapes, how to build it from Vars, and a naive reference in
// double precision written independently of the fast kernel. CheckOp then
//   1. compares the op's forward value with the reference on random inputs;
//   2. seeds loss = sum(output * W) for fixed random weights W, runs Backward, and compares the
//      gradient of every input that requires one with central finite differences of the same
//      loss computed on the reference in double (dense and row-sparse gradients are summed);
//   3. checks that inputs which do not require a gradient received none;
//   4. times the op when PSFLOW_OP_TIMING is set in the environment (ggml's `test-backend-ops
//      perf` mode): forward and backward at one intra-op thread, median of repeated runs, printed
//      as one "[op timing]" line per case (bench/ops_vs_torch.py reads them). Never asserted.
// Inputs are float-representable doubles, so the reference sees exactly the op's inputs and
// piecewise-linear ops (relu, max) pick the same branch in both. The finite differences are
// psflow's public CompareWithFiniteDifferences (psflow/core/gradient_check.h), evaluated on the
// double reference.
#ifndef PSFLOW_SRC_CORE_OP_TEST_HARNESS_H_
#define PSFLOW_SRC_CORE_OP_TEST_HARNESS_H_

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "psflow/core/autodiff.h"
#include "psflow/core/gradient_check.h"
#include "psflow/core/ops.h"
#include "psflow/core/random.h"
#include "psflow/core/tensor.h"
#include "psflow/core/threading.h"

namespace psflow::testing {

// A double-precision tensor for references: a shape and row-major values.
struct DTensor {
  Shape shape;
  std::vector<double> data;

  DTensor() = default;
  explicit DTensor(Shape s) : shape(std::move(s)), data(NumElements(shape), 0.0) {}
  int64_t size() const { return static_cast<int64_t>(data.size()); }
  double& operator[](int64_t i) { return data[i]; }
  double operator[](int64_t i) const { return data[i]; }
};

// The activations of ops::Activation in double, from their textbook formulas.
inline double RefActivate(ops::Activation activation, double x) {
  switch (activation) {
    case ops::Activation::kNone:
      return x;
    case ops::Activation::kRelu:
      return x > 0 ? x : 0.0;
    case ops::Activation::kTanh:
      return std::tanh(x);
    case ops::Activation::kSigmoid:
      return 1.0 / (1.0 + std::exp(-x));
    case ops::Activation::kGelu:
      return 0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
  }
  return x;
}

inline const char* ActivationSuffix(ops::Activation activation) {
  switch (activation) {
    case ops::Activation::kNone:
      return "_NoActivation";
    case ops::Activation::kRelu:
      return "_Relu";
    case ops::Activation::kTanh:
      return "_Tanh";
    case ops::Activation::kSigmoid:
      return "_Sigmoid";
    case ops::Activation::kGelu:
      return "_Gelu";
  }
  return "";
}

struct OpCase {
  std::string name;
  std::vector<Shape> input_shapes;
  // Per input: whether it is a trainable Var whose gradient is checked; empty means all are.
  // Inputs that are not get built as Constants and must receive no gradient.
  std::vector<bool> requires_grad;
  std::function<Var(const std::vector<Var>&)> build;
  std::function<DTensor(const std::vector<DTensor>&)> reference;
  // Optional: fills input `index` (default uniform in [-1, 1]).
  std::function<void(int index, DTensor& input, Rng& rng)> fill;
  // Forward passes when |got - want| <= forward_tolerance * (1 + |want|); gradients likewise.
  double forward_tolerance = 1e-4;
  double gradient_tolerance = 1e-3;
  // Finite differences of at most this many elements per input (chosen at random) keep big
  // cases fast; 0 means all elements.
  int64_t max_gradient_checks = 0;
};

// gtest prints a failing parameter with this rather than as raw bytes.
inline void PrintTo(const OpCase& c, std::ostream* os) { *os << c.name; }

namespace harness_internal {

inline Tensor ToFloat(const DTensor& d) {
  Tensor t(d.shape);
  for (int64_t i = 0; i < d.size(); ++i) t[i] = static_cast<float>(d[i]);
  return t;
}

inline double WeightedSum(const DTensor& out, const DTensor& weights) {
  double s = 0.0;
  for (int64_t i = 0; i < out.size(); ++i) s += out[i] * weights[i];
  return s;
}

// sum(x * weights) as a graph node, so Backward seeds the op's output gradient with weights.
inline Var WeightedSumVar(const Var& x, const Tensor& weights) {
  double s = 0.0;
  for (int64_t i = 0; i < x->value.size(); ++i) s += static_cast<double>(x->value[i]) * weights[i];
  return MakeOpNode("WeightedSum", Tensor::Scalar(static_cast<float>(s)), {x}, [weights](Node& self) {
    Tensor g = weights;
    for (int64_t i = 0; i < g.size(); ++i) g[i] *= self.grad[0];
    self.inputs[0]->AccumulateGrad(std::move(g));
  });
}

inline bool Near(double got, double want, double tolerance) {
  return std::isfinite(got) && std::abs(got - want) <= tolerance * (1.0 + std::abs(want));
}

inline double MedianMicros(std::vector<double> seconds) {
  std::sort(seconds.begin(), seconds.end());
  return seconds[seconds.size() / 2] * 1e6;
}

}  // namespace harness_internal

struct OpTiming {
  double forward_us = 0;   // building the op (its forward kernel and node)
  double backward_us = 0;  // its backward closure, from a given output gradient
};

// Times the op on `inputs` at one intra-op thread: the median over repetitions (at least 5, and
// at least 0.2 s of forward + backward). Each repetition builds the op, seeds its output gradient
// with `weights` and runs its backward closure alone (like bench/kernels_bench.cc's conv backward).
inline OpTiming TimeOp(const OpCase& c, const std::vector<Var>& vars, const Tensor& weights) {
  using Clock = std::chrono::steady_clock;
  const int threads = IntraOpThreads();
  SetIntraOpThreads(1);
  std::vector<double> forward, backward;
  double total = 0;
  while (forward.size() < 5 || total < 0.2) {
    ZeroGrad(vars);
    const auto t0 = Clock::now();
    Var out = c.build(vars);
    const auto t1 = Clock::now();
    out->grad = weights;
    const auto t2 = Clock::now();
    if (out->backward) out->backward(*out);
    const auto t3 = Clock::now();
    forward.push_back(std::chrono::duration<double>(t1 - t0).count());
    backward.push_back(std::chrono::duration<double>(t3 - t2).count());
    total += forward.back() + backward.back();
  }
  SetIntraOpThreads(threads);
  ZeroGrad(vars);
  return {harness_internal::MedianMicros(forward), harness_internal::MedianMicros(backward)};
}

inline void CheckOp(const OpCase& c, uint64_t seed = 1) {
  using namespace harness_internal;
  SCOPED_TRACE("op case " + c.name);
  Rng rng(seed);
  const int num_inputs = static_cast<int>(c.input_shapes.size());
  std::vector<DTensor> inputs;
  std::vector<Var> vars;
  for (int i = 0; i < num_inputs; ++i) {
    DTensor in(c.input_shapes[i]);
    if (c.fill) {
      c.fill(i, in, rng);
    } else {
      for (double& v : in.data) v = 2.0 * rng.Uniform() - 1.0;
    }
    for (double& v : in.data) v = static_cast<float>(v);  // exactly what the op sees
    const bool trainable = c.requires_grad.empty() || c.requires_grad[i];
    vars.push_back(trainable ? MakeParameter("input" + std::to_string(i), ToFloat(in)) : Constant(ToFloat(in)));
    inputs.push_back(std::move(in));
  }

  // 1. Forward against the reference.
  Var out = c.build(vars);
  const DTensor want = c.reference(inputs);
  ASSERT_EQ(ShapeToString(out->value.shape()), ShapeToString(want.shape)) << "output shape";
  int forward_failures = 0;
  for (int64_t i = 0; i < want.size(); ++i) {
    if (!Near(out->value[i], want[i], c.forward_tolerance) && forward_failures++ < 5) {
      ADD_FAILURE() << "forward element " << i << ": got " << out->value[i] << ", want " << want[i];
    }
  }
  EXPECT_EQ(forward_failures, 0) << "forward elements off";

  // 2. Gradients against central differences of the reference.
  DTensor weights(want.shape);
  for (double& w : weights.data) w = static_cast<float>(2.0 * rng.Uniform() - 1.0);
  Backward(WeightedSumVar(out, ToFloat(weights)));
  std::vector<std::vector<double>> analytic_all(static_cast<size_t>(num_inputs));  // empty: not checked
  for (int i = 0; i < num_inputs; ++i) {
    SCOPED_TRACE("input " + std::to_string(i));
    Node& node = *vars[i];
    if (!node.requires_grad) {
      EXPECT_TRUE(node.grad.empty()) << "gradient computed for an input that does not need one";
      EXPECT_FALSE(node.sparse_grad.has_value());
      continue;
    }
    std::vector<double> analytic(inputs[i].size(), 0.0);
    if (!node.grad.empty()) {
      ASSERT_EQ(node.grad.size(), inputs[i].size());
      for (int64_t j = 0; j < node.grad.size(); ++j) analytic[j] += node.grad[j];
    }
    if (node.sparse_grad.has_value()) {
      const int64_t row = inputs[i].size() / std::max<int64_t>(inputs[i].shape[0], 1);
      const RowSparse& sparse = *node.sparse_grad;
      for (size_t r = 0; r < sparse.rows.size(); ++r) {
        for (int64_t k = 0; k < row; ++k) analytic[sparse.rows[r] * row + k] += sparse.values[r * row + k];
      }
    }
    analytic_all[i] = std::move(analytic);
  }
  // The reference is double, so a small step is both accurate and safe near kinks.
  GradientCheckOptions options;
  options.step = 1e-6;
  options.tolerance = c.gradient_tolerance;
  options.max_elements = c.max_gradient_checks;
  options.seed = seed;
  options.round_to_float = false;
  std::vector<std::vector<double>> points;
  for (const DTensor& in : inputs) points.push_back(in.data);
  const absl::Status status = CompareWithFiniteDifferences(
      points, analytic_all,
      [&](const std::vector<std::vector<double>>& at) {
        std::vector<DTensor> probe = inputs;
        for (size_t k = 0; k < at.size(); ++k) probe[k].data = at[k];
        return WeightedSum(c.reference(probe), weights);
      },
      options);
  EXPECT_TRUE(status.ok()) << status.message();

  // 4. Timing, on request.
  if (std::getenv("PSFLOW_OP_TIMING") != nullptr) {
    const OpTiming t = TimeOp(c, vars, ToFloat(weights));
    std::string shapes;
    for (const Shape& shape : c.input_shapes) {
      if (!shapes.empty()) shapes += ';';
      shapes += ShapeToString(shape);
    }
    std::printf("[op timing] %s inputs=%s forward_us=%.2f backward_us=%.2f\n", c.name.c_str(), shapes.c_str(),
                t.forward_us, t.backward_us);
  }
}

}  // namespace psflow::testing

#endif  // PSFLOW_SRC_CORE_OP_TEST_HARNESS_H_
