// Training on a disk that misbehaves, through the fault-injecting Env over real files and real
// MNIST: TensorBoard events on a full disk are disabled with one log line and the
// training finishes; checkpoints on a disk that fills up are reported in one line each while the
// training goes on, the last good checkpoint stays loadable with exactly the values a clean run
// saved at that step; a --checkpoint_dir that cannot be created fails before training; and
// --metrics_json on a full disk fails in one line, leaving the previous file whole.
#include <unistd.h>

#include <cstdlib>
#include <filesystem>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "io/fault_injection_env.h"
#include "psflow/ckpt/checkpoint.h"
#include "psflow/train/train.h"
#include "tboard/event_reader.h"

namespace psflow::train {
namespace {

using io::FaultInjectionEnv;
using io::FileOp;
using ::testing::HasSubstr;
using ::testing::Not;

class TrainFileFaultsTest : public ::testing::Test {
 protected:
  void SetUp() override { std::filesystem::remove_all(dir_); }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // A small deterministic single-process run: 60 steps, summaries every 10, checkpoints every 20.
  TrainOptions Options(const std::string& name) {
    TrainOptions o;
    const char* source = std::getenv("PSFLOW_SOURCE_DIR");
    o.data_dir = std::string(source ? source : ".") + "/data/mnist";
    o.model = "mlp";
    o.hidden_units = 16;
    o.train_steps = 60;
    o.batch_size = 20;
    o.seed = 3;
    o.log_every = 1000;
    o.save_summaries_steps = 10;
    o.save_checkpoint_steps = 20;
    o.logdir = dir_ + "/" + name + "/logs";
    o.checkpoint_dir = dir_ + "/" + name + "/ckpt";
    EXPECT_TRUE(ResolveTrainOptions(&o).ok());
    return o;
  }

  std::vector<std::string> Matching(const std::string& part) const {
    std::vector<std::string> out;
    for (const std::string& line : log_) {
      if (line.find(part) != std::string::npos) out.push_back(line);
    }
    return out;
  }

  const std::string dir_ =
      (std::filesystem::temp_directory_path() / ("train_faults_" + std::to_string(getpid()))).string();
  std::vector<std::string> log_;
  LogSink sink_ = [this](const std::string& line) { log_.push_back(line); };
};

TEST_F(TrainFileFaultsTest, EventsOnAFullDiskAreDisabledInOneLineAndTrainingFinishes) {
  FaultInjectionEnv env;
  env.Inject({.op = FileOp::kAppend, .nth = 3, .error = ENOSPC, .sticky = true, .path_part = "tfevents"});
  TrainOptions options = Options("events");
  options.env = &env;
  auto summary = TrainSingleProcess(options, sink_);
  ASSERT_TRUE(summary.ok()) << summary.status();
  EXPECT_EQ(summary->global_step, 60);
  EXPECT_GT(summary->test_accuracy, 0.5);
  const auto disabled = Matching("TensorBoard events disabled");
  ASSERT_EQ(disabled.size(), 1u) << ::testing::PrintToString(log_);
  EXPECT_THAT(disabled[0], HasSubstr("cannot write " + options.logdir + "/events.out.tfevents."));
  EXPECT_THAT(disabled[0], HasSubstr(": No space left on device"));
  EXPECT_THAT(disabled[0], Not(HasSubstr("\n")));
  // The records written before the disk filled stay readable: file_version and the first summary.
  auto files = tboard::FindEventFiles(options.logdir);
  ASSERT_TRUE(files.ok() && files->size() == 1u);
  auto records = tboard::ReadEventFile(files->front());
  ASSERT_TRUE(records.ok()) << records.status();
  EXPECT_EQ(records->size(), 2u);
  // Checkpoints, on other files, were unaffected.
  EXPECT_EQ(ckpt::ListCheckpoints(options.checkpoint_dir).front().first, 60);
}

TEST_F(TrainFileFaultsTest, CheckpointsOnADiskThatFillsUpKeepTheLastGoodOne) {
  // A clean run: its checkpoint at step 20 is what the faulty run must keep.
  TrainOptions clean = Options("clean");
  ASSERT_TRUE(TrainSingleProcess(clean, sink_).ok());
  auto expected = ckpt::ReadSafetensors(clean.checkpoint_dir + "/model.ckpt-20.safetensors");
  ASSERT_TRUE(expected.ok()) << expected.status();

  // The disk fills during the second save (step 40) and stays full.
  FaultInjectionEnv env;
  TrainOptions options = Options("full");
  options.env = &env;
  log_.clear();
  // Each save of the mlp appends 2 + (4 variables x 3 tensors: value, Adam m, v) pieces: the
  // disk is full from the 3rd write of the second save on (a miscount fails the asserts below).
  env.Inject({.op = FileOp::kAppend, .nth = 14 + 3, .error = ENOSPC, .sticky = true, .path_part = "model.ckpt"});
  auto summary = TrainSingleProcess(options, sink_);
  ASSERT_FALSE(summary.ok()) << "the final save cannot succeed on a full disk";
  const std::string final_error(summary.status().message());
  EXPECT_EQ(final_error, "cannot save checkpoint " + options.checkpoint_dir +
                             "/model.ckpt-60.safetensors: cannot write " + options.checkpoint_dir +
                             "/model.ckpt-60.safetensors.tmp: No space left on device; the "
                             "previous checkpoints are kept");
  // The periodic save at step 40 failed with one line, and training went on to step 60.
  const auto failed = Matching("checkpoint failed: ");
  ASSERT_EQ(failed.size(), 1u) << ::testing::PrintToString(log_);
  EXPECT_THAT(failed[0], HasSubstr("model.ckpt-40.safetensors.tmp: No space left on device"));
  EXPECT_EQ(Matching("saved checkpoint ").size(), 1u);

  std::vector<std::string> skipped;
  auto latest = ckpt::LoadLatestCheckpoint(options.checkpoint_dir, &skipped);
  ASSERT_TRUE(latest.ok() && latest->has_value()) << latest.status();
  EXPECT_TRUE(skipped.empty());
  EXPECT_EQ((*latest)->global_step, 20);
  ASSERT_EQ((*latest)->contents.tensors.size(), expected->tensors.size());
  for (const auto& [name, t] : expected->tensors) {
    const Tensor& got = (*latest)->contents.tensors.at(name);
    ASSERT_EQ(got.shape(), t.shape()) << name;
    for (int64_t i = 0; i < t.size(); ++i) ASSERT_EQ(got[i], t[i]) << name << "[" << i << "]";
  }
  EXPECT_FALSE(std::filesystem::exists(options.checkpoint_dir + "/model.ckpt-40.safetensors.tmp"));
  EXPECT_FALSE(std::filesystem::exists(options.checkpoint_dir + "/model.ckpt-60.safetensors.tmp"));
}

TEST_F(TrainFileFaultsTest, ACheckpointDirThatCannotBeCreatedFailsBeforeTraining) {
  FaultInjectionEnv env;
  env.Inject({.op = FileOp::kCreateDir, .nth = 1, .error = EACCES, .path_part = "/ckpt"});
  TrainOptions options = Options("denied");
  options.env = &env;
  auto summary = TrainSingleProcess(options, sink_);
  ASSERT_FALSE(summary.ok());
  EXPECT_EQ(summary.status().message(), "cannot create the directory " + options.checkpoint_dir +
                                            ": Permission denied; pick a writable --checkpoint_dir");
  EXPECT_TRUE(Matching("step ").empty() && Matching("training ").empty()) << "nothing was trained";
}

TEST_F(TrainFileFaultsTest, MetricsJsonOnAFullDiskFailsInOneLineAndKeepsThePreviousFile) {
  std::filesystem::create_directories(dir_);
  const std::string path = dir_ + "/metrics.json";
  RunSummary summary;
  summary.model = "mlp";
  summary.global_step = 10;
  ASSERT_TRUE(WriteSummaryJson(summary, path).ok());
  const std::string before = *io::Env::Default()->ReadFileToString(path);
  EXPECT_THAT(before, HasSubstr("\"global_step\":10"));

  for (FileOp op : {FileOp::kAppend, FileOp::kSync, FileOp::kClose, FileOp::kRename}) {
    FaultInjectionEnv env;
    env.Inject({.op = op, .nth = 1, .error = op == FileOp::kAppend ? ENOSPC : EIO});
    summary.global_step = 20;
    absl::Status s = WriteSummaryJson(summary, path, &env);
    ASSERT_FALSE(s.ok()) << io::FileOpName(op);
    EXPECT_THAT(s.message(), HasSubstr("cannot write --metrics_json=" + path + ": cannot "));
    EXPECT_THAT(s.message(), HasSubstr(op == FileOp::kAppend ? "No space left on device" : "Input/output error"));
    EXPECT_THAT(s.message(), Not(HasSubstr("\n")));
    EXPECT_EQ(*io::Env::Default()->ReadFileToString(path), before) << io::FileOpName(op);
    EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
  }
}

}  // namespace
}  // namespace psflow::train
