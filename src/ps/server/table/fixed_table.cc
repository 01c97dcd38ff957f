// A fixed table's shard (fixed_table.h).
#include "ps/server/table/fixed_table.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/check.h"
#include "ps/server/table/row_memory.h"
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

class FixedTableShard::Scanner final : public RowScan {
 public:
  explicit Scanner(const FixedTableShard* shard) : shard_(shard) {}
  bool Next(int64_t max_rows, RowsPart* part) override {
    const FixedTableShard& s = *shard_;
    const int64_t n = std::min(std::max<int64_t>(max_rows, 1), s.num_rows_ - next_);
    const int64_t dim = s.config_.spec.dim;
    const int slots = s.rule_.num_slots();
    *part = RowsPart();
    if (n <= 0) return false;
    part->ids.resize(n);
    part->values.resize(n * dim);
    part->slots.assign(slots, std::vector<float>(n * dim));
    part->last_step.assign(n, 0);
    part->count.assign(n, 0);
    absl::ReaderMutexLock lock(&s.mu_);
    for (int64_t i = 0; i < n; ++i) {
      const int64_t row = next_ + i;
      part->ids[i] = dist::FixedRowId(s.config_.layout(), s.shard_, row);
      const float* rec = s.records_ + row * s.stride_;
      std::memcpy(part->values.data() + i * dim, rec, dim * sizeof(float));
      for (int k = 0; k < slots; ++k) {
        std::memcpy(part->slots[k].data() + i * dim, rec + (1 + k) * dim, dim * sizeof(float));
      }
      if (!s.count_.empty()) part->count[i] = s.count_[row];
    }
    next_ += n;
    return true;
  }

 private:
  const FixedTableShard* shard_;  // borrowed
  int64_t next_ = 0;
};

std::unique_ptr<RowScan> FixedTableShard::Scan() const { return std::make_unique<Scanner>(this); }

absl::Status FixedTableShard::Load(const RowsPart& part) {
  if (auto s = CheckPart(config_, rule_.num_slots(), part); !s.ok()) return s;
  std::vector<int64_t> rows;
  if (auto s = LocalRows(part.ids, &rows); !s.ok()) return s;
  const int64_t dim = config_.spec.dim;
  absl::MutexLock lock(&mu_);
  for (size_t i = 0; i < rows.size(); ++i) {
    float* rec = records_ + rows[i] * stride_;
    std::memcpy(rec, part.values.data() + i * dim, dim * sizeof(float));
    for (size_t k = 0; k < part.slots.size(); ++k) {
      std::memcpy(rec + (1 + k) * dim, part.slots[k].data() + i * dim, dim * sizeof(float));
    }
    if (!count_.empty()) count_[rows[i]] = part.count[i];
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
