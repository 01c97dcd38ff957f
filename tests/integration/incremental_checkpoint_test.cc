// Incremental checkpoints (docs/checkpoints.md#increments), real processes and files. A sync ctr
// job saving a full checkpoint then increments (--full_checkpoint_every=4; saves run beside
// training, so a save still writing when the next is due moves that one on a step or two): its
// chain read back at its final step 100 equals, tensor for tensor and byte for byte, the final save
// at step 100 of the same job saving in full on 1 ps; restored from the chain onto another number of
// ps tasks it trains on to a step-150 checkpoint byte-identical to the straight run's — for every sparse rule, dynamic
// and fixed tables, memory and disk storage, 1 and 3 ps, 3 -> 2. `psflow eval` reads the chain. A chain whose middle
// increment is missing restores from the save before it, naming the file and step; a corrupt one too.
// Single-process `psflow train` writes the same chains (its chain at step 100 equals its full save at
// 100; resumed from the chain, its chain at step 150 equals the straight run's save). Two runs of one job write
// byte-identical chains, increments included (the chain id is derived from the seed and the save,
// not drawn), while another seed's chain id differs.
#include <algorithm>
#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "psflow/ckpt/checkpoint.h"
#include "psflow/ckpt/checkpoint_chain.h"
#include "test_util.h"

namespace psflow::testing {
namespace {

std::vector<std::string> Ctr(const std::string& dir, int ps, int64_t steps, const std::string& rule, int64_t vocab,
                             std::vector<std::string> more = {}) {
  std::vector<std::string> args = {"local",
                                   absl::StrCat("--ps=", ps),
                                   "--workers=2",
                                   absl::StrCat("--train_steps=", steps),
                                   "--sync_replicas",
                                   "--ctr_test_examples=1024",
                                   "--sparse_optimizer=" + rule,
                                   "--checkpoint_dir=" + dir,
                                   "--save_checkpoint_steps=25",
                                   "--log_every=1000"};
  AppendSmallCtr(&args, vocab, 96);
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

// The checkpoint files of `dir`, oldest first.
std::vector<std::pair<int64_t, std::string>> Files(const std::string& dir) {
  auto files = ckpt::ListCheckpoints(dir);
  std::reverse(files.begin(), files.end());
  return files;
}

TEST_P(IncrementalCheckpointTest, AChainRestoresToTheFullSaveByteForByte) {
  const Case c = GetParam();
  const std::string tag = Name({c, 0});
  const std::string chained = TempDir("ict_chain_" + tag), straight = TempDir("ict_straight_" + tag);
  const std::string straight100 = TempDir("ict_straight100_" + tag);
  std::vector<std::string> storage;
  if (c.disk) {
    storage = {"--table_storage=disk", "--table_dir=" + TempDir("ict_tables_" + tag), "--table_cache_bytes=30000"};
  }
  std::vector<std::string> chain_flags = storage;
  chain_flags.push_back("--full_checkpoint_every=4");
  auto a = RunProcess(Ctr(chained, c.from_ps, 100, c.rule, c.vocab, chain_flags), 300);
  ASSERT_EQ(a.exit_code, 0) << a.output;
  const auto files = Files(chained);
  ASSERT_FALSE(files.empty());
  ASSERT_EQ(files.back().first, 100) << a.output;  // the final save
  const std::string last = files.back().second;
  int increments = 0;
  for (const auto& [step, path] : files) increments += ckpt::IsIncrementPath(path) ? 1 : 0;
  ASSERT_GE(increments, 1) << a.output;
  auto b = RunProcess(Ctr(straight100, 1, 100, c.rule, c.vocab), 300);
  ASSERT_EQ(b.exit_code, 0) << b.output;
  // The chain read at step 100 is the full save at 100.
  auto merged = ckpt::ReadCheckpoint(last);
  ASSERT_TRUE(merged.ok()) << merged.status();
  auto full = ckpt::ReadCheckpoint(straight100 + "/model.ckpt-100.safetensors");
  ASSERT_TRUE(full.ok()) << full.status();
  ExpectSameState(*merged, *full);
  // An increment holds fewer rows than the table (fixed tables: the rows pushed since).
  for (const auto& [step, path] : files) {
    if (!ckpt::IsIncrementPath(path)) continue;
    auto inc = ckpt::OpenCheckpoint(path);
    ASSERT_TRUE(inc.ok()) << inc.status();
    EXPECT_LT((*inc)->Find("field_00")->shape[0], full->contents.tensors.at("field_00").shape()[0]) << path;
  }

  // Restored from the chain onto another number of ps tasks: the straight run's step-150 file.
  auto resumed = RunProcess(Ctr(chained, c.to_ps, 150, c.rule, c.vocab, storage), 300);
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_NE(resumed.output.find("restored " + last + " at global step 100"), std::string::npos) << resumed.output;
  if (ckpt::IsIncrementPath(last)) {
    EXPECT_NE(resumed.output.find("at global step 100 (a chain: the full save "), std::string::npos) << resumed.output;
  }
  auto straight_run = RunProcess(Ctr(straight, 1, 150, c.rule, c.vocab), 300);
  ASSERT_EQ(straight_run.exit_code, 0) << straight_run.output;
  EXPECT_TRUE(Bytes(chained + "/model.ckpt-150.safetensors") == Bytes(straight + "/model.ckpt-150.safetensors"))
      << "the step-150 checkpoints differ";
}

INSTANTIATE_TEST_SUITE_P(RulesTablesStorages, IncrementalCheckpointTest,
                         ::testing::Values(Case{"sgd", 0, false, 3, 2}, Case{"momentum", 0, false, 1, 3},
                                           Case{"adagrad", 0, false, 3, 2}, Case{"ftrl", 0, false, 1, 1},
                                           Case{"adam", 0, false, 3, 2}, Case{"rmsprop", 0, false, 3, 3},
                                           Case{"adagrad", 0, true, 3, 2}, Case{"adam", 0, true, 1, 3},
                                           Case{"sgd", 500, false, 3, 2}, Case{"adagrad", 500, false, 1, 3},
                                           Case{"adam", 500, false, 3, 2}),
                         Name);

TEST(SingleProcessChainTest, PsflowTrainWritesIncrementsThatRestoreToItsFullSaveByteForByte) {
  const std::string chained = TempDir("ict_single_chain"), full = TempDir("ict_single_full"),
                    straight = TempDir("ict_single_straight");
  auto train = [](const std::string& dir, int64_t steps, std::vector<std::string> more) {
    std::vector<std::string> args = {"train",
                                     "--ctr_test_examples=512",
                                     absl::StrCat("--train_steps=", steps),
                                     "--checkpoint_dir=" + dir,
                                     "--save_checkpoint_steps=25",
                                     "--log_every=1000"};
    AppendSmallCtr(&args, 0, 96);
    args.insert(args.end(), more.begin(), more.end());
    return RunProcess(Psflow(args), 300);
  };
  auto a = train(chained, 100, {"--full_checkpoint_every=4"});
  ASSERT_EQ(a.exit_code, 0) << a.output;
  for (int64_t step : {50, 75, 100}) {
    EXPECT_NE(a.output.find(absl::StrCat("saved checkpoint ", ckpt::IncrementPath(chained, step))), std::string::npos)
        << a.output;
  }
  auto b = train(full, 100, {});
  ASSERT_EQ(b.exit_code, 0) << b.output;
  auto merged = ckpt::ReadCheckpoint(ckpt::IncrementPath(chained, 100));
  ASSERT_TRUE(merged.ok()) << merged.status();
  auto whole = ckpt::ReadCheckpoint(full + "/model.ckpt-100.safetensors");
  ASSERT_TRUE(whole.ok()) << whole.status();
  ExpectSameState(*merged, *whole);
  auto inc = ckpt::OpenCheckpoint(ckpt::IncrementPath(chained, 100));
  ASSERT_TRUE(inc.ok()) << inc.status();
  EXPECT_LT((*inc)->Find("field_00")->shape[0], whole->contents.tensors.at("field_00").shape()[0]);
  // Resumed from the chain: the straight run's step-150 file, byte for byte.
  auto resumed = train(chained, 150, {"--full_checkpoint_every=4"});
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_NE(resumed.output.find("restored " + ckpt::IncrementPath(chained, 100) +
                                " at global step 100 (a chain: the full save "),
            std::string::npos)
      << resumed.output;
  auto c = train(straight, 150, {});
  ASSERT_EQ(c.exit_code, 0) << c.output;
  // Its next save was full (the rows restored carry no change marks), then increments again.
  EXPECT_NE(resumed.output.find("saved checkpoint " + chained + "/model.ckpt-125.safetensors"), std::string::npos)
      << resumed.output;
  const auto files = Files(chained);
  ASSERT_EQ(files.back().first, 150);
  EXPECT_TRUE(ckpt::IsIncrementPath(files.back().second)) << files.back().second;
  auto resumed150 = ckpt::ReadCheckpoint(files.back().second);
  ASSERT_TRUE(resumed150.ok()) << resumed150.status();
  auto straight150 = ckpt::ReadCheckpoint(straight + "/model.ckpt-150.safetensors");
  ASSERT_TRUE(straight150.ok()) << straight150.status();
  ExpectSameState(*resumed150, *straight150);
}

TEST(ReproducibleChainTest, TwoRunsOfOneJobWriteTheSameBytesIncrementsIncluded) {
  const std::string one = TempDir("ict_repro_1"), two = TempDir("ict_repro_2"), other = TempDir("ict_repro_seed");
  auto a = RunProcess(Ctr(one, 2, 100, "adagrad", 0, {"--full_checkpoint_every=4"}), 300);
  ASSERT_EQ(a.exit_code, 0) << a.output;
  auto b = RunProcess(Ctr(two, 2, 100, "adagrad", 0, {"--full_checkpoint_every=4"}), 300);
  ASSERT_EQ(b.exit_code, 0) << b.output;
  const auto files = Files(one);
  ASSERT_EQ(files.size(), 4u) << a.output;  // full at 25, increments at 50, 75, 100
  int increments = 0;
  for (const auto& [step, path] : files) {
    increments += ckpt::IsIncrementPath(path) ? 1 : 0;
    const std::string name = path.substr(path.rfind('/'));
    EXPECT_TRUE(Bytes(path) == Bytes(two + name)) << name << " differs between two runs of the same job";
  }
  EXPECT_EQ(increments, 3);
  // Another seed: another chain id (its increments would be refused on this chain).
  std::vector<std::string> args = Ctr(other, 2, 25, "adagrad", 0, {"--full_checkpoint_every=4"});
  for (std::string& arg : args) {
    if (arg == "--seed=5") arg = "--seed=6";
  }
  auto c = RunProcess(args, 300);
  ASSERT_EQ(c.exit_code, 0) << c.output;
  auto mine = ckpt::OpenCheckpoint(one + "/model.ckpt-25.safetensors");
  auto theirs = ckpt::OpenCheckpoint(other + "/model.ckpt-25.safetensors");
  ASSERT_TRUE(mine.ok() && theirs.ok());
  EXPECT_NE((*mine)->metadata().at(ckpt::kChainKey), (*theirs)->metadata().at(ckpt::kChainKey));
}

// A chain of a full save and at least two increments in a fresh directory (saves run beside
// training: on a loaded machine some are skipped, so the job runs longer until it has them).
std::vector<std::pair<int64_t, std::string>> ChainOfThree(const std::string& name) {
  for (int64_t steps : {100, 300, 900}) {
    const std::string dir = TempDir(absl::StrCat(name, "_", steps));
    auto a = RunProcess(
        Ctr(dir, 1, steps, "adagrad", 0, {"--full_checkpoint_every=1000", "--save_checkpoint_steps=10"}), 300);
    EXPECT_EQ(a.exit_code, 0) << a.output;
    auto files = Files(dir);
    if (files.size() >= 3 && !ckpt::IsIncrementPath(files[0].second)) return files;
  }
  ADD_FAILURE() << "no chain of three saves";
  return {};
}

TEST(IncrementalCheckpointFaultsTest, AMissingOrCorruptIncrementEndsTheRestoreAtTheSaveBefore) {
  auto files = ChainOfThree("ict_corrupt");
  ASSERT_GE(files.size(), 3u);
  ASSERT_TRUE(ckpt::IsIncrementPath(files[1].second) && ckpt::IsIncrementPath(files[2].second));
  const std::string dir = files[0].second.substr(0, files[0].second.rfind('/'));
  // The second increment corrupt: the restore takes the chain up to the first and says why.
  {
    std::fstream f(files[2].second, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-3, std::ios::end);
    f.put('\x55');
  }
  auto r = RunProcess(Ctr(dir, 2, files.back().first, "adagrad", 0), 300);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("refusing checkpoint " + files[2].second), std::string::npos) << r.output;
  if (files.size() > 3) {  // a later increment's chain runs through it: named with its step
    EXPECT_NE(r.output.find(absl::StrCat(files[2].second, " (step ", files[2].first, ") is unreadable")),
              std::string::npos)
        << r.output;
  }
  EXPECT_NE(r.output.find(absl::StrCat("restored ", files[1].second, " at global step ", files[1].first)),
            std::string::npos)
      << r.output;

  // Missing: another chain, its first increment deleted: `psflow eval` takes the full save and says why.
  files = ChainOfThree("ict_gap");
  ASSERT_GE(files.size(), 3u);
  const std::string gap = files[0].second.substr(0, files[0].second.rfind('/'));
  std::filesystem::remove(files[1].second);
  auto e = RunProcess(Psflow({"eval", "--model=ctr", "--ctr_fields=3", "--ctr_dim=4", "--ctr_vocab=0",
                              "--ctr_test_examples=1024", "--seed=5", "--checkpoint_dir=" + gap}),
                      120);
  EXPECT_EQ(e.exit_code, 0) << e.output;
  EXPECT_NE(e.output.find(absl::StrCat("lacks ", files[1].second, " (step ", files[1].first, ")")), std::string::npos)
      << e.output;
  EXPECT_NE(e.output.find(files[0].second), std::string::npos) << e.output;
}

}  // namespace
}  // namespace psflow::testing
