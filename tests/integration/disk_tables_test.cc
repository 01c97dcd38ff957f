// Disk tables end to end (docs/table-storage.md; DESIGN §11), real processes and files: a sync
// ctr job with --table_storage=disk and a row cache far smaller than its tables writes checkpoints
// byte-identical to the same job with memory tables, on 1 and 3 ps tasks, for adagrad (the ctr
// default) and lazy adam (per-row counts); its summary shows the cache and the disk. Bad input is
// one line: disk storage without --table_dir, a --table_dir that does not exist, a cache smaller
// than one push's rows (naming the ps, the table and the sizes). kill -9 of a ps task with disk
// tables mid-run (issue 26.5): the job resumes from its last save, with the ps restarted (the same
// number of ps tasks) or started again on another number of ps tasks; the steps since that save are
// the only ones lost, and the table directory the killed task left is wiped, never read; a sync job
// killed so ends with the bytes of the job run without the fault.
#include <signal.h>

#include <chrono>
#include <fstream>
#include <regex>
#include <thread>

#include "absl/strings/str_cat.h"
#include "process.h"
#include "psflow/ckpt/checkpoint.h"
#include "test_util.h"

namespace psflow::testing {
namespace {

// A row in the cache: 64 bytes of header and meta, then w and the rule's slots (dim 4).
constexpr int64_t kCacheBytes = 30000;  // about 300 rows of adagrad, 230 of adam: one push's rows on 1 ps

std::vector<std::string> Ctr(const std::string& dir, int ps, const std::string& rule,
                             std::vector<std::string> more = {}) {
  std::vector<std::string> args = {"local",
                                   absl::StrCat("--ps=", ps),
                                   "--workers=2",
                                   "--train_steps=150",
                                   "--sync_replicas",
                                   "--ctr_test_examples=2048",
                                   "--sparse_optimizer=" + rule,
                                   "--checkpoint_dir=" + dir,
                                   "--save_checkpoint_steps=50",
                                   "--log_every=1000"};
  AppendSmallCtr(&args, 0, 96);
  args.insert(args.end(), more.begin(), more.end());
  return Psflow(args);
}

struct Case {
  int ps;
  std::string rule;
};

class DiskTablesTest : public ::testing::TestWithParam<Case> {};

TEST_P(DiskTablesTest, SyncCheckpointsEqualTheMemoryTablesByteForByte) {
  const Case c = GetParam();
  const std::string tag = absl::StrCat(c.ps, "_", c.rule);
  const std::string memory = TempDir("dtt_memory_" + tag), disk = TempDir("dtt_disk_" + tag);
  const std::string tables = TempDir("dtt_tables_" + tag);
  auto m = RunProcess(Ctr(memory, c.ps, c.rule), 300);
  ASSERT_EQ(m.exit_code, 0) << m.output;
  auto d = RunProcess(Ctr(disk, c.ps, c.rule,
                          {"--table_storage=disk", "--table_dir=" + tables,
                           absl::StrCat("--table_cache_bytes=", kCacheBytes), "--metrics_json=" + disk + "/m.json"}),
                      300);
  ASSERT_EQ(d.exit_code, 0) << d.output;
  for (int64_t step : {50, 100, 150}) {
    const std::string name = absl::StrCat("/model.ckpt-", step, ".safetensors");
    EXPECT_TRUE(Bytes(memory + name) == Bytes(disk + name)) << name << " differs between memory and disk tables";
  }
  // The tables are far bigger than the cache: the rows moved through the disk.
  auto ck = ckpt::ReadCheckpoint(disk + "/model.ckpt-150.safetensors");
  ASSERT_TRUE(ck.ok()) << ck.status();
  int64_t rows = 0;
  for (const std::string name : {"field_00", "field_01", "field_02"}) rows += ck->contents.tensors.at(name).shape()[0];
  EXPECT_GT(rows * 96, 5 * kCacheBytes * c.ps) << rows << " rows";
  EXPECT_NE(d.output.find("disk: cache_hit_rate="), std::string::npos) << d.output;
  EXPECT_EQ(m.output.find("disk: cache_hit_rate="), std::string::npos) << m.output;
  // The summary's ps_traffic[].tables: every ps task's share of every table, with its cache and disk.
  nlohmann::json summary = ReadJson(disk + "/m.json");
  ASSERT_EQ(summary["ps_traffic"].size(), static_cast<size_t>(c.ps)) << summary.dump();
  for (const nlohmann::json& task : summary["ps_traffic"]) {
    ASSERT_EQ(task["tables"].size(), 3u) << task.dump();
    for (const nlohmann::json& t : task["tables"]) {
      EXPECT_EQ(t["storage"], "disk") << t.dump();
      EXPECT_GT(t["cache_hit_rate"].get<double>(), 0.0) << t.dump();
      EXPECT_LT(t["cache_hit_rate"].get<double>(), 1.0) << t.dump();  // a cache far smaller than the table
      EXPECT_GT(t["cache_bytes"].get<int64_t>(), 0) << t.dump();
      EXPECT_LE(t["cache_bytes"].get<int64_t>(), 2 * kCacheBytes) << t.dump();
      // Its table files (0 here: rows this few stay in RocksDB's memtables, which no kill outlives).
      EXPECT_TRUE(t.contains("disk_bytes") && t["disk_bytes"].is_number_integer()) << t.dump();
      EXPECT_GT(t["disk_rows_read"].get<int64_t>(), 0) << t.dump();
      EXPECT_GT(t["disk_rows_written"].get<int64_t>(), 0) << t.dump();
      EXPECT_GT(t["disk_rows_read_per_sec"].get<double>(), 0.0) << t.dump();
      EXPECT_GT(t["disk_rows_written_per_sec"].get<double>(), 0.0) << t.dump();
    }
  }
}

INSTANTIATE_TEST_SUITE_P(OneAndThreePs, DiskTablesTest,
                         ::testing::Values(Case{1, "adagrad"}, Case{3, "adagrad"}, Case{3, "adam"}),
                         [](const auto& info) { return absl::StrCat("ps", info.param.ps, "_", info.param.rule); });

// Whether one line of `output` holds `what`.
bool OneLineSays(const std::string& output, const std::string& what) {
  const size_t at = output.find(what);
  return at != std::string::npos && output.find('\n', output.rfind('\n', at) + 1) >= at + what.size();
}

TEST(DiskTablesBadInputTest, DiskWithoutTableDirIsOneLine) {
  auto r = RunProcess(Ctr(TempDir("dtt_nodir"), 1, "adagrad", {"--table_storage=disk"}), 60);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_TRUE(OneLineSays(r.output, "--table_storage=disk needs --table_dir")) << r.output;
}

TEST(DiskTablesBadInputTest, AMissingTableDirIsOneLineNamingIt) {
  const std::string missing = TempDir("dtt_missing") + "/not_there";
  auto r =
      RunProcess(Ctr(TempDir("dtt_missing_ck"), 1, "adagrad", {"--table_storage=disk", "--table_dir=" + missing}), 60);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_TRUE(OneLineSays(r.output, "--table_dir=" + missing + " does not exist")) << r.output;
}

TEST(DiskTablesBadInputTest, ACacheSmallerThanAPushIsOneLineNamingPsTableAndSizes) {
  auto r = RunProcess(Ctr(TempDir("dtt_small_ck"), 1, "adagrad",
                          {"--table_storage=disk", "--table_dir=" + TempDir("dtt_small"), "--table_cache_bytes=2000"}),
                      120);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_TRUE(OneLineSays(r.output, "ps task 0, table 'field_0")) << r.output;
  EXPECT_TRUE(OneLineSays(r.output, "--table_cache_bytes=2000 holds 20 rows of 96 bytes but one batch here has"))
      << r.output;
}

// A job of 2 ps tasks and 2 async workers started by hand (so a ps task can be killed and started
// again), ctr with disk tables, a save every 100 steps.
struct DiskJob {
  std::string checkpoints = TempDir("dtt_kill_ck"), tables = TempDir("dtt_kill_tables");
  std::vector<int> ports = FreePorts(4);
  std::unique_ptr<Process> ps[2], workers[2];

  bool sync = false;

  std::vector<std::string> Task(const std::string& job, int index, int64_t steps) const {
    std::vector<std::string> args = {"train",
                                     "--job_name=" + job,
                                     absl::StrCat("--task_index=", index),
                                     absl::StrCat("--ps_hosts=127.0.0.1:", ports[0], ",127.0.0.1:", ports[1]),
                                     absl::StrCat("--worker_hosts=127.0.0.1:", ports[2], ",127.0.0.1:", ports[3]),
                                     "--ctr_test_examples=512",
                                     absl::StrCat("--train_steps=", steps),
                                     "--checkpoint_dir=" + checkpoints,
                                     "--save_checkpoint_steps=100",
                                     "--log_every=100000",
                                     "--table_storage=disk",
                                     "--table_dir=" + tables,
                                     absl::StrCat("--table_cache_bytes=", kCacheBytes),
                                     "--ps_timeout_secs=60"};
    AppendSmallCtr(&args, 0, 96);
    if (sync) args.push_back("--sync_replicas");
    return Psflow(args);
  }
  void Start(int64_t steps) {
    for (int i = 0; i < 2; ++i) ps[i] = std::make_unique<Process>(Task("ps", i, steps));
    for (int i = 0; i < 2; ++i) workers[i] = std::make_unique<Process>(Task("worker", i, steps));
  }
  // Waits (bounded) until the chief has logged a saved checkpoint.
  bool WaitForASave() const {
    for (int i = 0; i < 1200; ++i) {
      if (workers[0]->OutputSoFar().find("saved checkpoint ") != std::string::npos) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    return false;
  }
};

// The steps of the checkpoints the chief logged as saved in `log` (before `end`), in order.
std::vector<int64_t> SavedSteps(const std::string& log, size_t end = std::string::npos) {
  std::vector<int64_t> steps;
  const std::string text = log.substr(0, end);
  static const std::regex saved(R"(saved checkpoint \S*model\.ckpt-(\d+)\.safetensors)");
  for (auto it = std::sregex_iterator(text.begin(), text.end(), saved); it != std::sregex_iterator(); ++it) {
    steps.push_back(std::stoll((*it)[1].str()));
  }
  return steps;
}

TEST(DiskTablesFaultTest, KillNineOfAPsRestoresEveryPsFromTheLastSaveAndTheJobFinishes) {
  DiskJob job;
  job.Start(3000);
  ASSERT_TRUE(job.WaitForASave()) << job.workers[0]->OutputSoFar();
  ASSERT_EQ(kill(job.ps[1]->pid(), SIGKILL), 0);
  job.ps[1]->Wait(30);
  job.ps[1] = std::make_unique<Process>(job.Task("ps", 1, 3000));  // the same --table_dir

  const ProcessResult chief = job.workers[0]->Wait(600);
  ASSERT_EQ(chief.exit_code, 0) << chief.output << "\nps 0:\n" << job.ps[0]->OutputSoFar();
  static const std::regex restoring(
      R"(ps task 1 restarted without its variables; restoring every ps task at global step (\d+) from the newest checkpoint)");
  std::smatch m;
  ASSERT_TRUE(std::regex_search(chief.output, m, restoring)) << chief.output;
  const int64_t restored = std::stoll(m[1].str());
  // At most the steps since the last save are lost: the job went back to the newest save it had.
  const std::vector<int64_t> before = SavedSteps(chief.output, static_cast<size_t>(m.position(0)));
  ASSERT_FALSE(before.empty());
  EXPECT_EQ(restored, before.back()) << chief.output;
  EXPECT_EQ(job.workers[1]->Wait(120).exit_code, 0);
  const ProcessResult restarted = job.ps[1]->Wait(120);
  EXPECT_EQ(restarted.exit_code, 0) << restarted.output;
  // What the killed task left in its table directory was wiped, not mixed with the restore.
  EXPECT_NE(restarted.output.find("ps task 1: wiped "), std::string::npos) << restarted.output;
  EXPECT_EQ(job.ps[0]->Wait(120).exit_code, 0);
  auto ck = ckpt::ReadCheckpoint(job.checkpoints + "/model.ckpt-3000.safetensors");
  ASSERT_TRUE(ck.ok()) << ck.status();
  EXPECT_GT(ck->contents.tensors.at("field_00").shape()[0], 0);
}

// A ps task killed with SIGKILL after a save and started again on the same --table_dir is restored to
// exactly the checkpoint: the sync job ends with the same bytes as the job run without the fault. (At
// this scale the killed task's rows never reach RocksDB's table files; disk_tier_kill_test.cc kills a
// tier that has some, and checks that none is read after the restart.)
TEST(DiskTablesFaultTest, AKilledPsRestartedOnItsTableDirRestoresTheCheckpointAndNoStaleRow) {
  DiskJob job;
  job.sync = true;
  job.Start(400);
  ASSERT_TRUE(job.WaitForASave()) << job.workers[0]->OutputSoFar();
  ASSERT_EQ(kill(job.ps[1]->pid(), SIGKILL), 0);
  job.ps[1]->Wait(30);
  job.ps[1] = std::make_unique<Process>(job.Task("ps", 1, 400));  // the same --table_dir
  const ProcessResult chief = job.workers[0]->Wait(600);
  ASSERT_EQ(chief.exit_code, 0) << chief.output << "\nps 0:\n" << job.ps[0]->OutputSoFar();
  EXPECT_NE(chief.output.find("ps task 1 restarted without its variables; restoring every ps task at global step"),
            std::string::npos)
      << chief.output;
  EXPECT_EQ(job.workers[1]->Wait(120).exit_code, 0);
  const ProcessResult restarted = job.ps[1]->Wait(120);
  EXPECT_EQ(restarted.exit_code, 0) << restarted.output;
  EXPECT_NE(restarted.output.find("ps task 1: wiped "), std::string::npos) << restarted.output;
  EXPECT_EQ(job.ps[0]->Wait(120).exit_code, 0);

  // The same job without the fault (memory tables: the disk tier's bits are the memory tier's).
  const std::string straight = TempDir("dtt_kill_straight");
  auto r = RunProcess(
      Psflow({"local", "--ps=2", "--workers=2", "--model=ctr", "--ctr_fields=3", "--ctr_dim=4", "--ctr_vocab=0",
              "--batch_size=96", "--seed=5", "--ctr_test_examples=512", "--train_steps=400",
              "--checkpoint_dir=" + straight, "--save_checkpoint_steps=100", "--log_every=100000", "--sync_replicas"}),
      600);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(Bytes(job.checkpoints + "/model.ckpt-400.safetensors") == Bytes(straight + "/model.ckpt-400.safetensors"))
      << "the final checkpoint after the kill differs from the job's without it\n"
      << chief.output;
}

TEST(DiskTablesFaultTest, AfterKillNineTheJobResumesFromTheLastSaveOnThreePs) {
  DiskJob job;
  job.Start(3000);
  ASSERT_TRUE(job.WaitForASave()) << job.workers[0]->OutputSoFar();
  ASSERT_EQ(kill(job.ps[1]->pid(), SIGKILL), 0);
  ASSERT_EQ(kill(job.workers[0]->pid(), SIGKILL), 0);  // the job is down; its chief's log says what it saved
  const std::vector<int64_t> saved = SavedSteps(job.workers[0]->Wait(30).output);
  for (auto* p : {job.ps[0].get(), job.ps[1].get(), job.workers[1].get()}) kill(p->pid(), SIGKILL);
  ASSERT_FALSE(saved.empty());
  const int64_t last = saved.back();

  auto resumed = RunProcess(
      Psflow({"local", "--ps=3", "--workers=2", "--model=ctr", "--ctr_fields=3", "--ctr_dim=4", "--ctr_vocab=0",
              "--batch_size=96", "--seed=5", "--ctr_test_examples=512", absl::StrCat("--train_steps=", last + 100),
              "--checkpoint_dir=" + job.checkpoints, "--save_checkpoint_steps=100", "--log_every=100000",
              "--table_storage=disk", "--table_dir=" + job.tables, absl::StrCat("--table_cache_bytes=", kCacheBytes)}),
      600);
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_NE(resumed.output.find(
                absl::StrCat("restored ", job.checkpoints, "/model.ckpt-", last, ".safetensors at global step ", last)),
            std::string::npos)
      << "saved " << last << ":\n"
      << resumed.output;
  EXPECT_NE(resumed.output.find("and 3 tables at global step " + std::to_string(last)), std::string::npos)
      << resumed.output;
  auto ck = ckpt::ReadCheckpoint(absl::StrCat(job.checkpoints, "/model.ckpt-", last + 100, ".safetensors"));
  ASSERT_TRUE(ck.ok()) << ck.status();
}

}  // namespace
}  // namespace psflow::testing
