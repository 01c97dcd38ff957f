// core/id_positions.h — a scratch hash table from int64 id to a position, for the per-batch work
// on embedding ids (DedupIds, the ps client's routing of a table's ids): open addressing over
// power-of-two arrays that are kept between calls and emptied in O(1) by a generation stamp, so a
// batch of n ids costs n probes and no allocation once the arrays have grown. Not thread-safe:
// each thread uses its own (IdPositions::ForThisThread()).
#ifndef PSFLOW_CORE_ID_POSITIONS_H_
#define PSFLOW_CORE_ID_POSITIONS_H_

#include <cstdint>
#include <utility>
#include <vector>

namespace psflow {

class IdPositions {
 public:
  // This thread's table (reused by every call on the thread).
  static IdPositions& ForThisThread();

  // Empties the table and sizes it for up to `n` ids.
  void Reset(int64_t n) {
    int shift = 64 - 4;  // at least 16 slots, at most half full
    uint64_t capacity = 16;
    while (capacity < 2 * static_cast<uint64_t>(n > 0 ? n : 0)) {
      capacity <<= 1;
      --shift;
    }
    // Grown to the largest batch seen; given back once a batch needs a sixteenth of it (and it
    // holds more than 2^20 slots, 20 MiB), so one huge call does not pin its memory to the thread.
    if (capacity > keys_.size() || (keys_.size() > (uint64_t{1} << 20) && capacity * 16 <= keys_.size())) {
      keys_ = std::vector<int64_t>();
      positions_ = std::vector<int64_t>();
      stamps_ = std::vector<uint32_t>();
      keys_.assign(capacity, 0);
      positions_.assign(capacity, 0);
      stamps_.assign(capacity, 0);
      stamp_ = 0;
    }
    shift_ = shift;
    mask_ = capacity - 1;
    if (++stamp_ == 0) {  // the stamps wrapped: empty every slot once
      stamps_.assign(stamps_.size(), 0);
      stamp_ = 1;
    }
  }

  // The position of `id` when it is in the table (second: false); else inserts it at `position`
  // (second: true). At most the `n` of Reset ids may be inserted.
  std::pair<int64_t, bool> Insert(int64_t id, int64_t position) {
    // Fibonacci hashing: the high bits of id * 2^64/φ (the ids of a table are often small and
    // dense), after folding the id's high half into its low one: ids that differ only above bit
    // 32 (k << 52, say: ids arrive from peers too) would otherwise share a few thousand slots.
    uint64_t x = static_cast<uint64_t>(id);
    x ^= x >> 32;
    uint64_t slot = (x * 0x9E3779B97F4A7C15ULL) >> shift_;
    for (;;) {
      if (stamps_[slot] != stamp_) {
        stamps_[slot] = stamp_;
        keys_[slot] = id;
        positions_[slot] = position;
        return {position, true};
      }
      if (keys_[slot] == id) return {positions_[slot], false};
      slot = (slot + 1) & mask_;
    }
  }

 private:
  std::vector<int64_t> keys_, positions_;
  std::vector<uint32_t> stamps_;
  uint32_t stamp_ = 0;
  int shift_ = 60;
  uint64_t mask_ = 15;
};

}  // namespace psflow

#endif  // PSFLOW_CORE_ID_POSITIONS_H_
