// Disk tables end to end (docs/tables.md#storage; DESIGN §11), real processes and files: a sync
// ctr job with --table_storage=disk and a row cache far smaller than its tables writes checkpoints
// byte-identical to the same job with memory tables, on 1 and 3 ps tasks, for adagrad (the ctr
// default) and lazy adam (per-row counts); its summary shows the cache and the disk. Bad input is
// one line: disk storage without --table_dir, a --table_dir that does not exist, a cache smaller
// than one push's rows (naming the ps, the table and the sizes).
#include <fstream>

#include "absl/strings/str_cat.h"
#include "psflow/ckpt/checkpoint.h"
#include "test_util.h"

namespace psflow::testing {
namespace {

std::string Bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in.good()) << "missing " << path;
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// A row in the cache: 64 bytes of header and meta, then w and the rule's slots (dim 4).
constexpr int64_t kCacheBytes = 30000;  // about 300 rows of adagrad, 230 of adam: one push's rows on 1 ps

std::vector<std::string> Ctr(const std::string& dir, int ps, const std::string& rule,
                             std::vector<std::string> more = {}) {
  std::vector<std::string> args = {"local",
                                   absl::StrCat("--ps=", ps),
                                   "--workers=2",
                                   "--model=ctr",
                                   "--ctr_fields=3",
                                   "--ctr_dim=4",
                                   "--ctr_vocab=0",
                                   "--batch_size=96",
                                   "--train_steps=150",
                                   "--sync_replicas",
                                   "--seed=5",
                                   "--ctr_test_examples=2048",
                                   "--sparse_optimizer=" + rule,
                                   "--checkpoint_dir=" + dir,
                                   "--save_checkpoint_steps=50",
                                   "--log_every=1000"};
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
  auto d = RunProcess(
      Ctr(disk, c.ps, c.rule,
          {"--table_storage=disk", "--table_dir=" + tables, absl::StrCat("--table_cache_bytes=", kCacheBytes)}),
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

}  // namespace
}  // namespace psflow::testing
