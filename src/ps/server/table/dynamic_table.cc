// A dynamic table's share on one ps task (dynamic_table.h).
#include "ps/server/table/dynamic_table.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/container/btree_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "core/check.h"
#include "ps/server/table/shard_checks.h"

namespace psflow::ps::table {
namespace {

// Slabs of about 1 MiB (at least 16 rows), a power of two rows each.
int SlabShift(int64_t record_bytes) {
  int shift = 4;
  while ((int64_t{2} << shift) * record_bytes <= (int64_t{1} << 20)) ++shift;
  return shift;
}

}  // namespace

DynamicTableShard::DynamicTableShard(TableConfig config, SparseRule rule, int ps, int num_ps)
    : config_(std::move(config)),
      rule_(std::move(rule)),
      accessor_(config_, num_ps),
      ps_(ps),
      num_ps_(num_ps),
      stride_((1 + rule_.num_slots()) * config_.dim),
      slab_shift_(SlabShift(stride_ * static_cast<int64_t>(sizeof(float)))),
      slab_mask_((int64_t{1} << slab_shift_) - 1) {
  CHECK(config_.kind == TableKind::kDynamic);
  CHECK(ps >= 0 && ps < num_ps);
}

absl::Status DynamicTableShard::CheckOwned(absl::Span<const int64_t> ids) const {
  for (int64_t id : ids) {
    const int owner = dist::RouteDynamicId(id, num_ps_);
    if (owner != ps_) {
      return absl::InvalidArgumentError(absl::StrCat("table '", config_.name, "': id ", id,
                                                     " lives on ps ", owner, " of ", num_ps_, ", not ", ps_));
    }
  }
  return absl::OkStatus();
}

int64_t DynamicTableShard::AllocateSlot() {
  if (!free_slots_.empty()) {
    const int64_t slot = free_slots_.back();
    free_slots_.pop_back();
    return slot;
  }
  if (next_slot_ == static_cast<int64_t>(slabs_.size()) << slab_shift_) {
    const size_t rows = size_t{1} << slab_shift_;
    slabs_.emplace_back(new float[rows * static_cast<size_t>(stride_)]);
    meta_slabs_.emplace_back(new RowMeta[rows]);
  }
  return next_slot_++;
}

absl::Status DynamicTableShard::Gather(absl::Span<const int64_t> ids, absl::Span<float> out) const {
  if (auto s = CheckRowsSize(config_, "a gather's output", ids.size(), out.size()); !s.ok()) return s;
  if (auto s = CheckOwned(ids); !s.ok()) return s;
  const int64_t dim = config_.dim;
  const size_t row_bytes = static_cast<size_t>(dim) * sizeof(float);
  {
    // Two passes: find every slot first (prefetching its record), then copy, so the records'
    // cache misses overlap instead of following one another.
    std::vector<int64_t> slots(ids.size());
    absl::ReaderMutexLock lock(&mu_);
    for (size_t i = 0; i < ids.size(); ++i) {
      const auto it = index_.find(ids[i]);
      slots[i] = it == index_.end() ? -1 : it->second;
      if (slots[i] >= 0) __builtin_prefetch(Record(slots[i]));
    }
    for (size_t i = 0; i < ids.size(); ++i) {
      float* dst = out.data() + i * dim;
      if (slots[i] >= 0) {
        std::memcpy(dst, Record(slots[i]), row_bytes);
      } else {
        accessor_.InitialValue(ids[i], dst);
      }
    }
  }
  rows_gathered_.fetch_add(static_cast<int64_t>(ids.size()), std::memory_order_relaxed);
  return absl::OkStatus();
}

absl::Status DynamicTableShard::Apply(absl::Span<const int64_t> ids, absl::Span<const float> grads,
                                      int64_t global_step) {
  if (auto s = CheckRowsSize(config_, "a gradient", ids.size(), grads.size()); !s.ok()) return s;
  if (auto s = CheckOwned(ids); !s.ok()) return s;
  if (const int64_t cap = accessor_.row_cap(); cap > 0 && static_cast<int64_t>(ids.size()) > cap) {
    return absl::InvalidArgumentError(absl::StrCat(
        "table '", config_.name, "': one push holds ", ids.size(), " ids but max_rows allows ", cap,
        " rows on this ps; raise max_rows above a batch's unique ids per ps"));
  }
  if (auto s = CheckFinite(config_, ids, grads); !s.ok()) return s;
  const float lr = rule_.LearningRate(global_step);
  const int64_t dim = config_.dim;
  absl::MutexLock lock(&mu_);
  // Pass 1: find the stored rows (prefetching them) and refuse an id listed twice: stored rows by
  // their mark, absent ids by a set of those only (few, once a table is warm).
  if (++epoch_ == 0) {  // wrapped: clear the marks once every 2^32 pushes
    for (int64_t slot = 0; slot < next_slot_; ++slot) Meta(slot).mark = 0;
    epoch_ = 1;
  }
  std::vector<int64_t> slots(ids.size());
  absl::flat_hash_set<int64_t> absent;
  for (size_t i = 0; i < ids.size(); ++i) {
    const auto it = index_.find(ids[i]);
    bool repeated;
    if (it != index_.end()) {
      slots[i] = it->second;
      __builtin_prefetch(Record(slots[i]), 1);
      uint32_t& mark = Meta(slots[i]).mark;
      repeated = mark == epoch_;
      mark = epoch_;
    } else {
      slots[i] = -1;
      repeated = !absent.insert(ids[i]).second;
    }
    if (repeated) {
      return absl::InvalidArgumentError(absl::StrCat("table '", config_.name, "': id ", ids[i],
                                                     " listed twice in one push (sum its rows first)"));
    }
  }
  // Pass 2: update stored rows; count, admit and create absent ones.
  if (!absent.empty()) index_.reserve(index_.size() + absent.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    const int64_t id = ids[i];
    const float* g = grads.data() + i * dim;
    int64_t slot = slots[i];
    if (slot >= 0) {
      RowMeta& meta = Meta(slot);
      ++meta.count;
      meta.last_step = global_step;
    } else {
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
          continue;
        }
        if (p != pending_.end()) pending_.erase(p);
      }
      slot = AllocateSlot();
      float* rec = Record(slot);
      accessor_.InitialValue(id, rec);
      rule_.InitSlots(rec + dim, dim);
      Meta(slot) = RowMeta{id, global_step, count, epoch_};
      index_.emplace(id, slot);
      ++admissions_;
    }
    float* rec = Record(slot);
    rule_.Apply(rec, rec + dim, g, dim, lr, accessor_.UpdatesOf(Meta(slot).count));
  }
  rows_pushed_.fetch_add(static_cast<int64_t>(ids.size()), std::memory_order_relaxed);
  return absl::OkStatus();
}

int64_t DynamicTableShard::RemoveNow(int64_t global_step) {
  if (!accessor_.removes_anything()) return 0;
  absl::MutexLock lock(&mu_);
  int64_t removed = 0;
  if (accessor_.MayRemove(static_cast<int64_t>(index_.size()))) {
    // Two passes over the map and no per-row array: a table near max_rows holds millions of rows,
    // and a copy of their ages would add tens of MB to the ps at every pass.
    absl::btree_map<int64_t, int64_t> rows_per_step;
    for (const auto& [id, slot] : index_) ++rows_per_step[Meta(slot).last_step];
    const RowAccessor::Cut cut =
        accessor_.CutFor({rows_per_step.begin(), rows_per_step.end()}, global_step);
    std::vector<int64_t> tied;  // ids at the cut's step: the lowest `ties` go
    for (auto it = index_.begin(); cut.count > 0 && it != index_.end();) {
      const int64_t last_step = Meta(it->second).last_step;
      if (last_step < cut.before_step) {
        free_slots_.push_back(it->second);
        index_.erase(it++);
        ++removed;
        continue;
      }
      if (last_step == cut.before_step && cut.ties > 0) tied.push_back(it->first);
      ++it;
    }
    if (cut.ties > 0) {
      std::nth_element(tied.begin(), tied.begin() + (cut.ties - 1), tied.end());
      for (auto id = tied.begin(); id != tied.begin() + cut.ties; ++id) {
        auto it = index_.find(*id);
        free_slots_.push_back(it->second);
        index_.erase(it);
        ++removed;
      }
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
    for (const auto& entry : shard_->index_) ids_.push_back(entry.first);
    std::sort(ids_.begin(), ids_.end());
  }

  bool Next(int64_t max_rows, RowsPart* part) override {
    const DynamicTableShard& s = *shard_;
    const int64_t dim = s.config_.dim;
    const int slots = s.rule_.num_slots();
    *part = RowsPart();
    part->slots.resize(slots);
    max_rows = std::max<int64_t>(max_rows, 1);
    absl::ReaderMutexLock lock(&s.mu_);
    while (next_ < ids_.size() && static_cast<int64_t>(part->ids.size()) < max_rows) {
      const int64_t id = ids_[next_++];
      const auto it = s.index_.find(id);
      if (it == s.index_.end()) continue;  // removed since the scan began
      const float* rec = s.Record(it->second);
      const RowMeta& meta = s.Meta(it->second);
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
  const int64_t dim = config_.dim;
  absl::MutexLock lock(&mu_);
  for (size_t i = 0; i < part.ids.size(); ++i) {
    const int64_t id = part.ids[i];
    int64_t slot;
    if (const auto it = index_.find(id); it != index_.end()) {
      slot = it->second;
    } else {
      slot = AllocateSlot();
      index_.emplace(id, slot);
      pending_.erase(id);
    }
    float* rec = Record(slot);
    std::memcpy(rec, part.values.data() + i * dim, dim * sizeof(float));
    for (size_t k = 0; k < part.slots.size(); ++k) {
      std::memcpy(rec + (1 + k) * dim, part.slots[k].data() + i * dim, dim * sizeof(float));
    }
    Meta(slot) = RowMeta{id, part.last_step[i], part.count[i], 0};
  }
  return absl::OkStatus();
}

TableStats DynamicTableShard::stats() const {
  TableStats s;
  absl::ReaderMutexLock lock(&mu_);
  s.rows = static_cast<int64_t>(index_.size());
  s.pending_ids = static_cast<int64_t>(pending_.size());
  const int64_t slab_rows = int64_t{1} << slab_shift_;
  s.bytes = static_cast<int64_t>(slabs_.size()) * slab_rows *
                (stride_ * static_cast<int64_t>(sizeof(float)) + static_cast<int64_t>(sizeof(RowMeta))) +
            static_cast<int64_t>(index_.capacity() * (sizeof(std::pair<int64_t, int64_t>) + 1)) +
            static_cast<int64_t>(pending_.capacity() * (sizeof(std::pair<int64_t, Pending>) + 1)) +
            static_cast<int64_t>(free_slots_.capacity() * sizeof(int64_t));
  s.admissions = admissions_;
  s.evictions = evictions_;
  s.rows_dropped = rows_dropped_;
  s.rows_gathered = rows_gathered_.load(std::memory_order_relaxed);
  s.rows_pushed = rows_pushed_.load(std::memory_order_relaxed);
  return s;
}

}  // namespace psflow::ps::table
