// Test-only helpers for psflow_data tests: IDX bytes built by hand from the format's definition
// (independent of the reader), written plain or through zlib's gzopen/gzwrite into a fresh
// temporary directory per test.
#ifndef PSFLOW_SRC_DATA_TEST_FILES_H_
#define PSFLOW_SRC_DATA_TEST_FILES_H_

#include <unistd.h>
#include <zlib.h>

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace psflow::data::testing {

// Magic 00 00 <type> <ndims>, big-endian uint32 dims, then `data`.
inline std::vector<uint8_t> IdxBytes(const std::vector<uint32_t>& dims, const std::vector<uint8_t>& data,
                                     uint8_t type = 0x08) {
  std::vector<uint8_t> bytes = {0, 0, type, static_cast<uint8_t>(dims.size())};
  for (uint32_t d : dims) {
    bytes.insert(bytes.end(), {static_cast<uint8_t>(d >> 24), static_cast<uint8_t>(d >> 16),
                               static_cast<uint8_t>(d >> 8), static_cast<uint8_t>(d)});
  }
  bytes.insert(bytes.end(), data.begin(), data.end());
  return bytes;
}

inline void WriteBytes(const std::string& path, const std::vector<uint8_t>& bytes, bool gzip) {
  if (gzip) {
    gzFile f = gzopen(path.c_str(), "wb");
    ASSERT_NE(f, nullptr) << path;
    ASSERT_EQ(gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size())), static_cast<int>(bytes.size()));
    ASSERT_EQ(gzclose(f), Z_OK);
  } else {
    FILE* f = std::fopen(path.c_str(), "wb");
    ASSERT_NE(f, nullptr) << path;
    ASSERT_EQ(std::fwrite(bytes.data(), 1, bytes.size(), f), bytes.size());
    ASSERT_EQ(std::fclose(f), 0);
  }
}

inline std::vector<uint8_t> ReadBytes(const std::string& path) {
  std::vector<uint8_t> bytes;
  FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) return bytes;
  int c;
  while ((c = std::fgetc(f)) != EOF) bytes.push_back(static_cast<uint8_t>(c));
  std::fclose(f);
  return bytes;
}

// An empty directory unique to the running test, removed when the fixture ends.
class TempDirTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const ::testing::TestInfo* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = std::filesystem::temp_directory_path() / (std::string("psflow_data_") + info->test_suite_name() + "_" +
                                                     info->name() + "_" + std::to_string(getpid()));
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string Path(const std::string& name) const { return (dir_ / name).string(); }
  std::string dir() const { return dir_.string(); }

 private:
  std::filesystem::path dir_;
};

}  // namespace psflow::data::testing

#endif  // PSFLOW_SRC_DATA_TEST_FILES_H_
