// The CTR network: its gradients (dense parameters, each field's unique rows, with repeated ids)
// against finite differences through the public gradient check; its logit against a forward
// written out by hand for a tiny configuration (the dedup of a batch column: core/unique_ids_test.cc).
#include "psflow/nn/ctr_model.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "psflow/core/gradient_check.h"
#include "psflow/core/ops.h"

namespace psflow::nn {
namespace {

TEST(CtrModelTest, BadConfigsAreRefused) {
  CtrModelConfig config;
  config.num_fields = 0;
  EXPECT_EQ(CtrModel::Create(config).status().code(), absl::StatusCode::kInvalidArgument);
  config = {};
  config.dim = 0;
  EXPECT_EQ(CtrModel::Create(config).status().code(), absl::StatusCode::kInvalidArgument);
  config = {};
  config.top_hidden = {4, 0};
  EXPECT_EQ(CtrModel::Create(config).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(CtrModelTest, ParameterShapes) {
  CtrModelConfig config{.num_dense = 5, .num_fields = 3, .dim = 4, .bottom_hidden = {6}, .top_hidden = {7}};
  auto model = CtrModel::Create(config);
  ASSERT_TRUE(model.ok());
  // bottom 5->6->4, top (4 + C(4,2)=6 = 10)->7->1.
  const std::vector<Var>& p = (*model)->parameters();
  ASSERT_EQ(p.size(), 8u);
  EXPECT_EQ(p[0]->name, "bottom/0/weights");
  EXPECT_EQ(ShapeToString(p[2]->value.shape()), ShapeToString(Shape{6, 4}));
  EXPECT_EQ(ShapeToString(p[4]->value.shape()), ShapeToString(Shape{10, 7}));
  EXPECT_EQ(ShapeToString(p[6]->value.shape()), ShapeToString(Shape{7, 1}));
  EXPECT_EQ((*model)->NumParameters(), 5 * 6 + 6 + 6 * 4 + 4 + 10 * 7 + 7 + 7 + 1);
}

// With no hidden layers and no dense features the logit is b + v · dots; check it by hand.
TEST(CtrModelTest, LogitByHand) {
  CtrModelConfig config{.num_dense = 0, .num_fields = 3, .dim = 2, .bottom_hidden = {}, .top_hidden = {}};
  auto model = CtrModel::Create(config);
  ASSERT_TRUE(model.ok());
  const std::vector<Var>& p = (*model)->parameters();
  ASSERT_EQ(p.size(), 2u);  // top/0/weights [3, 1], top/0/biases [1]
  p[0]->value = Tensor({3, 1}, std::vector<float>{0.5f, -1.0f, 2.0f});
  p[1]->value = Tensor({1}, std::vector<float>{0.25f});
  Var r0 = Constant(Tensor({2, 2}, std::vector<float>{1, 2, 3, 4}));
  Var r1 = Constant(Tensor({1, 2}, std::vector<float>{-1, 1}));
  Var r2 = Constant(Tensor({2, 2}, std::vector<float>{0.5f, 0, 2, -2}));
  const std::vector<int64_t> i0 = {1, 0}, i1 = {0, 0}, i2 = {0, 1};
  Var logits = (*model)->Logits(nullptr, 2, {{r0, i0}, {r1, i1}, {r2, i2}});
  // Example 0: e0 = (3, 4), e1 = (-1, 1), e2 = (0.5, 0): dots 1, 1.5, -0.5.
  // Example 1: e0 = (1, 2), e1 = (-1, 1), e2 = (2, -2): dots 1, -2, -4.
  EXPECT_FLOAT_EQ(logits->value[0], 0.25f + 0.5f * 1 - 1.0f * 1.5f + 2.0f * -0.5f);
  EXPECT_FLOAT_EQ(logits->value[1], 0.25f + 0.5f * 1 - 1.0f * -2 + 2.0f * -4);
}

TEST(CtrModelTest, GradientsMatchFiniteDifferences) {
  CtrModelConfig config{.num_dense = 3, .num_fields = 2, .dim = 3, .bottom_hidden = {4}, .top_hidden = {5}, .seed = 3};
  auto made = CtrModel::Create(config);
  ASSERT_TRUE(made.ok());
  const CtrModel& model = **made;
  const int64_t batch = 6;
  Rng rng(11);
  std::vector<float> dense(batch * config.num_dense);
  for (float& x : dense) x = static_cast<float>(2 * rng.Uniform() - 1);
  std::vector<float> labels = {1, 0, 0, 1, 1, 0};
  // Field 0: 3 unique rows, field 1: 2; repeated ids so each unique row's gradient is a sum.
  const std::vector<int64_t> index0 = {0, 1, 2, 0, 0, 1}, index1 = {1, 1, 0, 0, 1, 1};
  std::vector<Tensor> inputs;
  for (const Var& p : model.parameters()) inputs.push_back(p->value);
  for (int64_t unique : {3, 2}) {
    Tensor rows({unique, config.dim});
    for (int64_t i = 0; i < rows.size(); ++i) rows[i] = static_cast<float>(rng.Uniform() - 0.5);
    inputs.push_back(std::move(rows));
  }
  const size_t num_params = model.parameters().size();
  auto op = [&](const std::vector<Var>& v) {
    std::vector<Var> params(v.begin(), v.begin() + num_params);
    Var logits = model.LogitsWith(params, dense.data(), batch, {{v[num_params], index0}, {v[num_params + 1], index1}});
    return CtrModel::Loss(logits, labels);
  };
  GradientCheckOptions options;
  options.step = 1e-3;
  options.tolerance = 2e-2;
  EXPECT_TRUE(CheckGradients(op, inputs, options).ok()) << CheckGradients(op, inputs, options).message();
}

}  // namespace
}  // namespace psflow::nn
