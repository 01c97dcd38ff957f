// The event writer on a disk that misbehaves, through the fault-injecting Env over real files: a
// full disk fails the record being added with one line naming the file and the cause, the records
// added before stay readable, and a failing fsync or close is reported, not ignored.
#include <unistd.h>

#include <filesystem>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "io/fault_injection_env.h"
#include "psflow/tboard/event_writer.h"
#include "tboard/event_reader.h"

namespace psflow::tboard {
namespace {

using io::FaultInjectionEnv;
using io::FileOp;
using ::testing::HasSubstr;
using ::testing::Not;

class EventWriterFaultsTest : public ::testing::Test {
 protected:
  void SetUp() override { std::filesystem::remove_all(dir_); }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  const std::string dir_ =
      (std::filesystem::temp_directory_path() / ("events_faults_" + std::to_string(getpid()))).string();
};

TEST_F(EventWriterFaultsTest, AFullDiskFailsTheRecordInOneLineAndKeepsTheEarlierOnes) {
  FaultInjectionEnv env;
  // Write 1 is the file_version record, 2 and 3 the first scalars; the disk is full from write 4 on.
  env.Inject({.op = FileOp::kAppend, .nth = 4, .error = ENOSPC, .sticky = true, .path_part = "tfevents"});
  auto writer = EventWriter::Create(dir_, &env);
  ASSERT_TRUE(writer.ok()) << writer.status();
  ASSERT_TRUE((*writer)->AddScalar("loss", 1.5f, 10).ok());
  ASSERT_TRUE((*writer)->AddScalars({{"loss", 1.0f}, {"accuracy", 0.5f}}, 20).ok());
  absl::Status full = (*writer)->AddScalar("loss", 0.5f, 30);
  EXPECT_EQ(full.message(), "cannot write " + (*writer)->path() + ": No space left on device");
  EXPECT_THAT(full.message(), Not(HasSubstr("\n")));
  EXPECT_TRUE(absl::IsResourceExhausted(full));
  EXPECT_FALSE((*writer)->AddSessionStart(40).ok()) << "the disk stays full";
  EXPECT_TRUE((*writer)->Close().ok()) << "nothing is left to write";

  auto records = ReadEventFile((*writer)->path());
  ASSERT_TRUE(records.ok()) << records.status();
  ASSERT_EQ(records->size(), 3u);
  EXPECT_EQ((*records)[0].file_version, "brain.Event:2");
  EXPECT_EQ((*records)[1].step, 10);
  EXPECT_EQ((*records)[2].step, 20);
  EXPECT_EQ((*records)[2].scalars.size(), 2u);
}

TEST_F(EventWriterFaultsTest, AFullDiskAtTheFirstRecordFailsCreateNamingTheFile) {
  FaultInjectionEnv env;
  env.Inject({.op = FileOp::kAppend, .nth = 1, .error = ENOSPC});
  auto writer = EventWriter::Create(dir_, &env);
  ASSERT_FALSE(writer.ok());
  EXPECT_THAT(writer.status().message(), HasSubstr("cannot write " + dir_ + "/events.out.tfevents."));
  EXPECT_THAT(writer.status().message(), HasSubstr(": No space left on device"));
}

TEST_F(EventWriterFaultsTest, AFailingFsyncOrCloseIsReported) {
  FaultInjectionEnv env;
  env.Inject({.op = FileOp::kSync, .nth = 1, .error = EIO});
  env.Inject({.op = FileOp::kClose, .nth = 1, .error = EIO});
  auto writer = EventWriter::Create(dir_, &env);
  ASSERT_TRUE(writer.ok()) << writer.status();
  ASSERT_TRUE((*writer)->AddScalar("loss", 1.5f, 10).ok());
  EXPECT_EQ((*writer)->Flush().message(), "cannot sync " + (*writer)->path() + ": Input/output error");
  EXPECT_EQ((*writer)->Close().message(), "cannot close " + (*writer)->path() + ": Input/output error");
  EXPECT_FALSE((*writer)->AddScalar("loss", 1.0f, 20).ok()) << "closed";
  auto records = ReadEventFile((*writer)->path());
  ASSERT_TRUE(records.ok()) << records.status();
  EXPECT_EQ(records->size(), 2u) << "the records handed to the system are in the file";
}

}  // namespace
}  // namespace psflow::tboard
