// ps/server/ps_tables.h — the embedding tables one ps task holds (docs/tables.md "How the ps will
// use them"): the table shards the chief's Initialize lists (created here from their declarations,
// each row from its initializer: the chief never sends values), the table blocks of pulls and
// pushes decoded and validated off the wire, gathers for answers, async updates with the sparse
// rule, the sync step's per-table SparseStepSum (summed in worker order), checkpoint scans and
// loads, and per-table counters.
//
// Owned by the ps's Model (ps_server_impl.h), created with it and immutable as a map afterwards.
// Thread-safe: each TableShard has its own mutex; each table's sync sum is guarded by its own mutex
// (sync pushes accumulate concurrently); ApplyStep runs under the sync accumulator's lock (lock
// order: SyncAccumulator::mu_ -> TableState::mu -> the shard's).
#ifndef PSFLOW_PS_SERVER_PS_TABLES_H_
#define PSFLOW_PS_SERVER_PS_TABLES_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "proto/psflow.pb.h"
#include "ps/server/table/disk_store.h"
#include "ps/server/table/sparse_sync_sum.h"
#include "ps/server/table/table_shard.h"
#include "psflow/ps/ps_types.h"
#include "rpc/transport.h"

namespace psflow::ps {

// One table shard on this ps, under its wire name (NAME/part_I, or NAME).
struct TableState {
  std::string name;
  std::unique_ptr<table::TableShard> shard;
  int64_t dim = 0;
  int shard_index = 0, num_shards = 1;  // dynamic: this ps task of num_ps
  absl::Mutex mu;
  table::SparseStepSum sum ABSL_GUARDED_BY(mu);  // sync: the current step's gradients
  // Told of a storage failure of the shard (a disk table's: ResourceExhausted or Internal, naming
  // the ps and the table), which ends the task; may be empty.
  std::function<void(const absl::Status&)> on_failure;

  TableState(std::string n, std::unique_ptr<table::TableShard> s, int64_t d)
      : name(std::move(n)), shard(std::move(s)), dim(d), sum(name, d) {}
};

// A decoded table block: its ids (and, for pushes, its rows [ids, dim]), validated.
struct TableBlock {
  TableState* table = nullptr;
  std::vector<int64_t> ids;
  std::vector<float> rows;
};

// The sparse rule of a training config: --sparse_optimizer (its name empty: the dense optimizer)
// with its learning rate (--sparse_learning_rate; 0: the optimizer's) and --ftrl_l1/--ftrl_l2.
table::SparseRuleConfig SparseRuleOf(const TrainingConfig& config);

class PsTables {
 public:
  // The table shards `init.table_shards()` lists, from `init.config().tables`, on ps task `ps_task`.
  // InvalidArgument (one line naming the table) for an undeclared or doubly declared table, a bad
  // declaration (initializer, layout), a shard index out of range or a bad --sparse_sync_mean.
  // With `disk`, dynamic tables keep their rows there (fixed tables stay in memory); a storage
  // failure of a table is told to `on_failure` (and returned by the call that met it).
  static absl::StatusOr<std::unique_ptr<PsTables>> Create(const wire::InitializeRequest& init, int ps_task,
                                                          table::DiskTier* disk = nullptr,
                                                          std::function<void(const absl::Status&)> on_failure = {});
  ~PsTables();

  bool empty() const { return list_.empty(); }
  const std::vector<std::shared_ptr<TableState>>& list() const { return list_; }
  TableState* Find(const std::string& name) const;

  // Decodes `blocks`; with `rows_from` their rows are tensors [first_tensor, first_tensor + n) of
  // it (named as the block, [ids, dim] floats). Checks everything before anything is applied: a
  // known table, whole int64 ids, unique ids this shard owns (fixed: in range and routed here;
  // dynamic: Mix64(id) % P is this task), the rows' size and finiteness. InvalidArgument naming
  // the table otherwise.
  absl::StatusOr<std::vector<TableBlock>> Decode(const google::protobuf::RepeatedPtrField<wire::TableRows>& blocks,
                                                 const rpc::IncomingMessage* rows_from, int first_tensor) const;

  // Appends one [ids, dim] tensor per block (its rows now) to `out`, named as the block. Errors: a
  // disk table's storage failure (told to its on_failure too).
  static absl::Status AppendGathered(const std::vector<TableBlock>& blocks, rpc::OutgoingMessage* out);

  // Async: applies each block's rows at `global_step`, then runs due removal passes. Errors (a
  // dynamic share's row cap) name the table; the blocks before it were applied.
  absl::Status ApplyAsync(const std::vector<TableBlock>& blocks, int64_t global_step);

  // Sync: keeps worker `worker`'s blocks for the current step (an empty gradient for the tables it
  // did not touch here, so every sum counts R gradients).
  void Accumulate(int worker, const std::vector<TableBlock>& blocks);
  // Sync: each table's combined rows (the sums in worker order, divided per --sparse_sync_mean)
  // applied once at `global_step`, then due removal passes.
  void ApplyStep(int64_t global_step);

  std::vector<TableTaskStats> Stats() const;

  // Checkpoints. A part of a scan (its first call runs a removal pass at `global_step` and starts
  // the scan with the request's options: full or an increment): an increment's removed ids first,
  // then the rows into `part` (ids, last_step, count) and `out`'s tensors (values, then each slot).
  // FailedPrecondition naming the table for an increment the shard cannot answer (the save must be
  // full).
  // A scan left open (its chief died, or its save stopped) is dropped by DropIdleScans or
  // DropScansOf; a later read of it is Aborted naming why (never a scan opened again silently, which
  // would read the shard at a later moment than the save's).
  absl::Status ScanPart(const wire::TableScan& scan, int64_t global_step, wire::TableScanPart* part,
                        rpc::OutgoingMessage* out) ABSL_LOCKS_EXCLUDED(scans_mu_);
  // Drops the open scans whose client made no scan call to this task for `bound` before `now`
  // (every scan of a client counts: a save reads its tables one after another). Returns one line
  // per scan dropped, naming the table, the save and `flag` (the bound's flag).
  std::vector<std::string> DropIdleScans(absl::Time now, absl::Duration bound, const std::string& flag)
      ABSL_LOCKS_EXCLUDED(scans_mu_);
  // Drops the open scans of client `client_id` (a process replaced by a restarted one: `who`, e.g.
  // "worker 0"). One line per scan dropped.
  std::vector<std::string> DropScansOf(uint64_t client_id, const std::string& who) ABSL_LOCKS_EXCLUDED(scans_mu_);
  // Stores checkpoint rows (a LoadTable call; its tensors in order: per block the
  // values, then each slot). InvalidArgument naming the table (a wrong dim or slot count, an id
  // this shard does not own, ...); the blocks before the bad one are stored.
  absl::Status Load(const google::protobuf::RepeatedPtrField<wire::TableRows>& blocks,
                    const rpc::IncomingMessage& message);

 private:
  // An open scan borrows its shard: scans_ is emptied before the shards go (a disk table's database
  // closed under an open iterator aborted the ps task when a restore replaced the tables while a
  // save's scan was left open by a chief whose save had failed).
  struct OpenScan {
    TableState* table = nullptr;
    std::unique_ptr<table::RowScan> scan;
    size_t removed_sent = 0;  // of scan->removed()
    uint64_t client_id = 0;   // who opened it (0: unknown)
    int64_t save_id = 0;
    absl::Time last_call;  // the newest scan call of its client (or of it, client unknown)
  };
  // Drops scan `it` (scans_mu_ held), remembering why for a later read of it.
  void DropLocked(absl::flat_hash_map<uint64_t, OpenScan>::iterator it, const std::string& why)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(scans_mu_);
  mutable absl::Mutex scans_mu_;
  absl::flat_hash_map<uint64_t, OpenScan> scans_ ABSL_GUARDED_BY(scans_mu_);
  // Scans dropped (their ids and why), the newest kDroppedKept, for the reads that come later.
  static constexpr size_t kDroppedKept = 4096;
  absl::flat_hash_map<uint64_t, std::string> dropped_ ABSL_GUARDED_BY(scans_mu_);
  std::vector<uint64_t> dropped_order_ ABSL_GUARDED_BY(scans_mu_);
  table::SparseSyncMean mean_ = table::SparseSyncMean::kWorkers;
  int ps_task_ = 0;
  std::vector<std::shared_ptr<TableState>> list_;
  absl::flat_hash_map<std::string, std::shared_ptr<TableState>> by_name_;
};

}  // namespace psflow::ps

#endif  // PSFLOW_PS_SERVER_PS_TABLES_H_
