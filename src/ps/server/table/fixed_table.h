// ps/server/table/fixed_table.h — one shard of a fixed-vocabulary table [N, dim] (docs/tables.md#semantics):
// all of its rows, created at construction from their initial values (a function of (seed, id),
// so the same on any number of shards), each stored as a record [w | slots] of (1 + slots)·dim
// floats, in one block of row memory (huge pages). Ids are global; the shard holds those that dist::RouteFixedId sends
// to it. A row's update count is kept only for lazy adam. Rows are never removed. Each row's save
// generation (table_shard.h ScanOptions) is stamped beside the array (4 bytes a row), always: an
// increment walks the stamps and reads the rows changed. Thread-safe (table_shard.h).
#ifndef PSFLOW_PS_SERVER_TABLE_FIXED_TABLE_H_
#define PSFLOW_PS_SERVER_TABLE_FIXED_TABLE_H_

#include <atomic>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "ps/server/table/accessor.h"
#include "ps/server/table/row_memory.h"
#include "ps/server/table/scan_snapshot.h"
#include "ps/server/table/table_shard.h"

namespace psflow::ps::table {

class FixedTableShard final : public TableShard {
 public:
  // config valid and fixed, shard in [0, layout.num_shards) (CHECKed; MakeTableShard validates).
  FixedTableShard(TableConfig config, SparseRule rule, int shard);

  const TableConfig& config() const override { return config_; }
  const SparseRule& rule() const override { return rule_; }
  absl::Status Gather(absl::Span<const int64_t> ids, absl::Span<float> out) const override;
  absl::Status Apply(absl::Span<const int64_t> ids, absl::Span<const float> grads, int64_t global_step) override;
  int64_t RemoveNow(int64_t global_step) override { return 0; }
  std::unique_ptr<RowScan> Scan() const override;
  absl::StatusOr<std::unique_ptr<RowScan>> Scan(const ScanOptions& options) override;
  absl::Status Load(const RowsPart& part) override;
  TableStats stats() const override;

 private:
  class Scanner;
  bool PassDue(int64_t global_step) const override { return false; }
  // Rows of `ids` in this shard, or InvalidArgument naming the table and the first foreign id (Load:
  // rows from a checkpoint file, which a single-process trainer hands over without a ps).
  absl::Status LocalRows(absl::Span<const int64_t> ids, std::vector<int64_t>* rows) const;
  // The same for ids checked where they entered the ps (Gather, Apply): a foreign one is a bug of
  // the caller, stopped before it touches memory outside the shard.
  void CheckedLocalRows(absl::Span<const int64_t> ids, std::vector<int64_t>* rows) const;

  const TableConfig config_;
  const SparseRule rule_;
  const RowAccessor accessor_;
  const int shard_;
  const int64_t num_rows_;
  const int64_t stride_;    // floats per record
  const int64_t first_id_;  // div: the shard's ids are [first_id_, first_id_ + num_rows_)
  mutable absl::Mutex mu_;
  // [num_rows_, stride_]: owned by storage_, read and written through records_ (set once; the
  // floats are guarded).
  const RowArray<float> storage_;
  float* const records_ ABSL_PT_GUARDED_BY(mu_);
  std::vector<int64_t> count_ ABSL_GUARDED_BY(mu_);  // per-row update count (adam only, else empty)
  // Saves: each row's generation, the current one, and the first save scanned (-1: none yet; the
  // stamps are complete since then).
  std::vector<uint32_t> gen_of_ ABSL_GUARDED_BY(mu_);
  uint32_t gen_ ABSL_GUARDED_BY(mu_) = 0;
  // The save scans open on the shard (scan_snapshot.h): a row's record goes to them before its
  // first change in a generation (Keep, before the stamp moves), keyed by its local row.
  const std::shared_ptr<SnapshotSet> snapshots_ = SnapshotSet::Make();
  void Keep(int64_t row) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  int64_t known_since_ ABSL_GUARDED_BY(mu_) = -1;
  mutable std::atomic<int64_t> rows_gathered_{0};
  std::atomic<int64_t> rows_pushed_{0};
};

}  // namespace psflow::ps::table

#endif  // PSFLOW_PS_SERVER_TABLE_FIXED_TABLE_H_
