// SetUpTask's reading of --cluster_secret_file through the Env of the options: the secret is the
// file's content without surrounding whitespace; a missing file, a file that cannot be opened, an
// I/O error while reading it and an empty file each fail in one line naming the flag and the file.
#include "train/cluster_setup.h"

#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "io/fault_injection_env.h"

namespace psflow::train {
namespace {

using io::FaultInjectionEnv;
using io::FileOp;
using ::testing::HasSubstr;
using ::testing::Not;

class SecretFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() / ("psflow_secret_" + std::to_string(getpid()));
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
    options_.job_name = "ps";
    options_.ps_hosts = "127.0.0.1:2222";
    options_.worker_hosts = "127.0.0.1:2223";
    options_.env = &env_;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string Write(const std::string& name, const std::string& content) {
    const std::string path = (dir_ / name).string();
    EXPECT_TRUE(io::WriteFileAtomically(io::Env::Default(), path, {content}).ok());
    return path;
  }
  // SetUpTask with the cluster from the flags alone ($TF_CONFIG ignored).
  absl::StatusOr<TaskSetup> SetUpFromFlags() { return SetUpTask(options_, std::string()); }

  std::filesystem::path dir_;
  FaultInjectionEnv env_;
  TrainOptions options_;
};

TEST_F(SecretFileTest, TheSecretIsTheFileWithoutSurroundingWhitespace) {
  options_.cluster_secret_file = Write("secret", "  5ecret-value\n\n");
  absl::StatusOr<TaskSetup> setup = SetUpFromFlags();
  ASSERT_TRUE(setup.ok()) << setup.status();
  EXPECT_EQ(setup->security.secret, "5ecret-value");
  EXPECT_EQ(env_.Count(FileOp::kOpen), 1) << "read through the options' Env";
}

TEST_F(SecretFileTest, EachFailureIsOneLineNamingTheFlagAndTheFile) {
  const std::string missing = (dir_ / "none").string();
  const std::string present = Write("secret", "5ecret\n");
  struct Case {
    std::string what, path;
    FileOp op;  // the operation failing, with errno `error` (a missing file needs no fault)
    int error;
    absl::StatusCode code;
    std::string cause;
  };
  const Case cases[] = {
      {"missing", missing, FileOp::kOpen, 0, absl::StatusCode::kNotFound,
       "cannot open " + missing + ": No such file or directory"},
      {"unreadable", present, FileOp::kOpen, EACCES, absl::StatusCode::kPermissionDenied,
       "cannot open " + present + ": Permission denied"},
      {"I/O error", present, FileOp::kRead, EIO, absl::ErrnoToStatusCode(EIO),
       "cannot read " + present + ": Input/output error"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    env_.Reset();
    if (c.error != 0) env_.Inject({.op = c.op, .nth = 1, .error = c.error});
    options_.cluster_secret_file = c.path;
    absl::Status s = SetUpFromFlags().status();
    EXPECT_EQ(s.code(), c.code) << s;
    EXPECT_EQ(s.message(), "--cluster_secret_file=" + c.path + " cannot be read (" + c.cause +
                               "); create it with a shared secret (e.g. `openssl rand -hex 32 > FILE`)");
    EXPECT_THAT(std::string(s.message()), Not(HasSubstr("\n")));
  }
  env_.Reset();
  options_.cluster_secret_file = Write("blank", " \n\t\n");
  absl::Status empty = SetUpFromFlags().status();
  EXPECT_EQ(empty.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(empty.message(), "--cluster_secret_file=" + options_.cluster_secret_file + " is empty");
}

}  // namespace
}  // namespace psflow::train
