// Round trips of tensors through the gRPC byte-buffer coding, re-sliced at arbitrary byte
// boundaries as a network would deliver them, and malformed buffers that must be errors.
#include "rpc/tensor_coding.h"

#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "psflow/core/tensor.h"

namespace psflow::rpc {
namespace {

std::string Flatten(const grpc::ByteBuffer& buffer) {
  std::vector<grpc::Slice> slices;
  EXPECT_TRUE(buffer.Dump(&slices).ok());
  std::string out;
  for (const auto& s : slices) out.append(reinterpret_cast<const char*>(s.begin()), s.size());
  return out;
}

// Splits bytes into slices of random sizes (1 byte up to `max_slice`, 64 KiB by default), like TCP
// reads do; `offset` shifts the start of each slice's memory so floats land at every alignment.
grpc::ByteBuffer Reslice(const std::string& bytes, std::mt19937& rng, int offset, size_t max_slice = 65536) {
  std::uniform_int_distribution<size_t> size_dist(1, max_slice);
  std::vector<grpc::Slice> slices;
  size_t pos = 0;
  while (pos < bytes.size()) {
    const size_t n = std::min(bytes.size() - pos, size_dist(rng));
    std::string piece(static_cast<size_t>(offset), 'x');
    piece.append(bytes, pos, n);
    grpc::Slice whole(piece);
    slices.push_back(whole.sub(static_cast<size_t>(offset), piece.size()));
    pos += n;
  }
  return grpc::ByteBuffer(slices.data(), slices.size());
}

grpc::ByteBuffer FromString(const std::string& bytes) {
  grpc::Slice slice(bytes);
  return grpc::ByteBuffer(&slice, 1);
}

Tensor Iota(int64_t n, float scale) {
  Tensor t(Shape{n});
  for (int64_t i = 0; i < n; ++i) t[i] = scale * static_cast<float>(i % 100003) + 0.25f;
  return t;
}

OutgoingTensor Dense(const std::string& name, const Tensor& t) {
  OutgoingTensor out;
  out.meta.set_name(name);
  for (int64_t d : t.shape()) out.meta.add_shape(d);
  out.data = t.data();
  out.num_floats = t.size();
  return out;
}

TEST(TensorCodingTest, DenseRoundTripOverManySizesAndSlicings) {
  std::mt19937 rng(7);
  const std::vector<int64_t> sizes = {0, 1, 2, 3, 17, 1023, 1024, 1025, 4097, 65537, (16 << 20) / 4};
  for (int64_t n : sizes) {
    const Tensor original = Iota(n, 0.5f);
    wire::PushRequest header;
    header.set_step_tag(n);
    OutgoingMessage msg;
    msg.header = header.SerializeAsString();
    msg.tensors.push_back(Dense("w", original));
    const std::string bytes = Flatten(EncodeMessage(std::move(msg)));
    for (int offset = 0; offset < 4; ++offset) {
      SCOPED_TRACE(testing::Message() << "n=" << n << " offset=" << offset);
      absl::StatusOr<IncomingMessage> in = DecodeMessage(Reslice(bytes, rng, offset));
      ASSERT_TRUE(in.ok()) << in.status();
      wire::PushRequest parsed;
      ASSERT_TRUE(in->ParseHeader(&parsed).ok());
      EXPECT_EQ(parsed.step_tag(), n);
      ASSERT_EQ(in->num_tensors(), 1);
      EXPECT_EQ(in->meta(0).name(), "w");
      ASSERT_EQ(in->num_floats(0), n);

      Tensor copy(Shape{n});
      in->CopyTo(0, copy.data());
      EXPECT_EQ(std::memcmp(copy.data(), original.data(), original.bytes()), 0);

      Tensor sum(Shape{n}, 1.0f);
      in->AddTo(0, sum.data());
      int64_t wrong = 0;
      for (int64_t i = 0; i < n; ++i) wrong += sum[i] != original[i] + 1.0f;
      EXPECT_EQ(wrong, 0);

      int64_t seen = 0;
      bool in_order = true;
      in->ForEachRun(0, [&](const float* run, int64_t first, int64_t count) {
        in_order &= first == seen && reinterpret_cast<uintptr_t>(run) % alignof(float) == 0 &&
                    std::memcmp(run, original.data() + first, count * 4) == 0;
        seen += count;
        return true;
      });
      EXPECT_TRUE(in_order);
      EXPECT_EQ(seen, n);

      // A sub-range, as a thread of a parallel walk sees it.
      const int64_t first = n / 3, count = n / 2;
      int64_t next = first;
      bool range_ok = true;
      in->ForEachRunInRange(0, first, count, [&](const float* run, int64_t at, int64_t k) {
        range_ok &= at == next && std::memcmp(run, original.data() + at, k * 4) == 0;
        next += k;
        return true;
      });
      EXPECT_TRUE(range_ok);
      EXPECT_EQ(next, first + count);
      std::vector<float> part(static_cast<size_t>(count));
      in->CopyRange(0, first, count, part.data());
      EXPECT_EQ(std::memcmp(part.data(), original.data() + first, count * 4), 0);

      // The same ranges as bytes in place: every float once, in order, whatever its alignment.
      for (const auto& [from, len] : {std::pair<int64_t, int64_t>{0, n}, {first, count}}) {
        int64_t at_next = from;
        bool bytes_ok = true;
        in->ForEachByteRunInRange(0, from, len, [&](const void* run, int64_t at, int64_t k) {
          bytes_ok &= at == at_next && k > 0 && std::memcmp(run, original.data() + at, k * 4) == 0;
          at_next += k;
          return true;
        });
        EXPECT_TRUE(bytes_ok);
        EXPECT_EQ(at_next, from + len);
      }
      if (n > 0) {  // stopping early
        int calls = 0;
        EXPECT_FALSE(in->ForEachByteRunInRange(0, 0, n, [&](const void*, int64_t, int64_t) { return ++calls > 1; }));
        EXPECT_EQ(calls, 1);
      }
    }
  }
}

TEST(TensorCodingTest, FirstNonFiniteFindsTheFirstInfOrNanWhereverTheBytesLie) {
  std::mt19937 rng(11);
  constexpr int64_t n = 3001;
  const float kBad[] = {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                        -std::numeric_limits<float>::infinity()};
  for (WireDtype dtype : {WireDtype::kFloat32, WireDtype::kBFloat16}) {
    for (int64_t at : {int64_t{0}, int64_t{1}, int64_t{2}, int64_t{1500}, n - 2, n - 1}) {
      for (float bad : kBad) {
        Tensor t = Iota(n, 0.5f);
        t[5] = 1e38f;  // large and tiny finite values (in every dtype) are not flagged
        t[6] = std::numeric_limits<float>::denorm_min();
        t[at] = bad;
        if (at + 1 < n) t[n - 1] = -bad;  // a later one: only the first counts
        OutgoingMessage msg;
        msg.header = "h";
        msg.tensors.push_back(Dense("g", t));
        if (dtype != WireDtype::kFloat32) msg.tensors.back().meta.set_dtype(WireDtypeName(dtype));
        const std::string bytes = Flatten(EncodeMessage(std::move(msg)));
        for (int offset = 0; offset < 4; ++offset) {
          for (size_t max_slice : {size_t{7}, size_t{65536}}) {
            SCOPED_TRACE(testing::Message() << WireDtypeName(dtype) << " at=" << at << " bad=" << bad
                                            << " offset=" << offset << " max_slice=" << max_slice);
            absl::StatusOr<IncomingMessage> in = DecodeMessage(Reslice(bytes, rng, offset, max_slice));
            ASSERT_TRUE(in.ok()) << in.status();
            EXPECT_EQ(in->FirstNonFinite(0, 0, n), at);
            EXPECT_EQ(in->FirstNonFinite(0, 0, at), -1);
            EXPECT_EQ(in->FirstNonFinite(0, at, 1), at);
            if (at + 1 < n) {
              EXPECT_EQ(in->FirstNonFinite(0, at + 1, n - at - 1), n - 1);
              EXPECT_EQ(in->FirstNonFinite(0, at + 1, n - at - 2), -1);
            }
          }
        }
      }
    }
  }
}

TEST(TensorCodingTest, StridedCopyPlacesBlocks) {
  // A [4, 3] shard holding columns 2..4 of a [4, 6] tensor.
  Tensor shard(Shape{4, 3});
  for (int i = 0; i < 12; ++i) shard[i] = static_cast<float>(i + 1);
  OutgoingMessage msg;
  msg.tensors.push_back(Dense("w/part_1", shard));
  std::mt19937 rng(1);
  absl::StatusOr<IncomingMessage> in = DecodeMessage(Reslice(Flatten(EncodeMessage(std::move(msg))), rng, 1));
  ASSERT_TRUE(in.ok()) << in.status();
  Tensor full(Shape{4, 6});
  in->CopyStrided(0, full.data() + 2, 3, 6);
  for (int r = 0; r < 4; ++r) {
    for (int c = 0; c < 6; ++c) {
      const float expected = (c >= 2 && c < 5) ? static_cast<float>(r * 3 + (c - 2) + 1) : 0.0f;
      EXPECT_EQ(full[r * 6 + c], expected) << r << "," << c;
    }
  }
}

TEST(TensorCodingTest, RowSparseAndSeveralTensorsRoundTrip) {
  const Tensor small = Iota(5, 1.0f);
  const Tensor big = Iota(3 * 5000, 2.0f);  // 3 rows of 5000
  OutgoingMessage msg;
  msg.tensors.push_back(Dense("bias", small));
  OutgoingTensor sparse = Dense("emb/part_1", big);
  sparse.meta.clear_shape();
  sparse.meta.add_shape(3);
  sparse.meta.add_shape(5000);
  sparse.meta.set_sparse(true);
  for (int64_t r : {7, 2, 9}) sparse.meta.add_rows(r);
  msg.tensors.push_back(sparse);
  msg.tensors.push_back(Dense("empty", Tensor(Shape{0, 4})));
  std::mt19937 rng(3);
  absl::StatusOr<IncomingMessage> in = DecodeMessage(Reslice(Flatten(EncodeMessage(std::move(msg))), rng, 3));
  ASSERT_TRUE(in.ok()) << in.status();
  ASSERT_EQ(in->num_tensors(), 3);
  Tensor a(Shape{5}), b(Shape{3, 5000});
  in->CopyTo(0, a.data());
  in->CopyTo(1, b.data());
  EXPECT_EQ(std::memcmp(a.data(), small.data(), small.bytes()), 0);
  EXPECT_EQ(std::memcmp(b.data(), big.data(), big.bytes()), 0);
  EXPECT_TRUE(in->meta(1).sparse());
  EXPECT_EQ(std::vector<int64_t>(in->meta(1).rows().begin(), in->meta(1).rows().end()),
            (std::vector<int64_t>{7, 2, 9}));
  EXPECT_EQ(in->num_floats(2), 0);
}

TEST(TensorCodingTest, LargeTensorsAreWrappedNotCopiedAndOwnersReleasedAfterTheBuffer) {
  auto owner = std::make_shared<Tensor>(Iota(1 << 16, 1.0f));
  std::weak_ptr<Tensor> watch = owner;
  auto guard = std::make_shared<int>(0);
  std::weak_ptr<int> watch_guard = guard;
  OutgoingMessage msg;
  OutgoingTensor t = Dense("w", *owner);
  t.owner = owner;
  msg.tensors.push_back(std::move(t));
  const float* data = owner->data();
  owner.reset();
  {
    grpc::ByteBuffer buffer = EncodeMessage(std::move(msg), guard);
    guard.reset();
    EXPECT_FALSE(watch.expired());
    EXPECT_FALSE(watch_guard.expired());
    std::vector<grpc::Slice> slices;
    ASSERT_TRUE(buffer.Dump(&slices).ok());
    bool wrapped = false;
    for (const auto& s : slices) wrapped |= reinterpret_cast<const float*>(s.begin()) == data;
    EXPECT_TRUE(wrapped) << "the tensor's memory should be a slice of its own";
  }
  EXPECT_TRUE(watch.expired());
  EXPECT_TRUE(watch_guard.expired());
}

// A valid message as bytes, to corrupt.
std::string ValidBytes() {
  const Tensor t = Iota(10, 1.0f);
  OutgoingMessage msg;
  msg.header = "hdr";
  msg.tensors.push_back(Dense("w", t));
  return Flatten(EncodeMessage(std::move(msg)));
}

std::string Frame(const std::string& header, const wire::TensorList& list, const std::string& payload) {
  std::string out;
  auto u32 = [&out](uint32_t v) { out.append(reinterpret_cast<const char*>(&v), 4); };
  u32(static_cast<uint32_t>(header.size()));
  out += header;
  const std::string l = list.SerializeAsString();
  u32(static_cast<uint32_t>(l.size()));
  out += l;
  out.append((8 - out.size() % 8) % 8, '\0');
  return out + payload;
}

TEST(TensorCodingTest, EveryTruncationIsAnError) {
  const std::string bytes = ValidBytes();
  ASSERT_TRUE(DecodeMessage(FromString(bytes)).ok());
  for (size_t cut = 0; cut < bytes.size(); ++cut) {
    absl::StatusOr<IncomingMessage> in = DecodeMessage(FromString(bytes.substr(0, cut)));
    EXPECT_FALSE(in.ok()) << "cut at " << cut;
    if (!in.ok()) {
      EXPECT_EQ(in.status().code(), absl::StatusCode::kInvalidArgument);
    }
  }
}

TEST(TensorCodingTest, HeadersThatLieAreErrors) {
  const std::string payload(40, '\0');  // 10 floats
  auto decode = [](const std::string& bytes) { return DecodeMessage(FromString(bytes)).status(); };
  auto list_with = [](std::vector<int64_t> shape, bool sparse = false, std::vector<int64_t> rows = {}) {
    wire::TensorList list;
    wire::TensorMeta* m = list.add_tensors();
    m->set_name("w");
    for (int64_t d : shape) m->add_shape(d);
    m->set_sparse(sparse);
    for (int64_t r : rows) m->add_rows(r);
    return list;
  };
  EXPECT_TRUE(decode(Frame("h", list_with({10}), payload)).ok());
  EXPECT_TRUE(decode(Frame("h", list_with({2, 5}, true, {0, 3}), payload)).ok());

  // Sizes that disagree with the payload.
  EXPECT_FALSE(decode(Frame("h", list_with({11}), payload)).ok());
  EXPECT_FALSE(decode(Frame("h", list_with({9}), payload)).ok());
  EXPECT_FALSE(decode(Frame("h", list_with({2, 6}), payload)).ok());
  EXPECT_FALSE(decode(Frame("h", list_with({10}), payload + "\1\2")).ok());
  // Negative, huge and overflowing dims.
  EXPECT_FALSE(decode(Frame("h", list_with({-10}), payload)).ok());
  EXPECT_FALSE(decode(Frame("h", list_with({-2, -5}), payload)).ok());
  EXPECT_FALSE(decode(Frame("h", list_with({int64_t{1} << 62}), payload)).ok());
  EXPECT_FALSE(decode(Frame("h", list_with({int64_t{1} << 32, int64_t{1} << 32, 0}), payload)).ok());
  EXPECT_FALSE(decode(Frame("h", list_with({int64_t{1} << 31, int64_t{1} << 31}), payload)).ok());
  // Sparse rows that disagree with the shape, or are negative; rows on a dense tensor.
  EXPECT_FALSE(decode(Frame("h", list_with({3, 5}, true, {0, 1}), payload)).ok());
  EXPECT_FALSE(decode(Frame("h", list_with({}, true, {}), std::string(4, '\0'))).ok());
  EXPECT_FALSE(decode(Frame("h", list_with({2, 5}, true, {0, -1}), payload)).ok());
  EXPECT_FALSE(decode(Frame("h", list_with({10}, false, {1}), payload)).ok());

  // Header sizes that point past the end.
  std::string bytes = ValidBytes();
  std::string lie = bytes;
  const uint32_t huge = 0xfffffff0u;
  std::memcpy(lie.data(), &huge, 4);
  EXPECT_FALSE(decode(lie).ok());
  lie = bytes;
  std::memcpy(lie.data() + 4 + 3, &huge, 4);  // the tensor list size (header is "hdr")
  EXPECT_FALSE(decode(lie).ok());
  // A tensor list that is not a protobuf.
  lie = bytes;
  for (size_t i = 11; i < 20 && i < lie.size(); ++i) lie[i] = '\xff';
  EXPECT_FALSE(decode(lie).ok());
}

// A tensor sent as bfloat16 or float16 arrives as the rounding of each value (rpc/wire_dtype.h),
// whatever way the bytes are sliced and however it is read; float32 tensors beside it are exact.
TEST(TensorCodingTest, SixteenBitTensorsRoundTripAsTheirRoundingOverManySizesAndSlicings) {
  std::mt19937 rng(5);
  for (WireDtype dtype : {WireDtype::kBFloat16, WireDtype::kFloat16}) {
    for (int64_t n : {int64_t{1}, int64_t{3}, int64_t{4097}, int64_t{40000}, int64_t{300001}}) {
      Tensor t = Iota(n, 0.37f);
      for (int64_t i = 0; i < n; i += 7) t[i] = -t[i] * 1e-6f;  // subnormal halves among them
      const Tensor exact = Iota(5, 1.5f);
      OutgoingMessage msg;
      msg.header = "h16";
      msg.tensors.push_back(Dense("a", t));
      msg.tensors.back().meta.set_dtype(WireDtypeName(dtype));
      msg.tensors.push_back(Dense("b", exact));
      const std::string bytes = Flatten(EncodeMessage(std::move(msg)));
      for (int offset : {0, 1, 3}) {
        absl::StatusOr<IncomingMessage> in = DecodeMessage(Reslice(bytes, rng, offset));
        ASSERT_TRUE(in.ok()) << in.status();
        ASSERT_EQ(in->num_floats(0), n);
        EXPECT_EQ(in->dtype(0), dtype);
        EXPECT_EQ(in->meta(0).dtype(), WireDtypeName(dtype));
        EXPECT_EQ(in->dtype(1), WireDtype::kFloat32);
        std::vector<float> want(static_cast<size_t>(n)), got(static_cast<size_t>(n)), part(static_cast<size_t>(n));
        std::vector<uint16_t> narrow(static_cast<size_t>(n));
        EncodeFloats(dtype, t.data(), n, narrow.data());
        DecodeFloats(dtype, narrow.data(), n, want.data());
        in->CopyTo(0, got.data());
        const int64_t first = n / 3, count = n - n / 3;
        in->CopyRange(0, first, count, part.data());
        std::vector<float> sum(static_cast<size_t>(n), 1.0f);
        in->AddTo(0, sum.data());
        int64_t wrong = 0;
        for (int64_t i = 0; i < n; ++i) {
          wrong += FloatBits(got[i]) != FloatBits(want[i]);
          wrong += sum[i] != 1.0f + want[i];
          if (i < count) wrong += FloatBits(part[i]) != FloatBits(want[first + i]);
        }
        EXPECT_EQ(wrong, 0) << WireDtypeName(dtype) << " n=" << n << " offset=" << offset;
        int64_t next = 0;
        in->ForEachByteRunInRange(0, 0, n, [&](const void* run, int64_t at, int64_t k) {
          wrong += at != next || std::memcmp(run, want.data() + at, static_cast<size_t>(k) * 4) != 0;
          next += k;
          return true;
        });
        EXPECT_EQ(next, n);
        EXPECT_EQ(wrong, 0) << "byte runs of " << WireDtypeName(dtype) << " n=" << n << " offset=" << offset;
        std::vector<float> b(5);
        in->CopyTo(1, b.data());
        for (int i = 0; i < 5; ++i) EXPECT_EQ(b[i], exact[i]);
      }
    }
  }
}

TEST(TensorCodingTest, DtypeIsWrittenAndAnythingButTheWireDtypesIsRefused) {
  const Tensor t = Iota(10, 1.0f);
  auto encode = [&t](const std::string& dtype) {
    OutgoingMessage msg;
    msg.header = "hdr";
    msg.tensors.push_back(Dense("layer/w", t));
    msg.tensors.back().meta.set_dtype(dtype);
    return Flatten(EncodeMessage(std::move(msg)));
  };
  absl::StatusOr<IncomingMessage> in = DecodeMessage(FromString(encode("")));
  ASSERT_TRUE(in.ok()) << in.status();
  EXPECT_EQ(in->meta(0).dtype(), "float32");  // the encoder names the type it sends

  // A sender from before the dtype field: no dtype at all means float32.
  wire::TensorList old_list;
  old_list.add_tensors()->add_shape(10);
  absl::StatusOr<IncomingMessage> old = DecodeMessage(FromString(Frame("h", old_list, std::string(40, '\0'))));
  ASSERT_TRUE(old.ok()) << old.status();
  EXPECT_EQ(old->meta(0).dtype(), "float32");

  for (const std::string dtype : {"int64", "float64", "half", "Float32"}) {
    absl::StatusOr<IncomingMessage> refused = DecodeMessage(FromString(encode(dtype)));
    ASSERT_FALSE(refused.ok()) << dtype;
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(refused.status().message(),
              "malformed message: tensor 0 ('layer/w') has dtype '" + dtype +
                  "' but psflow exchanges float32, bfloat16 or float16 tensors only (is the peer a different "
                  "psflow version?)");
  }
  // Bytes from the peer are escaped: the error stays one line.
  absl::StatusOr<IncomingMessage> odd = DecodeMessage(FromString(encode("f\n32")));
  ASSERT_FALSE(odd.ok());
  EXPECT_EQ(std::string(odd.status().message()).find('\n'), std::string::npos) << odd.status();
  EXPECT_NE(std::string(odd.status().message()).find("'f\\n32'"), std::string::npos) << odd.status();
}

TEST(TensorCodingTest, RandomGarbageNeverCrashes) {
  std::mt19937 rng(11);
  const std::string valid = ValidBytes();
  int accepted = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    std::string bytes = valid;
    const int flips = 1 + static_cast<int>(rng() % 4);
    for (int f = 0; f < flips; ++f) bytes[rng() % bytes.size()] = static_cast<char>(rng());
    absl::StatusOr<IncomingMessage> in = DecodeMessage(FromString(bytes));
    if (in.ok()) {
      ++accepted;  // a flip inside the payload or a name is still a well-formed message
      for (int i = 0; i < in->num_tensors(); ++i) {
        std::vector<float> sink(static_cast<size_t>(in->num_floats(i)));
        in->CopyTo(i, sink.data());
      }
    }
  }
  EXPECT_LT(accepted, 3000);
}

}  // namespace
}  // namespace psflow::rpc
