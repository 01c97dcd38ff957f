// bench/shard_bench.cc — Google Benchmark timings of a ps shard's update path (src/ps/server/shard.h), the
// work a ps task does for each push once the bytes have arrived: validating the received gradient
// (shape, rows, finiteness) and applying it with the optimizer (async), or adding it into the
// step's accumulator and applying the average (sync); dense and row-sparse gradients, over sizes.
// One intra-op thread. Timings only: correctness is ps_data_test and ps_sync_test.
// Run: build/bench/psflow_shard_bench [--benchmark_filter=REGEX]
#include <benchmark/benchmark.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "ps/server/shard.h"
#include "psflow/core/threading.h"
#include "psflow/optim/optimizer.h"
#include "rpc/tensor_coding.h"
#include "rpc/transport.h"

namespace psflow::ps {
namespace {

constexpr int64_t kRowSize = 64;  // floats per row of the sparse benchmarks' variable

std::unique_ptr<optim::Optimizer> Adam() {
  optim::OptimizerConfig config;
  config.name = "adam";
  config.learning_rate = 1e-3f;
  return std::move(optim::MakeOptimizer(config)).value();
}

std::unique_ptr<Shard> MakeShard(const Shape& shape, const optim::Optimizer& optimizer) {
  const int64_t n = NumElements(shape);
  FloatBuffer initial(static_cast<size_t>(n), 0.5f);
  return std::make_unique<Shard>("w", shape, std::move(initial), optimizer.NewState(n));
}

// A received push of one gradient: dense (`rows` empty) of `shape`, or those rows of it.
rpc::IncomingMessage ReceivedGradient(const Shape& shape, const std::vector<int64_t>& rows) {
  const int64_t n = rows.empty() ? NumElements(shape) : static_cast<int64_t>(rows.size()) * kRowSize;
  auto values = std::make_shared<FloatBuffer>(static_cast<size_t>(n), 0.01f);
  rpc::OutgoingMessage msg;
  rpc::OutgoingTensor t;
  t.meta.set_name("w");
  if (rows.empty()) {
    for (int64_t d : shape) t.meta.add_shape(d);
  } else {
    t.meta.set_sparse(true);
    t.meta.add_shape(static_cast<int64_t>(rows.size()));
    t.meta.add_shape(kRowSize);
    for (int64_t r : rows) t.meta.add_rows(r);
  }
  t.data = values->data();
  t.num_floats = n;
  t.owner = values;
  msg.tensors.push_back(std::move(t));
  return std::move(rpc::DecodeMessage(rpc::EncodeMessage(std::move(msg)))).value();
}

// Async push of a dense gradient of n floats: validate, then one Adam update.
void BM_ShardApplyDense(benchmark::State& state) {
  SetIntraOpThreads(1);
  const Shape shape{state.range(0)};
  auto optimizer = Adam();
  auto shard = MakeShard(shape, *optimizer);
  const rpc::IncomingMessage message = ReceivedGradient(shape, {});
  for (auto _ : state) {
    ShardGradient g;
    if (auto s = shard->DecodeGradient(message, 0, &g); !s.ok()) {
      state.SkipWithError(std::string(s.message()).c_str());
      return;
    }
    shard->Apply(g, *optimizer, 1e-3f);
  }
  state.SetBytesProcessed(state.iterations() * state.range(0) * static_cast<int64_t>(sizeof(float)));
}
BENCHMARK(BM_ShardApplyDense)->RangeMultiplier(16)->Range(1 << 10, 1 << 22);

// Async push of a row-sparse gradient: range(0) rows (every 7th, so no duplicates) of a
// [range(0) * 7, 64] variable.
void BM_ShardApplySparse(benchmark::State& state) {
  SetIntraOpThreads(1);
  const int64_t touched = state.range(0);
  const Shape shape{touched * 7, kRowSize};
  std::vector<int64_t> rows;
  for (int64_t r = 0; r < touched; ++r) rows.push_back(r * 7);
  auto optimizer = Adam();
  auto shard = MakeShard(shape, *optimizer);
  const rpc::IncomingMessage message = ReceivedGradient(shape, rows);
  for (auto _ : state) {
    ShardGradient g;
    if (auto s = shard->DecodeGradient(message, 0, &g); !s.ok()) {
      state.SkipWithError(std::string(s.message()).c_str());
      return;
    }
    shard->Apply(g, *optimizer, 1e-3f);
  }
  state.SetBytesProcessed(state.iterations() * touched * kRowSize * static_cast<int64_t>(sizeof(float)));
}
BENCHMARK(BM_ShardApplySparse)->RangeMultiplier(8)->Range(8, 4096);

// One sync step of range(1) workers' dense gradients of range(0) floats: each is validated and
// accumulated, then the average is applied once.
void BM_ShardSyncStepDense(benchmark::State& state) {
  SetIntraOpThreads(1);
  const Shape shape{state.range(0)};
  const int workers = static_cast<int>(state.range(1));
  auto optimizer = Adam();
  auto shard = MakeShard(shape, *optimizer);
  const rpc::IncomingMessage message = ReceivedGradient(shape, {});
  for (auto _ : state) {
    for (int w = 0; w < workers; ++w) {
      ShardGradient g;
      if (auto s = shard->DecodeGradient(message, 0, &g); !s.ok()) {
        state.SkipWithError(std::string(s.message()).c_str());
        return;
      }
      g.worker = w;  // summed in worker order when the step applies (ps/server/shard.h)
      shard->Accumulate(g);
    }
    shard->ApplyAccumulated(workers, *optimizer, 1e-3f);
  }
  state.SetBytesProcessed(state.iterations() * workers * state.range(0) * static_cast<int64_t>(sizeof(float)));
}
BENCHMARK(BM_ShardSyncStepDense)->ArgsProduct({{1 << 10, 1 << 16, 1 << 20}, {2, 4}});

}  // namespace
}  // namespace psflow::ps

BENCHMARK_MAIN();
