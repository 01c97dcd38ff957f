// ps/server/table/row_index.h — a dynamic table's id -> record index (dynamic_table.h): open
// addressing with linear probing over 16-byte entries {id, record}, a power-of-two number of them,
// at most 3/4 full, removals by backward shift (no tombstones). An id's home entry is the top bits
// of dist::Mix64(id): the bits the routing's Mix64(id) % P leaves free, so the ids of one ps still
// spread over every entry. Lookups of a batch compute the homes first and prefetch their entries,
// so the cache misses of a push's ids overlap. Also ModOf: Mix64(id) % P by a precomputed
// reciprocal instead of a 64-bit division per id.
//
// Not thread-safe: the owning table guards it (reads may share its lock, changes hold it alone).
#ifndef PSFLOW_PS_SERVER_TABLE_ROW_INDEX_H_
#define PSFLOW_PS_SERVER_TABLE_ROW_INDEX_H_

#include <cstddef>
#include <cstdint>

#include "ps/server/table/row_memory.h"
#include "psflow/dist/table_routing.h"

namespace psflow::ps::table {

// x % d for a fixed d >= 1 without a division (Lemire, Kaser & Kurz 2019, "Faster remainder by
// direct computation", the 64-bit variant): exact for every 64-bit x.
class ModOf {
 public:
  explicit ModOf(uint64_t d) : d_(d), m_(~static_cast<unsigned __int128>(0) / d + 1) {}
  uint64_t operator()(uint64_t x) const {
    const unsigned __int128 low = m_ * x;  // the fraction x / d, in 128 fixed-point bits
    const unsigned __int128 bottom = (static_cast<unsigned __int128>(static_cast<uint64_t>(low)) * d_) >> 64;
    const unsigned __int128 top = static_cast<unsigned __int128>(static_cast<uint64_t>(low >> 64)) * d_;
    return static_cast<uint64_t>((bottom + top) >> 64);
  }

 private:
  uint64_t d_;
  unsigned __int128 m_;
};

class RowIndex {
 public:
  RowIndex();

  int64_t size() const { return size_; }
  // Bytes held by the entries.
  int64_t bytes() const { return static_cast<int64_t>(capacity() * sizeof(Entry)); }

  // The record of `id`, or nullptr.
  float* Find(int64_t id) const;
  // records[i] = Find(ids[i]) for i in [0, n), prefetching the entries of a block of ids before
  // probing them.
  void FindMany(const int64_t* ids, size_t n, float** records) const;
  // Adds id -> record (not null); the id must be absent.
  void Insert(int64_t id, float* record);
  // Removes `id` if present.
  void Erase(int64_t id);
  // Room for `n` ids without growing.
  void Reserve(int64_t n);
  // f(id, record) for every entry, in no particular order. The index must not change meanwhile.
  template <typename F>
  void ForEach(F&& f) const {
    for (size_t e = 0; e < capacity(); ++e) {
      if (entries_[e].record != nullptr) f(entries_[e].id, entries_[e].record);
    }
  }
  // Whether pred(id, record) holds for some entry; stops at the first that does.
  template <typename P>
  bool Any(P&& pred) const {
    for (size_t e = 0; e < capacity(); ++e) {
      if (entries_[e].record != nullptr && pred(entries_[e].id, entries_[e].record)) return true;
    }
    return false;
  }

 private:
  struct Entry {
    int64_t id;
    float* record;  // nullptr: empty
  };
  size_t capacity() const { return mask_ + 1; }
  size_t Home(int64_t id) const { return static_cast<size_t>(dist::Mix64(static_cast<uint64_t>(id)) >> shift_); }
  float* Probe(int64_t id, size_t e) const {
    for (;; e = (e + 1) & mask_) {
      const Entry& entry = entries_[e];
      if (entry.record == nullptr || entry.id == id) return entry.record;
    }
  }
  void Rehash(size_t capacity);

  RowArray<Entry> entries_;
  size_t mask_ = 0;  // capacity - 1 (a power of two >= 16)
  int shift_ = 64;   // 64 - log2(capacity)
  int64_t size_ = 0;
};

}  // namespace psflow::ps::table

#endif  // PSFLOW_PS_SERVER_TABLE_ROW_INDEX_H_
