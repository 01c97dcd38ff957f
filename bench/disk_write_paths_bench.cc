// The disk tier's write-back paths: the memtable (before session 8) beside the runs it uses now
// (docs/table-storage.md, "Runs"; proposed in docs/table-storage-figures.md, "This session (diskmiss)"):
// the CPU a row costs to get a run of rows into a RocksDB table file, (a) through the memtable (a
// WriteBatch of sorted random keys at a time, as the tier's writer did, then the flush) and (b)
// with SstFileWriter and IngestExternalFile (the run sorted once, written as a file, ingested).
// Rows of 528 bytes (dim 64 with adagrad: RowMeta and 128 floats) under 8-byte keys, random over
// 2^18 ids; table options as the tier's (disk_store.cc: no compression, bloom 10 bits, partitioned
// index and filters); auto compactions off, so each figure is the write alone.
//
// Run: DISK_BENCH_DIR=/var/tmp build/bench/psflow_disk_write_paths_bench --benchmark_min_time=2
// Counters: us_cpu_per_row (the process's CPU: the flush's thread included).
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "benchmark/benchmark.h"
#include "rocksdb/db.h"
#include "rocksdb/filter_policy.h"
#include "rocksdb/options.h"
#include "rocksdb/sst_file_writer.h"
#include "rocksdb/table.h"
#include "rocksdb/write_batch.h"

namespace {

constexpr size_t kValueBytes = 528;
constexpr size_t kRunRows = 29000;  // one 16 MiB memtable's rows

double ProcessCpu() {
  timespec t;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_nsec) * 1e-9;
}

void KeyOf(uint64_t id, char* k) {
  for (int i = 0; i < 8; ++i) k[i] = static_cast<char>(id >> (56 - 8 * i));
}

rocksdb::Options TierLikeOptions() {
  rocksdb::Options o;
  o.create_if_missing = true;
  o.compression = rocksdb::kNoCompression;
  o.write_buffer_size = size_t{16} << 20;
  o.max_write_buffer_number = 2;
  o.memtable_prefix_bloom_size_ratio = 0.1;
  o.memtable_whole_key_filtering = true;
  o.disable_auto_compactions = true;
  rocksdb::BlockBasedTableOptions t;
  t.filter_policy.reset(rocksdb::NewBloomFilterPolicy(10));
  t.index_type = rocksdb::BlockBasedTableOptions::kTwoLevelIndexSearch;
  t.partition_filters = true;
  t.cache_index_and_filter_blocks = true;
  o.table_factory.reset(rocksdb::NewBlockBasedTableFactory(t));
  return o;
}

std::string BenchDir(const char* name) {
  const char* root = std::getenv("DISK_BENCH_DIR");
  return (std::filesystem::path(root != nullptr ? root : "/tmp") / name).string();
}

// state.range(0): 0 = memtable and flush (batches of state.range(1) rows), 1 = file and ingest.
void BM_WriteRun(benchmark::State& state) {
  const bool ingest = state.range(0) == 1;
  const size_t batch = static_cast<size_t>(state.range(1));
  const std::string path = BenchDir(ingest ? "psflow_write_paths_ingest" : "psflow_write_paths_memtable");
  const rocksdb::Options o = TierLikeOptions();
  rocksdb::DestroyDB(path, o);
  rocksdb::DB* raw = nullptr;
  if (rocksdb::Status s = rocksdb::DB::Open(o, path, &raw); !s.ok()) {
    state.SkipWithError(s.ToString().c_str());
    return;
  }
  std::unique_ptr<rocksdb::DB> db(raw);
  rocksdb::WriteOptions w;
  w.disableWAL = true;
  const std::string value(kValueBytes, 'x');
  std::mt19937_64 rng(1);
  double cpu = 0;
  int64_t rows = 0, run = 0;
  for (auto _ : state) {
    std::vector<uint64_t> ids(kRunRows);
    for (uint64_t& id : ids) id = rng() % (uint64_t{1} << 18);
    const double t0 = ProcessCpu();
    char k[8];
    rocksdb::Status s;
    if (!ingest) {
      for (size_t b = 0; b < ids.size() && s.ok(); b += batch) {
        const auto end = ids.begin() + static_cast<std::ptrdiff_t>(std::min(ids.size(), b + batch));
        std::sort(ids.begin() + static_cast<std::ptrdiff_t>(b), end);
        rocksdb::WriteBatch wb;
        for (auto it = ids.begin() + static_cast<std::ptrdiff_t>(b); it != end; ++it) {
          KeyOf(*it, k);
          wb.Put(rocksdb::Slice(k, 8), value);
        }
        s = db->Write(w, &wb);
      }
      if (s.ok()) s = db->Flush(rocksdb::FlushOptions());
    } else {
      std::sort(ids.begin(), ids.end());
      ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
      rocksdb::SstFileWriter writer(rocksdb::EnvOptions(), o);
      const std::string file = path + ".run" + std::to_string(run++) + ".sst";
      s = writer.Open(file);
      for (size_t i = 0; i < ids.size() && s.ok(); ++i) {
        KeyOf(ids[i], k);
        s = writer.Put(rocksdb::Slice(k, 8), value);
      }
      if (s.ok()) s = writer.Finish();
      rocksdb::IngestExternalFileOptions io;
      io.move_files = true;
      io.write_global_seqno = false;
      if (s.ok()) s = db->IngestExternalFile({file}, io);
    }
    cpu += ProcessCpu() - t0;
    if (!s.ok()) {
      state.SkipWithError(s.ToString().c_str());
      break;
    }
    rows += static_cast<int64_t>(kRunRows);
  }
  state.counters["us_cpu_per_row"] = rows > 0 ? cpu / static_cast<double>(rows) * 1e6 : 0;
  db.reset();
  rocksdb::DestroyDB(path, o);
}
BENCHMARK(BM_WriteRun)
    ->ArgNames({"ingest", "batch"})
    ->Args({0, 1})
    ->Args({0, 123})
    ->Args({0, 1000})
    ->Args({0, 4000})
    ->Args({1, 0})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
