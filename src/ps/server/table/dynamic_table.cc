// A dynamic table's share on one ps task (dynamic_table.h).
#include "ps/server/table/dynamic_table.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/container/btree_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "core/check.h"
#include "ps/server/table/row_memory.h"
#include "ps/server/table/shard_checks.h"

namespace psflow::ps::table {
namespace {

constexpr int64_t kSlabBytes = int64_t{2} << 20;  // one huge page (row_memory.h)
constexpr size_t kAhead = 8;                      // rows whose records are prefetched ahead

// Prefetches the cache lines of [p, p + bytes).
void PrefetchBytes(const float* p, int64_t bytes, bool write) {
  const char* c = reinterpret_cast<const char*>(p);
  for (int64_t b = 0; b < bytes; b += 64) {
    if (write) {
      __builtin_prefetch(c + b, 1);
    } else {
      __builtin_prefetch(c + b);
    }
  }
}

}  // namespace

DynamicTableShard::DynamicTableShard(TableConfig config, SparseRule rule, int ps, int num_ps)
    : config_(std::move(config)),
      rule_(std::move(rule)),
      accessor_(config_, num_ps),
      ps_(ps),
      num_ps_(num_ps),
      mod_num_ps_(static_cast<uint64_t>(std::max(num_ps, 1))),
      stride_(kMetaFloats + ((1 + rule_.num_slots()) * config_.spec.dim + 1) / 2 * 2),
      slab_rows_(std::max<int64_t>(16, kSlabBytes / (stride_ * static_cast<int64_t>(sizeof(float))))) {
  static_assert(sizeof(RowMeta) % sizeof(float) == 0 && alignof(RowMeta) <= 8);
  CHECK(config_.spec.kind == TableKind::kDynamic);
  CHECK(ps >= 0 && ps < num_ps);
}

absl::Status DynamicTableShard::CheckOwned(absl::Span<const int64_t> ids) const {
  if (num_ps_ == 1) return absl::OkStatus();
  for (int64_t id : ids) {
    // dist::RouteDynamicId without its division.
    const int owner = static_cast<int>(mod_num_ps_(dist::Mix64(static_cast<uint64_t>(id))));
    if (owner != ps_) {
      return absl::InvalidArgumentError(absl::StrCat("table '", config_.spec.name, "': id ", id,
                                                     " lives on ps ", owner, " of ", num_ps_, ", not ", ps_));
    }
  }
  return absl::OkStatus();
}

float* DynamicTableShard::AllocateRecord() {
  if (!free_records_.empty()) {
    float* record = free_records_.back();
    free_records_.pop_back();
    return record;
  }
  if (slabs_.empty() || last_slab_used_ == slab_rows_) {
    slabs_.push_back(AllocateRows<float>(static_cast<size_t>(slab_rows_ * stride_)));
    last_slab_used_ = 0;
  }
  return slabs_.back().get() + (last_slab_used_++) * stride_ + kMetaFloats;
}

absl::Status DynamicTableShard::Gather(absl::Span<const int64_t> ids, absl::Span<float> out) const {
  if (auto s = CheckRowsSize(config_, "a gather's output", ids.size(), out.size()); !s.ok()) return s;
  if (auto s = CheckOwned(ids); !s.ok()) return s;
  const int64_t dim = config_.spec.dim;
  {
    // Find every record first (the index prefetches its entries a block at a time), then copy,
    // prefetching the rows a few ahead, so the cache misses overlap instead of following one another.
    std::vector<float*> records(ids.size());
    absl::ReaderMutexLock lock(&mu_);
    index_.FindMany(ids.data(), ids.size(), records.data());
    for (size_t i = 0; i < ids.size(); ++i) {
      if (i + kAhead < ids.size() && records[i + kAhead] != nullptr) {
        PrefetchBytes(records[i + kAhead], dim * static_cast<int64_t>(sizeof(float)), false);
      }
      float* dst = out.data() + i * dim;
      if (records[i] != nullptr) {
        CopyRow(dst, records[i], dim);
      } else {
        accessor_.InitialValue(ids[i], dst);
      }
    }
  }
  rows_gathered_.fetch_add(static_cast<int64_t>(ids.size()), std::memory_order_relaxed);
  return absl::OkStatus();
}

absl::Status DynamicTableShard::CheckPush(absl::Span<const int64_t> ids, absl::Span<const float> grads) const {
  if (auto s = CheckRowsSize(config_, "a gradient", ids.size(), grads.size()); !s.ok()) return s;
  if (auto s = CheckOwned(ids); !s.ok()) return s;
  if (const int64_t cap = accessor_.row_cap(); cap > 0 && static_cast<int64_t>(ids.size()) > cap) {
    return absl::InvalidArgumentError(absl::StrCat(
        "table '", config_.spec.name, "': one push holds ", ids.size(), " ids but max_rows allows ", cap,
        " rows on this ps; raise max_rows above a batch's unique ids per ps"));
  }
  return CheckFinite(config_, ids, grads);
}

void DynamicTableShard::NextEpoch() {
  if (++epoch_ != 0) return;
  // Wrapped: clear the marks once every 2^32 pushes.
  for (size_t k = 0; k < slabs_.size(); ++k) {
    const int64_t used = k + 1 == slabs_.size() ? last_slab_used_ : slab_rows_;
    for (int64_t r = 0; r < used; ++r) Meta(slabs_[k].get() + r * stride_ + kMetaFloats).mark = 0;
  }
  epoch_ = 1;
}

absl::Status DynamicTableShard::CountStored(absl::Span<const int64_t> ids, absl::Span<float* const> records,
                                            int64_t global_step, absl::flat_hash_set<int64_t>* absent) {
  const size_t n = ids.size();
  // A stored row is counted as soon as it is checked (its metadata line is at hand); an id listed
  // twice then undoes the counts taken so far, so a refused push changes nothing.
  std::unique_ptr<int64_t[]> previous_step(new int64_t[n]);
  for (size_t i = 0; i < n; ++i) {
    if (i + kAhead < n && records[i + kAhead] != nullptr) {
      __builtin_prefetch(&Meta(records[i + kAhead]), 1);
    }
    bool repeated;
    if (records[i] != nullptr) {
      RowMeta& meta = Meta(records[i]);
      repeated = meta.mark == epoch_;
      if (!repeated) {
        meta.mark = epoch_;
        previous_step[i] = meta.last_step;
        ++meta.count;
        meta.last_step = global_step;
      }
    } else {
      repeated = !absent->insert(ids[i]).second;
    }
    if (repeated) {
      for (size_t j = 0; j < i; ++j) {
        if (records[j] == nullptr) continue;
        --Meta(records[j]).count;
        Meta(records[j]).last_step = previous_step[j];
      }
      return absl::InvalidArgumentError(absl::StrCat("table '", config_.spec.name, "': id ", ids[i],
                                                     " listed twice in one push (sum its rows first)"));
    }
  }
  return absl::OkStatus();
}

float* DynamicTableShard::AdmitAbsent(int64_t id, int64_t global_step) {
  int64_t count = 1;
  if (accessor_.counts_pending()) {
    const auto p = pending_.find(id);
    if (p != pending_.end()) count = p->second.count + 1;
    if (!accessor_.Admits(count)) {
      if (p != pending_.end()) {
        p->second = Pending{count, global_step};
      } else {
        pending_.emplace(id, Pending{count, global_step});
      }
      ++rows_dropped_;
      return nullptr;
    }
    if (p != pending_.end()) pending_.erase(p);
  }
  float* rec = AllocateRecord();
  accessor_.InitialValue(id, rec);
  rule_.InitSlots(rec + config_.spec.dim, config_.spec.dim);
  Meta(rec) = RowMeta{global_step, count, epoch_};
  index_.Insert(id, rec);
  ++admissions_;
  return rec;
}

absl::Status DynamicTableShard::Apply(absl::Span<const int64_t> ids, absl::Span<const float> grads,
                                      int64_t global_step) {
  if (absl::Status s = CheckPush(ids, grads); !s.ok()) return s;
  const float lr = rule_.LearningRate(global_step);
  const size_t n = ids.size();
  absl::MutexLock lock(&mu_);
  // Pass 1: find the stored rows and refuse an id listed twice: stored rows by the mark in their
  // record, absent ids by a set of those only (few, once a table is warm).
  NextEpoch();
  std::vector<float*> records(n);
  index_.FindMany(ids.data(), n, records.data());
  absl::flat_hash_set<int64_t> absent;
  if (absl::Status s = CountStored(ids, records, global_step, &absent); !s.ok()) return s;
  // Pass 2 (when a push holds absent ids, or the rule reads counts): count, admit and create absent
  // ids (one not admitted keeps a null record: the rule skips it); each row's update count.
  std::vector<int64_t> updates;
  if (rule_.needs_row_steps()) updates.resize(n);
  if (!absent.empty()) index_.Reserve(index_.size() + static_cast<int64_t>(absent.size()));
  if (!absent.empty() || !updates.empty()) {
    for (size_t i = 0; i < n; ++i) {
      if (records[i] == nullptr && (records[i] = AdmitAbsent(ids[i], global_step)) == nullptr) continue;
      if (!updates.empty()) updates[i] = accessor_.UpdatesOf(Meta(records[i]).count);
    }
  }
  // Pass 3: the rule over every admitted row, in one call.
  rule_.ApplyRows(records.data(), grads.data(), updates.empty() ? nullptr : updates.data(),
                  static_cast<int64_t>(n), config_.spec.dim, lr);
  rows_pushed_.fetch_add(static_cast<int64_t>(n), std::memory_order_relaxed);
  return absl::OkStatus();
}

int64_t DynamicTableShard::RemoveNow(int64_t global_step) {
  if (!accessor_.removes_anything()) return 0;
  absl::MutexLock lock(&mu_);
  int64_t removed = 0;
  if (accessor_.MayRemove(index_.size())) {
    // A pass over a table near max_rows (millions of rows) lists only the rows it removes: the cut
    // comes from the rows per last step, so no array of every row's age is built.
    absl::btree_map<int64_t, int64_t> rows_per_step;
    index_.ForEach([&](int64_t, float* record) { ++rows_per_step[Meta(record).last_step]; });
    const RowAccessor::Cut cut = accessor_.CutFor({rows_per_step.begin(), rows_per_step.end()}, global_step);
    std::vector<int64_t> doomed, tied;  // tied: ids at the cut's step, of which the lowest `ties` go
    if (cut.count > 0) {
      doomed.reserve(static_cast<size_t>(cut.count));
      index_.ForEach([&](int64_t id, float* record) {
        const int64_t last_step = Meta(record).last_step;
        if (last_step < cut.before_step) {
          doomed.push_back(id);
        } else if (last_step == cut.before_step && cut.ties > 0) {
          tied.push_back(id);
        }
      });
    }
    if (cut.ties > 0) {
      std::nth_element(tied.begin(), tied.begin() + (cut.ties - 1), tied.end());
      doomed.insert(doomed.end(), tied.begin(), tied.begin() + cut.ties);
    }
    for (int64_t id : doomed) {
      free_records_.push_back(index_.Find(id));
      index_.Erase(id);
      ++removed;
    }
  }
  if (!pending_.empty()) {
    std::vector<RowAge> ids;
    ids.reserve(pending_.size());
    for (const auto& [id, p] : pending_) ids.push_back(RowAge{id, p.last_step});
    for (size_t i : accessor_.SelectRemovals(ids, global_step)) {
      pending_.erase(ids[i].id);
      ++removed;
    }
  }
  evictions_ += removed;
  return removed;
}

class DynamicTableShard::Scanner final : public RowScan {
 public:
  explicit Scanner(const DynamicTableShard* shard) : shard_(shard) {
    absl::ReaderMutexLock lock(&shard_->mu_);
    ids_.reserve(shard_->index_.size());
    shard_->index_.ForEach([this](int64_t id, float*) { ids_.push_back(id); });
    std::sort(ids_.begin(), ids_.end());
  }

  bool Next(int64_t max_rows, RowsPart* part) override {
    const DynamicTableShard& s = *shard_;
    const int64_t dim = s.config_.spec.dim;
    const int slots = s.rule_.num_slots();
    *part = RowsPart();
    part->slots.resize(slots);
    max_rows = std::max<int64_t>(max_rows, 1);
    absl::ReaderMutexLock lock(&s.mu_);
    while (next_ < ids_.size() && static_cast<int64_t>(part->ids.size()) < max_rows) {
      const int64_t id = ids_[next_++];
      float* rec = s.index_.Find(id);
      if (rec == nullptr) continue;  // removed since the scan began
      const RowMeta& meta = s.Meta(rec);
      part->ids.push_back(id);
      part->values.insert(part->values.end(), rec, rec + dim);
      for (int k = 0; k < slots; ++k) {
        part->slots[k].insert(part->slots[k].end(), rec + (1 + k) * dim, rec + (2 + k) * dim);
      }
      part->last_step.push_back(meta.last_step);
      part->count.push_back(meta.count);
    }
    return !part->ids.empty();
  }

 private:
  const DynamicTableShard* shard_;  // borrowed
  std::vector<int64_t> ids_;        // the rows at Scan(), ascending
  size_t next_ = 0;
};

std::unique_ptr<RowScan> DynamicTableShard::Scan() const { return std::make_unique<Scanner>(this); }

absl::Status DynamicTableShard::Load(const RowsPart& part) {
  if (auto s = CheckPart(config_, rule_.num_slots(), part); !s.ok()) return s;
  if (auto s = CheckOwned(part.ids); !s.ok()) return s;
  const int64_t dim = config_.spec.dim;
  absl::MutexLock lock(&mu_);
  for (size_t i = 0; i < part.ids.size(); ++i) {
    const int64_t id = part.ids[i];
    float* rec = index_.Find(id);
    if (rec == nullptr) {
      rec = AllocateRecord();
      index_.Insert(id, rec);
      pending_.erase(id);
    }
    std::memcpy(rec, part.values.data() + i * dim, dim * sizeof(float));
    for (size_t k = 0; k < part.slots.size(); ++k) {
      std::memcpy(rec + (1 + k) * dim, part.slots[k].data() + i * dim, dim * sizeof(float));
    }
    Meta(rec) = RowMeta{part.last_step[i], part.count[i], 0};
  }
  return absl::OkStatus();
}

TableStats DynamicTableShard::stats() const {
  TableStats s;
  absl::ReaderMutexLock lock(&mu_);
  s.rows = index_.size();
  s.pending_ids = static_cast<int64_t>(pending_.size());
  const int64_t slab_bytes = slab_rows_ * stride_ * static_cast<int64_t>(sizeof(float));
  s.bytes = static_cast<int64_t>(slabs_.size()) * slab_bytes + index_.bytes() +
            static_cast<int64_t>(pending_.capacity() * (sizeof(std::pair<int64_t, Pending>) + 1)) +
            static_cast<int64_t>(free_records_.capacity() * sizeof(float*));
  s.admissions = admissions_;
  s.evictions = evictions_;
  s.rows_dropped = rows_dropped_;
  s.rows_gathered = rows_gathered_.load(std::memory_order_relaxed);
  s.rows_pushed = rows_pushed_.load(std::memory_order_relaxed);
  return s;
}

}  // namespace psflow::ps::table
