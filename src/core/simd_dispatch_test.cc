// simd::AnyNonFinite over every length up to a few vector widths, every position of the bad
// value and every byte alignment (received payloads are not float-aligned).
#include "core/simd_dispatch.h"

#include <gtest/gtest.h>

#include <cstring>
#include <limits>
#include <vector>

namespace psflow::simd {
namespace {

// n floats at byte offset `shift` of a buffer, all `fill`.
std::vector<char> Floats(int64_t n, int shift, float fill) {
  std::vector<char> bytes(static_cast<size_t>(n) * 4 + static_cast<size_t>(shift));
  for (int64_t i = 0; i < n; ++i) std::memcpy(bytes.data() + shift + 4 * i, &fill, 4);
  return bytes;
}

TEST(AnyNonFiniteTest, FindsEveryNonFiniteAtEveryPositionAndAlignment) {
  uint32_t signalling_nan_bits = 0x7f800001u;
  float signalling_nan;
  std::memcpy(&signalling_nan, &signalling_nan_bits, 4);
  const float bad[] = {std::numeric_limits<float>::quiet_NaN(), -std::numeric_limits<float>::quiet_NaN(),
                       signalling_nan, std::numeric_limits<float>::infinity(),
                       -std::numeric_limits<float>::infinity()};
  for (int shift = 0; shift < 4; ++shift) {
    for (int64_t n = 0; n <= 70; ++n) {
      std::vector<char> bytes = Floats(n, shift, 1.5f);
      EXPECT_FALSE(AnyNonFinite(bytes.data() + shift, n)) << "n=" << n << " shift=" << shift;
      for (int64_t at = 0; at < n; ++at) {
        for (float b : bad) {
          std::memcpy(bytes.data() + shift + 4 * at, &b, 4);
          EXPECT_TRUE(AnyNonFinite(bytes.data() + shift, n)) << "n=" << n << " shift=" << shift << " at=" << at;
          // Only the first n floats are read: a bad value just past them is not seen.
          EXPECT_FALSE(AnyNonFinite(bytes.data() + shift, at)) << "n=" << at << " shift=" << shift;
          const float fine = 1.5f;
          std::memcpy(bytes.data() + shift + 4 * at, &fine, 4);
        }
      }
    }
  }
}

TEST(AnyNonFiniteTest, ExtremeFiniteValuesAreFinite) {
  const float values[] = {std::numeric_limits<float>::max(),        -std::numeric_limits<float>::max(),
                          std::numeric_limits<float>::denorm_min(), -std::numeric_limits<float>::min(),
                          0.0f,                                     -0.0f};
  for (float v : values) {
    std::vector<char> bytes = Floats(1000, 1, v);
    EXPECT_FALSE(AnyNonFinite(bytes.data() + 1, 1000)) << v;
  }
}

}  // namespace
}  // namespace psflow::simd
