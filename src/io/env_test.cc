// The POSIX Env on real files in a temporary directory: what is written reads back, directories
// list and sync, renames replace, errors name the operation, the path and the cause — including
// a real "No space left on device" from /dev/full.
#include "psflow/io/env.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>

namespace psflow::io {
namespace {

using ::testing::HasSubstr;
using ::testing::UnorderedElementsAre;

std::string FreshDir(const std::string& name) {
  auto dir = std::filesystem::temp_directory_path() / (name + "_" + std::to_string(getpid()));
  std::filesystem::remove_all(dir);
  return dir.string();
}

TEST(PosixEnvTest, WritesReadBackListRenameAndRemove) {
  Env* env = Env::Default();
  const std::string dir = FreshDir("env_basic") + "/a/b";
  ASSERT_TRUE(env->CreateDir(dir).ok());
  ASSERT_TRUE(env->CreateDir(dir).ok()) << "an existing directory is fine";
  auto file = env->NewWritableFile(dir + "/f");
  ASSERT_TRUE(file.ok()) << file.status();
  const std::string big(200 * 1024, 'x');  // larger than the write buffer
  ASSERT_TRUE((*file)->Append("head:").ok());
  ASSERT_TRUE((*file)->Append(big).ok());
  ASSERT_TRUE((*file)->Append(":tail").ok());
  ASSERT_TRUE((*file)->Sync().ok());
  ASSERT_TRUE((*file)->Close().ok());
  EXPECT_FALSE((*file)->Append("late").ok()) << "a closed file refuses writes";
  auto read = env->ReadFileToString(dir + "/f");
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(*read, "head:" + big + ":tail");

  ASSERT_TRUE(env->RenameFile(dir + "/f", dir + "/g").ok());
  ASSERT_TRUE(env->SyncDir(dir).ok());
  EXPECT_FALSE(env->FileExists(dir + "/f"));
  EXPECT_TRUE(env->FileExists(dir + "/g"));
  ASSERT_TRUE(env->CreateDir(dir + "/sub").ok());
  auto children = env->GetChildren(dir);
  ASSERT_TRUE(children.ok());
  EXPECT_THAT(*children, UnorderedElementsAre("g", "sub"));
  ASSERT_TRUE(env->RemoveFile(dir + "/g").ok());
  EXPECT_FALSE(env->FileExists(dir + "/g"));
}

TEST(PosixEnvTest, FlushHandsDataToTheSystemAndExclusiveCreateRefusesAnExistingFile) {
  Env* env = Env::Default();
  const std::string dir = FreshDir("env_flush");
  ASSERT_TRUE(env->CreateDir(dir).ok());
  auto file = env->NewWritableFile(dir + "/events", Env::CreateMode::kExclusive);
  ASSERT_TRUE(file.ok());
  ASSERT_TRUE((*file)->Append("record1").ok());
  ASSERT_TRUE((*file)->Flush().ok());
  EXPECT_EQ(*env->ReadFileToString(dir + "/events"), "record1");  // visible before Close
  auto again = env->NewWritableFile(dir + "/events", Env::CreateMode::kExclusive);
  ASSERT_FALSE(again.ok());
  EXPECT_TRUE(absl::IsAlreadyExists(again.status())) << again.status();
  ASSERT_TRUE((*file)->Close().ok());
}

TEST(PosixEnvTest, ErrorsNameTheOperationThePathAndTheCause) {
  Env* env = Env::Default();
  const std::string missing = FreshDir("env_missing") + "/nowhere";
  auto file = env->NewWritableFile(missing + "/f");
  ASSERT_FALSE(file.ok());
  EXPECT_EQ(file.status().message(), "cannot create " + missing + "/f: No such file or directory");
  EXPECT_TRUE(absl::IsNotFound(file.status()));
  auto read = env->ReadFileToString(missing);
  EXPECT_TRUE(absl::IsNotFound(read.status())) << read.status();
  EXPECT_THAT(env->RenameFile(missing, missing + "2").message(), HasSubstr(missing));
  EXPECT_FALSE(env->GetChildren(missing).ok());
  EXPECT_FALSE(env->SyncDir(missing).ok());
  // A directory where a file stands.
  const std::string dir = FreshDir("env_notdir");
  ASSERT_TRUE(env->CreateDir(dir).ok());
  ASSERT_TRUE((*env->NewWritableFile(dir + "/plain"))->Close().ok());
  absl::Status s = env->CreateDir(dir + "/plain/sub");
  EXPECT_FALSE(s.ok());
  EXPECT_THAT(s.message(), HasSubstr(dir + "/plain/sub"));
}

TEST(PosixEnvTest, ASequentialFileReadsInPiecesUpToItsEnd) {
  Env* env = Env::Default();
  const std::string dir = FreshDir("env_sequential");
  ASSERT_TRUE(env->CreateDir(dir).ok());
  std::string content(100000, '\0');
  for (size_t i = 0; i < content.size(); ++i) content[i] = static_cast<char>(i * 31 + 7);
  ASSERT_TRUE(WriteFileAtomically(env, dir + "/f", {content}).ok());
  auto file = env->NewSequentialFile(dir + "/f");
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ((*file)->path(), dir + "/f");
  std::string got;
  char buf[30000];
  for (size_t expected : {30000, 30000, 30000, 10000, 0, 0}) {
    absl::StatusOr<size_t> n = (*file)->Read(buf, sizeof(buf));
    ASSERT_TRUE(n.ok()) << n.status();
    EXPECT_EQ(*n, expected) << "fewer bytes than asked only at the end";
    got.append(buf, *n);
  }
  EXPECT_EQ(got, content);
  // A file larger than ReadFileToString's first pieces comes back whole.
  const std::string big(3 << 20, 'y');
  ASSERT_TRUE(WriteFileAtomically(env, dir + "/big", {big, content}).ok());
  EXPECT_EQ(*env->ReadFileToString(dir + "/big"), big + content);
}

TEST(PosixEnvTest, ReadErrorsNameTheOperationThePathAndTheCause) {
  Env* env = Env::Default();
  const std::string dir = FreshDir("env_read_errors");
  ASSERT_TRUE(env->CreateDir(dir).ok());
  auto missing = env->NewSequentialFile(dir + "/none");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().message(), "cannot open " + dir + "/none: No such file or directory");
  EXPECT_TRUE(absl::IsNotFound(missing.status()));
  // A directory opens for reading, but read(2) fails on it.
  auto directory = env->NewSequentialFile(dir);
  ASSERT_TRUE(directory.ok()) << directory.status();
  char buf[16];
  absl::StatusOr<size_t> n = (*directory)->Read(buf, sizeof(buf));
  ASSERT_FALSE(n.ok());
  EXPECT_EQ(n.status().message(), "cannot read " + dir + ": Is a directory");
  EXPECT_EQ(env->ReadFileToString(dir).status().message(), "cannot read " + dir + ": Is a directory");
}

TEST(PosixEnvTest, AFullDeviceIsReportedAtFlushNamingThePath) {
  if (access("/dev/full", W_OK) != 0) GTEST_SKIP() << "no writable /dev/full here";
  auto file = Env::Default()->NewWritableFile("/dev/full");
  ASSERT_TRUE(file.ok()) << file.status();
  ASSERT_TRUE((*file)->Append("data").ok());  // buffered
  absl::Status s = (*file)->Flush();
  EXPECT_EQ(s.message(), "cannot write /dev/full: No space left on device");
  EXPECT_TRUE(absl::IsResourceExhausted(s)) << s;
  (void)(*file)->Close();
}

TEST(PosixEnvTest, WriteFileAtomicallyReplacesTheFileAndLeavesNoTemporary) {
  Env* env = Env::Default();
  const std::string dir = FreshDir("env_atomic");
  ASSERT_TRUE(env->CreateDir(dir).ok());
  const std::string path = dir + "/out.json";
  ASSERT_TRUE(WriteFileAtomically(env, path, {"old"}).ok());
  ASSERT_TRUE(WriteFileAtomically(env, path, {"{\"a\":", "1}", "\n"}).ok());
  EXPECT_EQ(*env->ReadFileToString(path), "{\"a\":1}\n");
  EXPECT_FALSE(env->FileExists(path + ".tmp"));
  EXPECT_EQ(DirName(path), dir);
  EXPECT_EQ(DirName("plain"), ".");
  EXPECT_EQ(DirName("/top"), "/");
}

}  // namespace
}  // namespace psflow::io
