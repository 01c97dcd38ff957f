// core/random_id.h — a random 64-bit id that is never 0, for ids that must differ between
// processes and restarts: a PsClient's client id (push deduplication), a ps model's id (a push
// from before a restore), a delta-pull session, a checkpoint chain. 0 means "none" or "not checked" in each of them.
// Header-only; thread-safe (each call has its own std::random_device).
#ifndef PSFLOW_CORE_RANDOM_ID_H_
#define PSFLOW_CORE_RANDOM_ID_H_

#include <chrono>
#include <cstdint>
#include <random>

namespace psflow {

inline uint64_t RandomNonZeroId() {
  std::random_device device;
  uint64_t id = 0;
  while (id == 0) {
    // The clock as well: a random_device that is a fixed-seed engine still differs per call then.
    id = (static_cast<uint64_t>(device()) << 32) ^ device() ^
         static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
  }
  return id;
}

}  // namespace psflow

#endif  // PSFLOW_CORE_RANDOM_ID_H_
