// The memory tier of a dynamic table's rows (row_store.h).
#include "ps/server/table/row_store.h"

#include <algorithm>
#include <utility>

namespace psflow::ps::table {
namespace {

constexpr int64_t kSlabBytes = int64_t{2} << 20;  // one huge page (row_memory.h)

}  // namespace

MemoryRowStore::MemoryRowStore(int64_t floats_per_row)
    : stride_(kMetaFloats + (floats_per_row + 1) / 2 * 2),
      slab_rows_(std::max<int64_t>(16, kSlabBytes / (stride_ * static_cast<int64_t>(sizeof(float))))) {}

float* MemoryRowStore::Create(int64_t id) {
  float* record;
  if (!free_records_.empty()) {
    record = free_records_.back();
    free_records_.pop_back();
  } else {
    if (slabs_.empty() || last_slab_used_ == slab_rows_) {
      slabs_.push_back(AllocateRows<float>(static_cast<size_t>(slab_rows_ * stride_)));
      last_slab_used_ = 0;
    }
    record = slabs_.back().get() + (last_slab_used_++) * stride_ + kMetaFloats;
  }
  index_.Insert(id, record);
  return record;
}

absl::Status MemoryRowStore::Erase(const std::vector<int64_t>& ids) {
  for (int64_t id : ids) {
    float* record = index_.Find(id);
    if (record == nullptr) continue;
    free_records_.push_back(record);
    index_.Erase(id);
  }
  return absl::OkStatus();
}

absl::Status MemoryRowStore::ForEachAge(absl::FunctionRef<void(int64_t, int64_t)> f) const {
  index_.ForEach([&](int64_t id, float* record) { f(id, MetaOf(record).last_step); });
  return absl::OkStatus();
}

// Sorts the ids at the call (8 bytes a row) and finds each row at Next.
class MemoryRowStore::Scanner final : public RecordScan {
 public:
  explicit Scanner(const MemoryRowStore* store) : store_(store) {
    ids_.reserve(static_cast<size_t>(store_->index_.size()));
    store_->index_.ForEach([this](int64_t id, float*) { ids_.push_back(id); });
    std::sort(ids_.begin(), ids_.end());
  }

  absl::StatusOr<bool> Next(int64_t max_rows, absl::FunctionRef<void(int64_t, const float*)> f) override {
    int64_t read = 0;
    while (next_ < ids_.size() && read < max_rows) {
      const int64_t id = ids_[next_++];
      const float* record = store_->index_.Find(id);
      if (record == nullptr) continue;  // removed since the scan began
      f(id, record);
      ++read;
    }
    return read > 0;
  }

 private:
  const MemoryRowStore* store_;  // borrowed
  std::vector<int64_t> ids_;     // the rows at Scan(), ascending
  size_t next_ = 0;
};

absl::StatusOr<std::unique_ptr<RecordScan>> MemoryRowStore::Scan() const { return std::make_unique<Scanner>(this); }

RowStoreStats MemoryRowStore::stats() const {
  RowStoreStats s;
  s.rows = index_.size();
  const int64_t slab_bytes = slab_rows_ * stride_ * static_cast<int64_t>(sizeof(float));
  s.memory_bytes = static_cast<int64_t>(slabs_.size()) * slab_bytes + index_.bytes() +
                   static_cast<int64_t>(free_records_.capacity() * sizeof(float*));
  return s;
}

}  // namespace psflow::ps::table
