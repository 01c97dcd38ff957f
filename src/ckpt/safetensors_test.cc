#include "psflow/ckpt/safetensors.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>

namespace psflow::ckpt {
namespace {

std::string TempPath(const std::string& name) {
  return (std::filesystem::temp_directory_path() / (name + "_" + std::to_string(getpid()))).string();
}

std::string ReadBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

TEST(SafetensorsTest, RoundTripKeepsValuesShapesAndMetadata) {
  Tensor a({2, 3}, {1, 2, 3, 4, 5, 6}), b({4}, {-1.5f, 0, 1e-30f, 3e38f}), empty({0, 5});
  const std::string path = TempPath("roundtrip.safetensors");
  ASSERT_TRUE(WriteSafetensors(path, {{"w", &a}, {"layer/b", &b}, {"e", &empty}}, {{"global_step", "42"}}).ok());
  auto file = ReadSafetensors(path);
  ASSERT_TRUE(file.ok()) << file.status();
  ASSERT_EQ(file->tensors.size(), 3u);
  EXPECT_EQ(file->tensors.at("w").shape(), a.shape());
  for (int i = 0; i < 6; ++i) EXPECT_EQ(file->tensors.at("w")[i], a[i]);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(file->tensors.at("layer/b")[i], b[i]);
  EXPECT_EQ(file->tensors.at("e").shape(), (Shape{0, 5}));
  EXPECT_EQ(file->metadata.at("global_step"), "42");
  // Layout check independent of our reader: 8-byte little-endian length, JSON, 8-aligned data.
  const std::string bytes = ReadBytes(path);
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= uint64_t(static_cast<unsigned char>(bytes[i])) << (8 * i);
  EXPECT_EQ(n % 8, 0u);
  EXPECT_EQ(bytes.size(), 8 + n + (6 + 4) * 4);
  EXPECT_EQ(bytes[8], '{');
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
  std::remove(path.c_str());
}

TEST(SafetensorsTest, CorruptFilesAreRefusedByName) {
  Tensor a({2, 2}, {1, 2, 3, 4});
  const std::string path = TempPath("corrupt.safetensors");
  ASSERT_TRUE(WriteSafetensors(path, {{"w", &a}}, {}).ok());
  const std::string good = ReadBytes(path);
  auto expect_refused = [&](std::string bytes, const std::string& what) {
    auto file = ParseSafetensors(bytes, "ckpt.safetensors");
    ASSERT_FALSE(file.ok()) << what;
    EXPECT_NE(file.status().message().find("ckpt.safetensors"), std::string::npos) << file.status();
  };
  expect_refused(good.substr(0, 5), "shorter than the length field");
  expect_refused(good.substr(0, good.size() - 4), "truncated data");
  std::string huge_len = good;
  huge_len[7] = 0x7f;
  expect_refused(huge_len, "header length beyond the file");
  std::string bad_json = good;
  bad_json[8] = '[';
  expect_refused(bad_json, "header not an object");
  std::string bad_dtype = good;
  bad_dtype.replace(bad_dtype.find("F32"), 3, "I64");
  expect_refused(bad_dtype, "unsupported dtype");
  EXPECT_FALSE(ReadSafetensors(TempPath("missing")).ok());
  std::remove(path.c_str());
}

}  // namespace
}  // namespace psflow::ckpt
