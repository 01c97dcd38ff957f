#include "psflow/data/idx.h"

#include <string>
#include <vector>

#include "data/test_files.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "io/fault_injection_env.h"

namespace psflow::data {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using testing::IdxBytes;
using ::testing::StartsWith;
using testing::WriteBytes;

class IdxTest : public testing::TempDirTest {
 protected:
  // Writes `bytes` to `name` and returns the reader's error (failing if it succeeded).
  absl::Status ErrorFor(const std::string& name, const std::vector<uint8_t>& bytes, bool gzip) {
    WriteBytes(Path(name), bytes, gzip);
    absl::StatusOr<IdxArray> array = ReadIdxFile(Path(name));
    EXPECT_FALSE(array.ok()) << name << " was read without error";
    // Every error starts with the file's path.
    EXPECT_THAT(std::string(array.status().message()), StartsWith(Path(name) + ": "));
    return array.status();
  }
};

std::vector<uint8_t> Iota(size_t n) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(i * 7 + 3);
  return v;
}

TEST_F(IdxTest, ReadsPlainFile) {
  WriteBytes(Path("a-idx3-ubyte"), IdxBytes({3, 2, 2}, Iota(12)), false);
  absl::StatusOr<IdxArray> array = ReadIdxFile(Path("a-idx3-ubyte"));
  ASSERT_TRUE(array.ok()) << array.status();
  EXPECT_THAT(array->dims, ElementsAre(3, 2, 2));
  EXPECT_EQ(array->data, Iota(12));
}

TEST_F(IdxTest, ReadsGzipFileWhateverItsName) {
  // Larger than the reader's gzip buffer, and spanning dimension bytes above 255.
  const std::vector<uint8_t> data = Iota(300 * 700);
  WriteBytes(Path("b.gz"), IdxBytes({300, 700}, data), true);
  WriteBytes(Path("b-no-suffix"), IdxBytes({300, 700}, data), true);
  for (const char* name : {"b.gz", "b-no-suffix"}) {
    absl::StatusOr<IdxArray> array = ReadIdxFile(Path(name));
    ASSERT_TRUE(array.ok()) << array.status();
    EXPECT_THAT(array->dims, ElementsAre(300, 700));
    EXPECT_EQ(array->data, data);
  }
}

TEST_F(IdxTest, ReadsOneDimensionalAndEmpty) {
  WriteBytes(Path("labels"), IdxBytes({5}, {5, 0, 4, 1, 9}), false);
  absl::StatusOr<IdxArray> labels = ReadIdxFile(Path("labels"));
  ASSERT_TRUE(labels.ok()) << labels.status();
  EXPECT_THAT(labels->dims, ElementsAre(5));
  EXPECT_THAT(labels->data, ElementsAre(5, 0, 4, 1, 9));
  WriteBytes(Path("empty"), IdxBytes({0, 28, 28}, {}), false);
  absl::StatusOr<IdxArray> empty = ReadIdxFile(Path("empty"));
  ASSERT_TRUE(empty.ok()) << empty.status();
  EXPECT_THAT(empty->dims, ElementsAre(0, 28, 28));
  EXPECT_TRUE(empty->data.empty());
}

TEST_F(IdxTest, MissingFileIsNotFound) {
  absl::StatusOr<IdxArray> array = ReadIdxFile(Path("nope"));
  EXPECT_EQ(array.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(array.status().message(), Path("nope") + ": no such file");
}

TEST_F(IdxTest, BadMagic) {
  std::vector<uint8_t> bytes = IdxBytes({2}, {1, 2});
  bytes[0] = 0x12;
  bytes[1] = 0x34;
  absl::Status s = ErrorFor("magic", bytes, false);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(s.message()), HasSubstr("not an IDX file: starts with bytes 12 34 08 01, expected 00 00 08"));
}

TEST_F(IdxTest, UnsupportedElementType) {
  absl::Status s = ErrorFor("floats", IdxBytes({1}, {0, 0, 0, 0}, 0x0D), false);
  EXPECT_THAT(std::string(s.message()), HasSubstr("element type 0x0d is not supported"));
}

TEST_F(IdxTest, ZeroDimensions) {
  absl::Status s = ErrorFor("nodims", IdxBytes({}, {}), false);
  EXPECT_THAT(std::string(s.message()), HasSubstr("0 dimensions"));
}

TEST_F(IdxTest, TruncatedMagicAndHeader) {
  EXPECT_THAT(std::string(ErrorFor("short", {0, 0}, false).message()), HasSubstr("truncated: file has 2 bytes"));
  // Claims 3 dimensions but has the bytes of only one.
  std::vector<uint8_t> bytes = IdxBytes({7}, {});
  bytes[3] = 3;
  EXPECT_THAT(std::string(ErrorFor("header", bytes, false).message()),
              HasSubstr("truncated: header of 3 dimensions needs 16 bytes, file has 8"));
}

TEST_F(IdxTest, TruncatedData) {
  // Header 4 + 12 bytes; data 2*3*4 = 24 bytes but only 10 present.
  std::vector<uint8_t> bytes = IdxBytes({2, 3, 4}, Iota(10));
  absl::Status s = ErrorFor("cut", bytes, false);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(s.message(), Path("cut") + ": truncated: header says 40 bytes, file has 26");
  s = ErrorFor("cut.gz", bytes, true);
  EXPECT_EQ(s.message(), Path("cut.gz") + ": truncated: header says 40 bytes, its uncompressed data has 26");
}

TEST_F(IdxTest, TrailingBytes) {
  std::vector<uint8_t> bytes = IdxBytes({2, 2}, Iota(7));  // 3 bytes too many
  absl::Status s = ErrorFor("long", bytes, false);
  EXPECT_EQ(s.message(), Path("long") + ": 3 trailing bytes: header says 16 bytes, file has 19");
  s = ErrorFor("long.gz", bytes, true);
  EXPECT_THAT(std::string(s.message()), HasSubstr("3 trailing bytes"));
}

TEST_F(IdxTest, TruncatedGzipStream) {
  WriteBytes(Path("whole.gz"), IdxBytes({100, 100}, Iota(10000)), true);
  std::vector<uint8_t> compressed = testing::ReadBytes(Path("whole.gz"));
  ASSERT_GT(compressed.size(), 40u);
  compressed.resize(compressed.size() - 20);  // cuts into the deflate data and the trailer
  absl::Status s = ErrorFor("cut-stream.gz", compressed, false);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(s.message()), HasSubstr("truncated"));
}

TEST_F(IdxTest, CorruptGzipStream) {
  WriteBytes(Path("whole.gz"), IdxBytes({100, 100}, Iota(10000)), true);
  std::vector<uint8_t> compressed = testing::ReadBytes(Path("whole.gz"));
  compressed[compressed.size() - 6] ^= 0xff;  // inside the CRC-32 of the gzip trailer
  absl::Status s = ErrorFor("bad-crc.gz", compressed, false);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(s.message()), HasSubstr("corrupt gzip stream"));
}

// Through the fault-injecting Env: a file that cannot be opened, and an I/O error in the middle of
// the data (the Nth read), plain and gzip, each one line naming the file; without a fault the same
// Env reads the file.
TEST_F(IdxTest, UnreadableFilesAndReadErrorsNameTheFile) {
  const std::vector<uint8_t> data = Iota(300 * 700);
  WriteBytes(Path("plain"), IdxBytes({300, 700}, data), false);
  WriteBytes(Path("packed.gz"), IdxBytes({300, 700}, data), true);
  for (const char* name : {"plain", "packed.gz"}) {
    SCOPED_TRACE(name);
    io::FaultInjectionEnv env;
    absl::StatusOr<IdxArray> clean = ReadIdxFile(Path(name), &env);
    ASSERT_TRUE(clean.ok()) << clean.status();
    EXPECT_EQ(clean->data, data);
    ASSERT_GE(env.Count(io::FileOp::kRead), 3) << "the file is read in several pieces";

    env.Reset();
    env.Inject({.op = io::FileOp::kOpen, .nth = 1, .error = EACCES});
    absl::StatusOr<IdxArray> refused = ReadIdxFile(Path(name), &env);
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kPermissionDenied);
    EXPECT_EQ(refused.status().message(), "cannot open " + Path(name) + ": Permission denied");

    env.Reset();
    env.Inject({.op = io::FileOp::kRead, .nth = 3, .error = EIO});
    absl::StatusOr<IdxArray> failed = ReadIdxFile(Path(name), &env);
    EXPECT_FALSE(failed.ok());
    EXPECT_EQ(failed.status().message(), "cannot read " + Path(name) + ": Input/output error");
    EXPECT_THAT(env.Fired(), ElementsAre("cannot read " + Path(name) + ": Input/output error"));
  }
}

// Concatenated gzip members are one stream (as gzip -d reads them); bytes after the last member
// that do not start another are ignored, as zlib's gzread does.
TEST_F(IdxTest, ReadsConcatenatedGzipMembers) {
  const std::vector<uint8_t> whole = IdxBytes({4, 5}, Iota(20));
  WriteBytes(Path("first.gz"), std::vector<uint8_t>(whole.begin(), whole.begin() + 11), true);
  WriteBytes(Path("second.gz"), std::vector<uint8_t>(whole.begin() + 11, whole.end()), true);
  std::vector<uint8_t> joined = testing::ReadBytes(Path("first.gz"));
  const std::vector<uint8_t> second = testing::ReadBytes(Path("second.gz"));
  joined.insert(joined.end(), second.begin(), second.end());
  joined.insert(joined.end(), {0, 0, 0});
  WriteBytes(Path("joined"), joined, false);
  absl::StatusOr<IdxArray> array = ReadIdxFile(Path("joined"));
  ASSERT_TRUE(array.ok()) << array.status();
  EXPECT_THAT(array->dims, ElementsAre(4, 5));
  EXPECT_EQ(array->data, Iota(20));
}

}  // namespace
}  // namespace psflow::data
