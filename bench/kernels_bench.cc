// bench/kernels_bench.cc — Google Benchmark timings of the compute kernels a training step spends
// its time in: matmul (OpenBLAS), conv forward and backward (oneDNN), and each optimizer's dense
// update (the loop the ps runs on every push), over sizes. One intra-op thread, so figures compare
// across machines of different core counts. Timings only: correctness is src/core's and
// src/optim's tests. Run: build/bench/psflow_kernels_bench [--benchmark_filter=REGEX]
#include <benchmark/benchmark.h>

#include <string>
#include <vector>

#include "psflow/core/autodiff.h"
#include "psflow/core/ops.h"
#include "psflow/core/random.h"
#include "psflow/core/tensor.h"
#include "psflow/core/threading.h"
#include "psflow/optim/optimizer.h"

namespace psflow {
namespace {

Tensor RandomTensor(const Shape& shape, uint64_t seed) {
  Rng rng(seed);
  Tensor t(shape);
  for (int64_t i = 0; i < t.size(); ++i) t[i] = rng.Uniform() * 2.0f - 1.0f;
  return t;
}

// [n, n] x [n, n].
void BM_MatMul(benchmark::State& state) {
  SetIntraOpThreads(1);
  const int64_t n = state.range(0);
  Var a = Constant(RandomTensor({n, n}, 1));
  Var b = Constant(RandomTensor({n, n}, 2));
  for (auto _ : state) {
    Var c = ops::MatMul(a, b);
    benchmark::DoNotOptimize(c->value.data());
  }
  state.SetItemsProcessed(state.iterations() * 2 * n * n * n);  // flops
}
BENCHMARK(BM_MatMul)->RangeMultiplier(4)->Range(16, 1024)->Unit(benchmark::kMicrosecond);

// The seed mlp's first layer: [batch, 784] x [784, 100].
void BM_MatMulMlpLayer(benchmark::State& state) {
  SetIntraOpThreads(1);
  const int64_t batch = state.range(0);
  Var x = Constant(RandomTensor({batch, 784}, 1));
  Var w = Constant(RandomTensor({784, 100}, 2));
  for (auto _ : state) {
    Var y = ops::MatMul(x, w);
    benchmark::DoNotOptimize(y->value.data());
  }
  state.SetItemsProcessed(state.iterations() * 2 * batch * 784 * 100);
}
BENCHMARK(BM_MatMulMlpLayer)->Arg(1)->Arg(100)->Arg(1000)->Unit(benchmark::kMicrosecond);

// The seed cnn's two convolutions (5x5, SAME): args {batch, layer}; layer 0 is 28x28x1 -> 32,
// layer 1 is 14x14x32 -> 64.
struct ConvShape {
  int64_t hw, in, out;
};
ConvShape CnnLayer(int64_t layer) { return layer == 0 ? ConvShape{28, 1, 32} : ConvShape{14, 32, 64}; }

void BM_Conv2DForward(benchmark::State& state) {
  SetIntraOpThreads(1);
  const int64_t batch = state.range(0);
  const ConvShape s = CnnLayer(state.range(1));
  Var x = Constant(RandomTensor({batch, s.hw, s.hw, s.in}, 1));
  Var filter = MakeParameter("filter", RandomTensor({5, 5, s.in, s.out}, 2));
  for (auto _ : state) {
    Var y = ops::Conv2D(x, filter, 1, 1, ops::Padding::kSame);
    benchmark::DoNotOptimize(y->value.data());
  }
  state.SetItemsProcessed(state.iterations() * 2 * batch * s.hw * s.hw * 25 * s.in * s.out);
}
BENCHMARK(BM_Conv2DForward)->ArgsProduct({{1, 16, 64}, {0, 1}})->Unit(benchmark::kMicrosecond);

// The backward closure of one convolution alone (gradients of its input and its filter), with the
// forward pass outside the timing.
void BM_Conv2DBackward(benchmark::State& state) {
  SetIntraOpThreads(1);
  const int64_t batch = state.range(0);
  const ConvShape s = CnnLayer(state.range(1));
  Var x = MakeParameter("x", RandomTensor({batch, s.hw, s.hw, s.in}, 1));
  Var filter = MakeParameter("filter", RandomTensor({5, 5, s.in, s.out}, 2));
  const Tensor upstream = RandomTensor({batch, s.hw, s.hw, s.out}, 3);
  for (auto _ : state) {
    state.PauseTiming();
    Var y = ops::Conv2D(x, filter, 1, 1, ops::Padding::kSame);
    y->grad = upstream;
    ZeroGrad({x, filter});
    state.ResumeTiming();
    y->backward(*y);
    benchmark::DoNotOptimize(filter->grad.data());
  }
  state.SetItemsProcessed(state.iterations() * 4 * batch * s.hw * s.hw * 25 * s.in * s.out);
}
BENCHMARK(BM_Conv2DBackward)->ArgsProduct({{1, 16, 64}, {0, 1}})->Unit(benchmark::kMicrosecond);

// One dense update of a variable of `n` floats, as the ps applies a push.
void BM_OptimizerApply(benchmark::State& state, const std::string& name) {
  optim::OptimizerConfig config;
  config.name = name;
  config.learning_rate = 1e-3f;
  auto optimizer = optim::MakeOptimizer(config);
  if (!optimizer.ok()) {
    state.SkipWithError(std::string(optimizer.status().message()).c_str());
    return;
  }
  const int64_t n = state.range(0);
  Tensor w = RandomTensor({n}, 1);
  const Tensor g = RandomTensor({n}, 2);
  optim::SlotState slots = (*optimizer)->NewState(n);
  for (auto _ : state) {
    (*optimizer)->ApplyDense(w.data(), g.data(), n, slots, config.learning_rate);
    benchmark::DoNotOptimize(w.data());
  }
  state.SetBytesProcessed(state.iterations() * n * static_cast<int64_t>(sizeof(float)));
  state.SetItemsProcessed(state.iterations() * n);
}
BENCHMARK_CAPTURE(BM_OptimizerApply, sgd, std::string("sgd"))->RangeMultiplier(16)->Range(1 << 10, 1 << 22);
BENCHMARK_CAPTURE(BM_OptimizerApply, momentum, std::string("momentum"))->RangeMultiplier(16)->Range(1 << 10, 1 << 22);
BENCHMARK_CAPTURE(BM_OptimizerApply, adagrad, std::string("adagrad"))->RangeMultiplier(16)->Range(1 << 10, 1 << 22);
BENCHMARK_CAPTURE(BM_OptimizerApply, adam, std::string("adam"))->RangeMultiplier(16)->Range(1 << 10, 1 << 22);
BENCHMARK_CAPTURE(BM_OptimizerApply, rmsprop, std::string("rmsprop"))->RangeMultiplier(16)->Range(1 << 10, 1 << 22);

}  // namespace
}  // namespace psflow

BENCHMARK_MAIN();
