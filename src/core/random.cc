#include "psflow/core/random.h"

#include <cmath>
#include <numbers>

namespace psflow {

double Rng::Normal() {
  if (has_spare_) {
    has_spare_ = false;
    return spare_;
  }
  // Box-Muller on 53-bit uniforms; u1 is taken from (0, 1] so that log(u1) is finite.
  constexpr double kTwoPow53 = 9007199254740992.0;
  const double u1 = 1.0 - static_cast<double>(NextU64() >> 11) / kTwoPow53;
  const double u2 = static_cast<double>(NextU64() >> 11) / kTwoPow53;
  const double radius = std::sqrt(-2.0 * std::log(u1));
  const double angle = 2.0 * std::numbers::pi * u2;
  spare_ = radius * std::sin(angle);
  has_spare_ = true;
  return radius * std::cos(angle);
}

namespace {
// splitmix64's finalizer: a bijection on 64 bits with good avalanche, so nearby seeds and
// stream ids give unrelated outputs.
uint64_t SplitMix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}
}  // namespace

uint64_t Rng::Mix(uint64_t seed, uint64_t stream) { return SplitMix64(SplitMix64(seed) ^ stream); }

}  // namespace psflow
