// ps/server/table/table_shard.h — one ps task's part of an embedding table (docs/tables.md;
// Paddle's table role): a fixed table's shard (dense rows of [rows, dim] and their slots, routed by
// div/mod) or a dynamic table's share (rows whose id hashes to this ps; its rows in memory or on
// disk: row_store.h), behind one
// small interface: gather rows, apply gradient rows, removal passes, reading rows in id order for a
// checkpoint (in parts), loading them back, and counters.
//
// Ids are the table's global ids on both kinds. A shard trusts its ids: they are checked once,
// where they enter the ps (PsTables::Decode and PsTables::Load: known table, whole int64s, unique,
// this shard's, rows of the table's dim and finite), so every Gather and Apply here takes ids
// that are unique and its own (a fixed shard CHECKs, to keep a caller's bug inside its memory). A
// shard still refuses sizes that do not match, what only it can judge (its row cap, its store), and
// a fixed shard a checkpoint part's foreign ids (a single-process trainer loads files without a ps).
//
// Thread-safe: each shard holds a mutex (gathers share it, updates hold it alone).
#ifndef PSFLOW_PS_SERVER_TABLE_TABLE_SHARD_H_
#define PSFLOW_PS_SERVER_TABLE_TABLE_SHARD_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "ps/server/table/sparse_rule.h"
#include "ps/server/table/table_config.h"

namespace psflow::ps::table {

class DiskTier;

// Counters of one shard (cumulative ones since it was made).
struct TableStats {
  int64_t rows = 0;           // rows stored (a fixed shard: all of its rows)
  int64_t pending_ids = 0;    // ids counted but not admitted yet (admit_after)
  int64_t bytes = 0;          // memory held: rows and slots, per-row counters, index
  int64_t admissions = 0;     // rows created (dynamic)
  int64_t evictions = 0;      // rows and pending ids removed by passes
  int64_t rows_gathered = 0;  // rows answered to pulls
  int64_t rows_pushed = 0;    // gradient rows received (applied or dropped before admission)
  int64_t rows_dropped = 0;   // gradient rows dropped before admission
  // Storage (row_store.h): "memory" or "disk". A disk table's `bytes` are its share of the ps's
  // row cache and its index; the rest are 0 for memory tables.
  const char* storage = "memory";
  int64_t cache_hits = 0;         // rows found in the cache by gathers and pushes
  int64_t cache_misses = 0;       // rows looked up on disk (found or absent)
  int64_t disk_bytes = 0;         // the table's files on disk
  int64_t disk_rows_read = 0;     // rows read from disk into the cache
  int64_t disk_rows_written = 0;  // dirty rows written back to disk
};

// A run of rows in ascending id order, as a checkpoint stores them (docs/tables.md#semantics): ids, values
// [n, dim], each slot [n, dim] (the rule's slot_names order), and per-row last update step and push
// count.
struct RowsPart {
  std::vector<int64_t> ids;
  std::vector<float> values;
  std::vector<std::vector<float>> slots;
  std::vector<int64_t> last_step;
  std::vector<int64_t> count;
};

// What a checkpoint's scan reads (docs/checkpoints.md#increments). Saves are numbered 1, 2, 3 ...
// by the chief (save_id). Each shard keeps a current generation; a scan for save n sets it to n + 1
// before it reads a row, and every change to a row (push, admission, load) stamps the row with it;
// a dynamic shard tracking changes also logs the ids it removes with the generation. So the rows
// changed since save m are those whose generation is > m.
//   full      (increment false): every row; the shard's change log before save n is dropped.
//   increment (increment true, changed_since = m, the last committed save of the chain): the rows
//             changed since save m and the ids removed since, each ascending; log entries of
//             generation <= m are dropped (save m is committed: nobody needs them).
// A dynamic shard lists changed rows from a log (id -> generation, 12 bytes a changed row) kept only
// while the saves ask for it (track_changes: the job makes increments); a fixed shard stamps every
// row (4 bytes a row) always. An increment the shard cannot answer — it has not tracked changes since
// save m (it was made, restored or restarted after it, or saved without track_changes) — is refused
// with FailedPrecondition naming the table: the save must be full.
struct ScanOptions {
  int64_t save_id = 0;  // this save's number (>= 0, < RowMeta::kMaxGen)
  bool increment = false;
  int64_t changed_since = -1;  // increment: the save it follows (0 <= changed_since < save_id)
  bool track_changes = false;  // keep the change log for later increments
};

// Reads a shard's rows in id order, a part at a time, without a second copy of the table (a
// dynamic shard's scan holds its ids sorted: 8 bytes per row). Rows removed between parts are
// skipped; rows created after Scan() are not read. Borrows the shard: it must outlive the scan.
class RowScan {
 public:
  virtual ~RowScan() = default;
  // An increment's removed ids (ascending; a removed id may be among the rows too, when it was
  // created again since); empty for a full scan.
  virtual const std::vector<int64_t>& removed() const {
    static const std::vector<int64_t> kNone;
    return kNone;
  }
  // Fills `part` with up to max_rows (>= 1) next rows; false once every row has been read or the
  // scan failed (status()).
  virtual bool Next(int64_t max_rows, RowsPart* part) = 0;
  // Why the scan stopped early (a disk table's read failure, naming the ps and the table); OK
  // otherwise.
  virtual absl::Status status() const { return absl::OkStatus(); }
};

class TableShard {
 public:
  virtual ~TableShard() = default;
  virtual const TableConfig& config() const = 0;
  virtual const SparseRule& rule() const = 0;

  // Copies the rows of `ids` into out ([ids.size(), dim]). A dynamic id not stored gets its
  // initial value, and is not stored. InvalidArgument naming the table for an `out` of the
  // wrong size.
  virtual absl::Status Gather(absl::Span<const int64_t> ids, absl::Span<float> out) const = 0;

  // Applies gradient rows ([ids.size(), dim], ids unique and this shard's, rows finite) with the rule at `global_step`
  // (the learning rate decays with it; rows record it as their last update). A dynamic id not stored counts the push
  // and, once admitted, is created from its initial value and updated. InvalidArgument naming the table (nothing
  // applied) for a wrong size or more ids than the shard's row cap.
  virtual absl::Status Apply(absl::Span<const int64_t> ids, absl::Span<const float> grads, int64_t global_step) = 0;

  // A removal pass (steps_to_live, max_rows) at `global_step`; returns how many rows and pending
  // ids it removed. Fixed shards never remove rows. MaybeRemove runs it only when the accessor says
  // one is due (every evict_every steps); a checkpoint calls RemoveNow first.
  virtual int64_t RemoveNow(int64_t global_step) = 0;
  int64_t MaybeRemove(int64_t global_step);

  // Rows in id order, in parts (see RowScan): every row, the shard's generations left alone.
  virtual std::unique_ptr<RowScan> Scan() const = 0;
  // A checkpoint's scan (see ScanOptions): full or an increment; moves the shard's generation on.
  // InvalidArgument for bad options, FailedPrecondition for an increment the shard cannot answer;
  // each naming the table.
  virtual absl::StatusOr<std::unique_ptr<RowScan>> Scan(const ScanOptions& options) = 0;
  // Stores rows read by a scan (of this table, possibly on another number of ps tasks): each id must
  // be this shard's (checked by PsTables::Load; a fixed shard also refuses others itself), sizes
  // must match dim and the rule's slots. InvalidArgument naming the table otherwise, nothing stored.
  virtual absl::Status Load(const RowsPart& part) = 0;

  virtual TableStats stats() const = 0;

 protected:
  virtual bool PassDue(int64_t global_step) const = 0;
};

// A fixed table's shard `shard` of config.layout().num_shards, or a dynamic table's share on ps task
// `shard` of `num_ps`. InvalidArgument naming the table for a bad config or rule.
absl::StatusOr<std::unique_ptr<TableShard>> MakeTableShard(const TableConfig& config, const SparseRuleConfig& rule,
                                                           int shard, int num_ps);
// The same with the rows of a dynamic table on disk, in `disk`'s directory and cache (borrowed;
// nullptr: in memory). InvalidArgument naming the table for a fixed table on disk (disk storage
// holds dynamic tables only); the tier's error if the table's database cannot be opened.
absl::StatusOr<std::unique_ptr<TableShard>> MakeTableShard(const TableConfig& config, const SparseRuleConfig& rule,
                                                           int shard, int num_ps, DiskTier* disk);

}  // namespace psflow::ps::table

#endif  // PSFLOW_PS_SERVER_TABLE_TABLE_SHARD_H_
