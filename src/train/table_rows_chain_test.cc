// ReadTableRows (train/table_checkpoint.h) on real files: the rows of some ids read from a
// checkpoint chain (a full save and increments with changed rows, removals and ids created again)
// equal the rows of the whole chain merged (ckpt::ReadCheckpoint), for a dynamic table of several
// blocks of ids and a fixed table, ids asked in many patterns (absent ones, removed ones, a run
// across blocks, the first and last ids); the same from a lone full save. CountTableRows counts the
// merged rows from the ids alone.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <map>
#include <random>
#include <set>

#include "absl/strings/str_cat.h"
#include "psflow/ckpt/checkpoint.h"
#include "psflow/ckpt/checkpoint_chain.h"
#include "train/table_checkpoint.h"

namespace psflow::train {
namespace {

namespace fs = std::filesystem;

constexpr int64_t kDim = 3;
constexpr int64_t kFixedRows = 9000;

std::string FreshDir(const std::string& name) {
  const fs::path p = fs::path(::testing::TempDir()) / absl::StrCat("tct_", getpid(), "_", name);
  fs::remove_all(p);
  fs::create_directories(p);
  return p.string();
}

// One file's rows of a table: id -> row.
using Rows = std::map<int64_t, std::vector<float>>;

struct Link {
  int64_t step;
  bool increment;
  Rows dyn, fixed;
  std::vector<int64_t> removed;  // the dynamic table's (increments)
};

void Save(const std::string& dir, const Link& link, int64_t save_id, int64_t base_step, int64_t prev_step) {
  std::map<std::string, std::string> meta = {{ckpt::kKindKey, link.increment ? "increment" : "full"},
                                             {ckpt::kChainKey, "0123456789abcdef"},
                                             {ckpt::kSaveIdKey, absl::StrCat(save_id)},
                                             {ckpt::kTablesKey, "d\nf\n"}};
  if (link.increment) {
    meta[ckpt::kBaseStepKey] = absl::StrCat(base_step);
    meta[ckpt::kPrevStepKey] = absl::StrCat(prev_step);
    meta[ckpt::kPrevSaveIdKey] = absl::StrCat(save_id - 1);
  }
  // Borrowed by the writer until the file is finished.
  std::vector<std::vector<int64_t>> ids;
  std::vector<std::vector<float>> values;
  ids.reserve(4);
  values.reserve(2);
  auto path = ckpt::SaveCheckpointStreamed(
      dir, link.step,
      [&](ckpt::SafetensorsWriter& w) -> absl::Status {
        auto put = [&](const std::string& name, const Rows& rows, bool with_ids) -> absl::Status {
          ids.emplace_back();
          values.emplace_back();
          for (const auto& [id, row] : rows) {
            ids.back().push_back(id);
            values.back().insert(values.back().end(), row.begin(), row.end());
          }
          const int64_t n = static_cast<int64_t>(rows.size());
          if (with_ids) {
            if (auto s = w.AddI64(name + "/ids", {n}, ids.back().data()); !s.ok()) return s;
          }
          auto h = w.BeginStreamed(name, ckpt::Dtype::kF32, {kDim});
          if (!h.ok()) return h.status();
          return w.Append(*h, values.back().data(), values.back().size());
        };
        if (auto s = put("d", link.dyn, true); !s.ok()) return s;
        if (link.increment) {
          ids.push_back(link.removed);
          if (auto s = w.AddI64("d/removed", {static_cast<int64_t>(link.removed.size())}, ids.back().data()); !s.ok()) {
            return s;
          }
        }
        return put("f", link.fixed, link.increment);
      },
      meta, ckpt::SaveOptions{5, link.increment});
  ASSERT_TRUE(path.ok()) << path.status();
}

std::vector<float> Row(std::mt19937_64& rng) {
  std::uniform_real_distribution<float> u(-1, 1);
  return {u(rng), u(rng), u(rng)};
}

// A full save of 20,000 dynamic rows (ids 5·i: five blocks of ids) and 9,000 fixed rows, then
// three increments, each changing rows, creating new ids, removing some and creating some removed
// ids again.
void SaveRandomChain(const std::string& dir) {
  std::mt19937_64 rng(7);
  Link full{10, false, {}, {}, {}};
  for (int64_t i = 0; i < 20000; ++i) full.dyn[5 * i] = Row(rng);
  for (int64_t i = 0; i < kFixedRows; ++i) full.fixed[i] = Row(rng);
  Save(dir, full, 1, 10, 0);
  std::set<int64_t> live;
  for (const auto& [id, row] : full.dyn) live.insert(id);
  std::set<int64_t> removed_once;
  for (int k = 1; k <= 3; ++k) {
    Link inc{10 + 10 * k, true, {}, {}, {}};
    std::uniform_int_distribution<int64_t> any(-50, 110000);
    for (int j = 0; j < 700; ++j) {
      const int64_t id = any(rng);
      if (live.count(id) && j % 3 == 0) {
        inc.removed.push_back(id);
      } else {
        inc.dyn[id] = Row(rng);
      }
    }
    // Removed earlier, created again now (some of them removed and created in this very file:
    // the row wins).
    for (int64_t id : removed_once) {
      if (rng() % 2) inc.dyn[id] = Row(rng);
    }
    std::sort(inc.removed.begin(), inc.removed.end());
    inc.removed.erase(std::unique(inc.removed.begin(), inc.removed.end()), inc.removed.end());
    for (int64_t id : inc.removed) {
      if (rng() % 4 == 0) inc.dyn[id] = Row(rng);
    }
    for (int64_t id : inc.removed) {
      if (!inc.dyn.count(id)) live.erase(id);
      removed_once.insert(id);
    }
    for (const auto& [id, row] : inc.dyn) live.insert(id);
    std::uniform_int_distribution<int64_t> fixed_row(0, kFixedRows - 1);
    for (int j = 0; j < 300; ++j) inc.fixed[fixed_row(rng)] = Row(rng);
    Save(dir, inc, k + 1, 10, 10 * k);
  }
}

dist::TableSpec Table(const std::string& name, bool dynamic) {
  dist::TableSpec t;
  t.name = name;
  t.kind = dynamic ? dist::TableKind::kDynamic : dist::TableKind::kFixed;
  t.dim = kDim;
  t.num_embeddings = dynamic ? 0 : kFixedRows;
  return t;
}

// What the merged checkpoint holds for `ids` of a table (found, row).
void ExpectRowsOfMerged(const ckpt::Checkpoint& merged, const ckpt::OpenedCheckpoint& chain,
                        const dist::TableSpec& table, const std::vector<int64_t>& ids, const std::string& what) {
  std::map<int64_t, const float*> expected;
  const Tensor& values = merged.contents.tensors.at(table.name);
  if (table.dynamic()) {
    const std::vector<int64_t>& merged_ids = merged.contents.int64s.at(table.name + "/ids");
    for (size_t r = 0; r < merged_ids.size(); ++r) expected[merged_ids[r]] = values.data() + r * kDim;
  } else {
    for (int64_t r = 0; r < values.shape()[0]; ++r) expected[r] = values.data() + r * kDim;
  }
  std::vector<bool> found;
  auto rows = ReadTableRows(chain, table, ids, &found);
  ASSERT_TRUE(rows.ok()) << rows.status();
  ASSERT_EQ(found.size(), ids.size());
  int64_t present = 0;
  for (size_t q = 0; q < ids.size(); ++q) {
    auto it = expected.find(ids[q]);
    ASSERT_EQ(found[q], it != expected.end()) << what << ": id " << ids[q];
    if (!found[q]) continue;
    ++present;
    EXPECT_EQ(std::memcmp(rows->data() + q * kDim, it->second, kDim * sizeof(float)), 0) << what << ": id " << ids[q];
  }
  if (!ids.empty()) {
    EXPECT_GT(present, 0) << what;
  }
}

// Sorted unique ids: every `stride`-th id in [from, to), and some random ones.
std::vector<int64_t> Ids(int64_t from, int64_t to, int64_t stride, int random, uint64_t seed) {
  std::set<int64_t> s;
  for (int64_t id = from; id < to; id += stride) s.insert(id);
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int64_t> any(from, to - 1);
  for (int i = 0; i < random; ++i) s.insert(any(rng));
  return {s.begin(), s.end()};
}

TEST(ReadTableRowsTest, SomeIdsOfAChainAreItsMergedRows) {
  const std::string dir = FreshDir("chain");
  SaveRandomChain(dir);
  for (int64_t step : {20, 30, 40}) {
    const std::string path = ckpt::IncrementPath(dir, step);
    auto chain = ckpt::OpenCheckpointFile(path);
    ASSERT_TRUE(chain.ok()) << chain.status();
    ASSERT_EQ(chain->earlier.size(), static_cast<size_t>(step / 10 - 1));
    auto merged = ckpt::ReadCheckpoint(path);
    ASSERT_TRUE(merged.ok()) << merged.status();
    const dist::TableSpec d = Table("d", true), f = Table("f", false);
    const std::string at = absl::StrCat("step ", step);
    ExpectRowsOfMerged(*merged, *chain, d, Ids(-100, 111000, 1, 0, 1), at + ", every id");
    ExpectRowsOfMerged(*merged, *chain, d, Ids(-100, 111000, 997, 400, 2), at + ", scattered");
    ExpectRowsOfMerged(*merged, *chain, d, Ids(40000, 41000, 1, 0, 3), at + ", a run across a block's end");
    ExpectRowsOfMerged(*merged, *chain, d, {0, 99995}, at + ", the first and last");
    ExpectRowsOfMerged(*merged, *chain, d, {}, at + ", none");
    ExpectRowsOfMerged(*merged, *chain, f, Ids(-5, kFixedRows + 5, 1, 0, 4), at + ", every fixed row");
    ExpectRowsOfMerged(*merged, *chain, f, Ids(0, kFixedRows, 101, 50, 5), at + ", some fixed rows");
    // Its rows counted from the ids alone: the merged table's.
    auto rows = CountTableRows(*chain, d);
    ASSERT_TRUE(rows.ok()) << rows.status();
    EXPECT_EQ(*rows, static_cast<int64_t>(merged->contents.int64s.at("d/ids").size())) << at;
    auto fixed_rows = CountTableRows(*chain, f);
    ASSERT_TRUE(fixed_rows.ok()) << fixed_rows.status();
    EXPECT_EQ(*fixed_rows, kFixedRows) << at;
  }
  // A lone full save: the same reader.
  auto full = ckpt::OpenCheckpointFile(dir + "/model.ckpt-10.safetensors");
  ASSERT_TRUE(full.ok()) << full.status();
  auto merged = ckpt::ReadCheckpoint(dir + "/model.ckpt-10.safetensors");
  ASSERT_TRUE(merged.ok()) << merged.status();
  ExpectRowsOfMerged(*merged, *full, Table("d", true), Ids(-100, 111000, 13, 300, 6), "the full save");
  ExpectRowsOfMerged(*merged, *full, Table("f", false), Ids(-5, kFixedRows + 5, 7, 0, 7), "the full save, fixed");
}

}  // namespace
}  // namespace psflow::train
