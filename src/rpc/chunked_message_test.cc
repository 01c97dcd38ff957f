// A message cut into chunks and read back (rpc/chunked_message.h), without a connection: the same
// message as the one-piece decoding whatever the chunk size (floats split across chunks
// included), the floats checked on the way, and every way a stream can end wrong refused.
#include "rpc/chunked_message.h"

#include <cmath>
#include <limits>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "rpc/tensor_coding.h"

namespace psflow::rpc {
namespace {

using ::testing::HasSubstr;

// A push-like message: a small dense tensor (inlined in the header slice), a large dense one, a
// sparse one and a bfloat16 one.
struct Sample {
  std::vector<float> small, large, rows, half;
  OutgoingMessage Message() const {
    OutgoingMessage m;
    m.header = "the header";
    auto add = [&m](const std::string& name, const std::vector<float>& data, bool sparse, const std::string& dtype) {
      OutgoingTensor t;
      t.meta.set_name(name);
      if (sparse) {
        t.meta.set_sparse(true);
        t.meta.add_shape(static_cast<int64_t>(data.size() / 2));
        t.meta.add_shape(2);
        for (size_t r = 0; r < data.size() / 2; ++r) t.meta.add_rows(static_cast<int64_t>(r));
      } else {
        t.meta.add_shape(static_cast<int64_t>(data.size()));
      }
      t.meta.set_dtype(dtype);
      t.data = data.data();
      t.num_floats = static_cast<int64_t>(data.size());
      m.tensors.push_back(std::move(t));
    };
    add("small", small, false, "");
    add("large", large, false, "float32");
    add("rows", rows, true, "");
    add("half", half, false, "bfloat16");
    return m;
  }
};

Sample MakeSample() {
  Sample s;
  s.small.assign(1001, 0.25f);
  s.large.resize(300001);
  for (size_t i = 0; i < s.large.size(); ++i) s.large[i] = static_cast<float>(i % 977) - 3.5f;
  s.rows.assign(40, -1.0f);
  s.half.assign(777, 2.0f);
  return s;
}

absl::StatusOr<IncomingMessage> ReadInChunks(const OutgoingMessage& m, size_t chunk_bytes, size_t drop_last = 0,
                                             int64_t max_bytes = int64_t{1} << 30) {
  std::vector<grpc::ByteBuffer> chunks = CutIntoChunks(EncodeMessage(m), chunk_bytes);
  ChunkedMessageReader reader(max_bytes);
  for (size_t k = 0; k + drop_last < chunks.size(); ++k) {
    if (absl::Status s = reader.Add(chunks[k]); !s.ok()) return s;
  }
  return reader.Finish();
}

std::vector<float> Floats(const IncomingMessage& m, int i) {
  std::vector<float> out(static_cast<size_t>(m.num_floats(i)));
  m.CopyTo(i, out.data());
  return out;
}

TEST(ChunkedMessageTest, CutsAreConsecutiveAndCoverTheMessage) {
  const Sample s = MakeSample();
  const grpc::ByteBuffer whole = EncodeMessage(s.Message());
  std::vector<grpc::ByteBuffer> chunks = CutIntoChunks(whole, 65537);
  ASSERT_EQ(chunks.size(), (whole.Length() + 65536) / 65537);
  size_t total = 0;
  for (size_t k = 0; k < chunks.size(); ++k) {
    if (k + 1 < chunks.size()) {
      EXPECT_EQ(chunks[k].Length(), 65537u);
    }
    total += chunks[k].Length();
  }
  EXPECT_EQ(total, whole.Length());
}

// Chunk sizes that split the headers, the floats (odd sizes cut floats in two) and the tensors.
TEST(ChunkedMessageTest, ReadsBackTheSameMessageAtAnyChunkSize) {
  const Sample s = MakeSample();
  for (size_t chunk : {size_t{1} << 30, size_t{1} << 20, size_t{65536}, size_t{4093}, size_t{7}}) {
    absl::StatusOr<IncomingMessage> m = ReadInChunks(s.Message(), chunk);
    ASSERT_TRUE(m.ok()) << chunk << ": " << m.status();
    EXPECT_EQ(m->header(), "the header");
    ASSERT_EQ(m->num_tensors(), 4);
    EXPECT_EQ(Floats(*m, 0), s.small);
    EXPECT_EQ(Floats(*m, 1), s.large) << chunk;
    EXPECT_EQ(Floats(*m, 2), s.rows);
    EXPECT_EQ(Floats(*m, 3), s.half);
    EXPECT_EQ(m->meta(2).rows_size(), 20);
    for (int i = 0; i < 4; ++i) EXPECT_EQ(m->FirstNonFinite(i, 0, m->num_floats(i)), -1) << i;
  }
}

// A NaN or Inf anywhere (a chunk's first float, a float split across two chunks, the very last
// float) is found where the one-piece message has it, whatever was checked on the way.
TEST(ChunkedMessageTest, FindsANonFiniteFloatWhereverItIs) {
  for (size_t at : {size_t{0}, size_t{1}, size_t{12345}, size_t{299999}, size_t{300000}}) {
    for (float bad : {std::numeric_limits<float>::quiet_NaN(), -std::numeric_limits<float>::infinity()}) {
      Sample s = MakeSample();
      s.large[at] = bad;
      for (size_t chunk : {size_t{1} << 20, size_t{65536}, size_t{4093}}) {
        absl::StatusOr<IncomingMessage> m = ReadInChunks(s.Message(), chunk);
        ASSERT_TRUE(m.ok()) << m.status();
        EXPECT_EQ(m->FirstNonFinite(1, 0, m->num_floats(1)), static_cast<int64_t>(at)) << chunk;
        // A range after the bad float, and one before it, read alone.
        if (at + 1 < s.large.size()) {
          EXPECT_EQ(m->FirstNonFinite(1, at + 1, s.large.size() - at - 1), -1);
        }
        EXPECT_EQ(m->FirstNonFinite(1, 0, at), -1);
        EXPECT_EQ(m->FirstNonFinite(0, 0, m->num_floats(0)), -1);
      }
    }
  }
}

TEST(ChunkedMessageTest, AStreamThatEndsEarlyIsNoMessage) {
  const Sample s = MakeSample();
  for (size_t chunk : {size_t{65536}, size_t{4093}}) {
    absl::StatusOr<IncomingMessage> m = ReadInChunks(s.Message(), chunk, /*drop_last=*/1);
    ASSERT_FALSE(m.ok());
    EXPECT_TRUE(absl::IsInvalidArgument(m.status())) << m.status();
    EXPECT_THAT(std::string(m.status().message()), HasSubstr("its chunks ended after"));
  }
  // Ended inside the headers: not even they parse.
  ChunkedMessageReader reader(int64_t{1} << 30);
  std::vector<grpc::ByteBuffer> chunks = CutIntoChunks(EncodeMessage(s.Message()), 3);
  ASSERT_TRUE(reader.Add(chunks[0]).ok());
  absl::StatusOr<IncomingMessage> m = reader.Finish();
  EXPECT_TRUE(absl::IsInvalidArgument(m.status())) << m.status();
  EXPECT_THAT(std::string(m.status().message()), HasSubstr("truncated"));
}

// Over the limit: refused as soon as the headers tell the size, in gRPC's words for it.
TEST(ChunkedMessageTest, RefusesAMessageOverTheLimitFromItsHeaders) {
  const Sample s = MakeSample();
  const size_t whole = EncodeMessage(s.Message()).Length();
  std::vector<grpc::ByteBuffer> chunks = CutIntoChunks(EncodeMessage(s.Message()), 65536);
  ChunkedMessageReader reader(1 << 20);
  absl::Status first = reader.Add(chunks[0]);
  EXPECT_TRUE(absl::IsResourceExhausted(first)) << first;
  EXPECT_THAT(std::string(first.message()),
              HasSubstr(absl::StrCat("message larger than max (", whole, " vs. ", 1 << 20, ")")));
  EXPECT_TRUE(ReadInChunks(s.Message(), 65536, 0, static_cast<int64_t>(whole)).ok());
}

// Malformed headers in chunks are refused as in one piece.
TEST(ChunkedMessageTest, MalformedHeadersAreRefusedAsInOnePiece) {
  OutgoingMessage m;
  m.header = "h";
  OutgoingTensor t;
  t.meta.set_name("w");
  t.meta.add_shape(-3);
  m.tensors.push_back(t);
  absl::StatusOr<IncomingMessage> got = ReadInChunks(m, 5);
  EXPECT_TRUE(absl::IsInvalidArgument(got.status())) << got.status();
  EXPECT_THAT(std::string(got.status().message()), HasSubstr("dimension -3"));
}

}  // namespace
}  // namespace psflow::rpc
