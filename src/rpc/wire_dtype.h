// rpc/wire_dtype.h — the element types a dense tensor may cross the wire in (--wire_dtype):
// float32 (the default: the float bytes as they are), bfloat16 or float16 (IEEE binary16), two
// bytes per element. Values live as float32 on both sides; a 16-bit tensor is rounded to nearest,
// ties to even, when encoded and widened exactly when read. NaN stays NaN (quiet, sign kept), an
// infinity stays infinite, values past the 16-bit format's range become infinite (float16 only:
// bfloat16 has float32's range), and subnormals are produced and read exactly (no flush to zero).
// Pure functions, thread-safe; the loops over arrays are compiled per ISA (core/simd_dispatch.h)
// and give the same bits on every CPU.
#ifndef PSFLOW_RPC_WIRE_DTYPE_H_
#define PSFLOW_RPC_WIRE_DTYPE_H_

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>

#include "absl/status/statusor.h"

namespace psflow::rpc {

enum class WireDtype { kFloat32, kBFloat16, kFloat16 };

// "float32", "bfloat16", "float16" (TensorMeta.dtype's spelling, and --wire_dtype's).
const char* WireDtypeName(WireDtype dtype);
// The dtype named `name`; "" is float32 (senders from before the dtype field). InvalidArgument
// naming the accepted spellings otherwise.
absl::StatusOr<WireDtype> ParseWireDtype(std::string_view name);
// Bytes of one element on the wire: 4 or 2.
inline size_t WireDtypeBytes(WireDtype dtype) { return dtype == WireDtype::kFloat32 ? 4 : 2; }

// One value (the reference the array loops below are checked against, bit for bit).
inline uint32_t FloatBits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}
inline float FloatOfBits(uint32_t b) {
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}

inline uint16_t FloatToBFloat16(float f) {
  const uint32_t b = FloatBits(f);
  if ((b & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((b >> 16) | 0x0040u);  // quiet NaN
  return static_cast<uint16_t>((b + 0x7fffu + ((b >> 16) & 1u)) >> 16);                    // carries into the exponent
}
inline float BFloat16ToFloat(uint16_t h) { return FloatOfBits(static_cast<uint32_t>(h) << 16); }

inline uint16_t FloatToHalf(float f) {
  const uint32_t b = FloatBits(f);
  const uint32_t sign = (b >> 16) & 0x8000u;
  const uint32_t a = b & 0x7fffffffu;
  if (a > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u | ((a >> 13) & 0x3ffu));  // quiet NaN
  if (a >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // >= 65520 (incl. Inf): Inf
  if (a >= 0x38800000u) {                                              // >= 2^-14: a normal half
    const uint32_t r = a - 0x38000000u;                                // rebias the exponent by 127 - 15
    return static_cast<uint16_t>(sign | ((r + 0x0fffu + ((r >> 13) & 1u)) >> 13));
  }
  if (a <= 0x33000000u) return static_cast<uint16_t>(sign);  // <= 2^-25: rounds to (signed) zero
  // A subnormal half: the value in units of 2^-24, rounded; 2^-14 itself when it rounds up to it.
  const uint32_t shift = 126u - (a >> 23);  // 14..24
  const uint32_t m = (a & 0x7fffffu) | 0x800000u;
  const uint32_t q = m >> shift, rem = m & ((1u << shift) - 1u), half = 1u << (shift - 1u);
  return static_cast<uint16_t>(sign | (q + ((rem > half) | ((rem == half) & q & 1u))));
}
inline float HalfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
  if (e == 0x1f) return FloatOfBits(sign | 0x7f800000u | (m << 13));  // Inf, NaN (payload kept)
  if (e != 0) return FloatOfBits(sign | ((e + 112u) << 23) | (m << 13));
  // Zero or subnormal: m * 2^-24, exact in float.
  return FloatOfBits(sign | FloatBits(static_cast<float>(m) * 0x1p-24f));
}

// dst[i] = src[i] in `dtype` (16-bit dtypes only), for i in [0, n).
void EncodeFloats(WireDtype dtype, const float* src, int64_t n, uint16_t* dst);
// dst[i] = the float32 value of src[i] (16-bit dtypes only), for i in [0, n).
void DecodeFloats(WireDtype dtype, const uint16_t* src, int64_t n, float* dst);

// Error feedback for a 16-bit push: v = grad[i] + residual[i] is sent as its rounding q (written
// to out[i] as the float32 value q, which `dtype` represents exactly), and residual[i] = v - q
// carries what rounding lost into the next push. A non-finite v or q leaves residual[i] = 0 (the
// ps refuses non-finite gradients; the residual must not poison the pushes after). `out` may be
// `grad`.
void RoundWithFeedback(WireDtype dtype, const float* grad, float* residual, float* out, int64_t n);

}  // namespace psflow::rpc

#endif  // PSFLOW_RPC_WIRE_DTYPE_H_
