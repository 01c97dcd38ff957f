// Run-time CPU dispatch for psflow's own element-wise kernels: one binary for every CPU of a
// cluster, with the same numbers on each.
//
// The default build targets the baseline x86-64 ISA (SSE2) so that one binary runs on every
// host of a cluster. The few loops that psflow itself runs over millions of floats (optimizer
// updates on the ps, gradient accumulation, max-pooling) are compiled three times with GCC's target_clones
// (AVX-512F, AVX2, baseline); the loader's ifunc resolver picks the widest one the CPU has,
// once, at start-up. Matmul and convolution are OpenBLAS / oneDNN, which dispatch themselves.
//
// The clones compute bit-identical results: element-wise add/mul/div/sqrt round the same way
// whatever the vector width, and files using PSFLOW_DISPATCH on a*b+c must be compiled with
// -ffp-contract=off (src/optim does) or the AVX-512 clone would fuse it into an FMA. So ps
// tasks on different CPUs apply the same updates. (OpenBLAS and oneDNN pick CPU-specific
// kernels whose sums may differ in the last bits between CPU families; docs/design.md#determinism.)
//
// With -DPSFLOW_NATIVE=ON (or any build whose baseline already has AVX-512F) the macro is
// empty: the compiler vectorizes for the build machine directly.
//
// Thread safety: the kernels are pure functions of their arguments.
#pragma once

#include <cstdint>

#if defined(__x86_64__) && !defined(__AVX512F__) && defined(__GNUC__) && !defined(__clang__)
#define PSFLOW_DISPATCH __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define PSFLOW_DISPATCH
#endif

namespace psflow::simd {

// dst[i] += src[i] for i in [0, n). dst and src must not overlap.
void AddInto(float* __restrict dst, const float* __restrict src, int64_t n);

// AddInto with src's n floats stored at any byte address (received bytes read in place).
void AddFromBytes(float* dst, const void* src, int64_t n);

// x[i] *= scale for i in [0, n).
void Scale(float* x, int64_t n, float scale);

// MaxPool's inner loop over channels: where cell[c] > best[c] (strictly: ties keep the earlier
// cell), best[c] = cell[c] and arg[c] = offset + c, for c in [0, n). Exact at any vector width.
void MaxInto(float* __restrict best, int32_t* __restrict arg, const float* __restrict cell, int32_t offset, int64_t n);

// Whether any of the n floats stored at `floats` is NaN or +-Inf (exponent bits all ones). The
// bytes may sit at any address (a received message's payload is not float-aligned): read as
// integers, an OR over the exponents. The finiteness checks of pushes, received tensors and table
// rows; the AVX-512 clone reads 16 MiB about four times faster than the baseline one.
bool AnyNonFinite(const void* floats, int64_t n);

}  // namespace psflow::simd
