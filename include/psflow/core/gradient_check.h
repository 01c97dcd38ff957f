// psflow/core/gradient_check.h — checks gradients against central finite differences: the test a
// custom op (MakeOpNode, docs/custom-models.md) needs before it trains anything. psflow's own op
// tests (src/core/op_test_harness.h) go through the same CompareWithFiniteDifferences.
//
// CheckGradients(op, inputs) builds op on trainable copies of `inputs`, seeds the output gradient
// with fixed random weights W (loss = Σ output · W), runs Backward, and compares each input's
// gradient (dense plus row-sparse) with (loss(x + h) - loss(x - h)) / 2h evaluated by running op
// again on perturbed inputs. Pure functions of their arguments; thread-safe.
#ifndef PSFLOW_CORE_GRADIENT_CHECK_H_
#define PSFLOW_CORE_GRADIENT_CHECK_H_

#include <cstdint>
#include <functional>
#include <vector>

#include "absl/status/status.h"
#include "psflow/core/autodiff.h"
#include "psflow/core/tensor.h"

namespace psflow {

struct GradientCheckOptions {
  // The central difference's step h. Float ops: 1e-2 balances rounding (which grows as 1/h) and
  // truncation (h^2); a double reference can take 1e-6.
  double step = 1e-2;
  // An element passes when |analytic - numeric| <= tolerance * (1 + |numeric|).
  double tolerance = 1e-2;
  // At most this many elements per input, chosen at random; 0 checks every element.
  int64_t max_elements = 0;
  // Seeds the output weights W and the choice of elements.
  uint64_t seed = 1;
  // Probes x ± h are rounded to float, the precision a float op sees, and the quotient divides by
  // the rounded difference. Off for references evaluated in double.
  bool round_to_float = true;
};

// The comparison itself. inputs[i] holds the values of input i (probed in place one element at a
// time and restored); analytic[i] is d loss / d inputs[i], or empty to skip input i; loss
// evaluates the scalar at the given inputs. Returns OK, or Internal naming the first elements
// whose gradients disagree and how many did.
absl::Status CompareWithFiniteDifferences(std::vector<std::vector<double>>& inputs,
                                          const std::vector<std::vector<double>>& analytic,
                                          const std::function<double(const std::vector<std::vector<double>>&)>& loss,
                                          const GradientCheckOptions& options);

// Checks the gradient op's backward gives every input against finite differences of op itself.
// op must be deterministic (the same inputs give the same output); an input that receives no
// gradient counts as a zero gradient. Returns OK, Internal when a gradient is off (naming the input
// and element), or InvalidArgument when op returns null.
absl::Status CheckGradients(const std::function<Var(const std::vector<Var>&)>& op, const std::vector<Tensor>& inputs,
                            const GradientCheckOptions& options = {});

}  // namespace psflow

#endif  // PSFLOW_CORE_GRADIENT_CHECK_H_
