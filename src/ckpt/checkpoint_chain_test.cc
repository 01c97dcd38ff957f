// Checkpoint chains (psflow/ckpt/checkpoint_chain.h) on real files: a full save and increments read
// back merged (rows of the newest file naming an id, removals, a removed id created again, a fixed
// table's implicit ids); the newest readable chain is opened, and a corrupt or missing increment ends
// it at the save before, named with its step; an increment of another chain (another job's) is
// refused in one line; retention keeps whole chains.
#include "psflow/ckpt/checkpoint_chain.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "psflow/ckpt/checkpoint.h"

namespace psflow::ckpt {
namespace {

namespace fs = std::filesystem;

std::string FreshDir(const std::string& name) {
  const fs::path p = fs::path(::testing::TempDir()) / absl::StrCat("chain_", getpid(), "_", name);
  fs::remove_all(p);
  fs::create_directories(p);
  return p.string();
}

// A table's rows in a file: ids, one float a row (the value), and removed ids.
struct Rows {
  std::vector<int64_t> ids;
  std::vector<float> values;
  std::vector<int64_t> removed;
};

struct Link {
  int64_t step;
  bool increment;
  Rows dyn;    // dynamic table "d"
  Rows fixed;  // fixed table "f" of 4 rows (a full save: all, ids implicit)
};

// Saves `link` into `dir` as chain `chain`, save `save_id`, following `prev` (an increment).
std::string Save(const std::string& dir, const Link& link, const std::string& chain, int64_t save_id, int64_t base_step,
                 int64_t prev_step, int keep = 5) {
  std::map<std::string, std::string> meta = {{kKindKey, link.increment ? "increment" : "full"},
                                             {kChainKey, chain},
                                             {kSaveIdKey, absl::StrCat(save_id)},
                                             {kTablesKey, "d\nf\n"}};
  if (link.increment) {
    meta[kBaseStepKey] = absl::StrCat(base_step);
    meta[kPrevStepKey] = absl::StrCat(prev_step);
    meta[kPrevSaveIdKey] = absl::StrCat(save_id - 1);
  }
  Tensor dense({2}, static_cast<float>(link.step));
  std::vector<std::vector<int64_t>> counts;  // borrowed by the writer until Finish
  counts.reserve(2);
  auto path = SaveCheckpointStreamed(
      dir, link.step,
      [&](SafetensorsWriter& w) -> absl::Status {
        if (auto s = w.AddF32("dense", &dense); !s.ok()) return s;
        auto put = [&](const std::string& name, const Rows& r, bool ids) -> absl::Status {
          const int64_t n = static_cast<int64_t>(r.values.size());
          if (ids) {
            if (auto s = w.AddI64(name + "/ids", {n}, r.ids.data()); !s.ok()) return s;
          }
          auto h = w.BeginStreamed(name, Dtype::kF32, {1});
          if (!h.ok()) return h.status();
          if (auto s = w.Append(*h, r.values.data(), r.values.size()); !s.ok()) return s;
          counts.emplace_back(r.values.size(), 7);
          if (auto s = w.AddI64(name + "/count", {n}, counts.back().data()); !s.ok()) return s;
          if (link.increment && name == "d") {
            if (auto s = w.AddI64(name + "/removed", {static_cast<int64_t>(r.removed.size())}, r.removed.data());
                !s.ok()) {
              return s;
            }
          }
          return absl::OkStatus();
        };
        if (auto s = put("d", link.dyn, true); !s.ok()) return s;
        return put("f", link.fixed, link.increment);
      },
      meta, SaveOptions{keep, link.increment});
  EXPECT_TRUE(path.ok()) << path.status();
  return path.ok() ? *path : "";
}

// The chain used below: full at 10, increments at 20, 30, 40.
void SaveChain(const std::string& dir, const std::string& chain = "c1") {
  Save(dir, {10, false, {{1, 2, 3}, {1, 2, 3}, {}}, {{}, {10, 11, 12, 13}, {}}}, chain, 1, 10, 0);
  Save(dir, {20, true, {{2, 5}, {20, 50}, {3}}, {{1}, {21}, {}}}, chain, 2, 10, 10);
  Save(dir, {30, true, {{3}, {300}, {1, 5}}, {{1, 3}, {31, 33}, {}}}, chain, 3, 10, 20);
  Save(dir, {40, true, {{6}, {6000}, {}}, {{}, {}, {}}}, chain, 4, 10, 30);
}

std::vector<float> Floats(const Tensor& t) { return std::vector<float>(t.data(), t.data() + t.size()); }

TEST(CheckpointChainTest, AnIncrementReadsAsItsChainMerged) {
  const std::string dir = FreshDir("merged");
  SaveChain(dir);
  auto c = ReadCheckpoint(IncrementPath(dir, 30));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->global_step, 30);
  // d: 1 removed at 30; 2 from 20; 3 removed at 20, created again at 30; 5 created at 20, removed at 30.
  EXPECT_EQ(c->contents.int64s.at("d/ids"), (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(Floats(c->contents.tensors.at("d")), (std::vector<float>{20, 300}));
  EXPECT_EQ(c->contents.int64s.at("d/count"), (std::vector<int64_t>{7, 7}));
  // f: every row, the newest of each; no ids (as a full save holds a fixed table).
  EXPECT_EQ(Floats(c->contents.tensors.at("f")), (std::vector<float>{10, 31, 12, 33}));
  EXPECT_EQ(c->contents.int64s.count("f/ids"), 0u);
  EXPECT_EQ(Floats(c->contents.tensors.at("dense")), (std::vector<float>{30, 30}));

  std::vector<std::string> skipped;
  auto latest = OpenLatestCheckpoint(dir, &skipped);
  ASSERT_TRUE(latest.ok() && latest->has_value());
  EXPECT_EQ((*latest)->global_step, 40);
  ASSERT_EQ((*latest)->earlier.size(), 3u);
  EXPECT_EQ((*latest)->earlier.front().path, dir + "/model.ckpt-10.safetensors");
  EXPECT_TRUE(skipped.empty());
  auto merged = ChainTableReader::Open((*latest)->chain(), "d");
  ASSERT_TRUE(merged.ok()) << merged.status();
  std::vector<int64_t> ids;
  std::vector<std::vector<char>> columns;
  ASSERT_TRUE(*(*merged)->Next(1, &ids, &columns));  // parts of one row
  EXPECT_EQ(ids, (std::vector<int64_t>{2}));
  ASSERT_TRUE(*(*merged)->Next(10, &ids, &columns));
  EXPECT_EQ(ids, (std::vector<int64_t>{3, 6}));
  EXPECT_FALSE(*(*merged)->Next(10, &ids, &columns));
}

TEST(CheckpointChainTest, ACorruptIncrementEndsTheChainAtTheSaveBeforeNamingFileAndStep) {
  const std::string dir = FreshDir("corrupt");
  SaveChain(dir);
  {
    std::fstream f(IncrementPath(dir, 30), std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-2, std::ios::end);
    f.put('\x7f');
  }
  std::vector<std::string> skipped;
  auto latest = OpenLatestCheckpoint(dir, &skipped);
  ASSERT_TRUE(latest.ok() && latest->has_value());
  EXPECT_EQ((*latest)->global_step, 20);
  EXPECT_EQ((*latest)->path, IncrementPath(dir, 20));
  ASSERT_EQ(skipped.size(), 2u);
  EXPECT_NE(skipped[0].find(IncrementPath(dir, 40) + " (step 40)"), std::string::npos) << skipped[0];
  EXPECT_NE(skipped[0].find(IncrementPath(dir, 30) + " (step 30) is unreadable"), std::string::npos) << skipped[0];
  EXPECT_NE(skipped[1].find(IncrementPath(dir, 30)), std::string::npos) << skipped[1];
  for (const std::string& s : skipped) EXPECT_EQ(s.find('\n'), std::string::npos) << s;
}

TEST(CheckpointChainTest, AMissingIncrementEndsTheChainAtTheSaveBefore) {
  const std::string dir = FreshDir("missing");
  SaveChain(dir);
  fs::remove(IncrementPath(dir, 20));
  std::vector<std::string> skipped;
  auto latest = OpenLatestCheckpoint(dir, &skipped);
  ASSERT_TRUE(latest.ok() && latest->has_value());
  EXPECT_EQ((*latest)->path, dir + "/model.ckpt-10.safetensors");
  EXPECT_TRUE((*latest)->earlier.empty());
  ASSERT_EQ(skipped.size(), 2u);
  EXPECT_NE(skipped[1].find("lacks " + IncrementPath(dir, 20) + " (step 20)"), std::string::npos) << skipped[1];
  // Opening the file itself says the same.
  auto direct = OpenCheckpointFile(IncrementPath(dir, 40));
  ASSERT_FALSE(direct.ok());
  EXPECT_NE(direct.status().message().find("step 20"), std::string::npos) << direct.status();
}

TEST(CheckpointChainTest, AnIncrementOfAnotherChainIsRefusedInOneLine) {
  const std::string dir = FreshDir("alien");
  SaveChain(dir, "mine");
  const std::string other = FreshDir("alien_other");
  SaveChain(other, "theirs");
  Save(other, {50, true, {{8}, {8}, {}}, {{}, {}, {}}}, "theirs", 5, 10, 40);
  fs::copy_file(IncrementPath(other, 50), IncrementPath(dir, 50));
  std::vector<std::string> skipped;
  auto latest = OpenLatestCheckpoint(dir, &skipped);
  ASSERT_TRUE(latest.ok() && latest->has_value());
  EXPECT_EQ((*latest)->global_step, 40);  // ours
  ASSERT_EQ(skipped.size(), 1u);
  EXPECT_NE(skipped[0].find("an increment from another job"), std::string::npos) << skipped[0];
  EXPECT_NE(skipped[0].find(IncrementPath(dir, 50)), std::string::npos) << skipped[0];
  EXPECT_EQ(skipped[0].find('\n'), std::string::npos);
}

TEST(CheckpointChainTest, RetentionKeepsWholeChains) {
  const std::string dir = FreshDir("retention");
  // Seven chains of a full save and two increments (steps 10k, 10k + 1, 10k + 2), keep 3.
  for (int64_t k = 1; k <= 7; ++k) {
    const std::string chain = absl::StrCat("c", k);
    const int64_t base = 10 * k;
    Save(dir, {base, false, {{1}, {1}, {}}, {{}, {1, 2, 3, 4}, {}}}, chain, 3 * k, base, 0, 3);
    Save(dir, {base + 1, true, {{1}, {2}, {}}, {{}, {}, {}}}, chain, 3 * k + 1, base, base, 3);
    Save(dir, {base + 2, true, {{1}, {3}, {}}, {{}, {}, {}}}, chain, 3 * k + 2, base, base + 1, 3);
  }
  std::vector<int64_t> steps;
  for (const auto& [step, path] : ListCheckpoints(dir)) steps.push_back(step);
  EXPECT_EQ(steps, (std::vector<int64_t>{72, 71, 70, 62, 61, 60, 52, 51, 50}));
  auto oldest = OpenCheckpointFile(IncrementPath(dir, 52));
  EXPECT_TRUE(oldest.ok()) << oldest.status();
}

}  // namespace
}  // namespace psflow::ckpt
