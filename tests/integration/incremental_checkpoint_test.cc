// Incremental checkpoints (docs/checkpoints.md#increments), real processes and files. A sync ctr
// job saving a full checkpoint then increments (--full_checkpoint_every=4): its chain read back at
// step 100 equals, tensor for tensor and byte for byte, the full save at step 100 of the same job
// saving in full on 1 ps; restored from the chain onto another number of ps tasks it trains on to a
// step-150 checkpoint byte-identical to the straight run's — for every sparse rule, dynamic and fixed
// tables, memory and disk storage, 1 and 3 ps, 3 -> 2. `psflow eval` reads the chain. A chain whose
// middle increment is missing restores from the save before it, naming the file and step; a corrupt
// one too.
#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "psflow/ckpt/checkpoint.h"
#include "psflow/ckpt/checkpoint_chain.h"
#include "test_util.h"

namespace psflow::testing {
namespace {

std::string Bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in.good()) << "missing " << path;
  return std::string(std::istreambuf_iterator<char>(in), {});
}

std::vector<std::string> Ctr(const std::string& dir, int ps, int64_t steps, const std::string& rule, int64_t vocab,
                             std::vector<std::string> more = {}) {
  std::vector<std::string> args = {"local",
                                   absl::StrCat("--ps=", ps),
                                   "--workers=2",
                                   "--model=ctr",
                                   "--ctr_fields=3",
                                   "--ctr_dim=4",
                                   absl::StrCat("--ctr_vocab=", vocab),
                                   "--batch_size=96",
                                   absl::StrCat("--train_steps=", steps),
                                   "--sync_replicas",
                                   "--seed=5",
                                   "--ctr_test_examples=1024",
                                   "--sparse_optimizer=" + rule,
                                   "--checkpoint_dir=" + dir,
                                   "--save_checkpoint_steps=25",
                                   "--log_every=1000"};
  args.insert(args.end(), more.begin(), more.end());
  return Psflow(args);
}

// Same tensors, bytes for bytes, and the same metadata but the chain's own keys (psflow.*).
void ExpectSameState(const ckpt::Checkpoint& a, const ckpt::Checkpoint& b) {
  ASSERT_EQ(a.contents.tensors.size(), b.contents.tensors.size());
  for (const auto& [name, t] : a.contents.tensors) {
    auto it = b.contents.tensors.find(name);
    ASSERT_NE(it, b.contents.tensors.end()) << name;
    ASSERT_EQ(t.shape(), it->second.shape()) << name;
    EXPECT_EQ(std::memcmp(t.data(), it->second.data(), t.size() * sizeof(float)), 0) << name << " differs";
  }
  EXPECT_EQ(a.contents.int64s, b.contents.int64s);
  auto own = [](std::map<std::string, std::string> m) {
    for (auto it = m.begin(); it != m.end();) it = it->first.rfind("psflow.", 0) == 0 ? m.erase(it) : std::next(it);
    return m;
  };
  EXPECT_EQ(own(a.contents.metadata), own(b.contents.metadata));
}

struct Case {
  std::string rule;
  int64_t vocab;  // 0: dynamic tables; N: fixed
  bool disk;
  int from_ps, to_ps;
};

std::string Name(const ::testing::TestParamInfo<Case>& info) {
  const Case& c = info.param;
  return absl::StrCat(c.rule, c.vocab == 0 ? "_dynamic" : "_fixed", c.disk ? "_disk_" : "_memory_", c.from_ps, "to",
                      c.to_ps);
}

class IncrementalCheckpointTest : public ::testing::TestWithParam<Case> {};

TEST_P(IncrementalCheckpointTest, AChainRestoresToTheFullSaveByteForByte) {
  const Case c = GetParam();
  const std::string tag = Name({c, 0});
  const std::string chained = TempDir("ict_chain_" + tag), straight = TempDir("ict_straight_" + tag);
  std::vector<std::string> storage;
  if (c.disk) {
    storage = {"--table_storage=disk", "--table_dir=" + TempDir("ict_tables_" + tag), "--table_cache_bytes=30000"};
  }
  std::vector<std::string> chain_flags = storage;
  chain_flags.push_back("--full_checkpoint_every=4");
  auto a = RunProcess(Ctr(chained, c.from_ps, 100, c.rule, c.vocab, chain_flags), 300);
  ASSERT_EQ(a.exit_code, 0) << a.output;
  for (int64_t step : {50, 75, 100}) {
    EXPECT_TRUE(std::filesystem::exists(ckpt::IncrementPath(chained, step))) << step << "\n" << a.output;
  }
  auto b = RunProcess(Ctr(straight, 1, 150, c.rule, c.vocab), 300);
  ASSERT_EQ(b.exit_code, 0) << b.output;
  // The chain at step 100 (a full save at 25 and increments at 50, 75, 100) is the full save at 100.
  auto merged = ckpt::ReadCheckpoint(ckpt::IncrementPath(chained, 100));
  ASSERT_TRUE(merged.ok()) << merged.status();
  auto full = ckpt::ReadCheckpoint(straight + "/model.ckpt-100.safetensors");
  ASSERT_TRUE(full.ok()) << full.status();
  ExpectSameState(*merged, *full);
  // An increment holds fewer rows than the table (fixed tables: the rows pushed since).
  auto inc = ckpt::OpenCheckpoint(ckpt::IncrementPath(chained, 100));
  ASSERT_TRUE(inc.ok()) << inc.status();
  EXPECT_LT((*inc)->Find("field_00")->shape[0], full->contents.tensors.at("field_00").shape()[0]);

  // Restored from the chain onto another number of ps tasks: the straight run's step-150 file.
  auto resumed = RunProcess(Ctr(chained, c.to_ps, 150, c.rule, c.vocab, storage), 300);
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_NE(resumed.output.find("restored " + ckpt::IncrementPath(chained, 100) +
                                " at global step 100 (a chain: the full save " + chained +
                                "/model.ckpt-25.safetensors and 3 increments)"),
            std::string::npos)
      << resumed.output;
  EXPECT_TRUE(Bytes(chained + "/model.ckpt-150.safetensors") == Bytes(straight + "/model.ckpt-150.safetensors"))
      << "the step-150 checkpoints differ";
}

INSTANTIATE_TEST_SUITE_P(
    RulesTablesStorages, IncrementalCheckpointTest,
    ::testing::Values(Case{"sgd", 0, false, 3, 2}, Case{"momentum", 0, false, 1, 3}, Case{"adagrad", 0, false, 3, 2},
                      Case{"ftrl", 0, false, 1, 1}, Case{"adam", 0, false, 3, 2}, Case{"rmsprop", 0, false, 3, 3},
                      Case{"adagrad", 0, true, 3, 2}, Case{"adam", 0, true, 1, 3}, Case{"sgd", 500, false, 3, 2},
                      Case{"adagrad", 500, false, 1, 3}, Case{"adam", 500, false, 3, 2}),
    Name);

TEST(IncrementalCheckpointFaultsTest, AMissingOrCorruptIncrementEndsTheRestoreAtTheSaveBefore) {
  const std::string dir = TempDir("ict_missing");
  auto a = RunProcess(Ctr(dir, 1, 100, "adagrad", 0, {"--full_checkpoint_every=4"}), 300);
  ASSERT_EQ(a.exit_code, 0) << a.output;
  // The increment at 75 corrupt: the restore takes the chain up to 50 and says why.
  {
    std::fstream f(ckpt::IncrementPath(dir, 75), std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-3, std::ios::end);
    f.put('\x55');
  }
  auto r = RunProcess(Ctr(dir, 2, 100, "adagrad", 0), 300);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find(ckpt::IncrementPath(dir, 75) + " (step 75) is unreadable"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("restored " + ckpt::IncrementPath(dir, 50) + " at global step 50"), std::string::npos)
      << r.output;

  // Missing: another chain, its increment at 50 deleted: the restore takes the full save at 25.
  const std::string gap = TempDir("ict_gap");
  auto g = RunProcess(Ctr(gap, 1, 100, "adagrad", 0, {"--full_checkpoint_every=4"}), 300);
  ASSERT_EQ(g.exit_code, 0) << g.output;
  std::filesystem::remove(ckpt::IncrementPath(gap, 50));
  auto e = RunProcess(Psflow({"eval", "--model=ctr", "--ctr_fields=3", "--ctr_dim=4", "--ctr_vocab=0",
                              "--ctr_test_examples=1024", "--seed=5", "--checkpoint_dir=" + gap}),
                      120);
  EXPECT_EQ(e.exit_code, 0) << e.output;
  EXPECT_NE(e.output.find("lacks " + ckpt::IncrementPath(gap, 50) + " (step 50)"), std::string::npos) << e.output;
  EXPECT_NE(e.output.find("model.ckpt-25.safetensors"), std::string::npos) << e.output;
}

}  // namespace
}  // namespace psflow::testing
