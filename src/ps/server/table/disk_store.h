// ps/server/table/disk_store.h — the disk tier of dynamic tables (docs/tables.md#storage; DESIGN §11):
// a ps task's DiskTier (its directory, its lock, and the hot-row cache its disk tables share) and
// one DiskRowStore per disk table (a RocksDB database under the tier's directory).
//
//   directory   --table_dir/ps_<task>/<table> (table names escaped: '/' and '%' as %2F, %25). The
//               tier creates ps_<task> and holds ps_<task>/LOCK (flock) while it lives: a second
//               running task on the same directory is refused. Tables left there by a task that died
//               are wiped when the tier opens (the disk tier is a cache of the checkpoint, not the
//               durable copy: a restore refills it), said in one log line.
//   RocksDB     key: the id with its sign bit flipped, big-endian (8 bytes: iteration is ascending
//               signed id order, as a checkpoint stores rows); value: the record (RowMeta with mark 0
//               and kDirty clear, then the floats; native byte order). Write-ahead log off, no
//               compression (floats do not compress), bloom filters (a lookup of an absent id reads no
//               data block), memtables of 16 MiB under one write-buffer budget per tier (64 MiB), index
//               and filters partitioned in one 80 MiB block cache per tier, which the memtables are
//               charged to: RocksDB's memory does not grow with the rows on disk (disk_store.cc states
//               the options chosen).
//   cache       records in memory, bounded in bytes (--table_cache_bytes per ps task: each record's
//               block, header + meta + floats, and the growth of the records' indexes count; the
//               blocks come from a RecordPool, record_pool.h: no allocator overhead per record), one
//               list over every disk table of the task. Policy: a window and TinyLFU admission in
//               front of CLOCK. A record read from disk or created enters a FIFO window (1/20 of the
//               bytes); one leaving the window goes to the CLOCK part's front if a count-min sketch
//               of the rows' uses has seen it used more often than CLOCK's next victim, else to its back, leaving
//               first. A use is a read from disk (ids not stored are not counted) or a second chance (below); 4 x
//               uint8 an id, halved every 10 counts a counter; cache_bytes / 256 counters, at least 4096, beside the
//               budget: 8 MiB at 2 GiB. In the CLOCK part a hit only marks a record (no list surgery, which would
//               touch two more cache lines a row, and no count); eviction walks from the back, moving marked records
//               to the front unmarked (a second chance: counted once in the sketch, so rows that always hit keep
//               their weight) and taking the unmarked, then the window's oldest if still over. A row seen once does
//               not push out rows used again and again (docs/tables.md, "The cache's policy"). Records whose
//               write-back is under way wait in a list of their own, out of the policy's sight (admission compares
//               with a victim that can leave). A batch's misses are read in key order, a few MultiGets side by side
//               (read_pool.h); records held by a batch are pinned; after a batch records leave until the cache is
//               within its bytes, dirty ones written back in one WriteBatch per table, keys in order. The write is
//               behind the caller (write_behind): the tier's writer thread runs it while the caller answers its pull,
//               the records staying cached, pinned, until it is done (a hit meanwhile keeps its record); then they
//               leave. One round of write-backs is open at a time: the next eviction waits for it. Held records may
//               take the cache over its bytes while they are held (concurrent batches of several tables). The policy
//               never changes arithmetic: a record leaves and comes back bit for bit.
// Refused in one line: a missing --table_dir or one not writable, a directory held by a running
// task, a cache smaller than one batch's rows (ResourceExhausted, naming the table, the ps and the
// sizes), a disk read or write failure (a full disk: ResourceExhausted; others: Internal; naming
// the ps and the table).
//
// Thread-safe: the tier's mutex guards the cache and every store's index. Calls of one tier
// serialize except for the reads of misses, made without it (the caller's table keeps its own rows
// still meanwhile: a shard's lock is held around Acquire and Release), and for the writer's
// RocksDB writes (the records it writes stay cached and pinned meanwhile; a write-back in the
// caller's thread, write_behind off, holds the lock).
#ifndef PSFLOW_PS_SERVER_TABLE_DISK_STORE_H_
#define PSFLOW_PS_SERVER_TABLE_DISK_STORE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "ps/server/table/read_pool.h"
#include "ps/server/table/record_pool.h"
#include "ps/server/table/row_store.h"

namespace rocksdb {
class DB;
class Cache;
class WriteBatch;
class WriteBufferManager;
}  // namespace rocksdb

namespace psflow::ps::table {

class DiskRowStore;

struct DiskTierOptions {
  std::string table_dir;    // --table_dir: must exist and be writable
  int64_t cache_bytes = 0;  // --table_cache_bytes: the task's hot-row cache (>= 1)
  int ps_task = 0;          // names the task's directory and the errors
  // RocksDB reads with O_DIRECT: a miss reads the device, not the kernel's page cache (whose
  // memory is outside --table_cache_bytes). Off by default (the page cache is free speed where RAM
  // is left); bench/disk_table_bench.cc measures both.
  bool direct_reads = false;
  // Threads beside the caller that read a batch's misses side by side (read_pool.h): a batch with
  // m misses reads min(m / 64, read_threads + 1) parts at once. 0: one MultiGet in the caller.
  int read_threads = 3;
  // Dirty records leaving the cache are written back by the tier's writer thread, behind the call
  // that evicted them (false: in that call). The arithmetic is the same either way.
  bool write_behind = true;
};

// One ps task's disk tier. Made by Open, shared (std::shared_ptr) by the task's disk stores.
class DiskTier : public std::enable_shared_from_this<DiskTier> {
 public:
  // Creates and locks table_dir/ps_<task>, wiping what a dead task left there (said through `log`).
  static absl::StatusOr<std::shared_ptr<DiskTier>> Open(const DiskTierOptions& options,
                                                        const std::function<void(const std::string&)>& log);
  ~DiskTier();
  DiskTier(const DiskTier&) = delete;
  DiskTier& operator=(const DiskTier&) = delete;

  // A store for table `table` ((1 + slots)·dim floats a row) in a fresh database: whatever was in
  // its directory is wiped. InvalidArgument if the table is open in this tier already; the error of
  // RocksDB, naming the table, otherwise.
  absl::StatusOr<std::unique_ptr<DiskRowStore>> OpenTable(const std::string& table, int64_t floats_per_row);

  const DiskTierOptions& options() const { return options_; }
  // The task's directory (table_dir/ps_<task>).
  const std::string& dir() const { return dir_; }
  // Bytes of records in the cache now (every table's).
  int64_t cache_bytes_used() const;
  // Every table's dirty records written back and its database flushed and compacted whole, waiting
  // for it (a bench's step after a fill, so its timings do not include RocksDB's compactions).
  absl::Status CompactAll();
  // Waits until the write-backs under way are done: their records have left the cache (unless used
  // meanwhile). The first failed write-back's error, if any.
  absl::Status WaitForWrites() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  friend class DiskRowStore;
  struct WriteJob;  // one table's dirty records leaving, written by writer_
  // A record in the cache: this header, then RowMeta, then the floats.
  struct Entry {
    Entry* prev;
    Entry* next;  // towards the least recently used
    DiskRowStore* owner;
    int64_t id;
    uint32_t pins;     // batches holding the record (a write-back under way counts one)
    uint16_t touched;  // used since it was put at the front (second chance)
    uint8_t list;      // the list it is in: kClock, kWindow or kLeaving
    uint8_t writing;   // leaving: its write-back is under way
  };
  static constexpr uint8_t kClock = 0;    // the CLOCK part
  static constexpr uint8_t kWindow = 1;   // the window, before admission
  static constexpr uint8_t kLeaving = 2;  // its write-back under way: out of the policy's sight
  struct List {
    Entry* head = nullptr;  // most recently put
    Entry* tail = nullptr;
  };
  static_assert(sizeof(Entry) + sizeof(RowMeta) == 64, "a record's floats start a cache line");
  static constexpr int64_t kHeaderFloats = (sizeof(Entry) + sizeof(float) - 1) / sizeof(float);
  static Entry* EntryOf(float* record) { return reinterpret_cast<Entry*>(record - kMetaFloats - kHeaderFloats); }

  DiskTier(DiskTierOptions options, std::string dir, int lock_fd);
  // List operations (mu_ held): the list is the window, the CLOCK part or the leaving, by e->list.
  List& ListOf(const Entry* e) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return e->list == kWindow ? window_ : e->list == kLeaving ? leaving_ : clock_;
  }
  void PushFront(Entry* e) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void PushBack(Entry* e) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Unlink(Entry* e) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The sketch: counts one use of (store, id) (a read from disk, or a hit seen as a second chance);
  // the estimate of its count.
  void CountUse(const DiskRowStore* store, int64_t id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  int Uses(const DiskRowStore* store, int64_t id) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Records past the window's share leave it: to the CLOCK part's front if used more often than
  // its next victim, else to its back.
  void AdmitFromWindow(int64_t budget) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The bytes the records may take: --table_cache_bytes less their indexes'.
  int64_t RecordBudget() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Records leave from the least recently used end until the cache is within its bytes; dirty ones
  // are written back, one WriteBatch per table.
  absl::Status EvictToBudget() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Forget(DiskRowStore* store) ABSL_LOCKS_EXCLUDED(mu_);
  // Hands `dirty` (a table's records leaving, each dirty) to the writer: a WriteBatch in key order,
  // kDirty cleared, the records pinned until it is written.
  void SubmitWriteBack(DiskRowStore* store, std::vector<Entry*>& dirty) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Until no write-back is under way (mu_ released meanwhile).
  void AwaitWrites() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The writer thread: runs the submitted WriteJobs, then unpins their records and drops those
  // nobody used meanwhile.
  void WriterLoop() ABSL_LOCKS_EXCLUDED(mu_);
  void FinishWrite(WriteJob& job, const absl::Status& written) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const DiskTierOptions options_;
  const std::string dir_;
  const int lock_fd_;
  std::shared_ptr<rocksdb::Cache> block_cache_;                 // shared by the tier's databases
  std::shared_ptr<rocksdb::WriteBufferManager> write_buffers_;  // ditto
  mutable absl::Mutex mu_;
  List clock_ ABSL_GUARDED_BY(mu_);    // the CLOCK part
  List window_ ABSL_GUARDED_BY(mu_);   // records read or created, before admission
  List leaving_ ABSL_GUARDED_BY(mu_);  // records being written back (kept if used meanwhile)
  int64_t bytes_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t window_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<uint8_t> sketch_ ABSL_GUARDED_BY(mu_);  // count-min, 4 counters an id
  int64_t sketch_adds_ ABSL_GUARDED_BY(mu_) = 0;
  RecordPool pool_ ABSL_GUARDED_BY(mu_);                    // the records' memory
  std::vector<DiskRowStore*> stores_ ABSL_GUARDED_BY(mu_);  // open tables (borrowed)
  ReadPool readers_;                                        // a batch's misses read side by side (no lock of ours held)
  std::vector<std::unique_ptr<WriteJob>> write_queue_ ABSL_GUARDED_BY(mu_);  // submitted, not taken yet
  int64_t writes_open_ ABSL_GUARDED_BY(mu_) = 0;                             // jobs submitted and not finished
  int64_t writing_bytes_ ABSL_GUARDED_BY(mu_) = 0;                           // bytes of the records being written back
  absl::Status write_error_ ABSL_GUARDED_BY(mu_);  // the first failed write-back's (the tier stops)
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread writer_;  // write-backs behind the callers (options_.write_behind)
};

class DiskRowStore final : public RowStore {
 public:
  ~DiskRowStore() override;

  const char* kind() const override { return "disk"; }
  int64_t size() const override;
  int64_t max_rows_held() const override { return tier_->options_.cache_bytes / entry_bytes(); }
  absl::Status Acquire(const int64_t* ids, size_t n, float** records) override;
  void Reserve(int64_t n) override;
  float* Create(int64_t id) override;
  absl::Status Release(float* const* records, size_t n) override;
  absl::Status Erase(const std::vector<int64_t>& ids) override;
  absl::Status ForEachAge(absl::FunctionRef<void(int64_t, int64_t)> f) const override;
  absl::StatusOr<std::unique_ptr<RecordScan>> Scan() const override;
  RowStoreStats stats() const override;

  // Writes every dirty cached record of this table to disk (a test's and a scan's step).
  absl::Status Flush();
  // Waits for the tier's write-backs under way (DiskTier::WaitForWrites; a test's step).
  absl::Status WaitForWrites() { return tier_->WaitForWrites(); }

 private:
  friend class DiskTier;
  class Scanner;
  DiskRowStore(std::shared_ptr<DiskTier> tier, std::string table, std::string dir, int64_t floats_per_row,
               std::unique_ptr<rocksdb::DB> db);
  // Bytes of one record's block in the cache.
  int64_t entry_bytes() const { return (DiskTier::kHeaderFloats + kMetaFloats + floats_) * 4; }
  // A new unpinned-yet entry's record, linked at the front and indexed.
  float* NewEntry(int64_t id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(tier_->mu_);
  // Removes a cached record (unlinked, unindexed, freed).
  void DropEntry(DiskTier::Entry* e) ABSL_EXCLUSIVE_LOCKS_REQUIRED(tier_->mu_);
  // Writes the dirty records among `entries` in one WriteBatch and clears their kDirty.
  absl::Status WriteBack(std::vector<DiskTier::Entry*>& entries) ABSL_EXCLUSIVE_LOCKS_REQUIRED(tier_->mu_);
  // Appends the record's Put (key, record with kDirty clear) to `batch` and clears its kDirty.
  void AppendPut(DiskTier::Entry* e, rocksdb::WriteBatch* batch) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(tier_->mu_);
  absl::Status Failed(const char* what, const std::string& why) const;

  const std::shared_ptr<DiskTier> tier_;
  const std::string table_, dir_;
  const int64_t floats_;                              // (1 + slots)·dim
  std::unique_ptr<rocksdb::DB> db_;                   // closed first by the destructor
  RowIndex index_ ABSL_GUARDED_BY(tier_->mu_);        // id -> cached record
  const int64_t empty_index_bytes_ = index_.bytes();  // not counted against the cache (RecordBudget)
  int64_t rows_ ABSL_GUARDED_BY(tier_->mu_) = 0;      // stored rows (cached, on disk or both)
  int64_t cached_bytes_ ABSL_GUARDED_BY(tier_->mu_) = 0;
  RowStoreStats counters_ ABSL_GUARDED_BY(tier_->mu_);  // hits, misses, rows read and written
};

}  // namespace psflow::ps::table

#endif  // PSFLOW_PS_SERVER_TABLE_DISK_STORE_H_
