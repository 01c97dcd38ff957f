// Checks LearningRateAt against the closed forms of torch.optim.lr_scheduler (LinearLR,
// CosineAnnealingLR, StepLR, ExponentialLR, SequentialLR) and tf.train.piecewise_constant,
// written here in double; python/tests/test_optim.py checks them against torch's schedulers.
#include <cmath>
#include <numbers>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "psflow/optim/optimizer.h"

namespace psflow::optim {
namespace {

using ::testing::HasSubstr;

OptimizerConfig Base(float lr) {
  OptimizerConfig c;
  c.name = "sgd";
  c.learning_rate = lr;
  return c;
}

std::string ErrorOf(const OptimizerConfig& c) {
  auto opt = MakeOptimizer(c);
  EXPECT_FALSE(opt.ok());
  return std::string(opt.status().message());
}

TEST(ScheduleTest, DefaultIsConstant) {
  const OptimizerConfig c = Base(0.3f);
  for (int64_t step : {0, 1, 1000, 1000000}) EXPECT_EQ(LearningRateAt(c, step), 0.3f);
}

TEST(ScheduleTest, StepLRIsTheStaircaseExponential) {
  OptimizerConfig c = Base(0.1f);
  c.decay_steps = 30;  // StepLR(step_size=30, gamma=0.1)
  c.decay_rate = 0.1f;
  c.staircase = true;
  for (int64_t step : {0, 29, 30, 59, 60, 95}) {
    EXPECT_NEAR(LearningRateAt(c, step), 0.1 * std::pow(0.1, step / 30), 2e-8) << step;
  }
}

TEST(ScheduleTest, CosineAnnealsToTheMinimumAndStays) {
  OptimizerConfig c = Base(0.2f);
  c.schedule = "cosine";
  c.cosine_steps = 100;
  c.min_learning_rate = 0.01f;
  for (int64_t step : {0, 1, 25, 50, 99, 100}) {
    const double expected = 0.01 + (0.2 - 0.01) * (1 + std::cos(std::numbers::pi * step / 100.0)) / 2;
    EXPECT_NEAR(LearningRateAt(c, step), expected, 1e-7 * expected) << step;
  }
  EXPECT_NEAR(LearningRateAt(c, 50), 0.105, 2e-8);
  EXPECT_FLOAT_EQ(LearningRateAt(c, 250), 0.01f);  // held at the minimum after cosine_steps
}

TEST(ScheduleTest, LinearWarmupThenTheSchedule) {
  OptimizerConfig c = Base(0.1f);
  c.warmup_steps = 10;
  c.warmup_start_factor = 0.25f;
  // LinearLR(start_factor=0.25, total_iters=10): 0.1 * (0.25 + 0.75 * step / 10).
  EXPECT_NEAR(LearningRateAt(c, 0), 0.025, 2e-8);
  EXPECT_NEAR(LearningRateAt(c, 4), 0.1 * (0.25 + 0.75 * 0.4), 2e-8);
  EXPECT_NEAR(LearningRateAt(c, 9), 0.1 * (0.25 + 0.75 * 0.9), 2e-8);
  EXPECT_NEAR(LearningRateAt(c, 10), 0.1, 2e-8);
  EXPECT_NEAR(LearningRateAt(c, 500), 0.1, 2e-8);
  // Then a cosine counted from the warmup's end (SequentialLR(milestones=[10])).
  c.schedule = "cosine";
  c.cosine_steps = 40;
  EXPECT_NEAR(LearningRateAt(c, 10), 0.1, 2e-8);
  EXPECT_NEAR(LearningRateAt(c, 30), 0.05, 2e-8);
  EXPECT_NEAR(LearningRateAt(c, 50), 0.0, 2e-8);
  // And an exponential decay, also from the warmup's end.
  c.schedule = "exponential";
  c.decay_steps = 10;
  c.decay_rate = 0.5f;
  EXPECT_NEAR(LearningRateAt(c, 25), 0.1 * std::pow(0.5, 1.5), 2e-8);
}

TEST(ScheduleTest, PiecewiseConstantSwitchesAfterEachBoundary) {
  OptimizerConfig c = Base(1.0f);
  c.schedule = "piecewise";
  c.boundaries = {100, 200};
  c.values = {1.0f, 0.5f, 0.1f};
  // tf.train.piecewise_constant: values[0] while step <= 100, values[1] while step <= 200.
  EXPECT_EQ(LearningRateAt(c, 0), 1.0f);
  EXPECT_EQ(LearningRateAt(c, 100), 1.0f);
  EXPECT_EQ(LearningRateAt(c, 101), 0.5f);
  EXPECT_EQ(LearningRateAt(c, 200), 0.5f);
  EXPECT_EQ(LearningRateAt(c, 201), 0.1f);
  EXPECT_EQ(LearningRateAt(c, 100000), 0.1f);
}

TEST(ScheduleTest, RefusesBadSchedules) {
  OptimizerConfig c = Base(0.1f);
  c.schedule = "triangle";
  EXPECT_EQ(ErrorOf(c),
            "optimizer 'sgd' schedule 'triangle': unknown schedule; choose one of exponential, cosine, piecewise");
  c.schedule = "cosine";
  EXPECT_THAT(ErrorOf(c), HasSubstr("cosine_steps must be >= 1, got 0"));
  c.schedule = "piecewise";
  c.boundaries = {10, 5};
  c.values = {1, 2, 3};
  EXPECT_THAT(ErrorOf(c), HasSubstr("boundaries must increase, got [10, 5]"));
  c.boundaries = {10};
  EXPECT_THAT(ErrorOf(c), HasSubstr("needs one more value than boundaries, got 1 boundaries and 3 values"));
  c = Base(0.1f);
  c.warmup_steps = 5;
  c.warmup_start_factor = 1.5f;
  EXPECT_THAT(ErrorOf(c), HasSubstr("warmup_start_factor must be in [0, 1], got 1.5"));
}

}  // namespace
}  // namespace psflow::optim
