// bench/ctr_data_bench.cc — Google Benchmark timings of the synthetic CTR generator
// (include/psflow/data/ctr.h) on one thread: examples per second of a worker's batch with the
// default configuration (26 fields with Criteo's cardinalities capped at 10^6, 13 dense features,
// teacher dim 8), with every field's vocabulary 10^9 (most draws in wide cells), with teacher dim 32,
// and the exact AUC of n scores. Goal: >= 1M examples/s per core. Correctness: data_ctr_*_test.
// Run: build/bench/psflow_ctr_data_bench [--benchmark_filter=REGEX]
#include <benchmark/benchmark.h>

#include <random>
#include <vector>

#include "psflow/data/ctr.h"
#include "psflow/data/ctr_metrics.h"

namespace psflow::data {
namespace {

void RunBatches(benchmark::State& state, const CtrConfig& config) {
  const CtrGenerator gen = *CtrGenerator::Create(config);
  const int64_t batch = state.range(0);
  std::vector<int64_t> ids(batch * gen.num_fields());
  std::vector<float> dense(batch * gen.num_dense()), labels(batch);
  int64_t step = 0;
  for (auto _ : state) {
    benchmark::DoNotOptimize(gen.FillBatch(0, step++, batch, ids.data(), dense.data(), labels.data()));
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(state.iterations() * batch);
}

void BM_CtrBatch(benchmark::State& state) { RunBatches(state, CtrConfig{}); }
BENCHMARK(BM_CtrBatch)->Arg(256)->Arg(4096);

void BM_CtrBatchHugeVocab(benchmark::State& state) {
  CtrConfig config;
  config.vocab_sizes.assign(26, 1'000'000'000);
  RunBatches(state, config);
}
BENCHMARK(BM_CtrBatchHugeVocab)->Arg(256)->Arg(4096);

void BM_CtrBatchTeacherDim32(benchmark::State& state) {
  CtrConfig config;
  config.teacher_dim = 32;
  RunBatches(state, config);
}
BENCHMARK(BM_CtrBatchTeacherDim32)->Arg(256)->Arg(4096);

void BM_Auc(benchmark::State& state) {
  const int64_t n = state.range(0);
  std::mt19937_64 rng(1);
  std::vector<float> labels(n), scores(n);
  for (int64_t i = 0; i < n; ++i) {
    labels[i] = static_cast<float>(rng() % 4 == 0);
    scores[i] = static_cast<float>(rng() % 1000000) * 1e-6f + 0.2f * labels[i];
  }
  for (auto _ : state) benchmark::DoNotOptimize(Auc(labels, scores));
  state.SetItemsProcessed(state.iterations() * n);
}
BENCHMARK(BM_Auc)->Arg(1000)->Arg(1000000)->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace psflow::data

BENCHMARK_MAIN();
