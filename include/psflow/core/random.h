// psflow/core/random.h — the one random generator psflow uses, so that a --seed makes a run
// bit-for-bit repeatable (standard-library distributions differ between implementations, so the
// transforms to uniform/normal are our own). Not thread-safe: one Rng per thread or replica.
#ifndef PSFLOW_CORE_RANDOM_H_
#define PSFLOW_CORE_RANDOM_H_

#include <cstdint>
#include <random>

namespace psflow {

class Rng {
 public:
  explicit Rng(uint64_t seed) : engine_(seed) {}
  uint64_t NextU64() { return engine_(); }
  // Uniform in [0, 1) with 24 random bits.
  float Uniform() { return static_cast<float>(engine_() >> 40) * (1.0f / 16777216.0f); }
  // Uniform integer in [0, n).
  uint64_t UniformInt(uint64_t n) { return engine_() % n; }
  // Standard normal (Box-Muller; one of the two values is kept for the next call).
  double Normal();
  // Derives an independent stream, e.g. per variable or per worker: seed mixed with `stream`.
  static uint64_t Mix(uint64_t seed, uint64_t stream);

 private:
  std::mt19937_64 engine_;
  bool has_spare_ = false;
  double spare_ = 0.0;
};

}  // namespace psflow

#endif  // PSFLOW_CORE_RANDOM_H_
