// Internal to psflow_data: platform-independent random draws on std::mt19937_64 (whose output
// sequence the C++ standard fixes). std::uniform_int_distribution and std::shuffle are not used
// because their algorithms differ between standard libraries, and data order must be
// bit-for-bit reproducible from --seed everywhere.
#ifndef PSFLOW_SRC_DATA_UNIFORM_H_
#define PSFLOW_SRC_DATA_UNIFORM_H_

#include <cstdint>
#include <random>

namespace psflow::data::internal {

// Uniform in [0, bound), bound > 0, without modulo bias (rejects the lowest 2^64 mod bound).
inline uint64_t UniformBelow(std::mt19937_64& engine, uint64_t bound) {
  const uint64_t threshold = (0 - bound) % bound;
  uint64_t r;
  do {
    r = engine();
  } while (r < threshold);
  return r % bound;
}

// SplitMix64's finalizer: spreads nearby inputs (seed 1, 2, ...; epoch 0, 1, ...) over all bits.
inline uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

}  // namespace psflow::data::internal

#endif  // PSFLOW_SRC_DATA_UNIFORM_H_
