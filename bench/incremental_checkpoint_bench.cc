// bench/incremental_checkpoint_bench.cc — incremental checkpoints (docs/checkpoints.md#increments)
// beside full ones, for one dynamic table shard of 2^19 rows of dim 64 with adagrad (256 MiB of
// values and slots; PSFLOW_INC_BENCH_ROWS overrides), in memory or on disk (RocksDB behind a 64 MiB
// row cache). The save path is the chief's minus the network: the shard's scan (full, or the rows
// changed since the last save), train::WriteTables into a checkpoint file (ckpt::SaveCheckpoint-
// Streamed: streamed tensors, checksum, fsync, rename).
//   BM_Save/changed_per_mille/storage   a save after pushes to changed_per_mille / 1000 of the rows
//                                       (0: a full save; 10: 1 %; 100: 10 %): seconds per save, and
//                                       the counter `bytes` (the file)
//   BM_RestoreChain/increments/storage  a restore into a fresh shard from a full save and that many
//                                       increments of 1 % each (0: the full save alone), merged by
//                                       ckpt::ChainTableReader
// Run: PSFLOW_INC_BENCH_DIR=/var/tmp build/bench/psflow_incremental_checkpoint_bench
// One thread; timings only (correctness: ps_table_test, ckpt_test, incremental_checkpoint_test).
#include <benchmark/benchmark.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "ps/server/table/disk_store.h"
#include "ps/server/table/table_shard.h"
#include "psflow/ckpt/checkpoint.h"
#include "psflow/ckpt/checkpoint_chain.h"
#include "train/table_checkpoint.h"

namespace psflow {
namespace {

namespace fs = std::filesystem;
using ps::table::TableShard;

constexpr int64_t kDim = 64;

int64_t Rows() {
  const char* env = std::getenv("PSFLOW_INC_BENCH_ROWS");
  return env != nullptr ? std::atoll(env) : (int64_t{1} << 19);
}

std::string Dir(const std::string& name) {
  const char* env = std::getenv("PSFLOW_INC_BENCH_DIR");
  const fs::path p = fs::path(env != nullptr ? env : "/tmp") / absl::StrCat("psflow_inc_bench_", getpid(), "_", name);
  fs::remove_all(p);
  fs::create_directories(p);
  return p.string();
}

ps::table::TableConfig Config() {
  ps::table::TableConfig c;
  c.spec.name = "emb";
  c.spec.dim = kDim;
  c.spec.kind = ps::table::TableKind::kDynamic;
  c.spec.initializer.kind = ps::table::InitKind::kTruncatedNormal;
  c.spec.initializer.stddev = 0.1f;
  return c;
}

ps::table::SparseRuleConfig Rule() {
  ps::table::SparseRuleConfig r;
  r.optimizer.name = "adagrad";
  r.optimizer.learning_rate = 0.05f;
  return r;
}

// A shard in memory or on disk (the tier kept alive beside it).
struct Table {
  std::shared_ptr<ps::table::DiskTier> tier;
  std::unique_ptr<TableShard> shard;
};

Table MakeTable(bool disk, const std::string& dir) {
  Table t;
  if (disk) {
    fs::create_directories(dir);
    auto tier = ps::table::DiskTier::Open({dir, int64_t{64} << 20, 0}, nullptr);
    if (!tier.ok()) {
      std::fprintf(stderr, "%s\n", std::string(tier.status().message()).c_str());
      std::abort();
    }
    t.tier = *tier;
  }
  auto made = ps::table::MakeTableShard(Config(), Rule(), 0, 1, t.tier.get());
  if (!made.ok()) std::abort();
  t.shard = *std::move(made);
  return t;
}

int64_t IdOf(int64_t r) { return static_cast<int64_t>(static_cast<uint64_t>(r) * 0x9e3779b97f4a7c1u); }

// Pushes to `count` rows: rows [from, from + count) of the table's row numbers (mod rows).
void Push(TableShard& shard, int64_t from, int64_t count, int64_t rows, int64_t step) {
  constexpr int64_t kBatch = 4096;
  std::vector<int64_t> ids;
  std::vector<float> grads(kBatch * kDim, 0.01f);
  for (int64_t done = 0; done < count; done += kBatch) {
    const int64_t n = std::min(kBatch, count - done);
    ids.resize(n);
    for (int64_t i = 0; i < n; ++i) ids[i] = IdOf((from + done + i) % rows);
    if (!shard.Apply(ids, absl::MakeConstSpan(grads.data(), n * kDim), step).ok()) std::abort();
  }
}

// The chief's save minus the network: the shard's scan into a checkpoint file. Returns its bytes.
int64_t Save(TableShard& shard, const std::string& dir, int64_t step, int64_t save_id, bool increment,
             int64_t base_step, int64_t prev_step) {
  const std::vector<dist::TableSpec> specs = {Config().spec};
  auto layout = train::TableLayoutOf(Rule());
  if (!layout.ok()) std::abort();
  ps::table::ScanOptions options;
  options.save_id = save_id;
  options.increment = increment;
  options.changed_since = save_id - 1;
  options.track_changes = true;
  train::TableScan scan = [&](const std::string& table, int64_t max_rows,
                              const std::function<absl::Status(ps::TableRowsPart part)>& sink) -> absl::Status {
    auto rows = shard.Scan(options);
    if (!rows.ok()) return rows.status();
    ps::table::RowsPart part;
    bool first = true;
    while ((*rows)->Next(max_rows, &part) || first) {
      const int64_t n = static_cast<int64_t>(part.ids.size());
      ps::TableRowsPart out;
      out.table = table;
      if (first) out.removed_ids = (*rows)->removed();
      first = false;
      out.ids = std::move(part.ids);
      out.values = Tensor({n, kDim}, std::move(part.values));
      for (auto& slot : part.slots) out.slots.emplace_back(Shape{n, kDim}, std::move(slot));
      out.last_step = std::move(part.last_step);
      out.count = std::move(part.count);
      if (auto s = sink(std::move(out)); !s.ok()) return s;
      if (n == 0) break;
      part = ps::table::RowsPart();
    }
    return (*rows)->status();
  };
  std::map<std::string, std::string> meta = {{ckpt::kKindKey, increment ? "increment" : "full"},
                                             {ckpt::kChainKey, "bench"},
                                             {ckpt::kSaveIdKey, absl::StrCat(save_id)},
                                             {ckpt::kTablesKey, "emb\n"}};
  if (increment) {
    meta[ckpt::kBaseStepKey] = absl::StrCat(base_step);
    meta[ckpt::kPrevStepKey] = absl::StrCat(prev_step);
    meta[ckpt::kPrevSaveIdKey] = absl::StrCat(save_id - 1);
  }
  auto path = ckpt::SaveCheckpointStreamed(
      dir, step, [&](ckpt::SafetensorsWriter& w) { return train::WriteTables(scan, specs, *layout, w, increment); },
      meta, ckpt::SaveOptions{100, increment});
  if (!path.ok()) {
    std::fprintf(stderr, "%s\n", std::string(path.status().message()).c_str());
    std::abort();
  }
  return static_cast<int64_t>(fs::file_size(*path));
}

void BM_Save(benchmark::State& state) {
  const int64_t per_mille = state.range(0);
  const bool disk = state.range(1) != 0;
  const int64_t rows = Rows();
  const std::string dir = Dir(absl::StrCat("save_", per_mille, "_", disk));
  Table t = MakeTable(disk, dir + "/tables");
  Push(*t.shard, 0, rows, rows, 1);
  int64_t step = 1, save_id = 1, bytes = 0, from = 0;
  Save(*t.shard, dir + "/ckpt", step, save_id, false, 0, 0);  // the chain's full save
  const int64_t changed = per_mille == 0 ? rows / 100 : rows * per_mille / 1000;
  for (auto _ : state) {
    state.PauseTiming();
    Push(*t.shard, from, changed, rows, ++step);
    from += changed;
    state.ResumeTiming();
    ++save_id;
    bytes = Save(*t.shard, dir + "/ckpt", step, save_id, per_mille > 0, 1, step - 1);
  }
  state.counters["bytes"] = static_cast<double>(bytes);
  state.counters["rows_changed"] = static_cast<double>(per_mille == 0 ? rows : changed);
  fs::remove_all(dir);
}
BENCHMARK(BM_Save)
    ->ArgsProduct({{0, 10, 100}, {0, 1}})
    ->ArgNames({"changed_per_mille", "storage"})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

void BM_RestoreChain(benchmark::State& state) {
  const int64_t increments = state.range(0);
  const bool disk = state.range(1) != 0;
  const int64_t rows = Rows();
  const std::string dir = Dir(absl::StrCat("restore_", increments, "_", disk));
  {
    Table t = MakeTable(disk, dir + "/tables");
    Push(*t.shard, 0, rows, rows, 1);
    Save(*t.shard, dir + "/ckpt", 1, 1, false, 0, 0);
    for (int64_t k = 1; k <= increments; ++k) {
      Push(*t.shard, (k - 1) * (rows / 100), rows / 100, rows, 1 + k);
      Save(*t.shard, dir + "/ckpt", 1 + k, 1 + k, true, 1, k);
    }
  }
  const std::string last =
      increments == 0 ? dir + "/ckpt/model.ckpt-1.safetensors" : ckpt::IncrementPath(dir + "/ckpt", 1 + increments);
  auto layout = train::TableLayoutOf(Rule());
  int64_t restored = 0;
  for (auto _ : state) {
    state.PauseTiming();
    Table fresh = MakeTable(disk, dir + "/fresh");
    state.ResumeTiming();
    auto opened = ckpt::OpenCheckpointFile(last);
    if (!opened.ok()) std::abort();
    auto sources = train::TableSources(*opened, {Config().spec}, *layout);
    if (!sources.ok()) std::abort();
    ps::TableRowsPart part;
    restored = 0;
    while (true) {
      auto more = (*sources)[0].second(&part);
      if (!more.ok()) std::abort();
      if (!*more) break;
      ps::table::RowsPart r;
      r.ids = std::move(part.ids);
      r.values.assign(part.values.data(), part.values.data() + part.values.size());
      for (const Tensor& s : part.slots) r.slots.emplace_back(s.data(), s.data() + s.size());
      r.last_step = std::move(part.last_step);
      r.count = std::move(part.count);
      restored += static_cast<int64_t>(r.ids.size());
      if (!fresh.shard->Load(r).ok()) std::abort();
    }
    state.PauseTiming();
    fresh = Table();
    state.ResumeTiming();
  }
  state.counters["rows"] = static_cast<double>(restored);
  fs::remove_all(dir);
}
BENCHMARK(BM_RestoreChain)
    ->ArgsProduct({{0, 10}, {0, 1}})
    ->ArgNames({"increments", "storage"})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

}  // namespace
}  // namespace psflow

BENCHMARK_MAIN();
