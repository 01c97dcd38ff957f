// src/core/op_test_harness.h — the one harness every op test of psflow_core goes through.
//
// An OpCase declares the op's input shapes, how to build it from Vars, and a naive reference in
// double precision written independently of the fast kernel. CheckOp then
//   1. compares the op's forward value with the reference on random inputs;
//   2. seeds loss = sum(output * W) for fixed random weights W, runs Backward, and compares the
//      gradient of every input that requires one with central finite differences of the same
//      loss computed on the reference in double (dense and row-sparse gradients are summed);
//   3. checks that inputs which do not require a gradient received none.
// Inputs are float-representable doubles, so the reference sees exactly the op's inputs and
// piecewise-linear ops (relu, max) pick the same branch in both.
#ifndef PSFLOW_SRC_CORE_OP_TEST_HARNESS_H_
#define PSFLOW_SRC_CORE_OP_TEST_HARNESS_H_

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <numeric>
#include <string>
#include <vector>

#include "psflow/core/autodiff.h"
#include "psflow/core/random.h"
#include "psflow/core/tensor.h"

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

}  // namespace harness_internal

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
    std::vector<int64_t> elements(inputs[i].size());
    std::iota(elements.begin(), elements.end(), 0);
    if (c.max_gradient_checks > 0 && inputs[i].size() > c.max_gradient_checks) {
      for (int64_t k = 0; k < c.max_gradient_checks; ++k) {  // partial Fisher-Yates
        std::swap(elements[k], elements[k + rng.UniformInt(elements.size() - k)]);
      }
      elements.resize(c.max_gradient_checks);
    }
    // The reference is double, so a small step is both accurate and safe near kinks.
    constexpr double kStep = 1e-6;
    int gradient_failures = 0;
    std::vector<DTensor> probe = inputs;
    for (int64_t j : elements) {
      const double x = inputs[i][j];
      probe[i][j] = x + kStep;
      const double up = WeightedSum(c.reference(probe), weights);
      probe[i][j] = x - kStep;
      const double down = WeightedSum(c.reference(probe), weights);
      probe[i][j] = x;
      const double numeric = (up - down) / (2 * kStep);
      if (!Near(analytic[j], numeric, c.gradient_tolerance) && gradient_failures++ < 5) {
        ADD_FAILURE() << "gradient element " << j << ": got " << analytic[j] << ", finite difference " << numeric;
      }
    }
    EXPECT_EQ(gradient_failures, 0) << "gradient elements off";
  }
}

}  // namespace psflow::testing

#endif  // PSFLOW_SRC_CORE_OP_TEST_HARNESS_H_
