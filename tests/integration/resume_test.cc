// Restart = resume, from the command line: a resumed run continues exactly where the checkpoint
// left it (checked against an uninterrupted run), onto another number of ps tasks and another
// partitioner, and `psflow eval` reads the result.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "psflow/ckpt/safetensors.h"
#include "test_util.h"

namespace psflow::testing {
namespace {

// The variables (no optimizer slots) of `dir`/model.ckpt-`step`.safetensors.
std::map<std::string, Tensor> VariablesAt(const std::string& dir, int64_t step) {
  auto file = ckpt::ReadSafetensors(absl::StrCat(dir, "/model.ckpt-", step, ".safetensors"));
  EXPECT_TRUE(file.ok()) << file.status();
  std::map<std::string, Tensor> variables;
  if (!file.ok()) return variables;
  for (auto& [name, t] : file->tensors) {
    if (name.find("/slot/") == std::string::npos) variables.emplace(name, std::move(t));
  }
  return variables;
}

int CountCheckpoints(const std::string& dir) {
  int n = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) n += entry.path().extension() == ".safetensors";
  return n;
}

TEST(ResumeTest, SingleProcessResumeIsBitIdenticalToAnUninterruptedRun) {
  const std::string resumed = TempDir("resume_single"), straight = TempDir("resume_single_ref");
  const std::vector<std::string> common = {"train", "--model=mlp", "--seed=5", "--data_dir=" + MnistDir(),
                                           "--save_checkpoint_steps=100"};
  auto with = [&](std::vector<std::string> extra) {
    std::vector<std::string> args = common;
    args.insert(args.end(), extra.begin(), extra.end());
    return Psflow(args);
  };
  auto first = RunProcess(with({"--train_steps=300", "--checkpoint_dir=" + resumed}), 300);
  ASSERT_EQ(first.exit_code, 0) << first.output;
  auto second = RunProcess(with({"--train_steps=500", "--checkpoint_dir=" + resumed}), 300);
  ASSERT_EQ(second.exit_code, 0) << second.output;
  EXPECT_NE(second.output.find("model.ckpt-300.safetensors at global step 300"), std::string::npos) << second.output;
  auto reference = RunProcess(with({"--train_steps=500", "--checkpoint_dir=" + straight}), 300);
  ASSERT_EQ(reference.exit_code, 0) << reference.output;
  // Variables, Adam's slots and step, and the data position all came back: nothing differs.
  EXPECT_EQ(MaxRelativeDifference(VariablesAt(resumed, 500), VariablesAt(straight, 500)), 0.0);
  EXPECT_EQ(CountCheckpoints(resumed), 5);  // 100..500: the last five are kept
}

TEST(ResumeTest, SyncClusterResumedOnAnotherPsCountAndPartitionerMatchesOneProcess) {
  // 2 ps with fixed:2 for 30 steps, then 1 ps unpartitioned for 30 more: sync with 2 workers of
  // batch 50 must still equal one process with batch 100 (docs/design.md#data-order), so the restore moved every
  // variable and slot whole across the different layout.
  const std::string dir = TempDir("resume_sync"), single = TempDir("resume_sync_single");
  const std::vector<std::string> common = {
      "local",           "--workers=2", "--sync_replicas",          "--model=mlp",
      "--batch_size=50", "--seed=3",    "--data_dir=" + MnistDir(), "--checkpoint_dir=" + dir};
  auto with = [&](std::vector<std::string> extra) {
    std::vector<std::string> args = common;
    args.insert(args.end(), extra.begin(), extra.end());
    return Psflow(args);
  };
  auto first = RunProcess(with({"--ps=2", "--partitioner=fixed:2", "--train_steps=30"}), 300);
  ASSERT_EQ(first.exit_code, 0) << first.output;
  auto second = RunProcess(with({"--ps=1", "--train_steps=60"}), 300);
  ASSERT_EQ(second.exit_code, 0) << second.output;
  EXPECT_NE(second.output.find("at global step 30"), std::string::npos) << second.output;
  auto reference = RunProcess(Psflow({"train", "--model=mlp", "--train_steps=60", "--batch_size=100", "--seed=3",
                                      "--data_dir=" + MnistDir(), "--checkpoint_dir=" + single}),
                              300);
  ASSERT_EQ(reference.exit_code, 0) << reference.output;
  EXPECT_LT(MaxRelativeDifference(VariablesAt(dir, 60), VariablesAt(single, 60)), 1e-4);
}

TEST(ResumeTest, EvalReadsTheNewestCheckpointAndAgreesWithTraining) {
  const std::string dir = TempDir("resume_eval");
  auto train = RunProcess(Psflow({"train", "--model=softmax", "--train_steps=200", "--data_dir=" + MnistDir(),
                                  "--checkpoint_dir=" + dir, "--metrics_json=" + dir + "/m.json"}),
                          300);
  ASSERT_EQ(train.exit_code, 0) << train.output;
  auto eval =
      RunProcess(Psflow({"eval", "--checkpoint_dir=" + dir, "--model=softmax", "--data_dir=" + MnistDir()}), 120);
  ASSERT_EQ(eval.exit_code, 0) << eval.output;
  const nlohmann::json m = ReadJson(dir + "/m.json");
  char expected[64];
  std::snprintf(expected, sizeof(expected), "test_accuracy=%.4f", m["test_accuracy"].get<double>());
  EXPECT_NE(eval.output.find(expected), std::string::npos) << eval.output << " vs " << expected;
  EXPECT_NE(eval.output.find("global_step=200"), std::string::npos) << eval.output;
  // A model that does not match the checkpoint is refused by name, not evaluated.
  auto wrong = RunProcess(Psflow({"eval", "--checkpoint_dir=" + dir, "--model=mlp", "--data_dir=" + MnistDir()}), 120);
  EXPECT_NE(wrong.exit_code, 0) << wrong.output;
  EXPECT_EQ(CountLines(wrong.output), 1) << wrong.output;
}

TEST(ResumeTest, ADivergedRunStopsAndLeavesTheCheckpointsFinite) {
  const std::string dir = TempDir("resume_diverged");
  const std::vector<std::string> common = {"train", "--model=mlp", "--data_dir=" + MnistDir(),
                                           "--checkpoint_dir=" + dir, "--save_checkpoint_steps=100"};
  auto with = [&](std::vector<std::string> extra) {
    std::vector<std::string> args = common;
    args.insert(args.end(), extra.begin(), extra.end());
    return Psflow(args);
  };
  ASSERT_EQ(RunProcess(with({"--train_steps=100"}), 300).exit_code, 0);
  // Resumed with an absurd learning rate: the parameters blow up and the loss turns NaN.
  auto r = RunProcess(with({"--train_steps=300", "--learning_rate=1e30"}), 300);
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("training diverged: the loss of step 10"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("--learning_rate"), std::string::npos) << r.output;
  EXPECT_EQ(CountCheckpoints(dir), 1) << r.output;  // nothing saved from the diverged run
  for (const auto& [name, t] : VariablesAt(dir, 100)) {
    for (int64_t i = 0; i < t.size(); ++i) ASSERT_TRUE(std::isfinite(t[i])) << name;
  }
}

TEST(ResumeTest, SavesEveryFewSecondsWhenAskedTo) {
  // --save_checkpoint_secs: a run of a few seconds saved at least twice before its final save.
  const std::string dir = TempDir("resume_secs");
  auto r = RunProcess(Psflow({"train", "--model=mlp", "--train_steps=3000", "--data_dir=" + MnistDir(),
                              "--checkpoint_dir=" + dir, "--save_checkpoint_secs=0.2"}),
                      300);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_GE(CountCheckpoints(dir), 3) << r.output;
}

}  // namespace
}  // namespace psflow::testing
