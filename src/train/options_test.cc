// ResolveTrainOptions: the one rule for invalid values (every flag, each named with its value and
// what it must be), model defaults only for values that were not given, and given values kept.
#include "psflow/train/options.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "psflow/nn/model.h"

namespace psflow::train {
namespace {

using ::testing::StartsWith;

TEST(ResolveTrainOptionsTest, UnsetValuesTakeTheModelsDefaults) {
  TrainOptions o;
  o.model = "cnn";
  ASSERT_TRUE(ResolveTrainOptions(&o).ok());
  EXPECT_EQ(*o.train_steps, 2000);
  EXPECT_EQ(*o.batch_size, 128);
  EXPECT_EQ(o.optimizer, "rmsprop");
  EXPECT_FLOAT_EQ(*o.learning_rate, 1e-3f);
  EXPECT_EQ(*o.lr_decay_steps, 1000);
  EXPECT_FLOAT_EQ(*o.lr_decay_rate, 0.5f);
}

TEST(ResolveTrainOptionsTest, GivenValuesAreKept) {
  TrainOptions o;
  o.model = "cnn";
  o.train_steps = 7;
  o.batch_size = 3;
  o.learning_rate = 0.25f;
  o.lr_decay_steps = 0;
  o.lr_decay_rate = 0.9f;
  ASSERT_TRUE(ResolveTrainOptions(&o).ok());
  EXPECT_EQ(*o.train_steps, 7);
  EXPECT_EQ(*o.batch_size, 3);
  EXPECT_FLOAT_EQ(*o.learning_rate, 0.25f);
  EXPECT_EQ(*o.lr_decay_steps, 0);
  EXPECT_EQ(OptimizerConfigFrom(o).decay_steps, 0);
  EXPECT_FLOAT_EQ(OptimizerConfigFrom(o).decay_rate, 0.9f);
}

// A model registered with ModelDefaults{} gets a value for every setting (the fields had no
// initial values: --local_replicas=1 was refused against a --batch_size=0 nobody gave).
TEST(ResolveTrainOptionsTest, ARegisteredModelsUnsetDefaultsAreUsable) {
  nn::RegisterModel(
      "defaults_only", [](const nn::ModelConfig&, Rng&) { return std::unique_ptr<nn::Model>(); }, nn::ModelDefaults{});
  TrainOptions o;
  o.model = "defaults_only";
  ASSERT_TRUE(ResolveTrainOptions(&o).ok());
  EXPECT_EQ(*o.batch_size, 100);
  EXPECT_EQ(*o.train_steps, 1000);
  EXPECT_EQ(o.optimizer, "sgd");
  EXPECT_FLOAT_EQ(*o.learning_rate, 0.01f);
  EXPECT_EQ(*o.lr_decay_steps, 0);
  EXPECT_FLOAT_EQ(*o.lr_decay_rate, 1.0f);
}

struct Invalid {
  std::string expected;  // the start of the message
  std::function<void(TrainOptions&)> set;
};

TEST(ResolveTrainOptionsTest, EveryInvalidValueIsInvalidArgumentNamingTheFlagAndValue) {
  const std::vector<Invalid> cases = {
      {"--train_steps=-5 must be positive; leave it out for the model's default (10000)",
       [](TrainOptions& o) { o.train_steps = -5; }},
      {"--train_steps=0 must be positive", [](TrainOptions& o) { o.train_steps = 0; }},
      {"--batch_size=0 must be positive", [](TrainOptions& o) { o.batch_size = 0; }},
      {"--learning_rate=-1 must be a positive number", [](TrainOptions& o) { o.learning_rate = -1.0f; }},
      {"--learning_rate=nan must be a positive number", [](TrainOptions& o) { o.learning_rate = std::nanf(""); }},
      {"--lr_decay_steps=-2 must be 0 (no decay) or positive", [](TrainOptions& o) { o.lr_decay_steps = -2; }},
      {"--lr_decay_rate=-0.5 must be a positive number", [](TrainOptions& o) { o.lr_decay_rate = -0.5f; }},
      {"--hidden_units=0 must be positive", [](TrainOptions& o) { o.hidden_units = 0; }},
      {"--intra_op_threads=0 must be at least 1", [](TrainOptions& o) { o.intra_op_threads = 0; }},
      {"--local_replicas=0 must be at least 1", [](TrainOptions& o) { o.local_replicas = 0; }},
      {"--local_replicas=8 must be at most --batch_size=4",
       [](TrainOptions& o) {
         o.local_replicas = 8;
         o.batch_size = 4;
       }},
      {"--log_every=0 must be positive", [](TrainOptions& o) { o.log_every = 0; }},
      {"--replicas_to_aggregate=-1 must be 0", [](TrainOptions& o) { o.replicas_to_aggregate = -1; }},
      {"--total_num_replicas=-1 must be 0", [](TrainOptions& o) { o.total_num_replicas = -1; }},
      {"--save_checkpoint_steps=-3 must be 0 (not by steps) or positive",
       [](TrainOptions& o) { o.save_checkpoint_steps = -3; }},
      {"--save_checkpoint_secs=-1 must be 0", [](TrainOptions& o) { o.save_checkpoint_secs = -1; }},
      {"--save_summaries_steps=0 must be positive", [](TrainOptions& o) { o.save_summaries_steps = 0; }},
      {"--metrics_port=-1 must be a port in 1..65535", [](TrainOptions& o) { o.metrics_port = -1; }},
      {"--sync_timeout_secs=0 must be a positive number of seconds", [](TrainOptions& o) { o.sync_timeout_secs = 0; }},
      {"--rpc_timeout_secs=-1 must be a positive number of seconds", [](TrainOptions& o) { o.rpc_timeout_secs = -1; }},
      {"--max_message_mb=0 must be between 1 and 2047", [](TrainOptions& o) { o.max_message_mb = 0; }},
      {"--transport=tcp must be grpc or shm", [](TrainOptions& o) { o.transport = "tcp"; }},
      {"unknown model 'resnet'", [](TrainOptions& o) { o.model = "resnet"; }},
  };
  for (const Invalid& c : cases) {
    TrainOptions o;
    c.set(o);
    const absl::Status s = ResolveTrainOptions(&o);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.expected;
    EXPECT_THAT(std::string(s.message()), StartsWith(c.expected));
  }
}

}  // namespace
}  // namespace psflow::train
