// 16-bit wire dtypes (rpc/wire_dtype.h): the array loops, compiled per ISA.
#include "rpc/wire_dtype.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "core/simd_dispatch.h"

namespace psflow::rpc {
namespace {

// The one-value functions of the header, inlined into loops the compiler vectorizes (they are
// branches on integers it turns into selects).
PSFLOW_DISPATCH void ToBFloat16(const float* __restrict src, int64_t n, uint16_t* __restrict dst) {
  for (int64_t i = 0; i < n; ++i) dst[i] = FloatToBFloat16(src[i]);
}
PSFLOW_DISPATCH void ToHalf(const float* __restrict src, int64_t n, uint16_t* __restrict dst) {
  for (int64_t i = 0; i < n; ++i) dst[i] = FloatToHalf(src[i]);
}
PSFLOW_DISPATCH void FromBFloat16(const uint16_t* __restrict src, int64_t n, float* __restrict dst) {
  for (int64_t i = 0; i < n; ++i) dst[i] = BFloat16ToFloat(src[i]);
}
PSFLOW_DISPATCH void FromHalf(const uint16_t* __restrict src, int64_t n, float* __restrict dst) {
  for (int64_t i = 0; i < n; ++i) dst[i] = HalfToFloat(src[i]);
}

}  // namespace

const char* WireDtypeName(WireDtype dtype) {
  switch (dtype) {
    case WireDtype::kFloat32:
      return "float32";
    case WireDtype::kBFloat16:
      return "bfloat16";
    case WireDtype::kFloat16:
      return "float16";
  }
  return "float32";
}

absl::StatusOr<WireDtype> ParseWireDtype(std::string_view name) {
  if (name.empty() || name == "float32") return WireDtype::kFloat32;
  if (name == "bfloat16") return WireDtype::kBFloat16;
  if (name == "float16") return WireDtype::kFloat16;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown wire dtype '", std::string(name), "' (float32, bfloat16 or float16)"));
}

void EncodeFloats(WireDtype dtype, const float* src, int64_t n, uint16_t* dst) {
  if (dtype == WireDtype::kBFloat16) return ToBFloat16(src, n, dst);
  if (dtype == WireDtype::kFloat16) return ToHalf(src, n, dst);
}

void DecodeFloats(WireDtype dtype, const uint16_t* src, int64_t n, float* dst) {
  if (dtype == WireDtype::kBFloat16) return FromBFloat16(src, n, dst);
  if (dtype == WireDtype::kFloat16) return FromHalf(src, n, dst);
}

void RoundWithFeedback(WireDtype dtype, const float* grad, float* residual, float* out, int64_t n) {
  constexpr int64_t kBlock = 2048;
  uint16_t wire[kBlock];
  float v[kBlock], q[kBlock];
  for (int64_t at = 0; at < n; at += kBlock) {
    const int64_t k = std::min(kBlock, n - at);
    for (int64_t i = 0; i < k; ++i) v[i] = grad[at + i] + residual[at + i];
    EncodeFloats(dtype, v, k, wire);
    DecodeFloats(dtype, wire, k, q);
    for (int64_t i = 0; i < k; ++i) {
      const float r = v[i] - q[i];
      residual[at + i] = std::isfinite(r) ? r : 0.0f;
      out[at + i] = q[i];
    }
  }
}

}  // namespace psflow::rpc
