// Element-wise kernels with run-time ISA dispatch; see simd_dispatch.h.
#include "core/simd_dispatch.h"

namespace psflow::simd {

PSFLOW_DISPATCH void AddInto(float* __restrict dst, const float* __restrict src, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] += src[i];
}

PSFLOW_DISPATCH void Scale(float* x, int64_t n, float scale) {
  for (int64_t i = 0; i < n; ++i) x[i] *= scale;
}

const char* DispatchLevel() {
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f")) return "avx512f";
  if (__builtin_cpu_supports("avx2")) return "avx2";
#endif
  return "default";
}

}  // namespace psflow::simd
