// The disk tier of dynamic tables: RocksDB behind a hot-row cache (disk_store.h). This file has
// DiskTier (the task's cache, its admission and eviction, the write-behind thread); DiskRowStore,
// one table's store in it, is in disk_row_store.cc.
#include "ps/server/table/disk_store.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <tuple>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "core/check.h"
#include "ps/server/table/compaction_signal.h"
#include "ps/server/table/disk_keys.h"
#include "rocksdb/cache.h"
#include "rocksdb/db.h"
#include "rocksdb/filter_policy.h"
#include "rocksdb/options.h"
#include "rocksdb/table.h"
#include "rocksdb/write_buffer_manager.h"

namespace psflow::ps::table {
namespace {

namespace fs = std::filesystem;

// Settings below the two flags (disk_store.h). RocksDB's memory is bounded whatever the table's
// size: one 80 MiB block cache a task holds the index and filter blocks (partitioned: only the
// partitions in use are in memory; without partitions, every table file's whole index and filter
// stay in RAM, ~4 B a row: 150 MB a ps at 40M rows) beside the data blocks the misses read (rows are
// cached as records, not blocks), and the runs (disk_store.h) are charged to the same cache (a write
// buffer manager's reservation), within 64 MiB for every table of a task together: the memtables'
// budget before rows went to disk as ingested files.
constexpr int64_t kRunBudget = int64_t{64} << 20;
// Sealed runs waiting for the writer or being written, at most (then the caller waits): with the
// open run, two runs a table, as RocksDB's two memtables were (max_write_buffer_number).
constexpr int64_t kRunsInFlight = 1;
// The memtables: never written (rows arrive as files), so small.
constexpr size_t kTableWriteBuffer = size_t{1} << 20;
constexpr size_t kBlockCacheBytes = size_t{80} << 20;

// '/' and '%' escaped, so a table name is one directory.
std::string DirName(const std::string& table) {
  std::string out;
  for (char c : table) {
    if (c == '/') {
      out += "%2F";
    } else if (c == '%') {
      out += "%25";
    } else {
      out += c;
    }
  }
  return out;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// DiskTier

absl::StatusOr<std::shared_ptr<DiskTier>> DiskTier::Open(const DiskTierOptions& options,
                                                         const std::function<void(const std::string&)>& log) {
  const std::string& root = options.table_dir;
  if (root.empty()) {
    return absl::InvalidArgumentError(
        "--table_dir is required with --table_storage=disk (a directory the ps "
        "tasks may write)");
  }
  if (options.read_threads < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("the disk tier's read_threads=", options.read_threads, " must be >= 0"));
  }
  if (options.cache_bytes < 1) {
    return absl::InvalidArgumentError(absl::StrCat("--table_cache_bytes=", options.cache_bytes,
                                                   ": the disk tables' cache needs at least one row's bytes"));
  }
  std::error_code ec;
  if (!fs::is_directory(root, ec)) {
    return absl::InvalidArgumentError(absl::StrCat("--table_dir=", root,
                                                   " does not exist or is not a directory; "
                                                   "create it (ps task ",
                                                   options.ps_task, " makes ps_", options.ps_task, " inside it)"));
  }
  if (access(root.c_str(), W_OK | X_OK) != 0) {
    return absl::PermissionDeniedError(absl::StrCat("--table_dir=", root, " is not writable by ps task ",
                                                    options.ps_task, ": ", std::strerror(errno)));
  }
  const std::string dir = (fs::path(root) / absl::StrCat("ps_", options.ps_task)).string();
  fs::create_directory(dir, ec);
  if (ec) return absl::PermissionDeniedError(absl::StrCat("cannot create ", dir, ": ", ec.message()));
  const std::string lock_path = (fs::path(dir) / "LOCK").string();
  const int fd = open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) return absl::PermissionDeniedError(absl::StrCat("cannot open ", lock_path, ": ", std::strerror(errno)));
  if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
    char pid[32] = {0};
    const ssize_t got = pread(fd, pid, sizeof(pid) - 1, 0);
    close(fd);
    return absl::FailedPreconditionError(
        absl::StrCat("--table_dir=", root, ": ", dir, " is held by a running task (pid ",
                     got > 0 ? std::string(pid, static_cast<size_t>(got)) : std::string("?"),
                     "); give each ps task of each job its own --table_dir, or stop that task"));
  }
  const std::string me = std::to_string(getpid());
  if (ftruncate(fd, 0) != 0 || pwrite(fd, me.data(), me.size(), 0) != static_cast<ssize_t>(me.size())) {
    close(fd);
    return absl::PermissionDeniedError(absl::StrCat("cannot write ", lock_path, ": ", std::strerror(errno)));
  }
  // What a task that stopped without closing its tables left: wiped, never mixed with a restore.
  int64_t wiped = 0;
  for (const fs::directory_entry& e : fs::directory_iterator(dir, ec)) {
    if (e.path().filename() == "LOCK") continue;
    fs::remove_all(e.path(), ec);
    if (ec) {
      close(fd);
      return absl::PermissionDeniedError(absl::StrCat("cannot wipe ", e.path().string(),
                                                      " (left by a task that "
                                                      "stopped): ",
                                                      ec.message()));
    }
    ++wiped;
  }
  if (wiped > 0 && log) {
    log(absl::StrCat("ps task ", options.ps_task, ": wiped ", wiped,
                     wiped == 1 ? " table directory" : " table directories", " left in ", dir,
                     " by a task that stopped (the disk tier is a cache of the checkpoint; a restore refills it)"));
  }
  return std::shared_ptr<DiskTier>(new DiskTier(options, dir, fd, log));
}

DiskTier::DiskTier(DiskTierOptions options, std::string dir, int lock_fd, std::function<void(const std::string&)> log)
    : options_(std::move(options)),
      dir_(std::move(dir)),
      log_(std::move(log)),
      lock_fd_(lock_fd),
      block_cache_(rocksdb::NewLRUCache(kBlockCacheBytes)),
      write_buffers_(std::make_shared<rocksdb::WriteBufferManager>(kRunBudget, block_cache_)),
      readers_(options_.read_threads) {
  // cache_bytes / 256 counters (a power of two, at least 4096: a small cache's few ids must not
  // collide): ~2 a record of dim 64 with a slot.
  size_t counters = 4096;
  while (counters * 2 <= static_cast<size_t>(options_.cache_bytes) / 256) counters *= 2;
  {
    absl::MutexLock lock(&mu_);
    sketch_.assign(counters, 0);
  }
  if (options_.write_behind) writer_ = std::thread([this] { WriterLoop(); });
}

DiskTier::~DiskTier() {
  // Every store holds a shared_ptr to the tier: none is left here, and so no write-back.
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (writer_.joinable()) writer_.join();
  {
    absl::MutexLock lock(&mu_);
    ReserveRunBytes(0);
  }
  close(lock_fd_);  // releases the flock
}

void DiskTier::AwaitWrites() {
  mu_.Await(absl::Condition(
      +[](DiskTier* t) ABSL_EXCLUSIVE_LOCKS_REQUIRED(t->mu_) { return t->writes_open_ == 0; }, this));
}

absl::Status DiskTier::WaitForWrites() {
  absl::MutexLock lock(&mu_);
  AwaitWrites();
  return write_error_;
}

void DiskTier::ReserveRunBytes(int64_t bytes) {
  // In steps of 1 MiB: the reservation's dummy cache entries change seldom.
  constexpr int64_t kStep = int64_t{1} << 20;
  const int64_t want = bytes <= 0 ? 0 : (bytes + kStep - 1) / kStep * kStep;
  if (want > run_bytes_reserved_) {
    write_buffers_->ReserveMem(static_cast<size_t>(want - run_bytes_reserved_));
  } else if (want < run_bytes_reserved_) {
    write_buffers_->FreeMem(static_cast<size_t>(run_bytes_reserved_ - want));
  }
  run_bytes_reserved_ = want;
}

void DiskTier::Seal(DiskRowStore* store) {
  store->tier_->mu_.AssertHeld();  // this tier's
  if (store->open_ == nullptr || store->open_->rows.empty()) return;
  store->sealed_.push_back(std::move(store->open_));
  ++writes_open_;
  if (options_.write_behind) {
    write_queue_.push_back(store);
    return;
  }
  // In the call (under the lock).
  const DiskTier::Run& run = *store->sealed_.back();
  const int64_t number = store->next_file_++;
  const absl::Status written =
      write_error_.ok() ? store->WriteFile(DiskRowStore::SortedRows(run), number) : write_error_;
  FinishRun(store, written);
}

void DiskTier::FinishRun(DiskRowStore* store, const absl::Status& written) {
  store->tier_->mu_.AssertHeld();
  --writes_open_;
  if (!written.ok()) {
    if (write_error_.ok()) write_error_ = written;
    return;  // the run stays (its rows visible); the tier fails every later call
  }
  DiskTier::Run& run = *store->sealed_.front();
  store->counters_.disk_rows_written += run.records;
  store->FreeRun(run);
  store->sealed_.pop_front();
}

absl::Status DiskTier::SealRuns() {
  for (DiskRowStore* store : stores_) {
    store->tier_->mu_.AssertHeld();
    if (store->open_ != nullptr && store->open_->bytes >= options_.run_bytes) Seal(store);
  }
  while (run_bytes_ > kRunBudget && write_error_.ok()) {
    DiskRowStore* largest = nullptr;
    int64_t largest_bytes = 0;
    for (DiskRowStore* store : stores_) {
      store->tier_->mu_.AssertHeld();
      if (store->open_ != nullptr && !store->open_->rows.empty() && store->open_->bytes > largest_bytes) {
        largest = store;
        largest_bytes = store->open_->bytes;
      }
    }
    // The open runs' bytes over the budget are sealed once; sealed runs' bytes leave as the writer
    // ingests them.
    int64_t sealed = 0;
    for (DiskRowStore* store : stores_) {
      store->tier_->mu_.AssertHeld();
      for (const auto& run : store->sealed_) sealed += run->bytes;
    }
    if (largest != nullptr && sealed < kRunBudget) {
      Seal(largest);
    } else if (writes_open_ > 0) {
      AwaitWrites();
    } else {
      break;  // nothing to write: held records alone (cannot happen: runs hold no held record)
    }
  }
  // At most kRunsInFlight sealed runs not ingested: past them the caller waits for the writer (it
  // also needs the lock to finish a run, which a caller in a tight loop may otherwise keep from it).
  if (writes_open_ > kRunsInFlight && write_error_.ok()) {
    mu_.Await(absl::Condition(
        +[](DiskTier* t) ABSL_EXCLUSIVE_LOCKS_REQUIRED(t->mu_) {
          return t->writes_open_ <= kRunsInFlight || !t->write_error_.ok();
        },
        this));
  }
  ReserveRunBytes(run_bytes_);
  return write_error_;
}

std::pair<const DiskTier::Run*, int64_t> DiskTier::NextWrite(DiskRowStore* store) {
  store->tier_->mu_.AssertHeld();  // this tier's (held)
  // Its oldest run: runs are queued in the order they were sealed, this one thread writes them
  // one at a time, and FinishRun pops each before the next is taken (a failed one stays, but
  // then nothing more is written: the tier has failed).
  return {store->sealed_.front().get(), store->next_file_++};
}

void DiskTier::WriterLoop() {
  for (;;) {
    DiskRowStore* store = nullptr;
    const DiskTier::Run* run = nullptr;
    int64_t number = 0;
    bool failed = false;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(
          +[](DiskTier* t) ABSL_EXCLUSIVE_LOCKS_REQUIRED(t->mu_) { return t->stopping_ || !t->write_queue_.empty(); },
          this));
      if (write_queue_.empty()) return;  // stopping, nothing left
      store = write_queue_.front();
      write_queue_.pop_front();
      std::tie(run, number) = NextWrite(store);
      failed = !write_error_.ok();
    }
    // The run is read-only until FinishRun: its records are read without the lock. Level 0 is waited
    // for here, without the lock, so the tier's calls go on meanwhile.
    if (!failed) store->AwaitLevel0(absl::StrCat("run-", number, ".sst"));
    const absl::Status written = failed ? absl::OkStatus() : store->WriteFile(DiskRowStore::SortedRows(*run), number);
    absl::MutexLock lock(&mu_);
    FinishRun(store, failed ? write_error_ : written);
  }
}
int64_t DiskTier::cache_bytes_used() const {
  absl::MutexLock lock(&mu_);
  return bytes_;
}

absl::Status DiskTier::CompactAll() {
  std::vector<DiskRowStore*> stores;
  {
    absl::MutexLock lock(&mu_);
    stores = stores_;
  }
  for (DiskRowStore* store : stores) {
    if (absl::Status s = store->Flush(); !s.ok()) return s;
    rocksdb::CompactRangeOptions c;
    c.bottommost_level_compaction = rocksdb::BottommostLevelCompaction::kForceOptimized;
    if (rocksdb::Status s = store->db_->Flush(rocksdb::FlushOptions()); !s.ok()) {
      return store->Failed("flushing rows to disk", s.ToString());
    }
    if (rocksdb::Status s = store->db_->CompactRange(c, nullptr, nullptr); !s.ok()) {
      return store->Failed("compacting rows on disk", s.ToString());
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<DiskRowStore>> DiskTier::OpenTable(const std::string& table, int64_t floats_per_row) {
  // A table open twice (a model re-initialized while the old one is alive): the second in
  // <table>.2, and so on.
  std::string path = (fs::path(dir_) / DirName(table)).string();
  {
    absl::MutexLock lock(&mu_);
    for (int k = 2;; ++k) {
      if (std::none_of(stores_.begin(), stores_.end(), [&](const DiskRowStore* s) { return s->dir_ == path; })) break;
      path = (fs::path(dir_) / absl::StrCat(DirName(table), ".", k)).string();
    }
  }
  std::error_code ec;
  fs::remove_all(path, ec);  // a fresh database: rows come from pushes and restores only
  if (ec)
    return absl::PermissionDeniedError(absl::StrCat("table '", table, "': cannot wipe ", path, ": ", ec.message()));
  rocksdb::Options o;
  o.create_if_missing = true;
  o.error_if_exists = true;
  o.compression = rocksdb::kNoCompression;  // floats do not compress
  // Rows arrive as ingested files (DiskRowStore::WriteFile): the memtable stays empty (a read skips
  // it at once), and the write buffer manager only reserves the runs' bytes in the block cache.
  o.write_buffer_size = kTableWriteBuffer;
  o.max_write_buffer_number = 2;
  o.use_direct_reads = options_.direct_reads;
  o.avoid_flush_during_shutdown = true;  // the directory is removed at close
  o.keep_log_file_num = 1;
  o.max_log_file_size = size_t{1} << 20;
  o.info_log_level = rocksdb::InfoLogLevel::WARN_LEVEL;
  // Read choices:
  // - data blocks of 4 KiB (a few records each: a miss reads one page); checksums verified on
  //   every read (XXH3, RocksDB's default: ~0.1 µs a block);
  // - bloom filters of 10 bits a key on every level, the last one included (not
  //   optimize_filters_for_hits: a job's ids not stored yet, which are most misses of a CTR table,
  //   are answered from the filter, not by reading a block of the last level);
  // - index and filters partitioned and kept in the block cache at high priority (the top level
  //   pinned), so their memory is the cache's 80 MiB, not ∝ rows (see kBlockCacheBytes);
  // - direct reads only with DiskTierOptions::direct_reads (the page cache is free speed where RAM
  //   is left, and outside the task's RSS).
  rocksdb::BlockBasedTableOptions t;
  t.block_cache = block_cache_;
  t.filter_policy.reset(rocksdb::NewBloomFilterPolicy(10));  // absent ids: answered from memory
  t.index_type = rocksdb::BlockBasedTableOptions::kTwoLevelIndexSearch;
  t.partition_filters = true;
  t.cache_index_and_filter_blocks = true;
  t.cache_index_and_filter_blocks_with_high_priority = true;
  t.pin_top_level_index_and_filter = true;
  // No partition is pinned (only each file's top level, above): they compete in the block cache at
  // high priority. Pinning flushed (L0) files' partitions looked cheap, but a file keeps its reader,
  // and so its pins, when a compaction moves it down whole (a trivial move: what ids written in
  // order, as the 40 GB run's fill, always get), so the pins grew with the rows, ~3.3 B a row, past
  // the cache's 80 MiB (measured with rocksdb.block-cache-pinned-usage: 49 of 52 MB pinned at 15 M
  // rows; peak RSS over the cache 292 MB in the 40 GB run, 208-213 MB with none pinned: docs/scale.md).
  t.metadata_cache_options.partition_pinning = rocksdb::PinningTier::kNone;
  o.table_factory.reset(rocksdb::NewBlockBasedTableFactory(t));
  // Wakes the level-0 waits (DiskRowStore::AwaitLevel0) as each compaction finishes.
  auto compactions = std::make_shared<CompactionSignal>();
  o.listeners.push_back(compactions);
  rocksdb::DB* db = nullptr;
  const rocksdb::Status s = rocksdb::DB::Open(o, path, &db);
  if (!s.ok()) {
    return absl::InternalError(absl::StrCat("ps task ", options_.ps_task, ", table '", table,
                                            "': cannot open its disk tier in ", path, ": ", s.ToString()));
  }
  auto store = std::unique_ptr<DiskRowStore>(new DiskRowStore(
      shared_from_this(), table, path, floats_per_row, std::unique_ptr<rocksdb::DB>(db), o, std::move(compactions)));
  absl::MutexLock lock(&mu_);
  stores_.push_back(store.get());
  return store;
}

void DiskTier::PushFront(Entry* e) {
  List& l = ListOf(e);
  e->prev = nullptr;
  e->next = l.head;
  if (l.head != nullptr) l.head->prev = e;
  l.head = e;
  if (l.tail == nullptr) l.tail = e;
}

void DiskTier::PushBack(Entry* e) {
  List& l = ListOf(e);
  e->next = nullptr;
  e->prev = l.tail;
  if (l.tail != nullptr) l.tail->next = e;
  l.tail = e;
  if (l.head == nullptr) l.head = e;
}

void DiskTier::Unlink(Entry* e) {
  List& l = ListOf(e);
  (e->prev != nullptr ? e->prev->next : l.head) = e->next;
  (e->next != nullptr ? e->next->prev : l.tail) = e->prev;
  e->prev = e->next = nullptr;
}

namespace {
// The sketch's i-th counter of (store, id).
size_t SketchSlot(const void* store, int64_t id, int i, size_t mask) {
  uint64_t x = static_cast<uint64_t>(id) ^ (reinterpret_cast<uintptr_t>(store) * 0x9e3779b97f4a7c15u);
  x += 0x9e3779b97f4a7c15u * static_cast<uint64_t>(i + 1);
  x ^= x >> 31;
  x *= 0xbf58476d1ce4e5b9u;
  x ^= x >> 29;
  return static_cast<size_t>(x) & mask;
}
}  // namespace

int DiskTier::Uses(const DiskRowStore* store, int64_t id) const {
  const size_t mask = sketch_.size() - 1;
  int m = 255;
  for (int i = 0; i < 4; ++i) m = std::min<int>(m, sketch_[SketchSlot(store, id, i, mask)]);
  return m;
}

void DiskTier::CountUse(const DiskRowStore* store, int64_t id) {
  const size_t mask = sketch_.size() - 1;
  const int m = Uses(store, id);
  for (int i = 0; i < 4; ++i) {  // conservative update: only the smallest counters grow
    uint8_t& c = sketch_[SketchSlot(store, id, i, mask)];
    if (c == m && c < 255) ++c;
  }
  if (++sketch_adds_ >= 10 * static_cast<int64_t>(sketch_.size())) {  // ageing: old counts fade
    for (uint8_t& c : sketch_) c >>= 1;
    sketch_adds_ = 0;
  }
}

int64_t DiskTier::RecordBudget() const {
  // The records' indexes, as they grow, count against the cache's bytes (at 2 GiB of 576-byte
  // records, their index is 2^23 entries of 16 bytes: 128 MiB); an empty index's few entries do not.
  int64_t index_bytes = 0;
  for (const DiskRowStore* store : stores_) {
    store->tier_->mu_.AssertHeld();
    index_bytes += store->index_.bytes() - store->empty_index_bytes_;
  }
  return options_.cache_bytes - index_bytes;
}

void DiskTier::AdmitFromWindow(int64_t budget) {
  const int64_t window_budget = budget / 20;
  if (window_bytes_ <= window_budget) return;
  // CLOCK's next victim: the first unmarked unpinned record from the back, a few looked at (each a
  // cache miss), once a call: the records leaving the window are compared with it.
  Entry* victim = clock_.tail;
  for (int k = 0; victim != nullptr && (victim->touched != 0 || victim->pins != 0); ++k) {
    victim = k < 4 ? victim->prev : nullptr;
  }
  const int victim_uses = victim != nullptr ? Uses(victim->owner, victim->id) : 0;
  for (Entry* c = window_.tail; c != nullptr && window_bytes_ > window_budget;) {
    Entry* const prev = c->prev;
    if (c->pins == 0) {  // a record held by a batch stays in the window until released
      Unlink(c);
      c->list = kClock;
      c->touched = 0;
      window_bytes_ -= c->owner->entry_bytes();
      if (bytes_ <= budget || victim == nullptr || Uses(c->owner, c->id) > victim_uses) {
        PushFront(c);
      } else {
        PushBack(c);  // used no more often than what would leave: leaves first
      }
    }
    c = prev;
  }
}

absl::Status DiskTier::EvictToBudget() {
  if (!write_error_.ok()) return write_error_;
  const int64_t budget = RecordBudget();
  AdmitFromWindow(budget);
  if (bytes_ > budget) {
    // The least recently used unpinned records, until what stays fits.
    // From the back: a record used since it was put at the front gets a second chance (to the
    // front, unmarked; the walk meets it again last); an unmarked unpinned one leaves. Then the
    // window's oldest unpinned records, if the CLOCK part had too few.
    std::vector<Entry*> leaving;
    int64_t after = bytes_;
    for (Entry* e = clock_.tail; e != nullptr && after > budget;) {
      Entry* const prev = e->prev;
      if (e->pins == 0) {
        if (e->touched != 0) {
          // A second chance: its hits since it was put at the front count once in the sketch, so a row
          // that always hits (and is never read from disk again) keeps its weight against new rows.
          e->touched = 0;
          CountUse(e->owner, e->id);
          if (e != clock_.head) {
            Unlink(e);
            PushFront(e);
          }
        } else {
          leaving.push_back(e);
          after -= e->owner->entry_bytes();
        }
      }
      e = prev;
    }
    for (Entry* e = window_.tail; e != nullptr && after > budget; e = e->prev) {
      if (e->pins == 0) {
        leaving.push_back(e);
        after -= e->owner->entry_bytes();
      }
    }
    // Clean records leave now; dirty ones move into their table's open run.
    for (Entry* e : leaving) {
      DiskRowStore* const store = e->owner;
      store->tier_->mu_.AssertHeld();  // this tier's mu_ (held): tells the analysis store->tier_ is this
      if ((MetaOfEntry(e).flags & RowMeta::kDirty) != 0) {
        store->MoveToRun(e);
      } else {
        store->DropEntry(e);
      }
    }
  }
  return SealRuns();
}

void DiskTier::Forget(DiskRowStore* store) {
  absl::MutexLock lock(&mu_);
  stores_.erase(std::remove(stores_.begin(), stores_.end(), store), stores_.end());
}

}  // namespace psflow::ps::table
