// The fault-injecting Env on real files: the Nth call fails (once, or from then on), a failing
// write can leave half its data, and a simulated crash keeps exactly what was synced — data and
// directory entries — so the checkpoint tests built on it can fail only for the right reasons.
#include "io/fault_injection_env.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>

namespace psflow::io {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::string FreshDir(const std::string& name) {
  auto dir = std::filesystem::temp_directory_path() / (name + "_" + std::to_string(getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir.string();
}

std::string Read(const std::string& path) { return Env::Default()->ReadFileToString(path).value_or("<missing>"); }

TEST(FaultInjectionEnvTest, TheNthWriteFailsOnceOrFromThenOn) {
  const std::string dir = FreshDir("fault_nth");
  FaultInjectionEnv env;
  env.Inject({.op = FileOp::kAppend, .nth = 2, .error = ENOSPC});
  auto file = env.NewWritableFile(dir + "/f");
  ASSERT_TRUE(file.ok());
  EXPECT_TRUE((*file)->Append("a").ok());
  absl::Status s = (*file)->Append("b");
  EXPECT_EQ(s.message(), "cannot write " + dir + "/f: No space left on device");
  EXPECT_TRUE(absl::IsResourceExhausted(s));
  EXPECT_TRUE((*file)->Append("c").ok()) << "not sticky: only the 2nd fails";
  ASSERT_TRUE((*file)->Close().ok());
  EXPECT_EQ(Read(dir + "/f"), "ac");
  EXPECT_EQ(env.Count(FileOp::kAppend), 3);
  EXPECT_THAT(env.Fired(), ElementsAre("cannot write " + dir + "/f: No space left on device"));

  env.Reset();
  env.Inject({.op = FileOp::kAppend, .nth = 2, .error = ENOSPC, .sticky = true, .path_part = "full"});
  auto full = env.NewWritableFile(dir + "/full");
  auto other = env.NewWritableFile(dir + "/other");
  EXPECT_TRUE((*full)->Append("1").ok());
  EXPECT_FALSE((*full)->Append("2").ok());
  EXPECT_FALSE((*full)->Append("3").ok()) << "sticky: the disk stays full";
  EXPECT_TRUE((*other)->Append("x").ok()) << "other paths are not matched";
  EXPECT_TRUE((*other)->Close().ok());
}

TEST(FaultInjectionEnvTest, APartialWriteLeavesHalfTheData) {
  const std::string dir = FreshDir("fault_partial");
  FaultInjectionEnv env;
  env.Inject({.op = FileOp::kAppend, .nth = 1, .error = ENOSPC, .partial = true});
  auto file = env.NewWritableFile(dir + "/f");
  EXPECT_FALSE((*file)->Append("abcdef").ok());
  EXPECT_EQ(Read(dir + "/f"), "abc");
}

TEST(FaultInjectionEnvTest, SyncCloseRenameAndDirectoryFaultsReadLikeRealOnes) {
  const std::string dir = FreshDir("fault_kinds");
  FaultInjectionEnv env;
  env.Inject({.op = FileOp::kSync, .nth = 1, .error = EIO});
  env.Inject({.op = FileOp::kClose, .nth = 1, .error = EIO});
  env.Inject({.op = FileOp::kRename, .nth = 1, .error = EXDEV});
  env.Inject({.op = FileOp::kSyncDir, .nth = 1, .error = EIO});
  auto file = env.NewWritableFile(dir + "/f");
  ASSERT_TRUE((*file)->Append("x").ok());
  EXPECT_EQ((*file)->Sync().message(), "cannot sync " + dir + "/f: Input/output error");
  EXPECT_EQ((*file)->Close().message(), "cannot close " + dir + "/f: Input/output error");
  EXPECT_FALSE((*file)->Append("y").ok()) << "a file whose close failed is closed";
  EXPECT_THAT(env.RenameFile(dir + "/f", dir + "/g").message(), HasSubstr("Invalid cross-device link"));
  EXPECT_TRUE(env.FileExists(dir + "/f")) << "a failed call does nothing";
  EXPECT_EQ(env.SyncDir(dir).message(), "cannot sync the directory " + dir + ": Input/output error");
}

TEST(FaultInjectionEnvTest, OpenAndReadFaultsReadLikeRealOnes) {
  const std::string dir = FreshDir("fault_read");
  ASSERT_TRUE(WriteFileAtomically(Env::Default(), dir + "/f", {"0123456789"}).ok());
  FaultInjectionEnv env;
  env.Inject({.op = FileOp::kOpen, .nth = 1, .error = EACCES});
  auto refused = env.NewSequentialFile(dir + "/f");
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().message(), "cannot open " + dir + "/f: Permission denied");
  EXPECT_TRUE(absl::IsPermissionDenied(refused.status()));

  // The second read fails (an I/O error in the middle of the file); the reads around it work.
  env.Reset();
  env.Inject({.op = FileOp::kRead, .nth = 2, .error = EIO});
  auto file = env.NewSequentialFile(dir + "/f");
  ASSERT_TRUE(file.ok()) << file.status();
  char buf[4];
  EXPECT_EQ((*file)->Read(buf, 4).value_or(0), 4u);
  absl::StatusOr<size_t> failed = (*file)->Read(buf, 4);
  ASSERT_FALSE(failed.ok());
  EXPECT_EQ(failed.status().message(), "cannot read " + dir + "/f: Input/output error");
  EXPECT_EQ((*file)->Read(buf, 4).value_or(0), 4u);
  EXPECT_EQ(std::string(buf, 4), "4567") << "the failed read consumed nothing";
  EXPECT_EQ(env.Count(FileOp::kRead), 3);
  EXPECT_EQ(env.Count(FileOp::kOpen), 1);

  // ReadFileToString goes through the same operations.
  env.Reset();
  env.Inject({.op = FileOp::kRead, .nth = 1, .error = EIO});
  EXPECT_EQ(env.ReadFileToString(dir + "/f").status().message(), "cannot read " + dir + "/f: Input/output error");
  EXPECT_EQ(*env.ReadFileToString(dir + "/f"), "0123456789");
}

TEST(FaultInjectionEnvTest, ACrashKeepsOnlyWhatWasSynced) {
  const std::string dir = FreshDir("fault_crash");
  FaultInjectionEnv env;
  // synced: written, synced, renamed, directory synced — survives whole.
  auto synced = env.NewWritableFile(dir + "/synced.tmp");
  ASSERT_TRUE((*synced)->Append("durable").ok());
  ASSERT_TRUE((*synced)->Sync().ok());
  ASSERT_TRUE((*synced)->Close().ok());
  ASSERT_TRUE(env.RenameFile(dir + "/synced.tmp", dir + "/synced").ok());
  ASSERT_TRUE(env.SyncDir(dir).ok());
  // unsynced: flushed to the OS (visible now) but never synced — loses its data.
  auto unsynced = env.NewWritableFile(dir + "/unsynced");
  ASSERT_TRUE((*unsynced)->Append("volatile").ok());
  ASSERT_TRUE((*unsynced)->Flush().ok());
  EXPECT_EQ(Read(dir + "/unsynced"), "volatile");
  // tail: synced "keep", then "lost" appended and flushed.
  auto tail = env.NewWritableFile(dir + "/tail");
  ASSERT_TRUE((*tail)->Append("keep").ok());
  ASSERT_TRUE((*tail)->Sync().ok());
  ASSERT_TRUE((*tail)->Append("lost").ok());
  ASSERT_TRUE((*tail)->Flush().ok());
  // renamed: synced data, but the rename never made durable — the rename is undone.
  auto renamed = env.NewWritableFile(dir + "/renamed.tmp");
  ASSERT_TRUE((*renamed)->Append("data").ok());
  ASSERT_TRUE((*renamed)->Sync().ok());
  ASSERT_TRUE((*renamed)->Close().ok());
  ASSERT_TRUE(env.RenameFile(dir + "/renamed.tmp", dir + "/renamed").ok());

  env.Inject({.op = FileOp::kAppend, .nth = 1, .crash = true});
  absl::Status s = (*tail)->Append("never");
  EXPECT_TRUE(absl::IsAborted(s)) << s;
  EXPECT_THAT(s.message(), HasSubstr("simulated crash"));
  EXPECT_TRUE(env.crashed());
  EXPECT_TRUE(absl::IsAborted(env.RemoveFile(dir + "/synced"))) << "a crashed machine does nothing more";
  unsynced->reset();
  tail->reset();  // the dead process's buffers never reach the disk

  EXPECT_EQ(Read(dir + "/synced"), "durable");
  EXPECT_EQ(Read(dir + "/unsynced"), "");
  EXPECT_EQ(Read(dir + "/tail"), "keep");
  EXPECT_FALSE(Env::Default()->FileExists(dir + "/renamed"));
  EXPECT_EQ(Read(dir + "/renamed.tmp"), "data");
  EXPECT_THAT(env.Fired(), ElementsAre("crash before append of " + dir + "/tail"));

  env.Reset();
  EXPECT_FALSE(env.crashed());
  EXPECT_TRUE(env.RemoveFile(dir + "/synced").ok()) << "after Reset the disk works again";
}

}  // namespace
}  // namespace psflow::io
