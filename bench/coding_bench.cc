// bench/coding_bench.cc — Google Benchmark timings of the tensor coding every push and pull goes
// through (src/rpc/tensor_coding.h): encoding a message into a gRPC byte buffer and decoding it,
// for dense tensors and row-sparse ones (an embedding gradient: a few rows of a big variable),
// over sizes; plus the receiver's copy out of the decoded slices. Timings only: the round-trip
// checks are rpc_tensor_coding_test. Run: build/bench/psflow_coding_bench [--benchmark_filter=RE]
#include <benchmark/benchmark.h>

#include <string>
#include <utility>
#include <vector>

#include "psflow/core/tensor.h"
#include "rpc/tensor_coding.h"
#include "rpc/transport.h"

namespace psflow::rpc {
namespace {

Tensor Ramp(int64_t n) {
  Tensor t(Shape{n});
  for (int64_t i = 0; i < n; ++i) t[i] = 0.5f * static_cast<float>(i % 1000);
  return t;
}

// A push of one dense tensor of `n` floats.
OutgoingMessage DenseMessage(const Tensor& t) {
  OutgoingMessage msg;
  msg.header = "push";
  OutgoingTensor out;
  out.meta.set_name("w");
  out.meta.add_shape(t.size());
  out.data = t.data();
  out.num_floats = t.size();
  msg.tensors.push_back(std::move(out));
  return msg;
}

// A push of `rows` rows (every 7th) of a [rows * 7, row_size] variable, as an embedding sends.
OutgoingMessage SparseMessage(const Tensor& values, int64_t rows, int64_t row_size) {
  OutgoingMessage msg;
  msg.header = "push";
  OutgoingTensor out;
  out.meta.set_name("embedding");
  out.meta.set_sparse(true);
  out.meta.add_shape(rows);
  out.meta.add_shape(row_size);
  for (int64_t r = 0; r < rows; ++r) out.meta.add_rows(r * 7);
  out.data = values.data();
  out.num_floats = rows * row_size;
  msg.tensors.push_back(std::move(out));
  return msg;
}

void BM_EncodeDense(benchmark::State& state) {
  const Tensor t = Ramp(state.range(0));
  for (auto _ : state) {
    grpc::ByteBuffer buffer = EncodeMessage(DenseMessage(t));
    benchmark::DoNotOptimize(buffer.Length());
  }
  // No bytes counter: from kInlineTensorBytes (64 KiB) on the tensor is wrapped, not copied, so the
  // time stays flat with the size.
}
BENCHMARK(BM_EncodeDense)->RangeMultiplier(16)->Range(1 << 8, 1 << 22);

void BM_DecodeDense(benchmark::State& state) {
  const Tensor t = Ramp(state.range(0));
  const grpc::ByteBuffer buffer = EncodeMessage(DenseMessage(t));
  for (auto _ : state) {
    absl::StatusOr<IncomingMessage> in = DecodeMessage(buffer);
    if (!in.ok()) {
      state.SkipWithError(std::string(in.status().message()).c_str());
      return;
    }
    benchmark::DoNotOptimize(in->num_floats(0));
  }
  // No bytes counter: decoding references the received slices; the copy is BM_DecodeAndCopyDense.
}
BENCHMARK(BM_DecodeDense)->RangeMultiplier(16)->Range(1 << 8, 1 << 22);

// Decode and copy the tensor out, as a pull's receiver does.
void BM_DecodeAndCopyDense(benchmark::State& state) {
  const Tensor t = Ramp(state.range(0));
  const grpc::ByteBuffer buffer = EncodeMessage(DenseMessage(t));
  Tensor dst(Shape{t.size()});
  for (auto _ : state) {
    absl::StatusOr<IncomingMessage> in = DecodeMessage(buffer);
    if (!in.ok()) {
      state.SkipWithError(std::string(in.status().message()).c_str());
      return;
    }
    in->CopyTo(0, dst.data());
    benchmark::DoNotOptimize(dst.data());
  }
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(t.bytes()));
}
BENCHMARK(BM_DecodeAndCopyDense)->RangeMultiplier(16)->Range(1 << 8, 1 << 22);

// Args {rows, row_size}.
void BM_EncodeRowSparse(benchmark::State& state) {
  const int64_t rows = state.range(0), row_size = state.range(1);
  const Tensor values = Ramp(rows * row_size);
  for (auto _ : state) {
    grpc::ByteBuffer buffer = EncodeMessage(SparseMessage(values, rows, row_size));
    benchmark::DoNotOptimize(buffer.Length());
  }
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(values.bytes()));
}
BENCHMARK(BM_EncodeRowSparse)->ArgsProduct({{16, 256, 4096}, {16, 128}});

void BM_DecodeRowSparse(benchmark::State& state) {
  const int64_t rows = state.range(0), row_size = state.range(1);
  const Tensor values = Ramp(rows * row_size);
  const grpc::ByteBuffer buffer = EncodeMessage(SparseMessage(values, rows, row_size));
  for (auto _ : state) {
    absl::StatusOr<IncomingMessage> in = DecodeMessage(buffer);
    if (!in.ok()) {
      state.SkipWithError(std::string(in.status().message()).c_str());
      return;
    }
    benchmark::DoNotOptimize(in->meta(0).rows_size());
  }
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(values.bytes()));
}
BENCHMARK(BM_DecodeRowSparse)->ArgsProduct({{16, 256, 4096}, {16, 128}});

}  // namespace
}  // namespace psflow::rpc

BENCHMARK_MAIN();
