// Checkpoints on a disk that misbehaves, through the fault-injecting Env over real
// files: a full disk at every write of a save, every file operation of a save failing in turn, a
// crash before every operation of a save (including between write and rename), a failing fsync,
// a failing close. Each must leave the previous checkpoint loadable with its exact values, and
// the failed save must say in one line which file failed and why. Every injected fault and its
// outcome is printed ("fault: ... -> ...") for the record.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <iostream>

#include "io/fault_injection_env.h"
#include "psflow/ckpt/checkpoint.h"

namespace psflow::ckpt {
namespace {

using io::FaultInjectionEnv;
using io::FileOp;
using ::testing::HasSubstr;
using ::testing::Not;

// Two variables with an optimizer slot, their values depending on the step.
struct Model {
  Tensor w, b, m;
  explicit Model(float step) : w({3, 5}), b({5}), m({3, 5}) {
    for (int64_t i = 0; i < w.size(); ++i) w[i] = step + 0.25f * i;
    for (int64_t i = 0; i < b.size(); ++i) b[i] = -step - i;
    for (int64_t i = 0; i < m.size(); ++i) m[i] = step * 0.5f + i;
  }
  std::vector<std::pair<std::string, const Tensor*>> Tensors() const {
    return {{"w", &w}, {"b", &b}, {SlotTensorName("w", "m"), &m}};
  }
};

void ExpectSame(const TensorFile& file, const Model& model) {
  for (const auto& [name, t] : model.Tensors()) {
    ASSERT_TRUE(file.tensors.count(name)) << name;
    const Tensor& got = file.tensors.at(name);
    ASSERT_EQ(got.shape(), t->shape()) << name;
    for (int64_t i = 0; i < t->size(); ++i) EXPECT_EQ(got[i], (*t)[i]) << name << "[" << i << "]";
  }
}

class CheckpointFaultsTest : public ::testing::Test {
 protected:
  // A directory holding one good checkpoint, at step 10.
  void SetUp() override {
    dir_ = (std::filesystem::temp_directory_path() / ("ckpt_faults_" + std::to_string(getpid()))).string();
    std::filesystem::remove_all(dir_);
    ASSERT_TRUE(SaveCheckpoint(dir_, 10, previous_.Tensors(), {{"model", "test"}}).ok());
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  void Restart() {
    std::filesystem::remove_all(dir_);
    SetUp();
  }

  std::string NewPath() const { return dir_ + "/model.ckpt-20.safetensors"; }

  // Saves step 20 through `env`, expecting a failure; checks what every failure must satisfy and
  // returns its message.
  std::string SaveExpectingFailure(FaultInjectionEnv& env) {
    auto saved = SaveCheckpoint(dir_, 20, next_.Tensors(), {{"model", "test"}}, 5, &env);
    EXPECT_FALSE(saved.ok()) << "the save succeeded despite " << ::testing::PrintToString(env.Fired());
    if (saved.ok()) return "";
    const std::string message(saved.status().message());
    EXPECT_THAT(message, HasSubstr("cannot save checkpoint " + NewPath() + ": "));
    EXPECT_THAT(message, HasSubstr("; the previous checkpoints are kept"));
    EXPECT_THAT(message, Not(HasSubstr("\n"))) << "one line";
    return message;
  }

  // After a failure (and a crash, if any): a restarted process finds a usable checkpoint — the
  // previous one with its exact values, or (only when the failure came after the rename) the new
  // complete one. The previous file is always still there and intact. Returns the step loaded.
  int64_t ExpectUsableCheckpoint() {
    std::vector<std::string> skipped;
    auto latest = LoadLatestCheckpoint(dir_, &skipped);
    EXPECT_TRUE(latest.ok() && latest->has_value()) << latest.status();
    EXPECT_TRUE(skipped.empty()) << "no torn checkpoint under a final name: " << ::testing::PrintToString(skipped);
    if (!latest.ok() || !latest->has_value()) return -1;
    const int64_t step = (*latest)->global_step;
    EXPECT_TRUE(step == 10 || step == 20) << step;
    ExpectSame((*latest)->contents, step == 10 ? previous_ : next_);
    auto old = ReadSafetensors(dir_ + "/model.ckpt-10.safetensors");
    EXPECT_TRUE(old.ok()) << old.status();
    if (old.ok()) ExpectSame(*old, previous_);
    return step;
  }

  bool TemporaryLeft() const { return std::filesystem::exists(NewPath() + ".tmp"); }

  // How many calls of `op` a clean save of step 20 makes.
  int64_t Counted(FileOp op) {
    FaultInjectionEnv env;
    EXPECT_TRUE(SaveCheckpoint(dir_, 20, next_.Tensors(), {{"model", "test"}}, 5, &env).ok());
    Restart();
    return env.Count(op);
  }

  // One line per fault fired: what was injected, and that the save failed while a checkpoint loads.
  void Report(const FaultInjectionEnv& env, int64_t step_loaded) const {
    for (std::string fired : env.Fired()) {
      for (size_t at; (at = fired.find(dir_)) != std::string::npos;) fired.replace(at, dir_.size(), "DIR");
      std::cout << "fault: " << fired << " -> save failed with a one-line error; step " << step_loaded << " loads\n";
    }
  }

  std::string dir_;
  const Model previous_{10}, next_{20};
};

TEST_F(CheckpointFaultsTest, ACleanSaveThroughTheFaultEnvWorks) {
  FaultInjectionEnv env;
  auto saved = SaveCheckpoint(dir_, 20, next_.Tensors(), {}, 5, &env);
  ASSERT_TRUE(saved.ok()) << saved.status();
  EXPECT_EQ(ExpectUsableCheckpoint(), 20);
  // A checkpoint is 1 create, 2 + tensors appends, 1 sync, 1 close, 1 rename, 1 directory sync.
  EXPECT_EQ(env.Count(FileOp::kAppend), 2 + 3);
  EXPECT_EQ(env.Count(FileOp::kSync), 1);
  EXPECT_EQ(env.Count(FileOp::kRename), 1);
  EXPECT_EQ(env.Count(FileOp::kSyncDir), 1);
}

TEST_F(CheckpointFaultsTest, AFullDiskAtEachWriteKeepsThePreviousCheckpoint) {
  const int64_t writes = Counted(FileOp::kAppend);
  ASSERT_GT(writes, 0);
  for (int64_t n = 1; n <= writes; ++n) {
    SCOPED_TRACE("disk full at write " + std::to_string(n));
    FaultInjectionEnv env;
    env.Inject({.op = FileOp::kAppend, .nth = n, .error = ENOSPC, .sticky = true, .partial = true});
    const std::string message = SaveExpectingFailure(env);
    EXPECT_THAT(message, HasSubstr("cannot write " + NewPath() + ".tmp: No space left on device"));
    EXPECT_EQ(ExpectUsableCheckpoint(), 10);
    EXPECT_FALSE(TemporaryLeft()) << "the torn temporary file is removed";
    Report(env, 10);
    Restart();
  }
}

TEST_F(CheckpointFaultsTest, EachFileOperationOfASaveFailingKeepsThePreviousCheckpoint) {
  for (FileOp op : {FileOp::kCreateDir, FileOp::kCreate, FileOp::kAppend, FileOp::kSync, FileOp::kClose,
                    FileOp::kRename, FileOp::kSyncDir}) {
    const int64_t calls = Counted(op);
    ASSERT_GT(calls, 0) << io::FileOpName(op);
    for (int64_t n = 1; n <= calls; ++n) {
      SCOPED_TRACE(std::string(io::FileOpName(op)) + " #" + std::to_string(n) + " fails");
      FaultInjectionEnv env;
      env.Inject({.op = op, .nth = n, .error = EIO});
      const std::string message = SaveExpectingFailure(env);
      EXPECT_THAT(message, HasSubstr("Input/output error"));
      const int64_t step = ExpectUsableCheckpoint();
      // Only a failure after the rename (the directory sync) can leave the new file in place.
      EXPECT_EQ(step, op == FileOp::kSyncDir ? 20 : 10);
      EXPECT_FALSE(TemporaryLeft());
      Report(env, step);
      Restart();
    }
  }
}

TEST_F(CheckpointFaultsTest, ACrashBeforeEachOperationOfASaveKeepsThePreviousCheckpoint) {
  const int64_t operations = Counted(FileOp::kAny);
  ASSERT_GT(operations, 0);
  for (int64_t n = 1; n <= operations; ++n) {
    SCOPED_TRACE("crash before operation " + std::to_string(n));
    FaultInjectionEnv env;
    env.Inject({.op = FileOp::kAny, .nth = n, .crash = true});
    const std::string message = SaveExpectingFailure(env);
    EXPECT_THAT(message, HasSubstr("simulated crash"));
    EXPECT_TRUE(env.crashed());
    // Nothing was made durable under the new name before the directory sync.
    EXPECT_EQ(ExpectUsableCheckpoint(), 10);
    Report(env, 10);
    // The restarted job saves again; its success also clears any temporary file the crash left.
    env.Reset();
    auto again = SaveCheckpoint(dir_, 30, next_.Tensors(), {}, 5, &env);
    ASSERT_TRUE(again.ok()) << again.status();
    EXPECT_FALSE(TemporaryLeft());
    Restart();
  }
}

// The other side of the crash tests: a crash just after a save returned keeps the new checkpoint
// whole (it would be torn without the fsync before the rename, and gone without the directory sync).
TEST_F(CheckpointFaultsTest, ACrashRightAfterASuccessfulSaveKeepsTheNewCheckpoint) {
  FaultInjectionEnv env;
  ASSERT_TRUE(SaveCheckpoint(dir_, 20, next_.Tensors(), {}, 5, &env).ok());
  env.Crash();
  EXPECT_EQ(ExpectUsableCheckpoint(), 20);
}

TEST_F(CheckpointFaultsTest, ACrashBetweenWriteAndRenameLeavesTheTemporaryFileAndThePreviousCheckpoint) {
  FaultInjectionEnv env;
  env.Inject({.op = FileOp::kRename, .nth = 1, .crash = true});
  const std::string message = SaveExpectingFailure(env);
  EXPECT_EQ(message, "cannot save checkpoint " + NewPath() + ": cannot rename " + NewPath() + ".tmp to " + NewPath() +
                         ": simulated crash; the previous checkpoints are kept");
  EXPECT_TRUE(TemporaryLeft()) << "the crash left the synced temporary file";
  EXPECT_FALSE(std::filesystem::exists(NewPath()));
  EXPECT_EQ(ExpectUsableCheckpoint(), 10);
  Report(env, 10);
  env.Reset();
  ASSERT_TRUE(SaveCheckpoint(dir_, 30, next_.Tensors(), {}, 5, &env).ok());
  EXPECT_FALSE(TemporaryLeft()) << "the next successful save removes it";
}

TEST_F(CheckpointFaultsTest, AFailingFsyncIsReportedNotIgnored) {
  FaultInjectionEnv env;
  env.Inject({.op = FileOp::kSync, .nth = 1, .error = EIO});
  const std::string message = SaveExpectingFailure(env);
  EXPECT_EQ(message, "cannot save checkpoint " + NewPath() + ": cannot sync " + NewPath() +
                         ".tmp: Input/output error; the previous checkpoints are kept");
  EXPECT_FALSE(std::filesystem::exists(NewPath()));
  EXPECT_EQ(ExpectUsableCheckpoint(), 10);
  Report(env, 10);
}

TEST_F(CheckpointFaultsTest, AFailingCloseIsReportedNotIgnored) {
  FaultInjectionEnv env;
  env.Inject({.op = FileOp::kClose, .nth = 1, .error = EIO});
  const std::string message = SaveExpectingFailure(env);
  EXPECT_EQ(message, "cannot save checkpoint " + NewPath() + ": cannot close " + NewPath() +
                         ".tmp: Input/output error; the previous checkpoints are kept");
  EXPECT_FALSE(std::filesystem::exists(NewPath()));
  EXPECT_EQ(ExpectUsableCheckpoint(), 10);
  Report(env, 10);
}

}  // namespace
}  // namespace psflow::ckpt
