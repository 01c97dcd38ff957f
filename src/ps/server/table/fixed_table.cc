// A fixed table's shard (fixed_table.h).
#include "ps/server/table/fixed_table.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/check.h"
#include "ps/server/table/row_memory.h"
#include "ps/server/table/row_store.h"
#include "ps/server/table/shard_checks.h"

namespace psflow::ps::table {

FixedTableShard::FixedTableShard(TableConfig config, SparseRule rule, int shard)
    : config_(std::move(config)),
      rule_(std::move(rule)),
      accessor_(config_, config_.layout().num_shards),
      shard_(shard),
      num_rows_(dist::FixedShardRows(config_.layout(), shard)),
      stride_((1 + rule_.num_slots()) * config_.spec.dim),
      first_id_(dist::FixedRowId(config_.layout(), shard, 0)),
      storage_(AllocateRows<float>(static_cast<size_t>(num_rows_ * stride_))),
      records_(storage_.get()) {
  CHECK(config_.spec.kind == TableKind::kFixed);
  const int64_t dim = config_.spec.dim;
  for (int64_t r = 0; r < num_rows_; ++r) {
    float* rec = records_ + r * stride_;
    accessor_.InitialValue(dist::FixedRowId(config_.layout(), shard_, r), rec);
    rule_.InitSlots(rec + dim, dim);
  }
  absl::MutexLock lock(&mu_);
  if (rule_.needs_row_steps()) count_.assign(static_cast<size_t>(num_rows_), 0);
  gen_of_.assign(static_cast<size_t>(num_rows_), 0);
}

absl::Status FixedTableShard::LocalRows(absl::Span<const int64_t> ids, std::vector<int64_t>* rows) const {
  // dist::RouteFixedId's result for this shard without its divisions: a div shard holds a
  // contiguous range of ids, a mod shard the ids congruent to it. Errors take the general route.
  rows->resize(ids.size());
  const int64_t p = config_.layout().num_shards;
  const bool div = config_.layout().strategy == dist::TableStrategy::kDiv;
  for (size_t i = 0; i < ids.size(); ++i) {
    const int64_t id = ids[i];
    int64_t row;
    bool mine;
    if (div) {
      row = id - first_id_;
      mine = row >= 0 && row < num_rows_;
    } else {
      row = id / p;
      mine = id >= 0 && id < config_.layout().num_embeddings && id - row * p == shard_;
    }
    if (!mine) {
      absl::StatusOr<dist::RowLocation> where = dist::RouteFixedId(config_.spec.name, config_.layout(), id);
      if (!where.ok()) return where.status();
      return absl::InvalidArgumentError(absl::StrCat("table '", config_.spec.name, "': id ", id, " belongs to shard ",
                                                     where->shard, ", not ", shard_));
    }
    (*rows)[i] = row;
  }
  return absl::OkStatus();
}

void FixedTableShard::CheckedLocalRows(absl::Span<const int64_t> ids, std::vector<int64_t>* rows) const {
  const absl::Status s = LocalRows(ids, rows);
  CHECK(s.ok()) << s << " (ids are checked where they enter the ps: PsTables::Decode)";
}

absl::Status FixedTableShard::Gather(absl::Span<const int64_t> ids, absl::Span<float> out) const {
  if (auto s = CheckRowsSize(config_, "a gather's output", ids.size(), out.size()); !s.ok()) return s;
  std::vector<int64_t> rows;
  CheckedLocalRows(ids, &rows);
  const size_t row_bytes = static_cast<size_t>(config_.spec.dim) * sizeof(float);
  {
    absl::ReaderMutexLock lock(&mu_);
    constexpr size_t kAhead = 8;  // rows prefetched ahead of the copy (random rows: DRAM latency)
    const int64_t dim = config_.spec.dim;
    for (size_t i = 0; i < rows.size(); ++i) {
      if (i + kAhead < rows.size()) {
        const char* next = reinterpret_cast<const char*>(records_ + rows[i + kAhead] * stride_);
        for (size_t b = 0; b < row_bytes; b += 64) __builtin_prefetch(next + b);
      }
      CopyRow(out.data() + i * dim, records_ + rows[i] * stride_, dim);
    }
  }
  rows_gathered_.fetch_add(static_cast<int64_t>(ids.size()), std::memory_order_relaxed);
  return absl::OkStatus();
}

absl::Status FixedTableShard::Apply(absl::Span<const int64_t> ids, absl::Span<const float> grads, int64_t global_step) {
  if (auto s = CheckRowsSize(config_, "a gradient", ids.size(), grads.size()); !s.ok()) return s;
  std::vector<int64_t> rows;
  CheckedLocalRows(ids, &rows);
  const float lr = rule_.LearningRate(global_step);
  const int64_t dim = config_.spec.dim;
  {
    absl::MutexLock lock(&mu_);
    for (size_t i = 0; i < rows.size(); ++i) {  // the ids are unique (PsTables::Decode)
      if (gen_of_[rows[i]] != gen_ && snapshots_->any()) Keep(rows[i]);
      gen_of_[rows[i]] = gen_;
    }
    // One call of the rule for the push's rows (it prefetches the records ahead of the update).
    std::vector<float*> records(rows.size());
    for (size_t i = 0; i < rows.size(); ++i) records[i] = records_ + rows[i] * stride_;
    std::vector<int64_t> counts;
    if (!count_.empty()) {
      counts.resize(rows.size());
      for (size_t i = 0; i < rows.size(); ++i) counts[i] = ++count_[rows[i]];
    }
    rule_.ApplyRows(records.data(), grads.data(), counts.empty() ? nullptr : counts.data(),
                    static_cast<int64_t>(rows.size()), dim, lr);
  }
  rows_pushed_.fetch_add(static_cast<int64_t>(ids.size()), std::memory_order_relaxed);
  return absl::OkStatus();
}

void FixedTableShard::Keep(int64_t row) {
  const int64_t floats = (1 + rule_.num_slots()) * config_.spec.dim;
  snapshots_->Capture(row, gen_of_[row], records_ + row * stride_, floats, 0, count_.empty() ? 0 : count_[row]);
}

// Every row in order, or (an increment) the rows whose generation is past `changed_since`, found by
// walking the stamps as the scan goes. With a snapshot (a save's scan), each row and its stamp as
// they were when the scan started.
class FixedTableShard::Scanner final : public RowScan {
 public:
  explicit Scanner(const FixedTableShard* shard, int64_t changed_since = -1,
                   std::unique_ptr<Snapshot> snapshot = nullptr)
      : shard_(shard), changed_since_(changed_since), snapshot_(std::move(snapshot)) {}
  bool Next(int64_t max_rows, RowsPart* part) override {
    const FixedTableShard& s = *shard_;
    const int64_t dim = s.config_.spec.dim;
    const int slots = s.rule_.num_slots();
    max_rows = std::max<int64_t>(max_rows, 1);
    *part = RowsPart();
    part->slots.resize(slots);
    absl::ReaderMutexLock lock(&s.mu_);
    for (; next_ < s.num_rows_ && static_cast<int64_t>(part->ids.size()) < max_rows; ++next_) {
      const int64_t row = next_;
      const float* rec = s.records_ + row * s.stride_;
      int64_t count = s.count_.empty() ? 0 : s.count_[row];
      uint32_t gen = s.gen_of_[row];
      KeptRow kept;
      if (snapshot_ != nullptr && snapshot_->Read(row, gen, &kept) == Snapshot::kKept) {
        rec = kept.floats.data();
        count = kept.count;
        gen = kept.gen;
      }
      if (changed_since_ >= 0 && int64_t{gen} <= changed_since_) continue;
      part->ids.push_back(dist::FixedRowId(s.config_.layout(), s.shard_, row));
      part->values.insert(part->values.end(), rec, rec + dim);
      for (int k = 0; k < slots; ++k) {
        part->slots[k].insert(part->slots[k].end(), rec + (1 + k) * dim, rec + (2 + k) * dim);
      }
      part->last_step.push_back(0);
      part->count.push_back(count);
    }
    if (next_ == s.num_rows_) snapshot_.reset();  // read to the end
    return !part->ids.empty();
  }

 private:
  const FixedTableShard* shard_;        // borrowed
  const int64_t changed_since_;         // -1: every row
  std::unique_ptr<Snapshot> snapshot_;  // until the scan is read to the end
  int64_t next_ = 0;
};

std::unique_ptr<RowScan> FixedTableShard::Scan() const { return std::make_unique<Scanner>(this); }

absl::StatusOr<std::unique_ptr<RowScan>> FixedTableShard::Scan(const ScanOptions& options) {
  if (auto s = CheckScanOptions(config_, options); !s.ok()) return s;
  absl::MutexLock lock(&mu_);
  if (options.increment && (known_since_ < 0 || options.changed_since < known_since_)) {
    return CannotIncrement(config_, options.changed_since, known_since_);
  }
  const int64_t next = std::max<int64_t>(int64_t{gen_} + 1, options.save_id + 1);
  if (next > RowMeta::kMaxGen) {
    return absl::InvalidArgumentError(
        absl::StrCat("table '", config_.spec.name, "': more than ", RowMeta::kMaxGen, " saves of one shard"));
  }
  gen_ = static_cast<uint32_t>(next);
  if (known_since_ < 0) known_since_ = options.save_id;  // a full save (an increment was refused above)
  // The scan reads the rows as they stand now, whatever is pushed meanwhile.
  return std::unique_ptr<RowScan>(
      std::make_unique<Scanner>(this, options.increment ? options.changed_since : -1, snapshots_->Open(gen_)));
}

absl::Status FixedTableShard::Load(const RowsPart& part) {
  if (auto s = CheckPart(config_, rule_.num_slots(), part); !s.ok()) return s;
  std::vector<int64_t> rows;
  if (auto s = LocalRows(part.ids, &rows); !s.ok()) return s;
  const int64_t dim = config_.spec.dim;
  absl::MutexLock lock(&mu_);
  for (size_t i = 0; i < rows.size(); ++i) {
    float* rec = records_ + rows[i] * stride_;
    if (gen_of_[rows[i]] != gen_ && snapshots_->any()) Keep(rows[i]);
    std::memcpy(rec, part.values.data() + i * dim, dim * sizeof(float));
    for (size_t k = 0; k < part.slots.size(); ++k) {
      std::memcpy(rec + (1 + k) * dim, part.slots[k].data() + i * dim, dim * sizeof(float));
    }
    if (!count_.empty()) count_[rows[i]] = part.count[i];
    gen_of_[rows[i]] = gen_;
  }
  return absl::OkStatus();
}

TableStats FixedTableShard::stats() const {
  TableStats s;
  s.rows = num_rows_;
  {
    absl::ReaderMutexLock lock(&mu_);
    s.bytes = num_rows_ * stride_ * static_cast<int64_t>(sizeof(float)) +
              static_cast<int64_t>(count_.capacity() * sizeof(int64_t));
  }
  s.rows_gathered = rows_gathered_.load(std::memory_order_relaxed);
  s.rows_pushed = rows_pushed_.load(std::memory_order_relaxed);
  return s;
}

}  // namespace psflow::ps::table
