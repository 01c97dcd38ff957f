// ps/server/table/dynamic_table.h — one ps task's share of a dynamic (hash-keyed) table
// (docs/tables.md#semantics): the rows whose int64 id routes here (dist::RouteDynamicId). The shard
// owns a row's life (admission, its update by the rule, removal) and keeps the rows in a RowStore
// (row_store.h): records [meta | w | slots] in memory (slabs and an index), or on disk behind a
// hot-row cache (disk_store.h); the code above the store is the same for both. A row's metadata
// (last step, push count, flags) sits in its record, next to the floats a push
// updates. A row is created by its first admitted gradient; a gather of an absent id answers its
// initial value without storing it. Ids waiting for admission (admit_after) hold only a count and a
// step in a second map (in memory for both stores). The accessor decides admission and removals.
// Saves (table_shard.h ScanOptions): every change stamps the row's generation in its metadata; while
// the saves track changes, the first change of a row in a generation also enters a change log
// (id -> generation) and a removal enters a removal log (id, generation), so an increment reads the
// changed rows only, not the table; the logs shrink as saves are committed (an increment since save
// m drops the entries of generation <= m; a full save drops all before it).
// A store's failure (a disk read or write) is returned by the call that met it and by every later
// one. Thread-safe (table_shard.h).
#ifndef PSFLOW_PS_SERVER_TABLE_DYNAMIC_TABLE_H_
#define PSFLOW_PS_SERVER_TABLE_DYNAMIC_TABLE_H_

#include <atomic>
#include <memory>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "ps/server/table/accessor.h"
#include "ps/server/table/row_index.h"
#include "ps/server/table/row_store.h"
#include "ps/server/table/scan_snapshot.h"
#include "ps/server/table/table_shard.h"

namespace psflow::ps::table {

class DynamicTableShard final : public TableShard {
 public:
  // config valid and dynamic, 0 <= ps < num_ps (CHECKed; MakeTableShard validates); `store` holds
  // (1 + slots)·dim floats a row.
  DynamicTableShard(TableConfig config, SparseRule rule, int ps, int num_ps, std::unique_ptr<RowStore> store);

  const TableConfig& config() const override { return config_; }
  const SparseRule& rule() const override { return rule_; }
  absl::Status Gather(absl::Span<const int64_t> ids, absl::Span<float> out) const override;
  absl::Status Apply(absl::Span<const int64_t> ids, absl::Span<const float> grads, int64_t global_step) override;
  int64_t RemoveNow(int64_t global_step) override;
  std::unique_ptr<RowScan> Scan() const override;
  absl::StatusOr<std::unique_ptr<RowScan>> Scan(const ScanOptions& options) override;
  absl::Status Load(const RowsPart& part) override;
  TableStats stats() const override;

 private:
  class Scanner;
  class IncrementScanner;
  struct Pending {
    int64_t count;
    int64_t last_step;
  };

  bool PassDue(int64_t global_step) const override { return accessor_.PassDue(global_step); }
  // Apply's steps. The checks that need no lock: the size and the row cap (the ids themselves were
  // checked where they entered the ps: PsTables::Decode).
  absl::Status CheckPush(absl::Span<const int64_t> ids, absl::Span<const float> grads) const;
  // Counts the push on each stored row (records[i] non-null, held from the store) and collects the
  // absent ids into `absent`.
  void CountStored(absl::Span<const int64_t> ids, absl::Span<float* const> records, int64_t global_step,
                   absl::flat_hash_set<int64_t>* absent) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // An absent id pushed at global_step: counted as pending, or admitted and created in the store
  // from its initial value (its record returned, held); nullptr while it is not admitted.
  float* AdmitAbsent(int64_t id, int64_t global_step) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A change to row `id` (its record's meta): stamps the current generation, logging the id when the
  // generation is new to the row and changes are tracked.
  // Before the row's first change in the generation, its record goes to the save scans open on the
  // shard that have not read it yet (scan_snapshot.h): call Stamp before the change. A row made now
  // (`fresh`) has no earlier record to keep.
  void Stamp(int64_t id, RowMeta& meta, bool fresh = false) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (GenOf(meta) == gen_) return;
    if (!fresh && snapshots_->any()) Keep(id, meta);
    SetGen(meta, gen_);
    if (tracking_) changed_[id] = gen_;
  }
  void Keep(int64_t id, const RowMeta& meta) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Keeps the records of `ids` (about to be removed) for the open save scans that have not read them.
  absl::Status KeepBeforeRemoval(const std::vector<int64_t>& ids) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A store error `s`, kept (every later call returns it) and returned.
  absl::Status Fail(absl::Status s) const;
  // The kept store error, or OK.
  absl::Status Failure() const;

  const TableConfig config_;
  const SparseRule rule_;
  const RowAccessor accessor_;

  mutable absl::Mutex mu_;
  // The rows (changes under mu_ held alone; Acquire/Release also under a shared mu_).
  const std::unique_ptr<RowStore> store_ ABSL_PT_GUARDED_BY(mu_);
  mutable std::atomic<bool> failed_{false};  // failure_ is set
  mutable absl::Mutex failure_mu_;           // a store's first failure (taken under mu_, shared or not)
  mutable absl::Status failure_ ABSL_GUARDED_BY(failure_mu_);
  absl::flat_hash_map<int64_t, Pending> pending_ ABSL_GUARDED_BY(mu_);
  // Saves: the current generation; whether the change logs are kept, and since which save they are
  // complete (-1: not at all); the logs.
  uint32_t gen_ ABSL_GUARDED_BY(mu_) = 0;
  bool tracking_ ABSL_GUARDED_BY(mu_) = false;
  int64_t known_since_ ABSL_GUARDED_BY(mu_) = -1;
  absl::flat_hash_map<int64_t, uint32_t> changed_ ABSL_GUARDED_BY(mu_);
  std::vector<std::pair<int64_t, uint32_t>> removed_ ABSL_GUARDED_BY(mu_);
  // The save scans open on the shard, each reading the shard as it was when it started.
  const std::shared_ptr<SnapshotSet> snapshots_ = SnapshotSet::Make();
  int64_t admissions_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t evictions_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t rows_dropped_ ABSL_GUARDED_BY(mu_) = 0;
  mutable std::atomic<int64_t> rows_gathered_{0};
  std::atomic<int64_t> rows_pushed_{0};
};

}  // namespace psflow::ps::table

#endif  // PSFLOW_PS_SERVER_TABLE_DYNAMIC_TABLE_H_
