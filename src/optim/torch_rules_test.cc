// Checks the torch convention, weight decay, nesterov and parameter groups against references
// written here in double precision in the form torch.optim's documentation gives them (e.g. Adam
// with bias-corrected m̂ and v̂ and ε added to √v̂), independent of the float kernels.
// python/tests/test_optim.py checks the same rules on the ps against torch.optim itself.
#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "psflow/optim/optimizer.h"

namespace psflow::optim {
namespace {

using ::testing::HasSubstr;

OptimizerConfig Torch(const std::string& name, float lr) {
  OptimizerConfig c;
  c.name = name;
  c.convention = "torch";
  c.learning_rate = lr;
  return c;
}

double Grad(int64_t i, int s) { return std::sin(0.37 * static_cast<double>(i) + 1.3 * s) * 0.8; }
double Init(int64_t i) { return std::cos(0.11 * static_cast<double>(i)) * 2.0; }

// A reference: state of one element, stepped by (w, g, t) -> new w.
using Reference = std::function<double(double w, double g, int t)>;

// Runs `steps` dense updates on n elements and compares every element with the reference (made
// fresh per element by `make`). n above 4096 crosses a chunk of the weight-decay scratch buffer.
void Check(const OptimizerConfig& config, int steps, const std::function<Reference()>& make, int64_t n = 37) {
  absl::StatusOr<std::unique_ptr<Optimizer>> made = MakeOptimizer(config);
  ASSERT_TRUE(made.ok()) << made.status();
  const Optimizer& opt = **made;
  SlotState state = opt.NewState(n);
  std::vector<float> w(n);
  for (int64_t i = 0; i < n; ++i) w[i] = static_cast<float>(Init(i));
  for (int s = 1; s <= steps; ++s) {
    std::vector<float> g(n);
    for (int64_t i = 0; i < n; ++i) g[i] = static_cast<float>(Grad(i, s));
    opt.ApplyDense(w.data(), g.data(), n, state, config.learning_rate);
  }
  for (int64_t i = 0; i < n; ++i) {
    Reference ref = make();
    double expected = static_cast<float>(Init(i));
    for (int s = 1; s <= steps; ++s) expected = ref(expected, static_cast<float>(Grad(i, s)), s);
    ASSERT_NEAR(w[i], expected, 2e-6 * std::max(1.0, std::abs(expected))) << config.name << " element " << i;
  }
}

TEST(TorchAdamTest, BiasCorrectedWithEpsilonOutsideTheCorrection) {
  OptimizerConfig c = Torch("adam", 0.05f);
  c.beta1 = 0.8f;
  c.beta2 = 0.95f;
  c.adam_epsilon = 0.05f;  // large, so that TF's placement of ε would fail the comparison
  Check(c, 12, [&] {
    return [&, m = 0.0, v = 0.0](double w, double g, int t) mutable {
      m = 0.8 * m + 0.2 * g;
      v = 0.95 * v + 0.05 * g * g;
      const double m_hat = m / (1 - std::pow(0.8, t)), v_hat = v / (1 - std::pow(0.95, t));
      return w - 0.05 * m_hat / (std::sqrt(v_hat) + 0.05);
    };
  });
}

TEST(TorchAdamTest, DiffersFromTensorFlowConventionOnlyThroughEpsilon) {
  // With a large ε the two conventions give different weights; with ε → 0 the same.
  for (float eps : {0.1f, 1e-12f}) {
    OptimizerConfig torch = Torch("adam", 0.1f), tf = torch;
    tf.convention = "tensorflow";
    torch.adam_epsilon = tf.adam_epsilon = eps;
    std::vector<float> w1 = {1.0f, -2.0f}, w2 = w1, g = {0.3f, -0.01f};
    auto a = MakeOptimizer(torch), b = MakeOptimizer(tf);
    SlotState sa = (*a)->NewState(2), sb = (*b)->NewState(2);
    for (int s = 0; s < 3; ++s) {
      (*a)->ApplyDense(w1.data(), g.data(), 2, sa, 0.1f);
      (*b)->ApplyDense(w2.data(), g.data(), 2, sb, 0.1f);
    }
    if (eps > 1e-6f) {
      EXPECT_GT(std::abs(w1[1] - w2[1]), 1e-3) << "eps " << eps;
    } else {
      EXPECT_NEAR(w1[1], w2[1], 1e-6) << "eps " << eps;
    }
  }
}

TEST(WeightDecayTest, AdamL2AddsDecayToTheGradient) {
  OptimizerConfig c = Torch("adam", 0.01f);
  c.weight_decay = 0.1f;
  Check(c, 8, [&] {
    return [m = 0.0, v = 0.0](double w, double g, int t) mutable {
      g += 0.1 * w;
      m = 0.9 * m + 0.1 * g;
      v = 0.999 * v + 0.001 * g * g;
      return w - 0.01 * (m / (1 - std::pow(0.9, t))) / (std::sqrt(v / (1 - std::pow(0.999, t))) + 1e-8);
    };
  });
}

TEST(WeightDecayTest, AdamWDecaysTheWeightBeforeTheStep) {
  OptimizerConfig c = Torch("adamw", 0.01f);
  c.weight_decay = 0.5f;
  Check(c, 8, [&] {
    return [m = 0.0, v = 0.0](double w, double g, int t) mutable {
      w *= 1 - 0.01 * 0.5;
      m = 0.9 * m + 0.1 * g;
      v = 0.999 * v + 0.001 * g * g;
      return w - 0.01 * (m / (1 - std::pow(0.9, t))) / (std::sqrt(v / (1 - std::pow(0.999, t))) + 1e-8);
    };
  });
}

TEST(WeightDecayTest, SgdL2AcrossScratchChunks) {
  OptimizerConfig c = Torch("sgd", 0.1f);
  c.weight_decay = 0.01f;
  Check(
      c, 5, [] { return [](double w, double g, int) { return w - 0.1 * (g + 0.01 * w); }; }, /*n=*/9000);
}

TEST(NesterovTest, MatchesTorchFormula) {
  OptimizerConfig c = Torch("momentum", 0.1f);
  c.momentum = 0.8f;
  c.nesterov = true;
  c.weight_decay = 0.02f;
  Check(c, 10, [] {
    return [buf = 0.0, first = true](double w, double g, int) mutable {
      g += 0.02 * w;
      buf = first ? g : 0.8 * buf + g;  // torch: the buffer starts as a clone of the gradient
      first = false;
      return w - 0.1 * (g + 0.8 * buf);
    };
  });
}

TEST(TorchAdagradTest, EpsilonOutsideTheRootAndZeroStart) {
  OptimizerConfig c = Torch("adagrad", 0.2f);
  c.initial_accumulator = 0.0f;
  c.adagrad_epsilon = 1e-3f;
  Check(c, 10, [] {
    return [acc = 0.0](double w, double g, int) mutable {
      acc += g * g;
      return w - 0.2 * g / (std::sqrt(acc) + 1e-3);
    };
  });
}

TEST(TorchRmsPropTest, WithAndWithoutMomentum) {
  for (float mu : {0.0f, 0.7f}) {
    OptimizerConfig c = Torch("rmsprop", 0.01f);
    c.rms_decay = 0.99f;
    c.rms_momentum = mu;
    c.rms_epsilon = 1e-4f;
    Check(c, 10, [mu] {
      return [mu, sq = 0.0, buf = 0.0](double w, double g, int) mutable {
        sq = 0.99 * sq + 0.01 * g * g;
        const double avg = std::sqrt(sq) + 1e-4;
        if (mu == 0.0f) return w - 0.01 * g / avg;
        buf = mu * buf + g / avg;
        return w - 0.01 * buf;
      };
    });
  }
}

TEST(ParameterGroupTest, ConfigForVariableTakesItsGroupsSettings) {
  OptimizerConfig c = Torch("adamw", 0.1f);
  c.weight_decay = 0.01f;
  c.schedule = "piecewise";
  c.boundaries = {10};
  c.values = {0.1f, 0.05f};
  ParameterGroup absolute{{"fc.bias", "emb"}, 0.02f, 1.0f, 0.0f};
  ParameterGroup scaled{{"head.weight"}, std::nullopt, 0.5f, std::nullopt};
  c.groups = {absolute, scaled};
  ASSERT_TRUE(MakeOptimizer(c).ok());

  const OptimizerConfig bias = ConfigForVariable(c, "fc.bias");
  EXPECT_FLOAT_EQ(bias.learning_rate, 0.02f);
  EXPECT_EQ(bias.weight_decay, 0.0f);
  EXPECT_TRUE(bias.groups.empty());
  EXPECT_NEAR(LearningRateAt(bias, 5), 0.02, 1e-8);  // piecewise values scaled by 0.02 / 0.1
  EXPECT_NEAR(LearningRateAt(bias, 11), 0.01, 1e-8);
  const OptimizerConfig head = ConfigForVariable(c, "head.weight");
  EXPECT_FLOAT_EQ(head.learning_rate, 0.05f);
  EXPECT_FLOAT_EQ(head.weight_decay, 0.01f);
  const OptimizerConfig other = ConfigForVariable(c, "fc.weight");
  EXPECT_FLOAT_EQ(other.learning_rate, 0.1f);
  EXPECT_FLOAT_EQ(other.weight_decay, 0.01f);
  EXPECT_NEAR(LearningRateAt(other, 11), 0.05, 1e-8);
}

TEST(ParameterGroupTest, RefusesBadGroups) {
  auto error_of = [](const OptimizerConfig& c) {
    auto opt = MakeOptimizer(c);
    EXPECT_FALSE(opt.ok());
    return std::string(opt.status().message());
  };
  OptimizerConfig c = Torch("sgd", 0.1f);
  c.groups = {ParameterGroup{{"a", "b"}, std::nullopt, 1.0f, std::nullopt},
              ParameterGroup{{"b"}, std::nullopt, 1.0f, std::nullopt}};
  EXPECT_EQ(error_of(c),
            "optimizer 'sgd' parameter group 1: variable 'b' is already in another group; "
            "a variable belongs to one group");
  c.groups = {ParameterGroup{{"a"}, -1.0f, 1.0f, std::nullopt}};
  EXPECT_THAT(error_of(c), HasSubstr("parameter group 0: learning_rate must be a finite number > 0, got -1"));
  c.groups = {ParameterGroup{{"a"}, std::nullopt, 1.0f, -0.5f}};
  EXPECT_THAT(error_of(c), HasSubstr("weight_decay must be a finite number >= 0, got -0.5"));
}

TEST(TorchValidationTest, RefusesWhatTorchRefuses) {
  auto error_of = [](const OptimizerConfig& c) {
    auto opt = MakeOptimizer(c);
    EXPECT_FALSE(opt.ok());
    return std::string(opt.status().message());
  };
  OptimizerConfig c = Torch("sgd", 0.1f);
  c.nesterov = true;
  EXPECT_THAT(error_of(c), HasSubstr("nesterov needs the momentum rule with momentum > 0"));
  c = Torch("adam", 0.1f);
  c.weight_decay = -1.0f;
  EXPECT_THAT(error_of(c), HasSubstr("weight_decay must be a finite number >= 0, got -1"));
  c = Torch("adam", 0.1f);
  c.convention = "jax";
  EXPECT_THAT(error_of(c), HasSubstr("convention must be tensorflow or torch, got 'jax'"));
  // Torch's Adagrad starts its accumulator at 0 (TF's must be > 0).
  c = Torch("adagrad", 0.1f);
  c.initial_accumulator = 0.0f;
  EXPECT_TRUE(MakeOptimizer(c).ok());
  c.convention = "tensorflow";
  EXPECT_THAT(error_of(c), HasSubstr("initial_accumulator must be > 0"));
}

}  // namespace
}  // namespace psflow::optim
