// Round trips of the shared-memory transport's wire pieces (rpc/shm_wire.h), every field set to a
// distinct non-default value so that a field lost on the way fails: the packets over a real
// SOCK_SEQPACKET socket pair (with a region's fd passed along), and a message written into a real
// sealed memfd region and read back in place.
#include "rpc/shm_wire.h"

#include <sys/socket.h>
#include <unistd.h>

#include <cstring>

#include "gtest/gtest.h"

namespace psflow::rpc::shm {
namespace {

struct SocketPair {
  int fds[2] = {-1, -1};
  SocketPair() { EXPECT_EQ(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, fds), 0); }
  ~SocketPair() {
    close(fds[0]);
    close(fds[1]);
  }
};

TEST(ShmWireTest, PacketKeepsEveryFieldTheTextAndThePassedRegion) {
  Packet p;
  // Exactly the struct's fields: adding one breaks this line until this test sets it.
  auto& [kind, slot, method, code, size] = p;
  kind = PacketKind::kReply;  // not the default kHello
  slot = 7;
  method = 9;
  code = static_cast<int32_t>(absl::StatusCode::kResourceExhausted);
  size = (uint64_t{1} << 40) + 3;
  auto region = Region::Create(100);
  ASSERT_TRUE(region.ok()) << region.status();
  std::memcpy((*region)->data(), "psflow", 6);

  SocketPair sockets;
  ASSERT_TRUE(SendPacket(sockets.fds[0], p, "the secret", (*region)->fd()).ok());
  auto got = ReceivePacket(sockets.fds[1]);
  ASSERT_TRUE(got.ok()) << got.status();
  const auto& [g_kind, g_slot, g_method, g_code, g_size] = got->packet;
  EXPECT_EQ(g_kind, kind);
  EXPECT_EQ(g_slot, slot);
  EXPECT_EQ(g_method, method);
  EXPECT_EQ(g_code, code);
  EXPECT_EQ(g_size, size);
  EXPECT_EQ(got->text, "the secret");
  ASSERT_GE(got->fd, 0);
  auto adopted = Region::Adopt(got->fd);  // the same memory, mapped again
  ASSERT_TRUE(adopted.ok()) << adopted.status();
  EXPECT_EQ((*adopted)->size(), (*region)->size());
  EXPECT_EQ(std::string((*adopted)->data(), 6), "psflow");

  // Without text or fd.
  ASSERT_TRUE(SendPacket(sockets.fds[0], Packet{PacketKind::kWelcome, 1, 2, 3, 4}, "", -1).ok());
  got = ReceivePacket(sockets.fds[1]);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->packet.kind, PacketKind::kWelcome);
  EXPECT_EQ(got->packet.size, 4u);
  EXPECT_EQ(got->text, "");
  EXPECT_EQ(got->fd, -1);
}

TEST(ShmWireTest, MessageKeepsHeaderEveryTensorFieldAndTheFloats) {
  OutgoingMessage out;
  out.header = std::string("header\0bytes", 12);
  std::vector<std::vector<float>> data = {{1.5f, -2.0f, 3.25f, 4.0f, 5.0f, 6.0f}, {7.0f, 8.0f}, {}};
  {
    OutgoingTensor dense;
    dense.meta.set_name("dense");
    dense.meta.add_shape(2);
    dense.meta.add_shape(3);
    dense.data = data[0].data();
    dense.num_floats = 6;
    out.tensors.push_back(std::move(dense));
    OutgoingTensor sparse;
    sparse.meta.set_name("sparse");
    sparse.meta.set_sparse(true);
    sparse.meta.add_shape(2);
    sparse.meta.add_shape(1);
    sparse.meta.add_rows(5);
    sparse.meta.add_rows(2);
    sparse.data = data[1].data();
    sparse.num_floats = 2;
    out.tensors.push_back(std::move(sparse));
    OutgoingTensor empty;
    empty.meta.set_name("empty");
    empty.meta.add_shape(0);
    out.tensors.push_back(std::move(empty));
  }
  const wire::TensorList sent_list = [&] {
    wire::TensorList l;
    for (const OutgoingTensor& t : out.tensors) *l.add_tensors() = t.meta;
    return l;
  }();
  const PreparedMessage prepared = Prepare(out);
  auto region = Region::Create(prepared.total_bytes);
  ASSERT_TRUE(region.ok()) << region.status();
  WriteMessage(prepared, (*region)->data());
  auto in = ReadMessage((*region)->data(), prepared.total_bytes, *region);
  ASSERT_TRUE(in.ok()) << in.status();
  EXPECT_EQ(in->header(), out.header);
  ASSERT_EQ(in->num_tensors(), 3);
  for (int i = 0; i < 3; ++i) {
    wire::TensorMeta expected = sent_list.tensors(i);
    expected.set_dtype(kWireDtype);  // the writer names the dtype
    EXPECT_EQ(in->meta(i).SerializeAsString(), expected.SerializeAsString()) << i;
    ASSERT_EQ(in->num_floats(i), static_cast<int64_t>(data[i].size())) << i;
    std::vector<float> floats(data[i].size());
    if (!floats.empty()) in->CopyTo(i, floats.data());
    EXPECT_EQ(floats, data[i]) << i;
  }
  // Every byte cut off the end is refused with a message, never read past.
  for (size_t cut = 1; cut <= prepared.total_bytes; cut += 7) {
    auto truncated = ReadMessage((*region)->data(), prepared.total_bytes - cut, *region);
    EXPECT_FALSE(truncated.ok()) << "cut " << cut;
  }
}

// A tensor named bfloat16 or float16 is written as its rounding (two bytes per value, from a copy
// the prepared message holds) and read back widened; the float32 one beside it stays exact.
TEST(ShmWireTest, SixteenBitTensorsAreWrittenRoundedAndReadWidened) {
  for (WireDtype dtype : {WireDtype::kBFloat16, WireDtype::kFloat16}) {
    std::vector<float> values = {1.0f + 0x1p-12f, -3.3e-3f, 65519.0f, 0x1p-20f, 0.0f, -7.0f, 1e-30f};
    const std::vector<float> exact = {0.1f, 0.2f};
    OutgoingMessage out;
    out.header = "h";
    OutgoingTensor t;
    t.meta.set_name("w16");
    t.meta.add_shape(static_cast<int64_t>(values.size()));
    t.meta.set_dtype(WireDtypeName(dtype));
    t.data = values.data();
    t.num_floats = static_cast<int64_t>(values.size());
    out.tensors.push_back(t);
    OutgoingTensor e;
    e.meta.set_name("w32");
    e.meta.add_shape(2);
    e.data = exact.data();
    e.num_floats = 2;
    out.tensors.push_back(e);
    const PreparedMessage prepared = Prepare(out);
    std::vector<float> want(values.size());
    std::vector<uint16_t> narrow(values.size());
    EncodeFloats(dtype, values.data(), static_cast<int64_t>(values.size()), narrow.data());
    DecodeFloats(dtype, narrow.data(), static_cast<int64_t>(values.size()), want.data());
    values.assign(values.size(), -1.0f);  // the prepared message holds its own rounded copy
    auto region = Region::Create(prepared.total_bytes);
    ASSERT_TRUE(region.ok()) << region.status();
    WriteMessage(prepared, (*region)->data());
    auto in = ReadMessage((*region)->data(), prepared.total_bytes, *region);
    ASSERT_TRUE(in.ok()) << in.status();
    EXPECT_EQ(in->dtype(0), dtype);
    std::vector<float> got(want.size()), got_exact(2);
    in->CopyTo(0, got.data());
    in->CopyTo(1, got_exact.data());
    EXPECT_EQ(got, want) << WireDtypeName(dtype);
    EXPECT_EQ(got_exact, exact);
  }
}

}  // namespace
}  // namespace psflow::rpc::shm
