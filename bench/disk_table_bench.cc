// bench/disk_table_bench.cc — Google Benchmark timings of a dynamic table on disk (RocksDB behind
// the ps task's hot-row cache; src/ps/server/table/disk_store.h) beside the same table in memory:
// rows/s gathered (a pull) and applied (a push, adagrad) against the cache hit rate. The table:
// 2^18 rows of dim 64 with adagrad's accumulator (about 140 MB on disk). Each call takes 4096
// unique ids: with probability p from a hot set of 16384 rows, else uniform over the table (512
// calls' ids, cycled); the cache holds the hot set and 4 calls' rows, so the hit rate follows p
// (measured, reported as the counter `hit_rate`). range(0): p in percent (100: every id hot); range(1): 0 memory table,
// 1 disk, 2 disk with O_DIRECT reads (misses read the device, not the page cache).
// The cache's bytes also hold the records' index's growth (disk_store.h): the hot set fits with
// room for ~3 calls' rows.
// The disk's own random-read limit, for the same 4 KiB blocks:
//   fio --name=r --filename=$DIR/fio.dat --size=1G --rw=randread --bs=4k --direct=1 --iodepth=1
//       --runtime=10 --time_based
// (bench/disk_fio.sh runs it, one reader and 4 side by side.)
// Run: DISK_BENCH_DIR=/var/tmp build/bench/psflow_disk_table_bench --benchmark_min_time=2
// DISK_BENCH_READ_THREADS=N sets the tier's read threads (default 3; 0: one MultiGet a batch).
// One thread; timings only (correctness: ps_table_test, disk_tables_test).
#include <benchmark/benchmark.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "ps/server/table/disk_store.h"
#include "ps/server/table/table_shard.h"

namespace psflow::ps::table {
namespace {

constexpr int64_t kRows = int64_t{1} << 18;
constexpr int64_t kDim = 64;
constexpr int64_t kBatch = 4096;
constexpr int64_t kHot = 16384;
constexpr int kBatches = 512;  // calls' ids cycled through (their cold rows: far more than the cache)
constexpr int64_t kRowBytes = 64 + 2 * kDim * 4;  // a cached record: header + meta, w, accumulator

// Ids look hashed: the row number times a fixed odd number, modulo 2^64 (unsigned: no overflow).
int64_t IdOf(int64_t r) { return static_cast<int64_t>(static_cast<uint64_t>(r) * 0x9e3779b97f4a7c1u); }
// The hot set is every 16th row: spread over the whole table as a job's hot ids are spread over the
// order their rows were created in (the first 16384 rows made a hot set the memory tier kept in
// 4.4 MB of consecutive slabs, a locality no job has, while the disk tier's cache held them wherever
// they were read back).
constexpr int64_t kHotStride = kRows / kHot;
int64_t HotRow(int64_t k) { return k * kHotStride; }

struct Fixture {
  ~Fixture() {  // the shard and the tier close first (the table's directory goes), then the rest
    shard.reset();
    tier.reset();
    if (!dir.empty()) std::filesystem::remove_all(dir);
  }
  std::string dir;  // disk: the tier's --table_dir
  std::shared_ptr<DiskTier> tier;
  std::unique_ptr<TableShard> shard;
  std::vector<std::vector<int64_t>> batches;  // kBatches calls' ids
  std::vector<float> rows;
};

std::unique_ptr<Fixture> Make(int p_percent, int storage) {
  auto f = std::make_unique<Fixture>();
  TableConfig config;
  config.spec.name = "bench";
  config.spec.dim = kDim;
  config.spec.kind = TableKind::kDynamic;
  config.spec.initializer.kind = InitKind::kUniform;
  config.spec.initializer.seed = 1;
  SparseRuleConfig rule;
  rule.optimizer.name = "adagrad";
  rule.optimizer.learning_rate = 1e-3f;
  DiskTier* disk = nullptr;
  if (storage > 0) {
    const char* root = std::getenv("DISK_BENCH_DIR");
    const std::string dir = std::string(root != nullptr ? root : "/var/tmp") + "/psflow_disk_bench_" +
                            std::to_string(getpid()) + "_" + std::to_string(p_percent) + "_" + std::to_string(storage);
    std::filesystem::create_directories(dir);
    f->dir = dir;
    DiskTierOptions options{dir, (kHot + 4 * kBatch) * kRowBytes, 0, storage == 2};
    if (const char* threads = std::getenv("DISK_BENCH_READ_THREADS"); threads != nullptr) {
      options.read_threads = std::atoi(threads);
    }
    auto tier = DiskTier::Open(options, nullptr);
    if (!tier.ok()) std::abort();
    f->tier = *tier;
    disk = f->tier.get();
  }
  f->shard = std::move(MakeTableShard(config, rule, 0, 1, disk)).value();
  std::vector<int64_t> all;
  std::vector<float> g;
  for (int64_t start = 0; start < kRows; start += kBatch) {  // every row created, most written to disk
    all.clear();
    for (int64_t r = start; r < start + kBatch; ++r) all.push_back(IdOf(r));
    g.assign(all.size() * kDim, 1e-3f);
    if (!f->shard->Apply(all, g, 1).ok()) std::abort();
  }
  // RocksDB's flushes and compactions of the fill end here, not inside the timings.
  if (f->tier != nullptr && !f->tier->CompactAll().ok()) std::abort();
  std::mt19937_64 rng(42);
  std::uniform_int_distribution<int64_t> hot(0, kHot - 1), any(0, kRows - 1);
  std::bernoulli_distribution from_hot(p_percent / 100.0);
  for (int b = 0; b < kBatches; ++b) {
    std::vector<int64_t> ids;
    std::vector<bool> taken(kRows, false);
    while (static_cast<int64_t>(ids.size()) < kBatch) {
      const int64_t r = from_hot(rng) ? HotRow(hot(rng)) : any(rng);
      if (taken[r]) continue;
      taken[r] = true;
      ids.push_back(IdOf(r));
    }
    f->batches.push_back(std::move(ids));
  }
  f->rows.assign(kBatch * kDim, 1e-3f);
  // Warm the cache with the hot set.
  for (int pass = 0; pass < 2; ++pass) {
    for (int64_t start = 0; start < kHot; start += kBatch) {
      all.clear();
      for (int64_t k = start; k < start + kBatch; ++k) all.push_back(IdOf(HotRow(k)));
      if (!f->shard->Gather(all, absl::MakeSpan(f->rows)).ok()) std::abort();
    }
  }
  return f;
}

// Made once per (p, storage); closed before main returns (their directories removed).
std::map<std::pair<int, int>, std::unique_ptr<Fixture>>& Made() {
  static auto* made = new std::map<std::pair<int, int>, std::unique_ptr<Fixture>>;
  return *made;
}

Fixture& Get(int p_percent, int storage) {
  auto& f = Made()[{p_percent, storage}];
  if (f == nullptr) f = Make(p_percent, storage);
  return *f;
}

// The process's file-backed resident memory (RssFile, MB): mapped files' pages (RocksDB's table
// files with allow_mmap_reads) count in a task's RSS, unlike pages read into the page cache.
double RssFileMb() {
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);) {
    if (line.rfind("RssFile:", 0) == 0) return std::atof(line.c_str() + 8) / 1024.0;
  }
  return -1;
}

void Report(benchmark::State& state, const TableStats& before, const TableStats& after) {
  state.counters["rows/s"] =
      benchmark::Counter(static_cast<double>(state.iterations() * kBatch), benchmark::Counter::kIsRate);
  const double hits = static_cast<double>(after.cache_hits - before.cache_hits);
  const double lookups = hits + static_cast<double>(after.cache_misses - before.cache_misses);
  state.counters["hit_rate"] = lookups > 0 ? hits / lookups : 1.0;
  // Misses per call, so a reader can compute the work per miss: (instr - memory's instr) / misses.
  state.counters["rss_file_mb"] = RssFileMb();
  state.counters["misses"] = (lookups - hits) / static_cast<double>(state.iterations());
}

// range(0) = p (percent of ids from the hot set), range(1) = storage (0 memory, 1 disk, 2 disk
// with O_DIRECT reads).
void BM_DiskTableGather(benchmark::State& state) {
  Fixture& f = Get(static_cast<int>(state.range(0)), static_cast<int>(state.range(1)));
  const TableStats before = f.shard->stats();
  size_t b = 0;
  for (auto _ : state) {
    if (!f.shard->Gather(f.batches[b], absl::MakeSpan(f.rows)).ok()) std::abort();
    benchmark::DoNotOptimize(f.rows.data());
    b = b + 1 == f.batches.size() ? 0 : b + 1;
  }
  Report(state, before, f.shard->stats());
}

void BM_DiskTableApply(benchmark::State& state) {
  Fixture& f = Get(static_cast<int>(state.range(0)), static_cast<int>(state.range(1)));
  const TableStats before = f.shard->stats();
  size_t b = 0;
  int64_t step = 2;
  for (auto _ : state) {
    if (!f.shard->Apply(f.batches[b], f.rows, step++).ok()) std::abort();
    b = b + 1 == f.batches.size() ? 0 : b + 1;
  }
  Report(state, before, f.shard->stats());
}

#define PSFLOW_DISK_ARGS                            \
  ArgNames({"hot_percent", "storage"})              \
      ->ArgsProduct({{100, 97, 82, 55}, {0, 1, 2}}) \
      ->UseRealTime()                               \
      ->MeasureProcessCPUTime()
BENCHMARK(BM_DiskTableGather)->PSFLOW_DISK_ARGS;
BENCHMARK(BM_DiskTableApply)->PSFLOW_DISK_ARGS;

}  // namespace
}  // namespace psflow::ps::table

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  psflow::ps::table::Made().clear();
  return 0;
}
