// Finite-difference gradient checks (psflow/core/gradient_check.h).
#include "psflow/core/gradient_check.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>

#include "absl/strings/str_cat.h"
#include "psflow/core/random.h"

namespace psflow {
namespace {

bool Near(double got, double want, double tolerance) {
  return std::isfinite(got) && std::abs(got - want) <= tolerance * (1.0 + std::abs(want));
}

double Probe(double x, const GradientCheckOptions& options) {
  return options.round_to_float ? static_cast<double>(static_cast<float>(x)) : x;
}

}  // namespace

absl::Status CompareWithFiniteDifferences(std::vector<std::vector<double>>& inputs,
                                          const std::vector<std::vector<double>>& analytic,
                                          const std::function<double(const std::vector<std::vector<double>>&)>& loss,
                                          const GradientCheckOptions& options) {
  if (analytic.size() != inputs.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("gradient check: ", analytic.size(), " analytic gradients for ", inputs.size(), " inputs"));
  }
  if (!(options.step > 0.0)) {
    return absl::InvalidArgumentError(absl::StrCat("gradient check: step ", options.step, " must be > 0"));
  }
  Rng rng(options.seed);
  std::string first_failures;
  int64_t failures = 0, checked = 0;
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (analytic[i].empty()) continue;
    std::vector<double>& x = inputs[i];
    if (analytic[i].size() != x.size()) {
      return absl::InvalidArgumentError(absl::StrCat("gradient check: input ", i, " has ", x.size(),
                                                     " elements but its gradient ", analytic[i].size()));
    }
    std::vector<size_t> elements(x.size());
    std::iota(elements.begin(), elements.end(), size_t{0});
    const size_t limit = static_cast<size_t>(options.max_elements);
    if (options.max_elements > 0 && x.size() > limit) {
      for (size_t k = 0; k < limit; ++k) {  // partial Fisher-Yates
        std::swap(elements[k], elements[k + rng.UniformInt(elements.size() - k)]);
      }
      elements.resize(limit);
    }
    for (size_t j : elements) {
      const double original = x[j];
      const double up_x = Probe(original + options.step, options);
      const double down_x = Probe(original - options.step, options);
      x[j] = up_x;
      const double up = loss(inputs);
      x[j] = down_x;
      const double down = loss(inputs);
      x[j] = original;
      const double numeric = (up - down) / (up_x - down_x);
      ++checked;
      if (!Near(analytic[i][j], numeric, options.tolerance)) {
        if (failures < 3) {
          absl::StrAppend(&first_failures, failures == 0 ? "" : "; ", "input ", i, " element ", j, ": backward gives ",
                          analytic[i][j], ", finite differences ", numeric);
        }
        ++failures;
      }
    }
  }
  if (failures == 0) return absl::OkStatus();
  return absl::InternalError(absl::StrCat("gradient check: ", failures, " of ", checked,
                                          " elements off by more than tolerance ", options.tolerance, " (",
                                          first_failures, ")"));
}

absl::Status CheckGradients(const std::function<Var(const std::vector<Var>&)>& op, const std::vector<Tensor>& inputs,
                            const GradientCheckOptions& options) {
  std::vector<Var> params;
  for (size_t i = 0; i < inputs.size(); ++i) params.push_back(MakeParameter("input" + std::to_string(i), inputs[i]));
  Var out = op(params);
  if (out == nullptr) return absl::InvalidArgumentError("gradient check: the op returned a null Var");
  // Fixed random output weights: loss = Σ out · W, so Backward seeds the op's output with W.
  Rng rng(options.seed ^ 0x9e3779b97f4a7c15ULL);
  Tensor weights(out->value.shape());
  for (int64_t k = 0; k < weights.size(); ++k) weights[k] = 2.0f * rng.Uniform() - 1.0f;
  double value = 0.0;
  for (int64_t k = 0; k < weights.size(); ++k) value += static_cast<double>(out->value[k]) * weights[k];
  Var loss = MakeOpNode("WeightedSum", Tensor::Scalar(static_cast<float>(value)), {out}, [weights](Node& self) {
    Tensor g = weights;
    for (int64_t k = 0; k < g.size(); ++k) g[k] *= self.grad[0];
    self.inputs[0]->AccumulateGrad(std::move(g));
  });
  Backward(loss);

  std::vector<std::vector<double>> analytic(inputs.size()), points(inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    const Node& node = *params[i];
    const int64_t n = inputs[i].size();
    analytic[i].assign(static_cast<size_t>(n), 0.0);
    points[i].assign(inputs[i].data(), inputs[i].data() + n);
    if (!node.grad.empty()) {
      for (int64_t k = 0; k < n; ++k) analytic[i][static_cast<size_t>(k)] += node.grad[k];
    }
    if (node.sparse_grad.has_value()) {
      const int64_t row = n / std::max<int64_t>(inputs[i].dim(0), 1);
      const RowSparse& sparse = *node.sparse_grad;
      for (size_t r = 0; r < sparse.rows.size(); ++r) {
        for (int64_t k = 0; k < row; ++k) {
          const int64_t from = static_cast<int64_t>(r) * row + k;
          analytic[i][static_cast<size_t>(sparse.rows[r] * row + k)] += sparse.values[from];
        }
      }
    }
  }
  auto evaluate = [&](const std::vector<std::vector<double>>& at) {
    std::vector<Var> constants;
    for (size_t i = 0; i < at.size(); ++i) {
      Tensor t = Tensor::Uninitialized(inputs[i].shape());
      for (int64_t k = 0; k < t.size(); ++k) t[k] = static_cast<float>(at[i][static_cast<size_t>(k)]);
      constants.push_back(Constant(std::move(t)));
    }
    Var y = op(constants);
    double sum = 0.0;
    for (int64_t k = 0; k < y->value.size(); ++k) sum += static_cast<double>(y->value[k]) * weights[k];
    return sum;
  };
  return CompareWithFiniteDifferences(points, analytic, evaluate, options);
}

}  // namespace psflow
