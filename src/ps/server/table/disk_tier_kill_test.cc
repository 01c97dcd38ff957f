// A table directory left by a killed ps task (DESIGN §11: the disk tier is a cache of the
// checkpoint): a real process (disk_tier_killed_writer) writes a disk table until RocksDB has table
// files on disk (or until its first run's file is written, before its ingest), and is killed with
// SIGKILL; a tier opened on the same --table_dir afterwards says it wiped the directory, and the table opened there
// holds no row the killed task wrote (its rows read as new ones, the initial values; its scan is empty) — never mixed
// into what a restore then loads.
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "ps/server/table/disk_store.h"
#include "ps/server/table/table_shard.h"
#include "ps/server/table/table_test_util.h"

extern char** environ;

namespace psflow::ps::table {
namespace {

namespace fs = std::filesystem;

int TableFiles(const std::string& dir) {
  int n = 0;
  std::error_code ec;
  for (const auto& e : fs::recursive_directory_iterator(dir, ec)) {
    // The database's files (NNNNNN.sst), not a run's before its ingest (run-N.sst): an ingest links
    // run-N.sst into the database and then removes that name, so both names may be there at once.
    const std::string name = e.path().filename().string();
    n += e.path().extension() == ".sst" && name.rfind("run-", 0) != 0 ? 1 : 0;
  }
  return n;
}

// Runs disk_tier_killed_writer on `root` (with `flag`, if any) until it is killed by its SIGKILL.
void RunKilledWriter(const std::string& root, const char* flag) {
  pid_t pid = 0;
  const std::string writer = DISK_TIER_KILLED_WRITER;
  std::vector<char*> argv = {const_cast<char*>(writer.c_str()), const_cast<char*>(root.c_str())};
  if (flag != nullptr) argv.push_back(const_cast<char*>(flag));
  argv.push_back(nullptr);
  ASSERT_EQ(posix_spawn(&pid, writer.c_str(), nullptr, nullptr, argv.data(), environ), 0) << writer;
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << "the writer exited with status " << status;
}

// A tier opened on `root` after the kill wipes what the task left, and its table "dyn" holds none of
// the rows the killed task wrote.
void ExpectWipedAndNoRowRead(const std::string& root) {
  std::vector<std::string> log;
  auto tier = DiskTier::Open({root, 1 << 20, 0}, [&](const std::string& line) { log.push_back(line); });
  ASSERT_TRUE(tier.ok()) << tier.status();  // the dead task's lock is free
  ASSERT_EQ(log.size(), 1u);
  EXPECT_NE(log[0].find("ps task 0: wiped 1 table directory left in " + root + "/ps_0 by a task that stopped"),
            std::string::npos)
      << log[0];
  EXPECT_EQ(TableFiles(root + "/ps_0"), 0);

  TableConfig config = testing::DynamicConfig(16);
  config.spec.initializer = dist::TableInitializer::Uniform(-1, 1, 7);  // the writer's
  auto shard = MakeTableShard(config, testing::Rule("sgd"), 0, 1, tier->get());
  ASSERT_TRUE(shard.ok()) << shard.status();
  auto fresh = MakeTableShard(config, testing::Rule("sgd"), 0, 1);  // in memory, empty
  ASSERT_TRUE(fresh.ok()) << fresh.status();
  // The first ids the writer pushed (surely written back: the cache holds 64 KiB).
  std::vector<int64_t> ids;
  for (int64_t id = 1000; id < 1256; ++id) ids.push_back(id);
  std::vector<float> on_disk(ids.size() * 16), initial(ids.size() * 16);
  ASSERT_TRUE((*shard)->Gather(ids, absl::MakeSpan(on_disk)).ok());
  ASSERT_TRUE((*fresh)->Gather(ids, absl::MakeSpan(initial)).ok());
  EXPECT_EQ(std::memcmp(on_disk.data(), initial.data(), on_disk.size() * sizeof(float)), 0)
      << "a row of the killed task was read";
  EXPECT_EQ((*shard)->stats().rows, 0);
  RowsPart part;
  EXPECT_FALSE((*shard)->Scan()->Next(100, &part));
  EXPECT_TRUE(part.ids.empty());
}

TEST(DiskTierKillTest, ATableDirLeftByAKilledTaskIsWipedAndNoneOfItsRowsIsRead) {
  const std::string root = testing::FreshTempDir("disk_tier_kill");
  ASSERT_NO_FATAL_FAILURE(RunKilledWriter(root, nullptr));
  // What the killed task left: its lock file and RocksDB table files of rows it wrote.
  ASSERT_GE(TableFiles(root + "/ps_0"), 2);
  ExpectWipedAndNoRowRead(root);
}

// A run interrupted by the kill: its file written in the table's directory and never ingested.
TEST(DiskTierKillTest, ARunKilledBeforeItsIngestIsWipedAndNoneOfItsRowsIsRead) {
  const std::string root = testing::FreshTempDir("disk_tier_kill_run");
  ASSERT_NO_FATAL_FAILURE(RunKilledWriter(root, "--before_ingest"));
  ASSERT_TRUE(fs::exists(root + "/ps_0/dyn/run-1.sst"));
  ASSERT_EQ(TableFiles(root + "/ps_0"), 0);  // the run's file only, no table file of the database
  ExpectWipedAndNoRowRead(root);
}

}  // namespace
}  // namespace psflow::ps::table
