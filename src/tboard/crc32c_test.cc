// CRC-32C and record framing against published values: the standard check value, the RFC 3720
// (iSCSI) B.4 vectors, masked values of TensorFlow's record format, and the bytes of one record
// assembled by hand (CRCs from an independent bit-by-bit implementation).
#include "tboard/crc32c.h"

#include <string>

#include "gtest/gtest.h"
#include "tboard/record.h"

namespace psflow::tboard {
namespace {

std::string FromHex(const std::string& hex) {
  std::string out;
  for (size_t i = 0; i + 1 < hex.size(); i += 2)
    out.push_back(static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16)));
  return out;
}

TEST(Crc32cTest, StandardCheckValue) { EXPECT_EQ(Crc32c("123456789"), 0xE3069283u); }

TEST(Crc32cTest, Rfc3720Vectors) {
  EXPECT_EQ(Crc32c(""), 0u);
  EXPECT_EQ(Crc32c(std::string(32, '\0')), 0x8A9136AAu);
  EXPECT_EQ(Crc32c(std::string(32, '\xff')), 0x62A8AB43u);
  std::string ascending, descending;
  for (int i = 0; i < 32; ++i) {
    ascending.push_back(static_cast<char>(i));
    descending.push_back(static_cast<char>(31 - i));
  }
  EXPECT_EQ(Crc32c(ascending), 0x46DD794Eu);
  EXPECT_EQ(Crc32c(descending), 0x113FDB5Cu);
}

TEST(Crc32cTest, TensorFlowMask) {
  // ((crc >> 15) | (crc << 17)) + 0xa282ead8, worked out by hand for the check value:
  // 0xE3069283 rotated right by 15 is 0x2507C60D; + 0xA282EAD8 = 0xC78AB0E5.
  EXPECT_EQ(MaskCrc(0xE3069283u), 0xC78AB0E5u);
  EXPECT_EQ(MaskCrc(Crc32c("")), 0xA282EAD8u);
  EXPECT_EQ(MaskCrc(Crc32c("foo")), 0xFEBE8A61u);
  for (uint32_t crc : {0u, 1u, 0xFFFFFFFFu, 0xDEADBEEFu, 0xE3069283u}) EXPECT_EQ(UnmaskCrc(MaskCrc(crc)), crc);
}

// Event{wall_time: 1.5, file_version: "brain.Event:2"} framed as a record, byte by byte:
// length 24 | masked CRC of the length | 09 <1.5 as LE double> 1a 0d "brain.Event:2" | masked CRC.
const char kFileVersionRecordHex[] =
    "1800000000000000"
    "a37f4b22"
    "09000000000000f83f1a0d627261696e2e4576656e743a32"
    "2a28646c";

TEST(RecordTest, EncodesTheGoldenRecord) {
  const std::string payload = FromHex("09000000000000f83f1a0d627261696e2e4576656e743a32");
  EXPECT_EQ(EncodeRecord(payload), FromHex(kFileVersionRecordHex));
}

TEST(RecordTest, SplitsConcatenatedRecords) {
  const std::string bytes = FromHex(kFileVersionRecordHex) + EncodeRecord("") + EncodeRecord("abc");
  absl::StatusOr<std::vector<std::string_view>> records = SplitRecords(bytes, "mem");
  ASSERT_TRUE(records.ok()) << records.status();
  ASSERT_EQ(records->size(), 3u);
  EXPECT_EQ((*records)[0], FromHex("09000000000000f83f1a0d627261696e2e4576656e743a32"));
  EXPECT_EQ((*records)[1], "");
  EXPECT_EQ((*records)[2], "abc");
}

TEST(RecordTest, EveryFlippedBitIsCaught) {
  const std::string good = EncodeRecord("hello") + EncodeRecord("world");
  for (size_t byte = 0; byte < good.size(); ++byte) {
    for (int bit = 0; bit < 8; ++bit) {
      std::string bad = good;
      bad[byte] = static_cast<char>(bad[byte] ^ (1 << bit));
      EXPECT_FALSE(SplitRecords(bad, "mem").ok()) << "byte " << byte << " bit " << bit;
    }
  }
}

TEST(RecordTest, NamesTheRecordAndTheCheckThatFailed) {
  const std::string first = EncodeRecord("hello");
  std::string bad = first + EncodeRecord("world");
  bad[first.size() + 12] ^= 0x01;  // first data byte of record 1
  absl::StatusOr<std::vector<std::string_view>> records = SplitRecords(bad, "f.tfevents");
  ASSERT_FALSE(records.ok());
  EXPECT_EQ(records.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(records.status().message().find("f.tfevents: record 1 at byte 21: data CRC mismatch"), std::string::npos)
      << records.status();

  bad = first + EncodeRecord("world");
  bad[first.size()] ^= 0x01;  // length of record 1
  records = SplitRecords(bad, "f.tfevents");
  ASSERT_FALSE(records.ok());
  EXPECT_NE(records.status().message().find("record 1 at byte 21: length CRC mismatch"), std::string::npos)
      << records.status();

  records = SplitRecords(first.substr(0, first.size() - 1), "f.tfevents");
  ASSERT_FALSE(records.ok());
  EXPECT_NE(records.status().message().find("record 0 at byte 0 is cut short"), std::string::npos) << records.status();
}

}  // namespace
}  // namespace psflow::tboard
