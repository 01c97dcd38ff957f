// Element-wise kernels with run-time ISA dispatch; see simd_dispatch.h.
#include "core/simd_dispatch.h"

#include <cstring>

namespace psflow::simd {
namespace {

// dst and the bytes never overlap (a received message's bytes and a buffer of the ps's own).
[[gnu::always_inline]] inline void AddBytes(float* __restrict dst, const char* __restrict src, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    float v;
    std::memcpy(&v, src + 4 * i, sizeof(v));
    dst[i] += v;
  }
}

}  // namespace

PSFLOW_DISPATCH void AddInto(float* __restrict dst, const float* __restrict src, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] += src[i];
}

PSFLOW_DISPATCH void AddFromBytes(float* dst, const void* src, int64_t n) {
  AddBytes(dst, static_cast<const char*>(src), n);
}

PSFLOW_DISPATCH void Scale(float* x, int64_t n, float scale) {
  for (int64_t i = 0; i < n; ++i) x[i] *= scale;
}

PSFLOW_DISPATCH void MaxInto(float* __restrict best, int32_t* __restrict arg, const float* __restrict cell,
                             int32_t offset, int64_t n) {
  for (int64_t c = 0; c < n; ++c) {
    const bool greater = cell[c] > best[c];
    best[c] = greater ? cell[c] : best[c];
    arg[c] = greater ? offset + static_cast<int32_t>(c) : arg[c];
  }
}

PSFLOW_DISPATCH bool AnyNonFinite(const void* floats, int64_t n) {
  const char* p = static_cast<const char*>(floats);
  uint32_t bad = 0;
  for (int64_t i = 0; i < n; ++i) {
    uint32_t bits;
    std::memcpy(&bits, p + 4 * i, sizeof(bits));
    bad |= static_cast<uint32_t>((bits & 0x7f800000u) == 0x7f800000u);
  }
  return bad != 0;
}

}  // namespace psflow::simd
