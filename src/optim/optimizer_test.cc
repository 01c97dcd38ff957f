// Checks each update rule against references written here in double precision, in textbook form
// (e.g. Adam with explicit bias-corrected m̂ and v̂), independent of the float kernels.
#include "psflow/optim/optimizer.h"

#include <cmath>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace psflow::optim {
namespace {

using ::testing::HasSubstr;

std::unique_ptr<Optimizer> Make(const OptimizerConfig& config) {
  absl::StatusOr<std::unique_ptr<Optimizer>> opt = MakeOptimizer(config);
  EXPECT_TRUE(opt.ok()) << opt.status();
  return std::move(opt).value();
}

OptimizerConfig Config(const std::string& name, float lr) {
  OptimizerConfig c;
  c.name = name;
  c.learning_rate = lr;
  return c;
}

// Gradient of element i at step s (1-based): a fixed, sign-changing pattern.
double Grad(int64_t i, int s) { return std::sin(0.37 * static_cast<double>(i) + 1.3 * s) * 0.8; }
double Init(int64_t i) { return std::cos(0.11 * static_cast<double>(i)) * 2.0; }

// Runs `steps` dense updates on n elements (37: the vector body and a scalar tail both run) and
// compares every element with `reference`, which maps (initial w, gradients by step) to final w.
void CheckAgainstReference(const OptimizerConfig& config, int steps,
                           const std::function<double(double, const std::vector<double>&)>& ref) {
  const int64_t n = 37;
  std::unique_ptr<Optimizer> opt = Make(config);
  SlotState state = opt->NewState(n);
  std::vector<float> w(n);
  for (int64_t i = 0; i < n; ++i) w[i] = static_cast<float>(Init(i));
  for (int s = 1; s <= steps; ++s) {
    std::vector<float> g(n);
    for (int64_t i = 0; i < n; ++i) g[i] = static_cast<float>(Grad(i, s));
    opt->ApplyDense(w.data(), g.data(), n, state, config.learning_rate);
  }
  EXPECT_EQ(state.updates, steps);
  for (int64_t i = 0; i < n; ++i) {
    std::vector<double> gs;
    // The reference sees the float-rounded inputs, as the kernel does.
    for (int s = 1; s <= steps; ++s) gs.push_back(static_cast<float>(Grad(i, s)));
    const double expected = ref(static_cast<float>(Init(i)), gs);
    EXPECT_NEAR(w[i], expected, 2e-6 * std::max(1.0, std::abs(expected))) << "element " << i;
  }
}

TEST(SgdTest, HandComputedSteps) {
  std::unique_ptr<Optimizer> opt = Make(Config("sgd", 0.1f));
  EXPECT_TRUE(opt->slot_names().empty());
  SlotState state = opt->NewState(2);
  std::vector<float> w = {1.0f, -2.0f};
  const float g1[] = {0.1f, -0.2f}, g2[] = {0.5f, 0.1f}, g3[] = {-0.3f, 0.2f};
  opt->ApplyDense(w.data(), g1, 2, state, 0.1f);
  opt->ApplyDense(w.data(), g2, 2, state, 0.1f);
  opt->ApplyDense(w.data(), g3, 2, state, 0.1f);
  // 1 - 0.1*(0.1 + 0.5 - 0.3) = 0.97;  -2 - 0.1*(-0.2 + 0.1 + 0.2) = -2.01
  EXPECT_NEAR(w[0], 0.97, 1e-6);
  EXPECT_NEAR(w[1], -2.01, 1e-6);
  CheckAgainstReference(Config("sgd", 0.1f), 4, [](double w, const std::vector<double>& gs) {
    for (double g : gs) w -= 0.1 * g;
    return w;
  });
}

TEST(MomentumTest, HandComputedSteps) {
  OptimizerConfig c = Config("momentum", 0.1f);
  c.momentum = 0.9f;
  std::unique_ptr<Optimizer> opt = Make(c);
  EXPECT_EQ(opt->slot_names(), std::vector<std::string>{"momentum"});
  SlotState state = opt->NewState(1);
  std::vector<float> w = {1.0f};
  const float g1 = 0.5f, g2 = -0.25f;
  opt->ApplyDense(w.data(), &g1, 1, state, 0.1f);
  opt->ApplyDense(w.data(), &g2, 1, state, 0.1f);
  // a1 = 0.5, w1 = 1 - 0.05 = 0.95; a2 = 0.45 - 0.25 = 0.2, w2 = 0.95 - 0.02 = 0.93
  EXPECT_NEAR(state.slots[0][0], 0.2, 1e-7);
  EXPECT_NEAR(w[0], 0.93, 1e-6);
  CheckAgainstReference(c, 5, [](double w, const std::vector<double>& gs) {
    double a = 0.0;
    for (double g : gs) {
      a = static_cast<double>(0.9f) * a + g;
      w -= 0.1 * a;
    }
    return w;
  });
}

TEST(AdagradTest, HandComputedSteps) {
  std::unique_ptr<Optimizer> opt = Make(Config("adagrad", 0.5f));
  SlotState state = opt->NewState(3);
  ASSERT_EQ(state.slots.size(), 1u);
  EXPECT_FLOAT_EQ(state.slots[0][2], 0.1f);  // initial accumulator
  std::vector<float> w = {1.0f};
  const float g1 = 0.3f, g2 = -0.4f;
  opt->ApplyDense(w.data(), &g1, 1, state, 0.5f);
  opt->ApplyDense(w.data(), &g2, 1, state, 0.5f);
  // acc1 = 0.1 + 0.09 = 0.19; acc2 = 0.19 + 0.16 = 0.35
  EXPECT_NEAR(w[0], 1.0 - 0.5 * 0.3 / std::sqrt(0.19) + 0.5 * 0.4 / std::sqrt(0.35), 1e-6);
  EXPECT_NEAR(state.slots[0][0], 0.35, 1e-7);
  CheckAgainstReference(Config("adagrad", 0.5f), 5, [](double w, const std::vector<double>& gs) {
    double acc = static_cast<double>(0.1f);
    for (double g : gs) {
      acc += g * g;
      w -= 0.5 * g / std::sqrt(acc);
    }
    return w;
  });
}

TEST(AdamTest, ConstantGradientMovesByLearningRate) {
  // With a constant gradient g, m_t = g(1-b1^t) and v_t = g^2(1-b2^t), so each step moves w by
  // exactly lr*g*sqrt(1-b2^t) / (|g|*sqrt(1-b2^t) + eps): almost lr, whatever |g| is.
  const double lr = 0.01, b2 = 0.999, eps = 1e-8;
  std::unique_ptr<Optimizer> opt = Make(Config("adam", 0.01f));
  SlotState state = opt->NewState(2);
  std::vector<float> w = {0.0f, 0.0f};
  const float g[] = {0.5f, -3.0f};
  double expected[] = {0.0, 0.0};
  for (int t = 1; t <= 6; ++t) {
    opt->ApplyDense(w.data(), g, 2, state, 0.01f);
    const double s = std::sqrt(1.0 - std::pow(b2, t));
    for (int i = 0; i < 2; ++i) expected[i] -= lr * g[i] * s / (std::abs(g[i]) * s + eps);
  }
  EXPECT_NEAR(w[0], expected[0], 1e-6);
  EXPECT_NEAR(w[1], expected[1], 1e-6);
  EXPECT_NEAR(w[0], -0.06, 1e-5);
  EXPECT_NEAR(w[1], 0.06, 1e-5);
}

TEST(AdamTest, MatchesTextbookBiasCorrectedForm) {
  OptimizerConfig c = Config("adam", 0.01f);
  CheckAgainstReference(c, 6, [](double w, const std::vector<double>& gs) {
    const double b1 = static_cast<double>(0.9f), b2 = static_cast<double>(0.999f);
    const double eps = static_cast<double>(1e-8f);
    double m = 0.0, v = 0.0;
    int t = 0;
    for (double g : gs) {
      ++t;
      m = b1 * m + (1.0 - b1) * g;
      v = b2 * v + (1.0 - b2) * g * g;
      const double m_hat = m / (1.0 - std::pow(b1, t));
      const double v_hat = v / (1.0 - std::pow(b2, t));
      // TF's epsilon sits outside the bias correction: eps_hat = eps / sqrt(1 - b2^t).
      w -= 0.01 * m_hat / (std::sqrt(v_hat) + eps / std::sqrt(1.0 - std::pow(b2, t)));
    }
    return w;
  });
}

TEST(RmsPropTest, HandComputedFirstStep) {
  OptimizerConfig c = Config("rmsprop", 0.001f);
  std::unique_ptr<Optimizer> opt = Make(c);
  EXPECT_EQ(opt->slot_names(), (std::vector<std::string>{"ms", "mom"}));
  SlotState state = opt->NewState(1);
  EXPECT_EQ(state.slots[0][0], 1.0f);  // ms starts at one, not zero
  std::vector<float> w = {1.0f};
  const float g = 2.0f;
  opt->ApplyDense(w.data(), &g, 1, state, 0.001f);
  // ms = 1 + (4 - 1) * 0.1 = 1.3;  w = 1 - 0.001 * 2 / sqrt(1.3 + 1e-10)
  EXPECT_NEAR(state.slots[0][0], 1.3, 1e-6);
  EXPECT_NEAR(w[0], 1.0 - 0.002 / std::sqrt(1.3), 1e-7);
}

TEST(RmsPropTest, MatchesReferenceWithAndWithoutMomentum) {
  for (float mu : {0.0f, 0.5f}) {
    OptimizerConfig c = Config("rmsprop", 0.01f);
    c.rms_momentum = mu;
    CheckAgainstReference(c, 6, [mu](double w, const std::vector<double>& gs) {
      const double rho = static_cast<double>(0.9f), eps = static_cast<double>(1e-10f);
      double ms = 1.0, mom = 0.0;
      for (double g : gs) {
        ms = rho * ms + (1.0 - rho) * g * g;
        mom = mu * mom + 0.01 * g / std::sqrt(ms + eps);
        w -= mom;
      }
      return w;
    });
  }
}

const char* const kAllRules[] = {"sgd", "momentum", "adagrad", "adam", "rmsprop"};

// Runs `f(optimizer, w, state)` after one dense warm-up step, so that slots are not trivial.
struct Warmed {
  std::unique_ptr<Optimizer> opt;
  std::vector<float> w;
  SlotState state;
};

Warmed WarmUp(const std::string& name, int64_t n) {
  Warmed r{Make(Config(name, 0.05f)), {}, {}};
  r.state = r.opt->NewState(n);
  std::vector<float> g(n);
  for (int64_t i = 0; i < n; ++i) {
    r.w.push_back(static_cast<float>(Init(i)));
    g[i] = static_cast<float>(Grad(i, 1));
  }
  r.opt->ApplyDense(r.w.data(), g.data(), n, r.state, 0.05f);
  return r;
}

TEST(ApplySparseTest, TouchesOnlyListedRowsAndEqualsDenseOnThem) {
  const int64_t rows = 6, row_size = 11;
  for (const char* name : kAllRules) {
    SCOPED_TRACE(name);
    Warmed r = WarmUp(name, rows * row_size);
    const std::vector<float> w_before = r.w;
    const SlotState state_before = r.state;
    const std::vector<int64_t> touched = {4, 1};
    std::vector<float> g_rows(touched.size() * row_size);
    for (size_t k = 0; k < g_rows.size(); ++k) g_rows[k] = static_cast<float>(Grad(k, 7));
    r.opt->ApplySparse(r.w.data(), touched, g_rows.data(), row_size, r.state, 0.05f);
    EXPECT_EQ(r.state.updates, 2);

    for (int64_t row = 0; row < rows; ++row) {
      const bool is_touched = row == 4 || row == 1;
      const int64_t off = row * row_size;
      if (!is_touched) {
        for (int64_t j = 0; j < row_size; ++j) {
          EXPECT_EQ(r.w[off + j], w_before[off + j]) << "row " << row;
          for (size_t s = 0; s < r.state.slots.size(); ++s) {
            EXPECT_EQ(r.state.slots[s][off + j], state_before.slots[s][off + j]) << "row " << row;
          }
        }
        continue;
      }
      // Dense reference on that row alone, from the same pre-update values and the same t.
      const size_t k = row == 4 ? 0 : 1;
      std::vector<float> w_row(w_before.begin() + off, w_before.begin() + off + row_size);
      SlotState row_state;
      row_state.updates = state_before.updates;
      for (const FloatBuffer& slot : state_before.slots) {
        row_state.slots.emplace_back(slot.begin() + off, slot.begin() + off + row_size);
      }
      r.opt->ApplyDense(w_row.data(), g_rows.data() + k * row_size, row_size, row_state, 0.05f);
      for (int64_t j = 0; j < row_size; ++j) {
        EXPECT_FLOAT_EQ(r.w[off + j], w_row[j]) << "row " << row;
        for (size_t s = 0; s < r.state.slots.size(); ++s) {
          EXPECT_FLOAT_EQ(r.state.slots[s][off + j], row_state.slots[s][j]) << "row " << row;
        }
      }
    }
  }
}

TEST(ApplySparseTest, RepeatedRowIsAppliedTwice) {
  std::unique_ptr<Optimizer> opt = Make(Config("sgd", 1.0f));
  SlotState state = opt->NewState(4);
  std::vector<float> w = {0, 0, 0, 0};  // 2 rows of 2
  const float g_rows[] = {1, 2, 10, 20};
  opt->ApplySparse(w.data(), {1, 1}, g_rows, 2, state, 1.0f);
  EXPECT_EQ(w, (std::vector<float>{0, 0, -11, -22}));
}

TEST(ApplyTest, DisjointRangesEqualOneDenseUpdate) {
  // The ps splits a variable into ranges for its threads; the result must not depend on it.
  const int64_t n = 101;
  for (const char* name : kAllRules) {
    SCOPED_TRACE(name);
    Warmed whole = WarmUp(name, n);
    Warmed split = WarmUp(name, n);
    std::vector<float> g(n);
    for (int64_t i = 0; i < n; ++i) g[i] = static_cast<float>(Grad(i, 2));
    whole.opt->ApplyDense(whole.w.data(), g.data(), n, whole.state, 0.05f);
    const int64_t t = split.state.updates + 1;
    split.opt->Apply(split.w.data(), g.data() + 40, split.state, 40, n - 40, 0.05f, t);
    split.opt->Apply(split.w.data(), g.data(), split.state, 0, 40, 0.05f, t);
    for (int64_t i = 0; i < n; ++i) EXPECT_FLOAT_EQ(split.w[i], whole.w[i]) << i;
  }
}

// Every dense rule (both conventions, nesterov, weight decay of either kind) read from bytes at
// each alignment (a received message's payload) gives the bits Apply gives on an aligned copy,
// weights and slots alike, over lengths with and without vector tails.
TEST(ApplyTest, FromBytesAtAnyAlignmentEqualsApplyBitForBit) {
  std::vector<OptimizerConfig> configs;
  for (const char* name : {"sgd", "momentum", "adagrad", "adam", "adamw", "rmsprop"}) {
    for (const char* convention : {"tensorflow", "torch"}) {
      for (float wd : {0.0f, 0.01f}) {
        OptimizerConfig c = Config(name, 0.05f);
        c.convention = convention;
        c.weight_decay = wd;
        c.rms_momentum = 0.5f;
        configs.push_back(c);
      }
    }
  }
  OptimizerConfig nesterov = Config("momentum", 0.05f);
  nesterov.nesterov = true;
  configs.push_back(nesterov);
  for (const OptimizerConfig& config : configs) {
    for (int64_t n : {1, 15, 16, 37, 5000}) {
      for (int offset = 0; offset < 4; ++offset) {
        SCOPED_TRACE(testing::Message() << config.name << " " << config.convention << " wd " << config.weight_decay
                                        << " nesterov " << config.nesterov << " n " << n << " offset " << offset);
        std::unique_ptr<Optimizer> opt = Make(config);
        std::vector<float> w_plain(n), w_bytes(n);
        for (int64_t i = 0; i < n; ++i) w_plain[i] = w_bytes[i] = static_cast<float>(Init(i));
        SlotState plain = opt->NewState(n), bytes = opt->NewState(n);
        for (int s = 1; s <= 3; ++s) {
          std::vector<float> g(n);
          for (int64_t i = 0; i < n; ++i) g[i] = static_cast<float>(Grad(i, s));
          std::vector<char> raw(static_cast<size_t>(n) * 4 + 4);
          std::memcpy(raw.data() + offset, g.data(), static_cast<size_t>(n) * 4);
          opt->Apply(w_plain.data(), g.data(), plain, 0, n, 0.05f, s);
          opt->ApplyFromBytes(w_bytes.data(), raw.data() + offset, bytes, 0, n, 0.05f, s);
        }
        EXPECT_EQ(std::memcmp(w_plain.data(), w_bytes.data(), static_cast<size_t>(n) * 4), 0);
        ASSERT_EQ(plain.slots.size(), bytes.slots.size());
        for (size_t k = 0; k < plain.slots.size(); ++k) {
          EXPECT_EQ(std::memcmp(plain.slots[k].data(), bytes.slots[k].data(), static_cast<size_t>(n) * 4), 0) << k;
        }
      }
    }
  }
}

TEST(DecayTest, ExponentialWithAndWithoutStaircase) {
  OptimizerConfig c = Config("rmsprop", 0.1f);
  c.decay_steps = 1000;
  c.decay_rate = 0.5f;
  EXPECT_NEAR(LearningRateAt(c, 0), 0.1, 1e-8);
  EXPECT_NEAR(LearningRateAt(c, 1000), 0.05, 1e-8);
  EXPECT_NEAR(LearningRateAt(c, 1500), 0.1 * std::pow(0.5, 1.5), 1e-8);  // 0.0353553
  EXPECT_NEAR(LearningRateAt(c, 2500), 0.1 * std::pow(0.5, 2.5), 1e-8);
  EXPECT_NEAR(LearningRateAt(c, 250), 0.1 * std::pow(0.5, 0.25), 1e-8);
  c.staircase = true;
  EXPECT_NEAR(LearningRateAt(c, 0), 0.1, 1e-8);
  EXPECT_NEAR(LearningRateAt(c, 999), 0.1, 1e-8);
  EXPECT_NEAR(LearningRateAt(c, 1000), 0.05, 1e-8);
  EXPECT_NEAR(LearningRateAt(c, 1500), 0.05, 1e-8);
  EXPECT_NEAR(LearningRateAt(c, 2500), 0.025, 1e-8);
  c.decay_steps = 0;  // constant
  EXPECT_FLOAT_EQ(LearningRateAt(c, 1000000), 0.1f);
}

TEST(MakeOptimizerTest, UnknownNameListsChoices) {
  absl::StatusOr<std::unique_ptr<Optimizer>> opt = MakeOptimizer(Config("lamb", 0.1f));
  ASSERT_FALSE(opt.ok());
  EXPECT_EQ(opt.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(opt.status().message(),
            "unknown optimizer 'lamb'; choose one of sgd, momentum, adagrad, adam, adamw, rmsprop");
}

TEST(MakeOptimizerTest, RejectsBadHyperParameters) {
  auto error_of = [](const OptimizerConfig& c) {
    absl::StatusOr<std::unique_ptr<Optimizer>> opt = MakeOptimizer(c);
    EXPECT_FALSE(opt.ok()) << c.name;
    EXPECT_EQ(opt.status().code(), absl::StatusCode::kInvalidArgument);
    return std::string(opt.status().message());
  };
  EXPECT_THAT(error_of(Config("sgd", 0.0f)), HasSubstr("learning_rate must be"));
  EXPECT_THAT(error_of(Config("sgd", -1.0f)), HasSubstr("got -1"));
  EXPECT_THAT(error_of(Config("sgd", NAN)), HasSubstr("learning_rate"));
  OptimizerConfig c = Config("adam", 0.1f);
  c.beta1 = 1.0f;
  EXPECT_THAT(error_of(c), HasSubstr("optimizer 'adam': beta1 must be in [0, 1), got 1"));
  c = Config("adagrad", 0.1f);
  c.initial_accumulator = 0.0f;
  EXPECT_THAT(error_of(c), HasSubstr("initial_accumulator"));
  c = Config("rmsprop", 0.1f);
  c.rms_epsilon = -1.0f;
  EXPECT_THAT(error_of(c), HasSubstr("rms_epsilon"));
  c = Config("sgd", 0.1f);
  c.decay_steps = 100;
  c.decay_rate = 0.0f;
  EXPECT_THAT(error_of(c), HasSubstr("decay_rate"));
  c.decay_steps = -5;
  EXPECT_THAT(error_of(c), HasSubstr("decay_steps"));
  // Fields of other rules are not checked: a momentum of -1 does not matter to adam.
  c = Config("adam", 0.1f);
  c.momentum = -1.0f;
  EXPECT_TRUE(MakeOptimizer(c).ok());
}

}  // namespace
}  // namespace psflow::optim
