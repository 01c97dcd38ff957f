// bench/table_ids_bench.cc — Google Benchmark timings of the per-id work a step's table rows cost
// outside the update itself, for a ctr DLRM's step (26 fixed tables of 100000 rows, dim 16, about
// 700 unique ids each, as `bench/ctr_vs_pytorch.py` pushes per worker and step):
//   RouteTablesPush: the worker routing a push's rows to ps tasks (ps/client/table_calls.h's
//     RouteTables: each id checked once and routed, the rows cut per ps task);
//   PsDecodeIds: the ps checking a pull's ids where they enter it (PsTables::Decode: no id twice,
//     each id this shard's own).
// Each with the tables whole on one ps (shards:1) or split over two (shards:2, div), beside the
// floor in the same run: IdsMemcpy, a copy of the same ids (what any per-id pass costs at least).
// The figure is ids/s, five repetitions each (mean, median, spread); run before and after a change
// to the id paths, on the same machine.
// Run: build/bench/psflow_table_ids_bench. One thread; timings only (correctness: ps_tables_test,
// ps_server_tables_test, dist_table_routing_test).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "proto/psflow.pb.h"
#include "ps/client/table_calls.h"
#include "ps/common/wire_config.h"
#include "ps/server/ps_tables.h"

namespace psflow::ps {
namespace {

constexpr int kTables = 26;
constexpr int64_t kRows = 100000;
constexpr int64_t kDim = 16;
constexpr int64_t kIdsPerTable = 700;

// kIdsPerTable unique ids of [first, first + count), drawn with `seed`, in random order.
std::vector<int64_t> UniqueIds(int64_t first, int64_t count, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<int64_t> ids;
  std::vector<bool> taken(static_cast<size_t>(count), false);
  std::uniform_int_distribution<int64_t> pick(0, count - 1);
  while (static_cast<int64_t>(ids.size()) < std::min(kIdsPerTable, count)) {
    const int64_t r = pick(rng);
    if (taken[static_cast<size_t>(r)]) continue;
    taken[static_cast<size_t>(r)] = true;
    ids.push_back(first + r);
  }
  return ids;
}

std::string TableName(int t) { return "tables." + std::to_string(t); }

dist::PlacementPlan Plan(int shards) {
  dist::PartitionerSpec partitioner;
  if (shards > 1) {
    partitioner.kind = dist::PartitionerKind::kFixedSize;
    partitioner.num_shards = shards;
  }
  std::vector<dist::TableSpec> tables;
  for (int t = 0; t < kTables; ++t) {
    dist::TableSpec& spec = tables.emplace_back();
    spec.name = TableName(t);
    spec.dim = kDim;
    spec.num_embeddings = kRows;
    spec.strategy = dist::TableStrategy::kDiv;
    spec.initializer = dist::TableInitializer::Uniform(-1, 1, /*seed=*/7);
  }
  dist::PlacementPlan plan =
      dist::PlanPlacement({{"w", {2}}}, partitioner, dist::PlacementStrategy::kRoundRobin, /*num_ps=*/2);
  if (absl::Status s = dist::PlanTables(tables, partitioner, dist::PlacementStrategy::kRoundRobin, &plan); !s.ok()) {
    std::abort();
  }
  return plan;
}

void BM_RouteTablesPush(benchmark::State& state) {
  const int shards = static_cast<int>(state.range(0));
  const dist::PlacementPlan plan = Plan(shards);
  std::vector<std::vector<int64_t>> ids(kTables);
  std::vector<std::vector<float>> grads(kTables);
  TableStep step;
  for (int t = 0; t < kTables; ++t) {
    ids[t] = UniqueIds(0, kRows, static_cast<uint64_t>(t) + 1);
    grads[t].assign(ids[t].size() * kDim, 0.25f);
    TableRowsRef& ref = step.pushes.emplace_back();
    ref.table = TableName(t);
    ref.ids = &ids[t];
    ref.grad_values = grads[t];
  }
  int64_t n = 0;
  for (auto _ : state) {
    absl::StatusOr<std::shared_ptr<TableWork>> work = RouteTables("Push", step, plan);
    if (!work.ok()) {
      state.SkipWithError(std::string(work.status().message()).c_str());
      return;
    }
    benchmark::DoNotOptimize(work);
    n += kTables * kIdsPerTable;
  }
  state.counters["ids_per_s"] = benchmark::Counter(static_cast<double>(n), benchmark::Counter::kIsRate);
}
BENCHMARK(BM_RouteTablesPush)->ArgName("shards")->Arg(1)->Arg(2)->Repetitions(5)->ReportAggregatesOnly(true);

// Ps task 0 of 2 holding shard 0 of each table (split: ids [0, kRows / 2)).
std::unique_ptr<PsTables> TablesOfTask0(int shards) {
  TrainingConfig config;
  config.optimizer.name = "sgd";
  config.optimizer.learning_rate = 1.0f;
  for (int t = 0; t < kTables; ++t) {
    TableDeclaration& d = config.tables.emplace_back();
    d.spec.name = TableName(t);
    d.spec.dim = kDim;
    d.spec.num_embeddings = kRows;
    d.spec.strategy = dist::TableStrategy::kDiv;
    d.spec.initializer = dist::TableInitializer::Uniform(-1, 1, /*seed=*/7);
    d.num_shards = shards;
  }
  wire::InitializeRequest init;
  *init.mutable_config() = ToWire(config);
  for (int t = 0; t < kTables; ++t) {
    wire::TableShardInfo* info = init.add_table_shards();
    info->set_table(TableName(t));
    info->set_shard(0);
    info->set_num_ps(2);
  }
  absl::StatusOr<std::unique_ptr<PsTables>> tables = PsTables::Create(init, 0);
  if (!tables.ok()) std::abort();
  return *std::move(tables);
}

void BM_PsDecodeIds(benchmark::State& state) {
  const int shards = static_cast<int>(state.range(0));
  std::unique_ptr<PsTables> tables = TablesOfTask0(shards);
  google::protobuf::RepeatedPtrField<wire::TableRows> blocks;
  for (int t = 0; t < kTables; ++t) {
    const std::vector<int64_t> ids = UniqueIds(0, kRows / shards, static_cast<uint64_t>(t) + 1);
    wire::TableRows* block = blocks.Add();
    block->set_table(shards > 1 ? TableName(t) + "/part_0" : TableName(t));
    block->set_ids(std::string(reinterpret_cast<const char*>(ids.data()), ids.size() * sizeof(int64_t)));
  }
  int64_t n = 0;
  for (auto _ : state) {
    absl::StatusOr<std::vector<TableBlock>> decoded = tables->Decode(blocks, nullptr, 0);
    if (!decoded.ok()) {
      state.SkipWithError(std::string(decoded.status().message()).c_str());
      return;
    }
    benchmark::DoNotOptimize(decoded);
    n += kTables * kIdsPerTable;
  }
  state.counters["ids_per_s"] = benchmark::Counter(static_cast<double>(n), benchmark::Counter::kIsRate);
}
BENCHMARK(BM_PsDecodeIds)->ArgName("shards")->Arg(1)->Arg(2)->Repetitions(5)->ReportAggregatesOnly(true);

void BM_IdsMemcpy(benchmark::State& state) {
  std::vector<std::vector<int64_t>> ids(kTables), copy(kTables);
  for (int t = 0; t < kTables; ++t) {
    ids[t] = UniqueIds(0, kRows, static_cast<uint64_t>(t) + 1);
    copy[t].resize(ids[t].size());
  }
  int64_t n = 0;
  for (auto _ : state) {
    for (int t = 0; t < kTables; ++t) std::memcpy(copy[t].data(), ids[t].data(), ids[t].size() * sizeof(int64_t));
    benchmark::ClobberMemory();
    n += kTables * kIdsPerTable;
  }
  state.counters["ids_per_s"] = benchmark::Counter(static_cast<double>(n), benchmark::Counter::kIsRate);
}
BENCHMARK(BM_IdsMemcpy)->Repetitions(5)->ReportAggregatesOnly(true);

}  // namespace
}  // namespace psflow::ps

BENCHMARK_MAIN();
