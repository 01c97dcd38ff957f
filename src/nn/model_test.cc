#include "psflow/nn/model.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace psflow::nn {
namespace {

std::unique_ptr<Model> Build(const std::string& name, uint64_t seed = 1) {
  auto model = BuildModel({.name = name, .hidden_units = 100, .seed = seed});
  EXPECT_TRUE(model.ok()) << model.status();
  return std::move(model).value();
}

std::vector<std::string> Names(const Model& m) {
  std::vector<std::string> names;
  for (const Var& p : m.parameters()) names.push_back(p->name + ShapeToString(p->value.shape()));
  return names;
}

TEST(ModelTest, SeedModelsHaveTheSeedsParameterCounts) {
  // Counts from the seeds' own architectures (TF's deep MNIST tutorial: 3,274,634 for cnn).
  EXPECT_EQ(Build("softmax")->NumParameters(), 784 * 10 + 10);
  EXPECT_EQ(Build("mlp")->NumParameters(), 784 * 100 + 100 + 100 * 10 + 10);
  EXPECT_EQ(Build("cnn")->NumParameters(), 3274634);
  EXPECT_THAT(Names(*Build("cnn")),
              testing::ElementsAre("conv1/weights[5,5,1,32]", "conv1/biases[32]", "conv2/weights[5,5,32,64]",
                                   "conv2/biases[64]", "fc1/weights[3136,1024]", "fc1/biases[1024]",
                                   "fc2/weights[1024,10]", "fc2/biases[10]"));
  auto vgg = Build("vgg19");
  EXPECT_EQ(vgg->parameters().size(), 2u * 19);
}

TEST(ModelTest, InitializationFollowsTheSeed) {
  auto mlp = Build("mlp");
  const Tensor& hidden = mlp->parameters()[0]->value;
  double sum_sq = 0, max_abs = 0;
  for (int64_t i = 0; i < hidden.size(); ++i) {
    sum_sq += hidden[i] * hidden[i];
    max_abs = std::max<double>(max_abs, std::abs(hidden[i]));
  }
  // Truncated normal with stddev 1/28: bounded by 2 stddev, and its std is 0.88 stddev.
  EXPECT_LE(max_abs, 2.0 / 28 + 1e-6);
  EXPECT_NEAR(std::sqrt(sum_sq / hidden.size()), 0.88 / 28, 0.02 / 28);
  for (float b : mlp->parameters()[1]->value.span()) EXPECT_EQ(b, 0.0f);
  auto cnn = Build("cnn");
  for (float b : cnn->parameters()[1]->value.span()) EXPECT_FLOAT_EQ(b, 0.1f);
  // Same seed, same values; another seed, other values.
  auto again = Build("mlp");
  const Tensor& hidden_again = again->parameters()[0]->value;
  ASSERT_EQ(hidden_again.size(), hidden.size());
  for (int64_t i = 0; i < hidden.size(); ++i) ASSERT_EQ(hidden_again[i], hidden[i]) << i;
  EXPECT_NE(Build("mlp", 2)->parameters()[0]->value[0], hidden[0]);
}

TEST(ModelTest, LogitsHaveBatchByClassesShape) {
  for (const char* name : {"softmax", "mlp", "cnn"}) {
    auto model = Build(name);
    std::vector<float> images(3 * 784, 0.5f);
    Rng rng(3);
    ForwardContext ctx{.training = true, .rng = &rng, .before_layer = nullptr};
    Var logits = model->Logits(images.data(), 3, ctx);
    EXPECT_EQ(logits->value.shape(), (Shape{3, 10})) << name;
    std::vector<int32_t> labels = {1, 2, 3};
    Var loss = Model::Loss(logits, labels);
    Backward(loss);
    for (const Var& p : model->parameters()) EXPECT_EQ(p->grad.shape(), p->value.shape()) << p->name;
  }
}

TEST(ModelTest, UnknownModelIsAClearError) {
  auto model = BuildModel({.name = "resnet"});
  ASSERT_FALSE(model.ok());
  EXPECT_EQ(model.status().message(), "unknown model 'resnet'; choose one of softmax, mlp, cnn, vgg19, ctr");
  EXPECT_FALSE(DefaultsFor("resnet").ok());
}

}  // namespace
}  // namespace psflow::nn
