// ps/server/table/disk_store.h — the disk tier of dynamic tables (docs/table-storage.md; DESIGN §11):
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
//               data block), index and filters partitioned in one 80 MiB block cache per tier, which the
//               runs (below) are charged to: RocksDB's memory does not grow with the rows on disk
//               (disk_store.cc states the options chosen). Rows reach the database only as ingested
//               table files: its memtables stay empty.
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
//               not push out rows used again and again (docs/table-storage-figures.md, "The cache's policy"). A batch's
//               misses are read in key order, a few MultiGets side by side (read_pool.h); records held by a batch are
//               pinned; after a batch records leave until the cache is within its bytes: clean ones are dropped, dirty
//               ones move (no copy: the record's block changes hands) into their table's open run. An increment's reads
//               (Peek) copy rows from the cache, the runs or the database without admitting, pinning or counting
//               them: a checkpoint does not push hot rows out for rows it reads once.
//   runs        write-back without the memtable: a table's dirty records leaving the cache are gathered in its
//               open run (one version of an id, the newest: a tombstone for a removed row), which is sealed at
//               DiskTierOptions::run_bytes (16 MiB) and written behind the caller by the tier's writer thread,
//               sorted, as one table file (rocksdb::SstFileWriter), then ingested (IngestExternalFile, move, a
//               global sequence number: newer than every row on disk; runs are ingested in the order they were
//               sealed). A run's rows stay visible until its file is in: a miss looks in the open run (the record
//               moves back into the cache, dirty) and the sealed runs, newest first (copied: the writer reads the
//               run's own block) before RocksDB. The runs of a tier take at most 64 MiB, reserved in the block
//               cache through a WriteBufferManager (the memtables' budget before; the memtables are no longer
//               written), so the task's memory does not grow; past it the largest open run is sealed; one sealed
//               run at a time waits for the writer or is written (a second makes the caller wait). The writer holds an
//               ingest while level 0 has 20 files or more and a compaction is under way (ingestion alone does not stall
//               on level 0), without the tier's lock, woken by RocksDB as each compaction finishes (an EventListener,
//               compaction_signal.h), for at most 60 s (then one log line says what it waited for, and the file goes
//               in). Flush, a scan, CompactAll write the open run and the dirty cached records as one file first
//               (the same level-0 wait before the tier's lock is taken); removal passes read the runs beside the
//               database; a closed table's runs are dropped with its
//               directory. Held records may take the cache over its bytes while they are held (concurrent batches of
//               several tables). The policy never changes arithmetic: a record leaves and comes back bit for bit.
// Refused in one line: a missing --table_dir or one not writable, a directory held by a running
// task, a cache smaller than one batch's rows (ResourceExhausted, naming the table, the ps and the
// sizes), a disk read or write failure (a full disk: ResourceExhausted; others: Internal; naming
// the ps and the table).
//
// Thread-safe: the tier's mutex guards the cache, the runs and every store's index. Calls of one tier
// serialize except for the reads of misses, made without it (the caller's table keeps its own rows
// still meanwhile: a shard's lock is held around Acquire, Release and Peek), for the writer's files
// and ingests (a sealed run is read-only until its file is in; write_behind off: written in the
// call, under the lock, with no level-0 wait), and for the level-0 waits (never under the lock: a
// table's pulls, pushes and misses, and every other table's, go on meanwhile). A flush's file is
// still written and ingested under the lock (its dirty records may change once it is released).
#ifndef PSFLOW_PS_SERVER_TABLE_DISK_STORE_H_
#define PSFLOW_PS_SERVER_TABLE_DISK_STORE_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "ps/server/table/read_pool.h"
#include "ps/server/table/record_pool.h"
#include "ps/server/table/row_store.h"

namespace rocksdb {
class DB;
class Cache;
struct Options;
class PinnableSlice;
class Status;
class WriteBufferManager;
}  // namespace rocksdb

namespace psflow::ps::table {

class CompactionSignal;
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
  // Sealed runs are written and ingested by the tier's writer thread, behind the call that sealed
  // them (false: in that call). The arithmetic is the same either way.
  bool write_behind = true;
  // A table's open run is sealed and written as one file when its records reach this many bytes
  // (16 MiB: RocksDB's memtable size before runs; tests set a few rows' bytes).
  int64_t run_bytes = int64_t{16} << 20;
  // Tests only: called with a sealed run's file path once the file is written, before it is ingested
  // (disk_tier_killed_writer kills its process there).
  std::function<void(const std::string&)> before_ingest = nullptr;
  // Tests only: called with the table's name as a level-0 wait begins (the writer's before an ingest,
  // a flush's before it takes the tier's lock).
  std::function<void(const std::string&)> at_level0_wait = nullptr;
  // A level-0 wait's bound: past it the file goes in anyway, said in one log line.
  absl::Duration level0_wait = absl::Seconds(60);
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
  // A record in the cache: this header, then RowMeta, then the floats.
  struct Entry {
    Entry* prev;
    Entry* next;  // towards the least recently used
    DiskRowStore* owner;
    int64_t id;
    uint32_t pins;     // batches holding the record (a write-back under way counts one)
    uint16_t touched;  // used since it was put at the front (second chance)
    uint8_t list;      // where it is: kClock, kWindow (linked) or kRun (a run's, not linked)
    uint8_t unused;
  };
  static constexpr uint8_t kClock = 0;   // the CLOCK part
  static constexpr uint8_t kWindow = 1;  // the window, before admission
  static constexpr uint8_t kRun = 2;     // left the cache, in a run (owned by it)
  struct List {
    Entry* head = nullptr;  // most recently put
    Entry* tail = nullptr;
  };
  // A table's records that left the cache dirty, and tombstones of its removed rows: one version of
  // an id, the newest. Open (DiskRowStore::open_) while it gathers; sealed, read-only, until its file
  // is in.
  struct Run {
    absl::flat_hash_map<int64_t, Entry*> rows;  // nullptr: removed (a tombstone)
    int64_t bytes = 0;                          // records and map entries (kRunEntryBytes each)
    int64_t records = 0;                        // rows that are not tombstones
  };
  static constexpr int64_t kRunEntryBytes = 32;  // a run's map entry, about
  static_assert(sizeof(Entry) + sizeof(RowMeta) == 64, "a record's floats start a cache line");
  static constexpr int64_t kHeaderFloats = (sizeof(Entry) + sizeof(float) - 1) / sizeof(float);
  static Entry* EntryOf(float* record) { return reinterpret_cast<Entry*>(record - kMetaFloats - kHeaderFloats); }
  static RowMeta& MetaOfEntry(Entry* e) { return MetaOf(reinterpret_cast<float*>(e) + kHeaderFloats + kMetaFloats); }
  static const RowMeta& MetaOfEntry(const Entry* e) {
    return MetaOf(reinterpret_cast<const float*>(e) + kHeaderFloats + kMetaFloats);
  }

  DiskTier(DiskTierOptions options, std::string dir, int lock_fd, std::function<void(const std::string&)> log);
  // List operations (mu_ held): the list is the window or the CLOCK part, by e->list.
  List& ListOf(const Entry* e) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return e->list == kWindow ? window_ : clock_; }
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
  // move into their table's open run. Then runs are sealed (run_bytes, or the largest open one while
  // the runs take more than their budget).
  absl::Status EvictToBudget() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Seals full runs, and the largest open runs while the runs are over their budget (waiting for
  // the writer when none is open).
  absl::Status SealRuns() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Hands store's open run to the writer (write_behind off: writes it now).
  void Seal(DiskRowStore* store) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Bytes of runs reserved in the block cache (the write buffer manager's), grown or shrunk to `bytes`.
  void ReserveRunBytes(int64_t bytes) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Forget(DiskRowStore* store) ABSL_LOCKS_EXCLUDED(mu_);
  // Until no sealed run is waiting or being written (mu_ released meanwhile).
  void AwaitWrites() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The writer's next run (store's oldest sealed one) and its file's number.
  std::pair<const Run*, int64_t> NextWrite(DiskRowStore* store) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The writer thread: writes and ingests the sealed runs in order, then frees them.
  void WriterLoop() ABSL_LOCKS_EXCLUDED(mu_);
  // A sealed run's file is in (or failed: the tier stops, the run is kept): its records freed.
  void FinishRun(DiskRowStore* store, const absl::Status& written) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const DiskTierOptions options_;
  const std::string dir_;
  const std::function<void(const std::string&)> log_;  // Open's (nullptr: stderr)
  const int lock_fd_;
  std::shared_ptr<rocksdb::Cache> block_cache_;                 // shared by the tier's databases
  std::shared_ptr<rocksdb::WriteBufferManager> write_buffers_;  // ditto
  mutable absl::Mutex mu_;
  List clock_ ABSL_GUARDED_BY(mu_);   // the CLOCK part
  List window_ ABSL_GUARDED_BY(mu_);  // records read or created, before admission
  int64_t bytes_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t window_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<uint8_t> sketch_ ABSL_GUARDED_BY(mu_);  // count-min, 4 counters an id
  int64_t sketch_adds_ ABSL_GUARDED_BY(mu_) = 0;
  RecordPool pool_ ABSL_GUARDED_BY(mu_);                    // the records' memory
  std::vector<DiskRowStore*> stores_ ABSL_GUARDED_BY(mu_);  // open tables (borrowed)
  ReadPool readers_;                                        // a batch's misses read side by side (no lock of ours held)
  std::deque<DiskRowStore*> write_queue_ ABSL_GUARDED_BY(mu_);  // a sealed run each (its store's oldest)
  int64_t writes_open_ ABSL_GUARDED_BY(mu_) = 0;                // sealed runs not ingested yet
  int64_t run_bytes_ ABSL_GUARDED_BY(mu_) = 0;                  // every run's bytes, open and sealed
  int64_t run_bytes_reserved_ ABSL_GUARDED_BY(mu_) = 0;         // of them, reserved in the block cache
  absl::Status write_error_ ABSL_GUARDED_BY(mu_);               // the first failed write's (the tier stops)
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread writer_;  // sealed runs written behind the callers (options_.write_behind)
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
  absl::Status Peek(const int64_t* ids, size_t n, absl::FunctionRef<void(size_t, const float*)> f) const override;
  absl::Status ForEachAge(absl::FunctionRef<void(int64_t, int64_t)> f) const override;
  absl::StatusOr<std::unique_ptr<RecordScan>> Scan() const override;
  RowStoreStats stats() const override;

  // Writes the open run and every dirty cached record of this table to disk as one file, after the
  // sealed runs (a test's, a scan's and CompactAll's step).
  absl::Status Flush();
  // Waits for the tier's sealed runs to be ingested (DiskTier::WaitForWrites; a test's step).
  absl::Status WaitForWrites() { return tier_->WaitForWrites(); }

 private:
  friend class DiskTier;
  class Scanner;
  // A row of a file to write: a record (RowMeta then the floats, kDirty clear) or, if nullptr, a
  // tombstone.
  using FileRow = std::pair<int64_t, const RowMeta*>;
  DiskRowStore(std::shared_ptr<DiskTier> tier, std::string table, std::string dir, int64_t floats_per_row,
               std::unique_ptr<rocksdb::DB> db, const rocksdb::Options& options,
               std::shared_ptr<CompactionSignal> compactions);
  // Bytes of one record's block in the cache.
  int64_t entry_bytes() const { return (DiskTier::kHeaderFloats + kMetaFloats + floats_) * 4; }
  // A new unpinned-yet entry's record, linked at the front and indexed.
  float* NewEntry(int64_t id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(tier_->mu_);
  // Removes a cached record (unlinked, unindexed, freed).
  void DropEntry(DiskTier::Entry* e) ABSL_EXCLUSIVE_LOCKS_REQUIRED(tier_->mu_);
  // Entry e (owner and id set) into the cache's window and index, pins and use cleared: its record.
  float* CacheEntry(DiskTier::Entry* e) ABSL_EXCLUSIVE_LOCKS_REQUIRED(tier_->mu_);
  // Entry e out of the cache's lists, byte counts and index (its block kept).
  void UncacheEntry(DiskTier::Entry* e) ABSL_EXCLUSIVE_LOCKS_REQUIRED(tier_->mu_);
  // `bytes` (negative: fewer) more in `run` and in the tier's runs.
  void AddToRun(DiskTier::Run& run, int64_t bytes) ABSL_EXCLUSIVE_LOCKS_REQUIRED(tier_->mu_);
  // A cached record leaving dirty: its block moves into the open run (kDirty cleared), replacing
  // what the run held for its id.
  void MoveToRun(DiskTier::Entry* e) ABSL_EXCLUSIVE_LOCKS_REQUIRED(tier_->mu_);
  // Puts a tombstone for `id` in the open run, freeing the record it held for it.
  void AddTombstone(int64_t id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(tier_->mu_);
  // `id` (not cached) in the runs, newest first: true if a run holds it, with *record its new cached
  // record (unpinned; moved back dirty from the open run, or a clean copy of a sealed run's), or
  // nullptr for a tombstone.
  bool TakeFromRuns(int64_t id, float** record) ABSL_EXCLUSIVE_LOCKS_REQUIRED(tier_->mu_);
  // The open run, made if none.
  DiskTier::Run& OpenRun() ABSL_EXCLUSIVE_LOCKS_REQUIRED(tier_->mu_);
  // Frees a run's records and its bytes (the run stays, empty).
  void FreeRun(DiskTier::Run& run) ABSL_EXCLUSIVE_LOCKS_REQUIRED(tier_->mu_);
  // The run holding `id` (not cached), newest run first, or null when none does; *e its entry
  // there, or nullptr for a tombstone.
  DiskTier::Run* FindInRuns(int64_t id, DiskTier::Entry** e) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(tier_->mu_);
  // Reads the records of ids[missed[k]] (not cached, in no run: on disk or not stored) from the
  // database without the tier's lock, in key order, a few MultiGets side by side; values[k] and
  // statuses[k] are ids[missed[k]]'s (missed is sorted by id).
  void ReadFromDisk(const int64_t* ids, std::vector<size_t>& missed, std::vector<rocksdb::PinnableSlice>* values,
                    std::vector<rocksdb::Status>* statuses) const ABSL_LOCKS_EXCLUDED(tier_->mu_);
  // Until level 0 has fewer than kMaxLevel0Files files or no compaction is running (none would
  // bring it down), woken as each compaction finishes; at most DiskTierOptions::level0_wait, then
  // one log line names what it waited for. An ingested file lands in level 0, which ingestion does
  // not stall on as writes do. `what` names the file that waits (in the log line).
  void AwaitLevel0(const std::string& what) const ABSL_LOCKS_EXCLUDED(tier_->mu_);
  // Whether a Flush would write anything (an open run, a dirty cached record), or the tier's
  // write error: a flush with nothing to write does not wait for level 0.
  absl::StatusOr<bool> HasRowsToWrite() const ABSL_LOCKS_EXCLUDED(tier_->mu_);
  // The run's rows in id order.
  static std::vector<FileRow> SortedRows(const DiskTier::Run& run);
  // Writes `rows` (ascending ids, each once) as one table file and ingests it. Reads only `rows`'
  // records, db_ and options_: called by the writer without the tier's lock.
  absl::Status WriteFile(const std::vector<FileRow>& rows, int64_t file_number) const;
  absl::Status Failed(const char* what, const std::string& why) const;

  const std::shared_ptr<DiskTier> tier_;
  const std::string table_, dir_;
  const int64_t floats_;                                 // (1 + slots)·dim
  std::unique_ptr<rocksdb::DB> db_;                      // closed first by the destructor
  const std::unique_ptr<rocksdb::Options> options_;      // the database's: its files' format
  const std::shared_ptr<CompactionSignal> compactions_;  // the database's listener (AwaitLevel0)
  RowIndex index_ ABSL_GUARDED_BY(tier_->mu_);           // id -> cached record
  const int64_t empty_index_bytes_ = index_.bytes();     // not counted against the cache (RecordBudget)
  int64_t rows_ ABSL_GUARDED_BY(tier_->mu_) = 0;         // stored rows (cached, on disk or both)
  int64_t cached_bytes_ ABSL_GUARDED_BY(tier_->mu_) = 0;
  RowStoreStats counters_ ABSL_GUARDED_BY(tier_->mu_);               // hits, misses, rows read and written
  std::unique_ptr<DiskTier::Run> open_ ABSL_GUARDED_BY(tier_->mu_);  // gathering (or null)
  std::deque<std::unique_ptr<DiskTier::Run>> sealed_ ABSL_GUARDED_BY(tier_->mu_);  // oldest first
  int64_t next_file_ ABSL_GUARDED_BY(tier_->mu_) = 1;                              // runs' file names
};

}  // namespace psflow::ps::table

#endif  // PSFLOW_PS_SERVER_TABLE_DISK_STORE_H_
