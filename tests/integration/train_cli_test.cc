// `psflow train` in one process, run as a real process on real MNIST: accuracy, the summary
// JSON, determinism, local replicas, one-line errors for bad input (one exit status per kind:
// 2 for a usage error, 1 for a missing or broken file), --help with defaults and --version.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>

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
  for (const char* key :
       {"workers", "ps", "train_seconds", "examples_per_sec", "stale_gradients_dropped", "ps_traffic"}) {
    EXPECT_TRUE(m.contains(key)) << key;
  }
}

TEST(TrainCliTest, SameSeedGivesBitIdenticalParameters) {
  std::vector<std::map<std::string, Tensor>> runs;
  for (int i = 0; i < 2; ++i) {
    const std::string dir = TempDir("determinism_" + std::to_string(i));
    auto r = RunProcess(Psflow({"train", "--model=mlp", "--train_steps=200", "--seed=7", "--data_dir=" + MnistDir(),
                                "--checkpoint_dir=" + dir}),
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
    auto r = RunProcess(
        Psflow({"train", "--model=mlp", "--train_steps=20", "--batch_size=64",
                "--local_replicas=" + std::to_string(replicas), "--data_dir=" + MnistDir(), "--checkpoint_dir=" + dir}),
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
  int exit_code;         // 2: a usage error (a flag or its value); 1: anything else (docs/bad-input.md)
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
  for (const std::string& f : GetParam().flags)
    args.push_back(f == "@TRUNCATED@" ? "--data_dir=" + TruncatedMnist() : f);
  auto r = RunProcess(Psflow(args), 60);
  EXPECT_EQ(r.exit_code, GetParam().exit_code) << r.output;
  EXPECT_EQ(CountLines(r.output), 1) << r.output;
  EXPECT_NE(r.output.find(GetParam().expected), std::string::npos) << r.output;
}

INSTANTIATE_TEST_SUITE_P(
    Cases, TrainBadInputTest,
    ::testing::Values(
        BadInput{"MissingDataDir", {"--data_dir=/nonexistent/mnist"}, "/nonexistent/mnist", 1},
        BadInput{"TruncatedIdx", {"@TRUNCATED@"}, "truncated", 1},
        BadInput{"UnknownModel", {"--model=resnet"}, "unknown model 'resnet'", 2},
        BadInput{"UnknownOptimizer", {"--optimizer=lion"}, "unknown optimizer 'lion'", 2},
        BadInput{"ZeroBatch", {"--batch_size=0"}, "--batch_size=0 must be positive", 2},
        BadInput{"NegativeBatch", {"--batch_size=-3"}, "--batch_size=-3 must be positive", 2},
        // Said "Could not convert: --batch_size = many": every number flag says what it must be.
        BadInput{"NotANumber", {"--batch_size=many"}, "psflow: error: --batch_size=many must be an integer", 2},
        BadInput{"NotAnInteger", {"--train_steps=abc"}, "psflow: error: --train_steps=abc must be an integer", 2},
        BadInput{"NotAFloat", {"--learning_rate=fast"}, "psflow: error: --learning_rate=fast must be a number", 2},
        BadInput{"NegativeSeed", {"--seed=-1"}, "psflow: error: --seed=-1 must be a non-negative integer", 2},
        BadInput{"IntegerTooLarge",
                 {"--batch_size=3000000000"},
                 "--batch_size=3000000000 must be an integer from -2147483648 to 2147483647",
                 2},
        BadInput{"UnknownFlag", {"--bogus=1"}, "--bogus=1 (see psflow train --help)", 2},
        BadInput{"ZeroTimeout", {"--ps_timeout_secs=0"}, "--ps_timeout_secs=0 must be a positive number", 2},
        BadInput{"MessageLimitOverGrpcs", {"--max_message_mb=4096"}, "between 1 and 2047", 2},
        // Negative values were taken as "the model's default" (train_steps) or silently accepted.
        BadInput{"NegativeTrainSteps",
                 {"--train_steps=-5"},
                 "--train_steps=-5 must be positive; leave it out for the model's default (10000)",
                 2},
        BadInput{"NegativeLearningRate", {"--learning_rate=-1"}, "--learning_rate=-1 must be a positive number", 2},
        BadInput{"NegativeCheckpointSteps",
                 {"--save_checkpoint_steps=-3"},
                 "--save_checkpoint_steps=-3 must be 0 (not by steps) or positive",
                 2},
        BadInput{"NegativeDecayRate", {"--lr_decay_rate=-0.5"}, "--lr_decay_rate=-0.5 must be a positive number", 2},
        BadInput{"NegativeDecaySteps", {"--lr_decay_steps=-1"}, "--lr_decay_steps=-1 must be 0 (no decay)", 2},
        // Exited 1 (found when the model was built) while --batch_size=0 exited 2.
        BadInput{"ZeroHiddenUnits", {"--hidden_units=0"}, "--hidden_units=0 must be positive", 2},
        BadInput{
            "NegativeSummarySteps", {"--save_summaries_steps=-1"}, "--save_summaries_steps=-1 must be positive", 2},
        BadInput{
            "MetricsPortOutOfRange", {"--metrics_port=70000"}, "--metrics_port=70000 must be a port in 1..65535", 2}),
    [](const auto& info) { return info.param.name; });

// The missing-data error names a script, and the README names that script too (it named only
// run_mnist.sh and test.sh, which run setup.sh first).
TEST(TrainCliTest, TheDataDirErrorNamesAScriptTheReadmeNames) {
  auto r = RunProcess(Psflow({"train", "--data_dir=/nonexistent/mnist"}), 60);
  EXPECT_EQ(r.exit_code, 1) << r.output;
  const size_t at = r.output.find("scripts/");
  ASSERT_NE(at, std::string::npos) << r.output;
  const std::string script = r.output.substr(at, r.output.find(' ', at) - at);
  std::ifstream readme(std::string(std::getenv("PSFLOW_SOURCE_DIR")) + "/README.md");
  ASSERT_TRUE(readme.good());
  const std::string text((std::istreambuf_iterator<char>(readme)), std::istreambuf_iterator<char>());
  EXPECT_NE(text.find("`" + script + "`"), std::string::npos) << script << " is not named in README.md";
}

// The same rule in `eval`, which reads the model flags too.
TEST(TrainCliTest, EvalRejectsABadValueAsAUsageError) {
  auto r = RunProcess(Psflow({"eval", "--checkpoint_dir=/nonexistent", "--hidden_units=0"}), 60);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_EQ(CountLines(r.output), 1) << r.output;
  EXPECT_NE(r.output.find("--hidden_units=0 must be positive"), std::string::npos) << r.output;
}

// A parse error points at the subcommand whose --help lists the flags, not at `psflow --help`.
TEST(TrainCliTest, ParseErrorsNameTheSubcommandsHelp) {
  for (const auto& [args, help] : std::vector<std::pair<std::vector<std::string>, std::string>>{
           {{"train", "--bogus"}, "(see psflow train --help)"},
           {{"eval", "--checkpoint_dir=x", "--bogus"}, "(see psflow eval --help)"},
           {{"bench", "transport", "--transport=tcp"}, "(see psflow bench transport --help)"},
           {{"frobnicate"}, "(see psflow --help)"}}) {
    auto r = RunProcess(Psflow(args), 60);
    EXPECT_EQ(r.exit_code, 2) << r.output;
    EXPECT_EQ(CountLines(r.output), 1) << r.output;
    EXPECT_NE(r.output.find(help), std::string::npos) << r.output;
  }
}

// A mistyped subcommand is named, with the closest one (it said "A subcommand is required").
TEST(TrainCliTest, AnUnknownSubcommandIsNamedWithTheClosestOne) {
  for (const auto& [args, expected] : std::vector<std::pair<std::vector<std::string>, std::string>>{
           {{"trian", "--model=mlp"},
            "psflow: error: unknown subcommand 'trian'; the closest is 'train' (see psflow --help)"},
           {{"lcoal"}, "psflow: error: unknown subcommand 'lcoal'; the closest is 'local' (see psflow --help)"},
           {{"bench", "transprt"},
            "psflow: error: unknown subcommand 'transprt'; the closest is 'transport' (see psflow bench --help)"}}) {
    auto r = RunProcess(Psflow(args), 60);
    EXPECT_EQ(r.exit_code, 2) << r.output;
    EXPECT_EQ(CountLines(r.output), 1) << r.output;
    EXPECT_NE(r.output.find(expected), std::string::npos) << r.output;
  }
}

// `psflow local` runs its tasks over shared memory unless told otherwise, and its --help says so
// (it showed train's --transport=grpc).
TEST(TrainCliTest, LocalHelpShowsTheTransportLocalUses) {
  auto r = RunProcess(Psflow({"local", "--help"}), 60);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("--transport TEXT=shm"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("--transport TEXT=grpc"), std::string::npos) << r.output;
}

// Every flag's --help line shows its default: the value itself, or each seed model's.
TEST(TrainCliTest, HelpShowsEveryDefault) {
  auto r = RunProcess(Psflow({"train", "--help"}), 60);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (const char* line : {"--hidden_units INT=100", "--data_dir TEXT=data/mnist", "--ps_timeout_secs FLOAT=120",
                           "--max_message_mb INT=1024", "--transport TEXT=grpc", "--log_every INT=100",
                           "(default: the model's: softmax 1000, mlp 10000, cnn 2000, vgg19 100, ctr 1000)",
                           "(default: the model's: softmax sgd, mlp adam, cnn rmsprop, vgg19 sgd, ctr adam)"}) {
    EXPECT_NE(r.output.find(line), std::string::npos) << line << " missing from:\n" << r.output;
  }
}

TEST(TrainCliTest, VersionPrintsTheVersionAndExitsZero) {
  auto r = RunProcess(Psflow({"--version"}), 60);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(CountLines(r.output), 1) << r.output;
  EXPECT_EQ(r.output.rfind("psflow ", 0), 0u) << r.output;
  EXPECT_EQ(r.output.find("subcommand"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace psflow::testing
