// Regression test, found by fuzzing the safetensors reader (fuzz/fuzz_safetensors): a shape whose
// element count overflows int64, e.g. [2^40, 2^40] = 2^80, wrapped to 0 elements, so the file was
// accepted with data_offsets [0, 0] and produced a Tensor whose shape promises 2^80 floats while
// holding none (signed overflow is undefined behaviour; with wrapping, later reads by shape run off
// the buffer). It must be refused as impossibly large.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <string>

#include "psflow/ckpt/safetensors.h"

namespace psflow::ckpt {
namespace {

using ::testing::HasSubstr;

std::string FileWithHeader(const std::string& json) {
  std::string bytes(8, '\0');
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>(uint64_t{json.size()} >> (8 * i));
  return bytes + json;
}

TEST(SafetensorsShapeOverflowTest, ElementCountBeyondInt64IsRefused) {
  for (const char* shape : {"[1099511627776, 1099511627776]",  // 2^40 * 2^40 = 2^80
                            "[1048576, 1048576, 16777216]",    // 2^20 * 2^20 * 2^24 = 2^64 (wraps to 0)
                            "[1099511627776, 2, 0]"}) {        // the prefix is already too large
    const std::string file =
        FileWithHeader(std::string(R"({"t": {"dtype": "F32", "shape": )") + shape + R"(, "data_offsets": [0, 0]}})");
    auto parsed = ParseSafetensors(file, "overflow.safetensors");
    ASSERT_FALSE(parsed.ok()) << shape;
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kDataLoss);
    EXPECT_THAT(parsed.status().message(), HasSubstr("impossibly large")) << parsed.status();
  }
}

TEST(SafetensorsShapeOverflowTest, LargestAllowedCountsStillParse) {
  // A zero dimension after large ones within the limit is a legitimately empty tensor.
  const std::string file =
      FileWithHeader(R"({"t": {"dtype": "F32", "shape": [1048576, 1048576, 0], "data_offsets": [0, 0]}})");
  auto parsed = ParseSafetensors(file, "empty.safetensors");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->tensors.at("t").size(), 0);
}

}  // namespace
}  // namespace psflow::ckpt
