// `psflow train` in one process, run as a real process on real MNIST: accuracy, the summary
// JSON, determinism, local replicas, and one-line errors for bad input.
#include <gtest/gtest.h>

#include <filesystem>

#include "test_util.h"

namespace psflow::testing {
namespace {

TEST(TrainCliTest, MlpLearnsMnistAndWritesTheSummary) {
  const std::string dir = TempDir("train_mlp");
  auto r = RunProcess(Psflow({"train", "--model=mlp", "--train_steps=1000", "--data_dir=" + MnistDir(),
                              "--metrics_json=" + dir + "/m.json", "--log_every=250"}),
                      300);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("step 250/1000 loss"), std::string::npos) << r.output;
  nlohmann::json m = ReadJson(dir + "/m.json");
  EXPECT_EQ(m["model"], "mlp");
  EXPECT_EQ(m["mode"], "single");
  EXPECT_EQ(m["global_step"], 1000);
  EXPECT_GT(m["test_accuracy"].get<double>(), 0.94);
  EXPECT_LT(m["validation_cross_entropy"].get<double>(), 0.25);
  for (const char* key : {"workers", "ps", "train_seconds", "examples_per_sec", "stale_gradients_dropped", "ps_traffic"}) {
    EXPECT_TRUE(m.contains(key)) << key;
  }
}

TEST(TrainCliTest, SameSeedGivesBitIdenticalParameters) {
  std::vector<std::map<std::string, Tensor>> runs;
  for (int i = 0; i < 2; ++i) {
    const std::string dir = TempDir("determinism_" + std::to_string(i));
    auto r = RunProcess(Psflow({"train", "--model=mlp", "--train_steps=200", "--seed=7",
                                "--data_dir=" + MnistDir(), "--checkpoint_dir=" + dir}),
                        300);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    runs.push_back(ReadFinalVariables(dir));
  }
  EXPECT_EQ(MaxRelativeDifference(runs[0], runs[1]), 0.0);
}

TEST(TrainCliTest, LocalReplicasComputeTheSameStepAsOne) {
  // K replicas each on a slice of the batch, gradients averaged = one replica on the whole batch.
  std::vector<std::map<std::string, Tensor>> runs;
  for (int replicas : {1, 2}) {
    const std::string dir = TempDir("replicas_" + std::to_string(replicas));
    auto r = RunProcess(Psflow({"train", "--model=mlp", "--train_steps=20", "--batch_size=64",
                                "--local_replicas=" + std::to_string(replicas), "--data_dir=" + MnistDir(),
                                "--checkpoint_dir=" + dir}),
                        300);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    runs.push_back(ReadFinalVariables(dir));
  }
  EXPECT_LT(MaxRelativeDifference(runs[1], runs[0]), 1e-4);
}

struct BadInput {
  std::string name;
  std::vector<std::string> flags;
  std::string expected;  // in the error line
};
void PrintTo(const BadInput& input, std::ostream* os) { *os << input.name; }

std::string TruncatedMnist() {
  const std::string dir = TempDir("truncated_mnist");
  for (const char* f : {"train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"}) {
    std::filesystem::copy_file(MnistDir() + "/" + f, dir + "/" + f);
  }
  std::filesystem::copy_file(MnistDir() + "/train-images-idx3-ubyte", dir + "/train-images-idx3-ubyte");
  std::filesystem::resize_file(dir + "/train-images-idx3-ubyte", 1000);
  return dir;
}

class TrainBadInputTest : public ::testing::TestWithParam<BadInput> {};

TEST_P(TrainBadInputTest, OneLineErrorAndNonZeroExit) {
  std::vector<std::string> args = {"train", "--train_steps=5"};
  for (const std::string& f : GetParam().flags) args.push_back(f == "@TRUNCATED@" ? "--data_dir=" + TruncatedMnist() : f);
  auto r = RunProcess(Psflow(args), 60);
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_LT(r.exit_code, 128) << "crashed: " << r.output;
  EXPECT_EQ(CountLines(r.output), 1) << r.output;
  EXPECT_NE(r.output.find(GetParam().expected), std::string::npos) << r.output;
}

INSTANTIATE_TEST_SUITE_P(
    Cases, TrainBadInputTest,
    ::testing::Values(BadInput{"MissingDataDir", {"--data_dir=/nonexistent/mnist"}, "/nonexistent/mnist"},
                      BadInput{"TruncatedIdx", {"@TRUNCATED@"}, "truncated"},
                      BadInput{"UnknownModel", {"--model=resnet"}, "unknown model 'resnet'"},
                      BadInput{"UnknownOptimizer", {"--optimizer=lion"}, "unknown optimizer 'lion'"},
                      BadInput{"ZeroBatch", {"--batch_size=0"}, "--batch_size=0 must be positive"},
                      BadInput{"NegativeBatch", {"--batch_size=-3"}, "--batch_size=-3 must be positive"},
                      BadInput{"NotANumber", {"--batch_size=many"}, "batch_size"},
                      BadInput{"UnknownFlag", {"--bogus=1"}, "bogus"},
                      BadInput{"ZeroTimeout", {"--ps_timeout_secs=0"}, "--ps_timeout_secs=0 must be a positive number"},
                      BadInput{"MessageLimitOverGrpcs", {"--max_message_mb=4096"}, "between 1 and 2047"}),
    [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace psflow::testing
