// bench/table_bench.cc — Google Benchmark timings of an embedding table on the ps
// (src/ps/server/table/): gathering a pull's rows and applying a push's gradient rows with each
// sparse update rule, at dim 16, 64 and 256, on a fixed shard and a dynamic share, beside a memcpy
// of the same bytes (rows · dim · 4) in the same run. Each call takes 4096 unique ids drawn at
// random from a table of 2^25 bytes of weights (bigger than the last-level cache; the rule's
// slots come on top), all rows present; the same ids every call (those rows stay in cache; the
// Cold gather cycles through disjoint batches instead). The figure is rows/s; the goals are gather
// >= 0.5x and adagrad apply >= 0.25x the memcpy's rows/s at the same dim.
// Run: build/bench/psflow_table_bench --benchmark_format=json | python3 bench/table_bench_ratios.py
// One thread; timings only (correctness: ps_table_test).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "ps/server/table/table_shard.h"

namespace psflow::ps::table {
namespace {

constexpr int64_t kBatch = 4096;
constexpr int64_t kWeightBytes = int64_t{1} << 25;
const char* const kRules[] = {"sgd", "momentum", "adagrad", "ftrl", "adam", "rmsprop"};

int64_t TableRows(int64_t dim) { return kWeightBytes / (dim * static_cast<int64_t>(sizeof(float))); }

struct Fixture {
  std::unique_ptr<TableShard> shard;
  std::vector<int64_t> ids;                   // a call's unique ids (the first of `batches`)
  std::vector<std::vector<int64_t>> batches;  // disjoint calls covering the table (up to 64)
  std::vector<float> rows;                    // [kBatch, dim]
};

// A table of TableRows(dim) rows (fixed, or dynamic with every row created), and a call's ids.
Fixture Make(bool dynamic, int64_t dim, const std::string& rule_name) {
  Fixture f;
  const int64_t n = TableRows(dim);
  TableConfig config;
  config.spec.name = "bench";
  config.spec.dim = dim;
  config.spec.initializer.kind = InitKind::kUniform;
  config.spec.initializer.seed = 1;
  config.spec.kind = dynamic ? TableKind::kDynamic : TableKind::kFixed;
  config.spec.num_embeddings = n;
  SparseRuleConfig rule;
  rule.optimizer.name = rule_name;
  rule.optimizer.learning_rate = 1e-3f;
  f.shard = std::move(MakeTableShard(config, rule, 0, 1)).value();
  // Dynamic ids look hashed: id = a fixed odd multiple of the row number.
  const auto id_of = [dynamic](int64_t r) { return dynamic ? r * int64_t{0x9e3779b97f4a7c1} : r; };
  if (dynamic) {
    std::vector<int64_t> all;
    std::vector<float> g;
    for (int64_t start = 0; start < n; start += kBatch) {
      all.clear();
      for (int64_t r = start; r < std::min(n, start + kBatch); ++r) all.push_back(id_of(r));
      g.assign(all.size() * dim, 1e-3f);
      if (!f.shard->Apply(all, g, 1).ok()) std::abort();
    }
  }
  std::mt19937_64 rng(42);
  std::vector<int64_t> perm(static_cast<size_t>(n));
  for (int64_t r = 0; r < n; ++r) perm[r] = r;
  std::shuffle(perm.begin(), perm.end(), rng);
  for (int64_t b = 0; b < std::min<int64_t>(64, n / kBatch); ++b) {
    f.batches.emplace_back();
    for (int64_t i = b * kBatch; i < (b + 1) * kBatch; ++i) f.batches.back().push_back(id_of(perm[i]));
  }
  f.ids = f.batches[0];
  f.rows.assign(kBatch * dim, 1e-3f);
  return f;
}

void SetRows(benchmark::State& state, int64_t dim) {
  state.counters["rows/s"] =
      benchmark::Counter(static_cast<double>(state.iterations() * kBatch), benchmark::Counter::kIsRate);
  state.SetBytesProcessed(state.iterations() * kBatch * dim * static_cast<int64_t>(sizeof(float)));
}

// The baseline: one memcpy of a call's bytes, from a different place of a table-sized buffer each
// time (so the source is not always in cache either).
void BM_RowsMemcpy(benchmark::State& state) {
  const int64_t dim = state.range(0);
  const int64_t call = kBatch * dim;
  std::vector<float> src(static_cast<size_t>(TableRows(dim) * dim), 1.0f), dst(static_cast<size_t>(call));
  int64_t offset = 0;
  for (auto _ : state) {
    std::memcpy(dst.data(), src.data() + offset, call * sizeof(float));
    benchmark::DoNotOptimize(dst.data());
    offset += call;
    if (offset + call > static_cast<int64_t>(src.size())) offset = 0;
  }
  SetRows(state, dim);
}
BENCHMARK(BM_RowsMemcpy)->ArgName("dim")->Arg(16)->Arg(64)->Arg(256);

// A pull's gather: range(0) = 0 fixed, 1 dynamic; range(1) = dim.
void BM_TableGather(benchmark::State& state) {
  const int64_t dim = state.range(1);
  Fixture f = Make(state.range(0) == 1, dim, "sgd");
  std::vector<float> out(static_cast<size_t>(kBatch * dim));
  for (auto _ : state) {
    if (!f.shard->Gather(f.ids, absl::MakeSpan(out)).ok()) std::abort();
    benchmark::DoNotOptimize(out.data());
  }
  SetRows(state, dim);
}
BENCHMARK(BM_TableGather)->ArgNames({"dynamic", "dim"})->ArgsProduct({{0, 1}, {16, 64, 256}});

// The same gather with the rows out of cache: each call takes the next of up to 64 disjoint
// batches of 4096 ids (together 2^18 rows, or the whole table at dim >= 64), as the memcpy takes
// the next block of its buffer. (BM_TableGather repeats one batch: its rows stay in cache.)
void BM_TableGatherCold(benchmark::State& state) {
  const int64_t dim = state.range(1);
  Fixture f = Make(state.range(0) == 1, dim, "sgd");
  std::vector<float> out(static_cast<size_t>(kBatch * dim));
  size_t b = 0;
  for (auto _ : state) {
    if (!f.shard->Gather(f.batches[b], absl::MakeSpan(out)).ok()) std::abort();
    benchmark::DoNotOptimize(out.data());
    b = b + 1 == f.batches.size() ? 0 : b + 1;
  }
  SetRows(state, dim);
}
BENCHMARK(BM_TableGatherCold)->ArgNames({"dynamic", "dim"})->ArgsProduct({{0, 1}, {16, 64, 256}});

// A push's apply (validation included): range(0) = rule (kRules), range(1) = dynamic, range(2) = dim.
void BM_TableApply(benchmark::State& state) {
  const int64_t dim = state.range(2);
  const std::string rule = kRules[state.range(0)];
  state.SetLabel(rule);
  Fixture f = Make(state.range(1) == 1, dim, rule);
  int64_t step = 2;
  for (auto _ : state) {
    if (!f.shard->Apply(f.ids, f.rows, step++).ok()) std::abort();
  }
  SetRows(state, dim);
}
BENCHMARK(BM_TableApply)
    ->ArgNames({"rule", "dynamic", "dim"})
    ->ArgsProduct({{0, 1, 2, 3, 4, 5}, {0, 1}, {16, 64, 256}});

}  // namespace
}  // namespace psflow::ps::table

BENCHMARK_MAIN();
