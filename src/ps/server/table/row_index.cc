// A dynamic table's id -> record index (row_index.h).
#include "ps/server/table/row_index.h"

#include <algorithm>

#include "core/check.h"

namespace psflow::ps::table {
namespace {

constexpr size_t kMinCapacity = 16;
constexpr size_t kBlock = 32;  // ids whose entries are prefetched before any of them is probed

}  // namespace

RowIndex::RowIndex() { Rehash(kMinCapacity); }

float* RowIndex::Find(int64_t id) const { return Probe(id, Home(id)); }

void RowIndex::FindMany(const int64_t* ids, size_t n, float** records) const {
  size_t homes[kBlock];
  for (size_t start = 0; start < n; start += kBlock) {
    const size_t end = std::min(n, start + kBlock);
    for (size_t i = start; i < end; ++i) {
      homes[i - start] = Home(ids[i]);
      __builtin_prefetch(&entries_[homes[i - start]]);
    }
    for (size_t i = start; i < end; ++i) records[i] = Probe(ids[i], homes[i - start]);
  }
}

void RowIndex::Insert(int64_t id, float* record) {
  if (static_cast<size_t>(size_ + 1) * 4 > capacity() * 3) Rehash(capacity() * 2);
  size_t e = Home(id);
  while (entries_[e].record != nullptr) e = (e + 1) & mask_;
  entries_[e] = Entry{id, record};
  ++size_;
}

void RowIndex::Erase(int64_t id) {
  size_t hole = Home(id);
  for (;; hole = (hole + 1) & mask_) {
    if (entries_[hole].record == nullptr) return;  // absent
    if (entries_[hole].id == id) break;
  }
  // Backward shift: move later entries of the run into the hole when their home allows it (their
  // home is not cyclically in (hole, e]), so every probe still finds them before an empty entry.
  for (size_t e = (hole + 1) & mask_; entries_[e].record != nullptr; e = (e + 1) & mask_) {
    const size_t home = Home(entries_[e].id);
    const bool home_in_gap = hole <= e ? (home > hole && home <= e) : (home > hole || home <= e);
    if (!home_in_gap) {
      entries_[hole] = entries_[e];
      hole = e;
    }
  }
  entries_[hole].record = nullptr;
  --size_;
}

void RowIndex::Reserve(int64_t n) {
  size_t capacity = this->capacity();
  while (static_cast<size_t>(n) * 4 > capacity * 3) capacity *= 2;
  if (capacity != this->capacity()) Rehash(capacity);
}

void RowIndex::Rehash(size_t capacity) {
  CHECK(capacity >= kMinCapacity && (capacity & (capacity - 1)) == 0);
  RowArray<Entry> old = std::move(entries_);
  const size_t old_capacity = old == nullptr ? 0 : this->capacity();
  entries_ = AllocateRows<Entry>(capacity);
  for (size_t e = 0; e < capacity; ++e) entries_[e] = Entry{0, nullptr};
  mask_ = capacity - 1;
  shift_ = 64 - __builtin_ctzll(capacity);
  for (size_t e = 0; e < old_capacity; ++e) {
    if (old[e].record == nullptr) continue;
    size_t to = Home(old[e].id);
    while (entries_[to].record != nullptr) to = (to + 1) & mask_;
    entries_[to] = old[e];
  }
}

}  // namespace psflow::ps::table
