// bench/shard_bench.cc — Google Benchmark timings of a ps shard's update path (src/ps/server/shard.h), the
// work a ps task does for each push once the bytes have arrived: validating the received gradient
// (shape, rows, finiteness) and applying it with the optimizer (async), or adding it into the
// step's accumulator and applying the average (sync); dense and row-sparse gradients, over sizes.
// One intra-op thread. Timings only: correctness is ps_data_test and ps_sync_test.
// Run: build/bench/psflow_shard_bench [--benchmark_filter=REGEX]
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstring>
#include <iterator>
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

// A received dense push of n floats cut the way gRPC hands the ps a large message: pieces of at
// most 64 KiB (one per TCP read), each in its own buffer 8 bytes past a 16-byte boundary, their
// lengths not multiples of 4 (so most floats after the first piece sit misaligned, and some are
// split across two pieces). The lengths cycle through sizes seen in a 16 MiB push on loopback.
struct Fragmented {
  std::vector<std::unique_ptr<char[]>> buffers;
  rpc::IncomingMessage message;
};
std::unique_ptr<Fragmented> FragmentedGradient(int64_t n, float value) {
  static constexpr size_t kPieces[] = {63590, 65536, 65536, 1702, 64459, 65536, 63834, 65536, 2567, 65430, 62969, 97};
  auto out = std::make_unique<Fragmented>();
  std::vector<char> bytes(static_cast<size_t>(n) * sizeof(float));
  for (int64_t i = 0; i < n; ++i) std::memcpy(bytes.data() + 4 * i, &value, 4);
  std::vector<rpc::IncomingMessage::Segment> segments;
  for (size_t at = 0, k = 0; at < bytes.size(); ++k) {
    const size_t take = std::min(kPieces[k % std::size(kPieces)], bytes.size() - at);
    out->buffers.push_back(std::make_unique<char[]>(take + 64));
    char* p = out->buffers.back().get();
    p += (24 - reinterpret_cast<uintptr_t>(p) % 16) % 16 + 8;  // 8 past a 16-byte boundary
    std::memcpy(p, bytes.data() + at, take);
    segments.push_back({p, take});
    at += take;
  }
  wire::TensorList list;
  wire::TensorMeta* meta = list.add_tensors();
  meta->set_name("w");
  meta->add_shape(n);
  out->message = std::move(rpc::IncomingMessage::Make("", std::move(list), std::move(segments), nullptr,
                                                      static_cast<int64_t>(bytes.size())))
                     .value();
  return out;
}

std::unique_ptr<optim::Optimizer> Sgd() {
  optim::OptimizerConfig config;
  config.name = "sgd";
  config.learning_rate = 1e-30f;
  return std::move(optim::MakeOptimizer(config)).value();
}

// A received 16 MiB (range(0) floats) SGD push as the ps handles it: the finiteness check
// (DecodeGradient) and the update (Apply), on range(1) intra-op threads. range(2): 0 = both,
// 1 = the check alone, 2 = the update alone, 3 = the update of a contiguous, aligned gradient.
void BM_ShardPushReceived(benchmark::State& state) {
  SetIntraOpThreads(static_cast<int>(state.range(1)));
  const Shape shape{state.range(0)};
  auto optimizer = Sgd();
  auto shard = MakeShard(shape, *optimizer);
  auto received = FragmentedGradient(state.range(0), 1e-3f);
  const rpc::IncomingMessage contiguous = ReceivedGradient(shape, {});
  ShardGradient decoded;
  if (auto s = shard->DecodeGradient(state.range(2) == 3 ? contiguous : received->message, 0, &decoded); !s.ok()) {
    state.SkipWithError(std::string(s.message()).c_str());
    return;
  }
  for (auto _ : state) {
    if (state.range(2) < 2) {
      ShardGradient g;
      if (auto s = shard->DecodeGradient(received->message, 0, &g); !s.ok()) {
        state.SkipWithError(std::string(s.message()).c_str());
        return;
      }
    }
    if (state.range(2) != 1) shard->Apply(decoded, *optimizer, 1e-30f);
  }
  state.SetBytesProcessed(state.iterations() * state.range(0) * static_cast<int64_t>(sizeof(float)));
  SetIntraOpThreads(1);
}
BENCHMARK(BM_ShardPushReceived)->ArgsProduct({{1 << 22}, {1, 2}, {0, 1, 2, 3}})->Unit(benchmark::kMicrosecond);

// The update of the same received gradient on one thread, the two ways of reading its pieces:
// range(1) 0 = through an aligned bounce buffer (ForEachRunInRange + Apply, the ps's path
// before), 1 = in place (ForEachByteRunInRange + ApplyFromBytes, the ps's path now).
void BM_ReceivedUpdateReads(benchmark::State& state) {
  const int64_t n = state.range(0);
  auto optimizer = Sgd();
  optim::SlotState slots = optimizer->NewState(n);
  FloatBuffer w(static_cast<size_t>(n), 0.5f);
  auto received = FragmentedGradient(n, 1e-3f);
  const rpc::IncomingMessage& message = received->message;
  for (auto _ : state) {
    if (state.range(1) == 0) {
      message.ForEachRunInRange(0, 0, n, [&](const float* run, int64_t first, int64_t k) {
        optimizer->Apply(w.data(), run, slots, first, k, 1e-30f, 1);
        return true;
      });
    } else {
      message.ForEachByteRunInRange(0, 0, n, [&](const void* run, int64_t first, int64_t k) {
        optimizer->ApplyFromBytes(w.data(), run, slots, first, k, 1e-30f, 1);
        return true;
      });
    }
  }
  state.SetBytesProcessed(state.iterations() * n * static_cast<int64_t>(sizeof(float)));
}
BENCHMARK(BM_ReceivedUpdateReads)->ArgsProduct({{1 << 18, 1 << 22, 1 << 25}, {0, 1}})->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace psflow::ps

BENCHMARK_MAIN();
