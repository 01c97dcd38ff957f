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
#include "ps/server/table/row_store.h"
#include "ps/server/table/shard_checks.h"

namespace psflow::ps::table {
namespace {

constexpr size_t kAhead = 8;  // rows whose records are prefetched ahead

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

DynamicTableShard::DynamicTableShard(TableConfig config, SparseRule rule, int ps, int num_ps,
                                     std::unique_ptr<RowStore> store)
    : config_(std::move(config)), rule_(std::move(rule)), accessor_(config_, num_ps), store_(std::move(store)) {
  CHECK(config_.spec.kind == TableKind::kDynamic);
  CHECK(ps >= 0 && ps < num_ps);
  CHECK(store_ != nullptr);
}

absl::Status DynamicTableShard::Fail(absl::Status s) const {
  absl::MutexLock lock(&failure_mu_);
  if (failure_.ok()) failure_ = s;
  failed_.store(true, std::memory_order_release);
  return s;
}

absl::Status DynamicTableShard::Failure() const {
  if (!failed_.load(std::memory_order_acquire)) return absl::OkStatus();
  absl::MutexLock lock(&failure_mu_);
  return failure_;
}

absl::Status DynamicTableShard::Gather(absl::Span<const int64_t> ids, absl::Span<float> out) const {
  if (auto s = CheckRowsSize(config_, "a gather's output", ids.size(), out.size()); !s.ok()) return s;
  if (auto s = Failure(); !s.ok()) return s;
  const int64_t dim = config_.spec.dim;
  // Find every record first (the memory index prefetches its entries a block at a time; the disk
  // store reads its misses in one batch), then copy, prefetching the rows a few ahead, so the cache
  // misses overlap instead of following one another. In runs the store holds at once (a disk
  // table's cache; a gather changes nothing, so runs give the same rows as one call).
  absl::ReaderMutexLock lock(&mu_);
  const size_t run = static_cast<size_t>(std::max<int64_t>(1, std::min<int64_t>(store_->max_rows_held(), ids.size())));
  std::vector<float*> records(std::min(run, ids.size()));
  for (size_t start = 0; start < ids.size(); start += run) {
    const size_t n = std::min(run, ids.size() - start);
    const int64_t* run_ids = ids.data() + start;
    if (auto s = store_->Acquire(run_ids, n, records.data()); !s.ok()) return Fail(s);
    for (size_t i = 0; i < n; ++i) {
      if (i + kAhead < n && records[i + kAhead] != nullptr) {
        PrefetchBytes(records[i + kAhead], dim * static_cast<int64_t>(sizeof(float)), false);
      }
      float* dst = out.data() + (start + i) * dim;
      if (records[i] != nullptr) {
        CopyRow(dst, records[i], dim);
      } else {
        accessor_.InitialValue(run_ids[i], dst);
      }
    }
    if (auto s = store_->Release(records.data(), n); !s.ok()) return Fail(s);
  }
  rows_gathered_.fetch_add(static_cast<int64_t>(ids.size()), std::memory_order_relaxed);
  return absl::OkStatus();
}

absl::Status DynamicTableShard::CheckPush(absl::Span<const int64_t> ids, absl::Span<const float> grads) const {
  if (auto s = CheckRowsSize(config_, "a gradient", ids.size(), grads.size()); !s.ok()) return s;
  if (const int64_t cap = accessor_.row_cap(); cap > 0 && static_cast<int64_t>(ids.size()) > cap) {
    return absl::InvalidArgumentError(
        absl::StrCat("table '", config_.spec.name, "': one push holds ", ids.size(), " ids but max_rows allows ", cap,
                     " rows on this ps; raise max_rows above a batch's unique ids per ps"));
  }
  return absl::OkStatus();
}

void DynamicTableShard::CountStored(absl::Span<const int64_t> ids, absl::Span<float* const> records,
                                    int64_t global_step, absl::flat_hash_set<int64_t>* absent) {
  // The ids are unique (checked where they entered the ps, PsTables::Decode). A counted row is
  // stamped changed (for a disk store: dirty).
  const size_t n = ids.size();
  for (size_t i = 0; i < n; ++i) {
    if (i + kAhead < n && records[i + kAhead] != nullptr) {
      __builtin_prefetch(&MetaOf(records[i + kAhead]), 1);
    }
    if (records[i] != nullptr) {
      RowMeta& meta = MetaOf(records[i]);
      meta.flags |= RowMeta::kDirty;
      Stamp(ids[i], meta);
      ++meta.count;
      meta.last_step = global_step;
    } else {
      absent->insert(ids[i]);
    }
  }
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
  float* rec = store_->Create(id);
  accessor_.InitialValue(id, rec);
  rule_.InitSlots(rec + config_.spec.dim, config_.spec.dim);
  MetaOf(rec) = RowMeta{global_step, count, 0, RowMeta::kDirty};
  Stamp(id, MetaOf(rec), /*fresh=*/true);
  ++admissions_;
  return rec;
}

absl::Status DynamicTableShard::Apply(absl::Span<const int64_t> ids, absl::Span<const float> grads,
                                      int64_t global_step) {
  if (absl::Status s = CheckPush(ids, grads); !s.ok()) return s;
  if (absl::Status s = Failure(); !s.ok()) return s;
  const float lr = rule_.LearningRate(global_step);
  const size_t n = ids.size();
  absl::MutexLock lock(&mu_);
  // Pass 1: find and count the stored rows (held by the store until Release); collect the absent ids.
  std::vector<float*> records(n);
  if (absl::Status s = store_->Acquire(ids.data(), n, records.data()); !s.ok()) return Fail(s);
  absl::flat_hash_set<int64_t> absent;
  CountStored(ids, records, global_step, &absent);
  // Pass 2 (when a push holds absent ids, or the rule reads counts): count, admit and create absent
  // ids (one not admitted keeps a null record: the rule skips it); each row's update count.
  std::vector<int64_t> updates;
  if (rule_.needs_row_steps()) updates.resize(n);
  if (!absent.empty()) store_->Reserve(static_cast<int64_t>(absent.size()));
  if (!absent.empty() || !updates.empty()) {
    for (size_t i = 0; i < n; ++i) {
      if (records[i] == nullptr && (records[i] = AdmitAbsent(ids[i], global_step)) == nullptr) continue;
      if (!updates.empty()) updates[i] = accessor_.UpdatesOf(MetaOf(records[i]).count);
    }
  }
  // Pass 3: the rule over every admitted row, in one call.
  rule_.ApplyRows(records.data(), grads.data(), updates.empty() ? nullptr : updates.data(), static_cast<int64_t>(n),
                  config_.spec.dim, lr);
  rows_pushed_.fetch_add(static_cast<int64_t>(n), std::memory_order_relaxed);
  // The store may write rows back to disk now.
  if (absl::Status s = store_->Release(records.data(), n); !s.ok()) return Fail(s);
  return absl::OkStatus();
}

void DynamicTableShard::Keep(int64_t id, const RowMeta& meta) {
  const float* rec = reinterpret_cast<const float*>(&meta) + kMetaFloats;
  snapshots_->Capture(id, GenOf(meta), rec, (1 + rule_.num_slots()) * config_.spec.dim, meta.last_step, meta.count);
}

absl::Status DynamicTableShard::KeepBeforeRemoval(const std::vector<int64_t>& ids) {
  const size_t run = static_cast<size_t>(std::max<int64_t>(1, std::min<int64_t>(store_->max_rows_held(), 4096)));
  std::vector<float*> records;
  for (size_t start = 0; start < ids.size(); start += run) {
    const size_t n = std::min(run, ids.size() - start);
    records.assign(n, nullptr);
    if (absl::Status s = store_->Acquire(ids.data() + start, n, records.data()); !s.ok()) return s;
    for (size_t j = 0; j < n; ++j) {
      if (records[j] != nullptr && GenOf(MetaOf(records[j])) != gen_) Keep(ids[start + j], MetaOf(records[j]));
    }
    if (absl::Status s = store_->Release(records.data(), n); !s.ok()) return s;
  }
  return absl::OkStatus();
}

int64_t DynamicTableShard::RemoveNow(int64_t global_step) {
  if (!accessor_.removes_anything()) return 0;
  absl::MutexLock lock(&mu_);

  int64_t removed = 0;
  if (Failure().ok() && accessor_.MayRemove(store_->size())) {
    // A pass over a table near max_rows (millions of rows) lists only the rows it removes: the cut
    // comes from the rows per last step, so no array of every row's age is built.
    absl::btree_map<int64_t, int64_t> rows_per_step;
    absl::Status s = store_->ForEachAge([&](int64_t, int64_t last_step) { ++rows_per_step[last_step]; });
    const RowAccessor::Cut cut = accessor_.CutFor({rows_per_step.begin(), rows_per_step.end()}, global_step);
    std::vector<int64_t> doomed, tied;  // tied: ids at the cut's step, of which the lowest `ties` go
    if (s.ok() && cut.count > 0) {
      doomed.reserve(static_cast<size_t>(cut.count));
      s = store_->ForEachAge([&](int64_t id, int64_t last_step) {
        if (last_step < cut.before_step) {
          doomed.push_back(id);
        } else if (last_step == cut.before_step && cut.ties > 0) {
          tied.push_back(id);
        }
      });
    }
    if (s.ok() && cut.ties > 0) {
      std::nth_element(tied.begin(), tied.begin() + (cut.ties - 1), tied.end());
      doomed.insert(doomed.end(), tied.begin(), tied.begin() + cut.ties);
    }
    if (s.ok() && snapshots_->any()) s = KeepBeforeRemoval(doomed);  // for the save scans open
    if (s.ok()) s = store_->Erase(doomed);                           // from memory and disk
    if (s.ok()) {
      removed += static_cast<int64_t>(doomed.size());
      if (tracking_) {
        for (int64_t id : doomed) {
          removed_.emplace_back(id, gen_);
          changed_.erase(id);
        }
      }
    } else {
      (void)Fail(s);  // the next gather or push returns it
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

// Appends one row (value, slots, last step, count) to `part`.
void AppendRow(int64_t id, const float* floats, int64_t last_step, int64_t count, int64_t dim, int slots,
               RowsPart* part) {
  part->ids.push_back(id);
  part->values.insert(part->values.end(), floats, floats + dim);
  for (int k = 0; k < slots; ++k) {
    part->slots[k].insert(part->slots[k].end(), floats + (1 + k) * dim, floats + (2 + k) * dim);
  }
  part->last_step.push_back(last_step);
  part->count.push_back(count);
}

// Appends row `id` as `snapshot` (when given) says the scan reads it: as it was when the scan
// started, or not at all (made since).
void AppendAsOf(Snapshot* snapshot, int64_t id, const float* rec, int64_t dim, int slots, RowsPart* part) {
  const RowMeta& meta = MetaOf(rec);
  if (snapshot == nullptr) return AppendRow(id, rec, meta.last_step, meta.count, dim, slots, part);
  KeptRow kept;
  switch (snapshot->Read(id, GenOf(meta), &kept)) {
    case Snapshot::kKept:
      return AppendRow(id, kept.floats.data(), kept.last_step, kept.count, dim, slots, part);
    case Snapshot::kLive:
      return AppendRow(id, rec, meta.last_step, meta.count, dim, slots, part);
    case Snapshot::kSkip:
      return;
  }
}

// Appends rows kept for a snapshot (ascending ids).
void AppendKept(const std::vector<std::pair<int64_t, KeptRow>>& rows, int64_t dim, int slots, RowsPart* part) {
  for (const auto& [id, kept] : rows) AppendRow(id, kept.floats.data(), kept.last_step, kept.count, dim, slots, part);
}

class DynamicTableShard::Scanner final : public RowScan {
 public:
  // `snapshot` (optional): read the shard as it was when the snapshot opened.
  explicit Scanner(const DynamicTableShard* shard, std::unique_ptr<Snapshot> snapshot = nullptr)
      : shard_(shard), snapshot_(std::move(snapshot)) {
    absl::ReaderMutexLock lock(&shard_->mu_);
    absl::StatusOr<std::unique_ptr<RecordScan>> scan = shard_->store_->Scan();
    if (scan.ok()) {
      scan_ = *std::move(scan);
    } else {
      status_ = shard_->Fail(scan.status());
    }
  }

  bool Next(int64_t max_rows, RowsPart* part) override {
    const DynamicTableShard& s = *shard_;
    const int64_t dim = s.config_.spec.dim;
    const int slots = s.rule_.num_slots();
    *part = RowsPart();
    part->slots.resize(slots);
    if (!status_.ok() || done_) return false;
    max_rows = std::max<int64_t>(max_rows, 1);
    absl::ReaderMutexLock lock(&s.mu_);
    // Until some rows are read or none are left (a run may hold only rows made since the snapshot).
    while (part->ids.empty()) {
      absl::StatusOr<bool> more = scan_->Next(max_rows, [&](int64_t id, const float* rec) {
        if (snapshot_ != nullptr) AppendKept(snapshot_->TakeKeptBefore(id), dim, slots, part);  // removed since
        AppendAsOf(snapshot_.get(), id, rec, dim, slots, part);
      });
      if (!more.ok()) {
        status_ = s.Fail(more.status());
        *part = RowsPart();
        part->slots.resize(slots);
        return false;
      }
      if (!*more) {
        if (snapshot_ != nullptr) AppendKept(snapshot_->TakeKeptBefore(std::nullopt), dim, slots, part);
        done_ = true;
        snapshot_.reset();  // read to the end: the shard's writers go on without keeping records
        break;
      }
    }
    return !part->ids.empty();
  }

  absl::Status status() const override { return status_; }

 private:
  const DynamicTableShard* shard_;      // borrowed
  std::unique_ptr<Snapshot> snapshot_;  // until the scan is read to the end
  std::unique_ptr<RecordScan> scan_;
  absl::Status status_;
  bool done_ = false;
};

std::unique_ptr<RowScan> DynamicTableShard::Scan() const { return std::make_unique<Scanner>(this); }

// An increment: the rows of the change log's ids (ascending, taken at the scan's start), read
// without being held or cached (RowStore::Peek); an id removed since is skipped.
class DynamicTableShard::IncrementScanner final : public RowScan {
 public:
  IncrementScanner(const DynamicTableShard* shard, std::vector<int64_t> ids, std::vector<int64_t> removed,
                   std::unique_ptr<Snapshot> snapshot)
      : shard_(shard), ids_(std::move(ids)), removed_(std::move(removed)), snapshot_(std::move(snapshot)) {}

  const std::vector<int64_t>& removed() const override { return removed_; }

  bool Next(int64_t max_rows, RowsPart* part) override {
    const DynamicTableShard& s = *shard_;
    const int64_t dim = s.config_.spec.dim;
    const int slots = s.rule_.num_slots();
    *part = RowsPart();
    part->slots.resize(slots);
    if (!status_.ok()) return false;
    max_rows = std::max<int64_t>(max_rows, 1);
    absl::ReaderMutexLock lock(&s.mu_);
    // Read without admission (RowStore::Peek): a disk table's cache keeps its hot rows, not the rows
    // this save reads once.
    while (next_ < ids_.size() && static_cast<int64_t>(part->ids.size()) < max_rows) {
      const size_t n = std::min(ids_.size() - next_, static_cast<size_t>(max_rows) - part->ids.size());
      const absl::Status read = s.store_->Peek(ids_.data() + next_, n, [&](size_t j, const float* rec) {
        if (rec == nullptr) {  // removed since the scan began: as it was then
          KeptRow kept;
          if (snapshot_ != nullptr && snapshot_->Read(ids_[next_ + j], RowMeta::kMaxGen, &kept) == Snapshot::kKept) {
            AppendRow(ids_[next_ + j], kept.floats.data(), kept.last_step, kept.count, dim, slots, part);
          }
          return;
        }
        AppendAsOf(snapshot_.get(), ids_[next_ + j], rec, dim, slots, part);
      });
      if (!read.ok()) {
        status_ = s.Fail(read);
        break;
      }
      next_ += n;
    }
    if (!status_.ok()) {
      *part = RowsPart();
      part->slots.resize(slots);
      return false;
    }
    if (next_ == ids_.size()) snapshot_.reset();  // read to the end
    return !part->ids.empty();
  }

  absl::Status status() const override { return status_; }

 private:
  const DynamicTableShard* shard_;  // borrowed
  const std::vector<int64_t> ids_;  // changed since the save the increment follows, ascending
  const std::vector<int64_t> removed_;
  std::unique_ptr<Snapshot> snapshot_;  // until the scan is read to the end
  size_t next_ = 0;
  absl::Status status_;
};

absl::StatusOr<std::unique_ptr<RowScan>> DynamicTableShard::Scan(const ScanOptions& options) {
  if (auto s = CheckScanOptions(config_, options); !s.ok()) return s;
  if (auto s = Failure(); !s.ok()) return s;
  std::vector<int64_t> ids, removed;
  std::unique_ptr<Snapshot> snapshot;
  {
    absl::MutexLock lock(&mu_);
    if (options.increment && (!tracking_ || options.changed_since < known_since_)) {
      return CannotIncrement(config_, options.changed_since, tracking_ ? known_since_ : -1);
    }
    // The new generation: past every stamp so far and past the save's id, so a row changed from
    // now on is stamped > save_id.
    const uint32_t previous = gen_;
    const int64_t next = std::max<int64_t>(int64_t{gen_} + 1, options.save_id + 1);
    if (next > RowMeta::kMaxGen) {
      return absl::InvalidArgumentError(
          absl::StrCat("table '", config_.spec.name, "': more than ", RowMeta::kMaxGen, " saves of one shard"));
    }
    gen_ = static_cast<uint32_t>(next);
    // From here on the scan reads the rows as they stand now, whatever is pushed meanwhile.
    snapshot = snapshots_->Open(gen_);
    // Log entries of generation <= `drop` go: those before this scan (full), or those a committed
    // save holds (increment).
    const int64_t drop = options.increment ? options.changed_since : int64_t{previous};
    if (options.increment) {
      for (const auto& [id, gen] : changed_) {
        if (gen > options.changed_since) ids.push_back(id);
      }
      for (const auto& [id, gen] : removed_) {
        if (gen > options.changed_since) removed.push_back(id);
      }
    }
    for (auto it = changed_.begin(); it != changed_.end();) {
      if (it->second <= drop) {
        changed_.erase(it++);
      } else {
        ++it;
      }
    }
    removed_.erase(std::remove_if(removed_.begin(), removed_.end(), [&](const auto& e) { return e.second <= drop; }),
                   removed_.end());
    if (options.track_changes) {
      // Complete since this save (a full one, or the one the increment follows), or since earlier.
      const int64_t since = options.increment ? options.changed_since : options.save_id;
      known_since_ = tracking_ ? std::max(known_since_, since) : since;
      tracking_ = true;
    } else {
      tracking_ = false;
      known_since_ = -1;
      changed_ = {};
      removed_ = {};
    }
  }
  if (!options.increment) return std::unique_ptr<RowScan>(std::make_unique<Scanner>(this, std::move(snapshot)));
  std::sort(ids.begin(), ids.end());
  std::sort(removed.begin(), removed.end());
  removed.erase(std::unique(removed.begin(), removed.end()), removed.end());
  return std::unique_ptr<RowScan>(
      std::make_unique<IncrementScanner>(this, std::move(ids), std::move(removed), std::move(snapshot)));
}

absl::Status DynamicTableShard::Load(const RowsPart& part) {
  if (auto s = CheckPart(config_, rule_.num_slots(), part); !s.ok()) return s;
  if (auto s = Failure(); !s.ok()) return s;
  const int64_t dim = config_.spec.dim;
  absl::MutexLock lock(&mu_);
  // In runs the store holds at once (a disk table's cache).
  const size_t run = static_cast<size_t>(std::max<int64_t>(1, std::min<int64_t>(store_->max_rows_held(), 4096)));
  std::vector<float*> records;
  for (size_t start = 0; start < part.ids.size(); start += run) {
    const size_t n = std::min(run, part.ids.size() - start);
    records.assign(n, nullptr);
    if (auto s = store_->Acquire(part.ids.data() + start, n, records.data()); !s.ok()) return Fail(s);
    for (size_t j = 0; j < n; ++j) {
      const size_t i = start + j;
      const int64_t id = part.ids[i];
      float* rec = records[j];
      if (rec == nullptr) {
        rec = records[j] = store_->Create(id);
        pending_.erase(id);
      } else {
        Stamp(id, MetaOf(rec));  // its record as it was, for a save scan open on the shard
      }
      std::memcpy(rec, part.values.data() + i * dim, dim * sizeof(float));
      for (size_t k = 0; k < part.slots.size(); ++k) {
        std::memcpy(rec + (1 + k) * dim, part.slots[k].data() + i * dim, dim * sizeof(float));
      }
      // Not yet on disk; stamped as changed now.
      MetaOf(rec) = RowMeta{part.last_step[i], part.count[i], 0, RowMeta::kDirty};
      Stamp(id, MetaOf(rec), /*fresh=*/true);
    }
    if (auto s = store_->Release(records.data(), n); !s.ok()) return Fail(s);
  }
  return absl::OkStatus();
}

TableStats DynamicTableShard::stats() const {
  TableStats s;
  absl::ReaderMutexLock lock(&mu_);
  const RowStoreStats store = store_->stats();
  s.rows = store.rows;
  s.pending_ids = static_cast<int64_t>(pending_.size());
  s.bytes = store.memory_bytes + static_cast<int64_t>(pending_.capacity() * (sizeof(std::pair<int64_t, Pending>) + 1));
  s.admissions = admissions_;
  s.evictions = evictions_;
  s.rows_dropped = rows_dropped_;
  s.rows_gathered = rows_gathered_.load(std::memory_order_relaxed);
  s.rows_pushed = rows_pushed_.load(std::memory_order_relaxed);
  s.storage = store_->kind();
  s.cache_hits = store.cache_hits;
  s.cache_misses = store.cache_misses;
  s.disk_bytes = store.disk_bytes;
  s.disk_rows_read = store.disk_rows_read;
  s.disk_rows_written = store.disk_rows_written;
  return s;
}

}  // namespace psflow::ps::table
