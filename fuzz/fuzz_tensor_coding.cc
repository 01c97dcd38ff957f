// Fuzzes the decoding of RPC messages (src/rpc/tensor_coding.h, IncomingMessage in
// psflow/rpc/transport.h): every byte a peer sends goes through DecodeMessage.
//
// Input layout: byte 0 = control, the rest = the message bytes.
//   control bits 0-1: misalignment (0..3 bytes) of every slice's memory, as TCP reads leave it;
//   control bits 2-3: number of extra cut points (0..3), each taken from the next 2 input bytes
//   (little-endian, modulo the message size), so the message arrives in 1 to 4 slices.
// Committed seeds are built by fuzz/make_seeds.py in this layout.
//
// A message that decodes is checked against the bytes themselves, read independently of the
// decoder: every tensor's floats through CopyTo, CopyStrided, ForEachRun and AddTo equal the bytes
// at its place in the payload (a bfloat16 or float16 tensor's two-byte values widened by
// wire_dtype.h's one-value reference); and re-encoding the decoded message decodes to the same one.
#include <google/protobuf/stubs/logging.h>
#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/slice.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "rpc/tensor_coding.h"
#include "rpc/wire_dtype.h"

namespace {

using psflow::rpc::IncomingMessage;
using psflow::rpc::WireDtype;

[[noreturn]] void Fail(const char* what) {
  std::fprintf(stderr, "%s\n", what);
  std::abort();
}

grpc::ByteBuffer Slices(std::string_view message, std::vector<size_t> cuts, size_t misalign) {
  std::sort(cuts.begin(), cuts.end());
  cuts.push_back(message.size());
  std::vector<grpc::Slice> slices;
  size_t begin = 0;
  for (size_t end : cuts) {
    std::string piece(misalign, 'x');
    piece.append(message.substr(begin, end - begin));
    grpc::Slice whole(piece);
    slices.push_back(whole.sub(misalign, piece.size()));
    begin = end;
  }
  return grpc::ByteBuffer(slices.data(), slices.size());
}

uint32_t LoadU32(std::string_view bytes, size_t at) {
  uint32_t v;
  std::memcpy(&v, bytes.data() + at, 4);
  return v;
}

// Where the payload starts, from the framing in tensor_coding.h (only called on decoded messages,
// so the sizes are known to be in range).
size_t PayloadStart(std::string_view message) {
  size_t pos = 4 + LoadU32(message, 0);
  pos += 4 + LoadU32(message, pos);
  return pos + (8 - pos % 8) % 8;
}

// Tensor i's values as float32 bytes: its wire bytes themselves, or (a 16-bit dtype) each value
// widened by wire_dtype.h's one-value reference, which the decoder's array loops must match.
std::string ExpectedFloats(WireDtype dtype, std::string_view wire, int64_t n) {
  if (dtype == WireDtype::kFloat32) return std::string(wire);
  std::string floats(static_cast<size_t>(n) * 4, '\0');
  for (int64_t j = 0; j < n; ++j) {
    uint16_t h;
    std::memcpy(&h, wire.data() + 2 * j, 2);
    const float f = dtype == WireDtype::kBFloat16 ? psflow::rpc::BFloat16ToFloat(h) : psflow::rpc::HalfToFloat(h);
    std::memcpy(&floats[4 * j], &f, 4);
  }
  return floats;
}

// The same floats, bit for bit, or NaN where the other is NaN (re-encoding a 16-bit signalling NaN
// quiets it, as wire_dtype.h says).
bool SameFloats(const float* a, const float* b, size_t n) {
  for (size_t j = 0; j < n; ++j) {
    if (std::memcmp(&a[j], &b[j], 4) != 0 && !(a[j] != a[j] && b[j] != b[j])) return false;
  }
  return true;
}

void CheckTensors(const IncomingMessage& m, std::string_view payload) {
  size_t offset = 0;
  for (int i = 0; i < m.num_tensors(); ++i) {
    const int64_t n = m.num_floats(i);
    const size_t wire_bytes = static_cast<size_t>(n) * psflow::rpc::WireDtypeBytes(m.dtype(i));
    if (offset + wire_bytes > payload.size()) Fail("tensor extends past the payload");
    const std::string expected_floats = ExpectedFloats(m.dtype(i), payload.substr(offset, wire_bytes), n);
    const std::string_view expected = expected_floats;
    const size_t bytes = expected.size();
    offset += wire_bytes;

    std::vector<float> copy(static_cast<size_t>(n));
    m.CopyTo(i, copy.data());
    if (bytes > 0 && std::memcmp(copy.data(), expected.data(), bytes) != 0) Fail("CopyTo differs from the bytes");

    std::string runs;
    int64_t next = 0;
    m.ForEachRun(i, [&](const float* run, int64_t first, int64_t count) {
      if (first != next || reinterpret_cast<uintptr_t>(run) % alignof(float) != 0) Fail("ForEachRun out of order");
      runs.append(reinterpret_cast<const char*>(run), static_cast<size_t>(count) * 4);
      next += count;
      return true;
    });
    if (runs != expected) Fail("ForEachRun differs from the bytes");

    // AddTo onto zeros gives the values back, up to -0 + 0 = +0 and NaN payloads: compare as floats.
    std::vector<float> sum(static_cast<size_t>(n), 0.0f);
    m.AddTo(i, sum.data());
    for (int64_t j = 0; j < n; ++j) {
      const float want = copy[j] + 0.0f;
      if (!(sum[j] == want) && !(sum[j] != sum[j] && want != want)) Fail("AddTo differs from CopyTo");
    }

    // Rows of the last dimension, spread one float apart: the strided copy of a shard.
    const auto& shape = m.meta(i).shape();
    const int64_t block = shape.empty() ? n : shape[shape.size() - 1];
    if (n > 0 && block > 0 && n % block == 0) {
      const int64_t blocks = n / block;
      std::vector<float> strided(static_cast<size_t>(blocks * (block + 1)), 7.0f);
      m.CopyStrided(i, strided.data(), block, block + 1);
      for (int64_t k = 0; k < blocks; ++k) {
        if (std::memcmp(&strided[k * (block + 1)], &copy[k * block], block * 4) != 0 ||
            strided[k * (block + 1) + block] != 7.0f) {
          Fail("CopyStrided differs from CopyTo");
        }
      }
    }
  }
  if (offset != payload.size()) Fail("tensors do not cover the payload");
}

// decode(encode(decoded)) == decoded.
void CheckReencode(const IncomingMessage& m) {
  psflow::rpc::OutgoingMessage out;
  out.header = m.header();
  std::vector<std::vector<float>> values(m.num_tensors());
  for (int i = 0; i < m.num_tensors(); ++i) {
    values[i].resize(static_cast<size_t>(m.num_floats(i)));
    m.CopyTo(i, values[i].data());
    psflow::rpc::OutgoingTensor t;
    t.meta = m.meta(i);
    t.data = values[i].data();
    t.num_floats = m.num_floats(i);
    out.tensors.push_back(std::move(t));
  }
  absl::StatusOr<IncomingMessage> again = psflow::rpc::DecodeMessage(psflow::rpc::EncodeMessage(std::move(out)));
  if (!again.ok()) Fail("re-encoded message does not decode");
  if (again->header() != m.header() || again->num_tensors() != m.num_tensors()) Fail("re-encoding changed the message");
  for (int i = 0; i < m.num_tensors(); ++i) {
    if (again->meta(i).SerializeAsString() != m.meta(i).SerializeAsString())
      Fail("re-encoding changed a tensor header");
    std::vector<float> copy(values[i].size());
    again->CopyTo(i, copy.data());
    if (!SameFloats(copy.data(), values[i].data(), copy.size())) Fail("re-encoding changed tensor values");
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  // Headers with invalid UTF-8 in string fields fail to parse as they should, and protobuf logs
  // each one to stderr; keep the fuzzer's log readable.
  google::protobuf::SetLogHandler(nullptr);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const size_t misalign = data[0] & 3;
  const size_t num_cuts = (data[0] >> 2) & 3;
  size_t pos = 1;
  std::vector<uint16_t> raw_cuts;
  for (size_t c = 0; c < num_cuts && pos + 2 <= size; ++c, pos += 2) {
    raw_cuts.push_back(static_cast<uint16_t>(data[pos] | (data[pos + 1] << 8)));
  }
  const std::string_view message(reinterpret_cast<const char*>(data + pos), size - pos);
  std::vector<size_t> cuts;
  for (uint16_t c : raw_cuts) cuts.push_back(c % (message.size() + 1));

  absl::StatusOr<IncomingMessage> decoded = psflow::rpc::DecodeMessage(Slices(message, cuts, misalign));
  if (!decoded.ok()) {
    if (decoded.status().code() != absl::StatusCode::kInvalidArgument) Fail("decode error is not InvalidArgument");
    return 0;
  }
  if (decoded->wire_bytes() != static_cast<int64_t>(message.size())) Fail("wire_bytes is not the message size");
  const size_t start = PayloadStart(message);
  if (start > message.size()) Fail("decoded a message whose padding is missing");
  CheckTensors(*decoded, message.substr(start));
  CheckReencode(*decoded);
  // The headers of the data-plane methods must parse or fail cleanly whatever their bytes.
  psflow::wire::PushRequest push;
  (void)decoded->ParseHeader(&push);
  psflow::wire::InitializeRequest init;
  (void)decoded->ParseHeader(&init);
  return 0;
}
