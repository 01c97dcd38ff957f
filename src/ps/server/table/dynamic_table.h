// ps/server/table/dynamic_table.h — one ps task's share of a dynamic (hash-keyed) table
// (docs/tables.md#semantics): the rows whose int64 id routes here (dist::RouteDynamicId), found through an
// index id -> record (row_index.h), stored as records [meta | w | slots] in slabs of about 2 MiB
// of row memory (row_memory.h: huge pages; no allocation per row; a removed row's record is reused). A
// row's metadata (last step, push count, duplicate mark) sits in its record, next to the floats a
// push updates. A row is created by its first admitted gradient; a gather of an absent id answers
// its initial value without storing it. Ids waiting for admission (admit_after) hold only a count
// and a step in a second map. The accessor decides admission and removals. Thread-safe
// (table_shard.h).
#ifndef PSFLOW_PS_SERVER_TABLE_DYNAMIC_TABLE_H_
#define PSFLOW_PS_SERVER_TABLE_DYNAMIC_TABLE_H_

#include <atomic>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/types/span.h"
#include "absl/synchronization/mutex.h"
#include "ps/server/table/accessor.h"
#include "ps/server/table/row_index.h"
#include "ps/server/table/row_memory.h"
#include "ps/server/table/table_shard.h"

namespace psflow::ps::table {

class DynamicTableShard final : public TableShard {
 public:
  // config valid and dynamic, 0 <= ps < num_ps (CHECKed; MakeTableShard validates).
  DynamicTableShard(TableConfig config, SparseRule rule, int ps, int num_ps);

  const TableConfig& config() const override { return config_; }
  const SparseRule& rule() const override { return rule_; }
  absl::Status Gather(absl::Span<const int64_t> ids, absl::Span<float> out) const override;
  absl::Status Apply(absl::Span<const int64_t> ids, absl::Span<const float> grads,
                     int64_t global_step) override;
  int64_t RemoveNow(int64_t global_step) override;
  std::unique_ptr<RowScan> Scan() const override;
  absl::Status Load(const RowsPart& part) override;
  TableStats stats() const override;

 private:
  class Scanner;
  struct RowMeta {  // at the start of each record, just before the row's floats
    int64_t last_step;
    int64_t count;  // pushes that held the id, the admitting one and those before it included
    uint32_t mark;  // the last push epoch that listed the row (duplicate detection)
  };
  struct Pending {
    int64_t count;
    int64_t last_step;
  };

  bool PassDue(int64_t global_step) const override { return accessor_.PassDue(global_step); }
  absl::Status CheckOwned(absl::Span<const int64_t> ids) const;
  // Apply's steps. The checks that need no lock: sizes, owner, the row cap, finiteness.
  absl::Status CheckPush(absl::Span<const int64_t> ids, absl::Span<const float> grads) const;
  // A new push epoch for RowMeta::mark (clearing every mark when it wraps).
  void NextEpoch() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Counts the push on each stored row (records[i] non-null) and collects the absent ids into
  // `absent`; an id listed twice undoes the counts and is refused (InvalidArgument naming the table).
  absl::Status CountStored(absl::Span<const int64_t> ids, absl::Span<float* const> records, int64_t global_step,
                           absl::flat_hash_set<int64_t>* absent) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // An absent id pushed at global_step: counted as pending, or admitted and created from its
  // initial value (its record returned); nullptr while it is not admitted.
  float* AdmitAbsent(int64_t id, int64_t global_step) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A free record's floats (reused, or a new one, adding a slab when the last is full).
  float* AllocateRecord() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  static constexpr int64_t kMetaFloats = sizeof(RowMeta) / sizeof(float);
  // A row's metadata, from its floats (what the index and free list point to).
  static RowMeta& Meta(float* row) { return *reinterpret_cast<RowMeta*>(row - kMetaFloats); }

  const TableConfig config_;
  const SparseRule rule_;
  const RowAccessor accessor_;
  const int ps_, num_ps_;
  const ModOf mod_num_ps_;     // x % num_ps_
  const int64_t stride_;       // floats per record [meta | w | slots] (a multiple of 8 bytes)
  const int64_t slab_rows_;    // records per slab (a slab: about 2 MiB, one huge page)

  mutable absl::Mutex mu_;
  RowIndex index_ ABSL_GUARDED_BY(mu_);  // id -> the row's floats in its record
  std::vector<RowArray<float>> slabs_ ABSL_GUARDED_BY(mu_);
  int64_t last_slab_used_ ABSL_GUARDED_BY(mu_) = 0;  // records handed out of slabs_.back()
  std::vector<float*> free_records_ ABSL_GUARDED_BY(mu_);
  uint32_t epoch_ ABSL_GUARDED_BY(mu_) = 0;  // per push, for RowMeta::mark
  absl::flat_hash_map<int64_t, Pending> pending_ ABSL_GUARDED_BY(mu_);
  int64_t admissions_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t evictions_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t rows_dropped_ ABSL_GUARDED_BY(mu_) = 0;
  mutable std::atomic<int64_t> rows_gathered_{0};
  std::atomic<int64_t> rows_pushed_{0};
};

}  // namespace psflow::ps::table

#endif  // PSFLOW_PS_SERVER_TABLE_DYNAMIC_TABLE_H_
