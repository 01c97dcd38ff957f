// bench/criteo_reader_bench.cc — Google Benchmark timings of the Criteo-layout reader
// (include/psflow/data/criteo.h). Goal: >= 1M lines/s per core (docs/data-files.md).
//   BM_CriteoParse            the line parser alone on one thread, text in memory (lines/s = per core)
//   BM_CriteoReader/gzip/thr  the reader end to end from a file (page cache): reading thread +
//                             `thr` parsing threads + the caller's copies into batches of 1024;
//                             counters: lines/s of wall time, and lines per CPU-second of the whole
//                             process (every thread: the per-core figure)
// The file: $PSFLOW_CRITEO_BENCH_FILE (plain or gzip, Criteo's layout, 13 integers and 26
// categoricals), else the CTR generator's stream written once to a temporary directory
// ($PSFLOW_CRITEO_BENCH_LINES lines, default 200k: ~95 MB plain). bench/criteo_reader_vs.py runs this beside `zcat | wc
// -l` and pandas on one file. Run: build/bench/psflow_criteo_reader_bench [--benchmark_filter=REGEX]
#include <benchmark/benchmark.h>
#include <time.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "data/criteo_internal.h"
#include "psflow/data/criteo.h"
#include "psflow/data/ctr.h"

namespace psflow::data {
namespace {

double ProcessCpuSeconds() {
  timespec t;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

// The benchmark's files: {plain, gzip}, written once.
const std::vector<std::string>& Files() {
  static const std::vector<std::string>* files = [] {
    auto* out = new std::vector<std::string>;
    if (const char* given = std::getenv("PSFLOW_CRITEO_BENCH_FILE"); given != nullptr && *given != '\0') {
      out->assign(2, given);
      return out;
    }
    const std::string dir =
        (std::filesystem::temp_directory_path() / ("psflow_criteo_bench_" + std::to_string(getpid()))).string();
    CtrConfig config;
    const CtrGenerator gen = *CtrGenerator::Create(config);
    for (bool gzip : {false, true}) {
      CtrFilesOptions o;
      o.out_dir = dir + (gzip ? "/gz" : "/plain");
      o.files = 1;
      const char* lines = std::getenv("PSFLOW_CRITEO_BENCH_LINES");
      o.examples_per_file = lines != nullptr ? std::atoll(lines) : 200000;
      o.test_examples = 0;
      o.gzip = gzip;
      out->push_back((*WriteCtrFiles(gen, o))[0]);
    }
    std::atexit([] { std::filesystem::remove_all(std::filesystem::path(Files()[0]).parent_path().parent_path()); });
    return out;
  }();
  return *files;
}

void BM_CriteoParse(benchmark::State& state) {
  std::ifstream in(Files()[0], std::ios::binary);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (text.size() > 8 << 20) text.resize(text.rfind('\n', 8 << 20) + 1);  // 8 MiB of whole lines
  if (text.empty() || text[0] == '\x1f') {
    state.SkipWithError("the file is gzip: BM_CriteoParse wants the plain text");
    return;
  }
  constexpr size_t kChunk = size_t{1} << 20;
  internal::ParsedChunk parsed;
  int64_t lines = 0;
  for (auto _ : state) {
    for (size_t at = 0; at < text.size();) {
      size_t end = std::min(text.size(), at + kChunk);
      end = text.rfind('\n', end - 1) + 1;
      internal::ParseCriteoChunk(text.data() + at, end - at, CriteoLayout{}, &parsed);
      lines += parsed.examples;
      at = end;
    }
  }
  state.SetItemsProcessed(lines);
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(text.size()));
  state.counters["lines_per_s"] = benchmark::Counter(static_cast<double>(lines), benchmark::Counter::kIsRate);
}
BENCHMARK(BM_CriteoParse)->Unit(benchmark::kMillisecond);

void BM_CriteoReader(benchmark::State& state) {
  const bool gzip = state.range(0) != 0;
  const std::string& file = Files()[gzip ? 1 : 0];
  CriteoReaderOptions options;
  options.parse_threads = static_cast<int>(state.range(1));
  constexpr int64_t kBatch = 1024;
  std::vector<int64_t> ids(kBatch * 26);
  std::vector<float> dense(kBatch * 13), labels(kBatch);
  int64_t lines = 0;
  double cpu = 0;
  for (auto _ : state) {
    const double cpu0 = ProcessCpuSeconds();
    auto reader = CriteoReader::Open(WholeFiles({file}), options);
    for (;;) {
      absl::StatusOr<int64_t> n = (*reader)->Read(kBatch, ids.data(), dense.data(), labels.data());
      if (!n.ok()) {
        state.SkipWithError(std::string(n.status().message()).c_str());
        return;
      }
      lines += *n;
      if (*n == 0) break;
    }
    reader->reset();
    cpu += ProcessCpuSeconds() - cpu0;
  }
  state.SetItemsProcessed(lines);
  state.counters["lines_per_s"] = benchmark::Counter(static_cast<double>(lines), benchmark::Counter::kIsRate);
  state.counters["lines_per_cpu_s"] = static_cast<double>(lines) / cpu;
  state.counters["cpu_per_wall"] = benchmark::Counter(cpu, benchmark::Counter::kIsRate);
}
BENCHMARK(BM_CriteoReader)
    ->ArgNames({"gzip", "threads"})
    ->Args({0, 1})
    ->Args({0, 2})
    ->Args({1, 1})
    ->Args({1, 2})
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace psflow::data

BENCHMARK_MAIN();
