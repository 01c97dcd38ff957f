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
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "core/check.h"
#include "ps/server/table/disk_keys.h"
#include "rocksdb/cache.h"
#include "rocksdb/db.h"
#include "rocksdb/filter_policy.h"
#include "rocksdb/options.h"
#include "rocksdb/table.h"
#include "rocksdb/write_batch.h"
#include "rocksdb/write_buffer_manager.h"

namespace psflow::ps::table {
namespace {

namespace fs = std::filesystem;

// Settings below the two flags (disk_store.h). RocksDB's memory is bounded whatever the table's
// size: one 80 MiB block cache a task holds the index and filter blocks (partitioned: only the
// partitions in use are in memory; without partitions, every table file's whole index and filter
// stay in RAM, ~4 B a row: 150 MB a ps at 40M rows) beside the data blocks the misses read (rows are
// cached as records, not blocks), and the memtables are charged to the same cache (the write buffer
// manager's dummy entries), within 64 MiB for every table of a task together.
constexpr size_t kWriteBufferBytes = size_t{64} << 20;
// A table's memtable: 16 MiB (two at most: 32 MiB a table). A write-back's rows are random over the
// table, so every L0 -> L1 compaction rewrites the whole last level: its cost per row written is
// the table's size over the bytes flushed before it (4 memtables). 16 MiB instead of 8 (with read
// parts of 64) took the ps's CPU a row at 97 % hits down ~35 % (docs/tables.md, "This session
// (diskcpu)"). Charged to the block cache, they do not raise the task's memory: before, a tier of
// one table had 64 MiB of blocks and up to 16 MiB of memtables beside them (80); now 80 MiB for both.
constexpr size_t kTableWriteBuffer = size_t{16} << 20;
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

struct DiskTier::WriteJob {
  DiskRowStore* store;
  rocksdb::WriteBatch batch;
  std::vector<Entry*> entries;  // pinned by the job, writing = 1
};

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
  return std::shared_ptr<DiskTier>(new DiskTier(options, dir, fd));
}

DiskTier::DiskTier(DiskTierOptions options, std::string dir, int lock_fd)
    : options_(std::move(options)),
      dir_(std::move(dir)),
      lock_fd_(lock_fd),
      block_cache_(rocksdb::NewLRUCache(kBlockCacheBytes)),
      write_buffers_(std::make_shared<rocksdb::WriteBufferManager>(kWriteBufferBytes, block_cache_)),
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

void DiskTier::SubmitWriteBack(DiskRowStore* store, std::vector<Entry*>& dirty) {
  store->tier_->mu_.AssertHeld();  // this tier's
  auto job = std::make_unique<WriteJob>();
  job->store = store;
  std::sort(dirty.begin(), dirty.end(), [](const Entry* a, const Entry* b) { return a->id < b->id; });
  for (Entry* e : dirty) {
    store->AppendPut(e, &job->batch);
    ++e->pins;
    e->writing = 1;
    e->touched = 0;  // a hit while it is written keeps it
    writing_bytes_ += store->entry_bytes();
    // Out of the window's and CLOCK's sight while it is written: admission compares with CLOCK's
    // next victim, which must be a record that can leave, not one leaving already.
    Unlink(e);
    if (e->list == kWindow) window_bytes_ -= store->entry_bytes();
    e->list = kLeaving;
    PushFront(e);
  }
  job->entries = std::move(dirty);
  ++writes_open_;
  write_queue_.push_back(std::move(job));
}

void DiskTier::FinishWrite(WriteJob& job, const absl::Status& written) {
  DiskRowStore* const store = job.store;
  store->tier_->mu_.AssertHeld();
  for (Entry* e : job.entries) {
    --e->pins;
    e->writing = 0;
    writing_bytes_ -= store->entry_bytes();
    RowMeta& meta = MetaOf(reinterpret_cast<float*>(e) + kHeaderFloats + kMetaFloats);
    if (!written.ok()) meta.flags |= RowMeta::kDirty;  // still only here: kept, and the tier fails
    if (e->pins == 0 && e->touched == 0 && (meta.flags & RowMeta::kDirty) == 0) {
      store->DropEntry(e);
      continue;
    }
    // Used meanwhile (or still held, or not written): back at CLOCK's front, its use counted as a
    // second chance's.
    if (e->touched != 0) CountUse(e->owner, e->id);
    e->touched = 0;
    Unlink(e);
    e->list = kClock;
    PushFront(e);
  }
  if (written.ok()) {
    store->counters_.disk_rows_written += static_cast<int64_t>(job.entries.size());
  } else if (write_error_.ok()) {
    write_error_ = written;
  }
}

void DiskTier::WriterLoop() {
  for (;;) {
    std::vector<std::unique_ptr<WriteJob>> jobs;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(
          +[](DiskTier* t) ABSL_EXCLUSIVE_LOCKS_REQUIRED(t->mu_) { return t->stopping_ || !t->write_queue_.empty(); },
          this));
      if (write_queue_.empty()) return;  // stopping, nothing left
      jobs.swap(write_queue_);
    }
    std::vector<absl::Status> written;
    for (const auto& job : jobs) {
      const rocksdb::Status s = job->store->db_->Write(NoLog(), &job->batch);
      written.push_back(s.ok() ? absl::OkStatus() : job->store->Failed("writing rows back to disk", s.ToString()));
    }
    absl::MutexLock lock(&mu_);
    for (size_t k = 0; k < jobs.size(); ++k) FinishWrite(*jobs[k], written[k]);
    writes_open_ -= static_cast<int64_t>(jobs.size());
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
  o.write_buffer_size = kTableWriteBuffer;
  o.max_write_buffer_number = 2;
  o.write_buffer_manager = write_buffers_;
  o.use_direct_reads = options_.direct_reads;
  // A miss looked up in the memtables first: their bloom filter answers for the ids not there (most,
  // in a read-mostly table) instead of a skip-list search per memtable.
  o.memtable_prefix_bloom_size_ratio = 0.1;
  o.memtable_whole_key_filtering = true;
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
  rocksdb::DB* db = nullptr;
  const rocksdb::Status s = rocksdb::DB::Open(o, path, &db);
  if (!s.ok()) {
    return absl::InternalError(absl::StrCat("ps task ", options_.ps_task, ", table '", table,
                                            "': cannot open its disk tier in ", path, ": ", s.ToString()));
  }
  auto store = std::unique_ptr<DiskRowStore>(
      new DiskRowStore(shared_from_this(), table, path, floats_per_row, std::unique_ptr<rocksdb::DB>(db)));
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
      if (bytes_ - writing_bytes_ <= budget || victim == nullptr || Uses(c->owner, c->id) > victim_uses) {
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
  int64_t budget = RecordBudget();
  if (writes_open_ > 0 && bytes_ - writing_bytes_ > budget) {
    AwaitWrites();  // one round of write-backs under way at a time
    if (!write_error_.ok()) return write_error_;
    budget = RecordBudget();
  }
  AdmitFromWindow(budget);
  // Records being written back are leaving already.
  if (bytes_ - writing_bytes_ <= budget) return absl::OkStatus();
  // The least recently used unpinned records, until what stays fits.
  // From the back: a record used since it was put at the front gets a second chance (to the
  // front, unmarked; the walk meets it again last); an unmarked unpinned one leaves. Then the
  // window's oldest unpinned records, if the CLOCK part had too few.
  absl::flat_hash_map<DiskRowStore*, std::vector<Entry*>> leaving;
  int64_t after = bytes_ - writing_bytes_;
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
        leaving[e->owner].push_back(e);
        after -= e->owner->entry_bytes();
      }
    }
    e = prev;
  }
  for (Entry* e = window_.tail; e != nullptr && after > budget; e = e->prev) {
    if (e->pins == 0) {
      leaving[e->owner].push_back(e);
      after -= e->owner->entry_bytes();
    }
  }
  for (auto& [store, entries] : leaving) {
    store->tier_->mu_.AssertHeld();  // this tier's mu_ (held): tells the analysis store->tier_ is this
    if (!options_.write_behind) {
      if (absl::Status s = store->WriteBack(entries); !s.ok()) return s;  // kept in memory: nothing lost
      for (Entry* e : entries) store->DropEntry(e);
      continue;
    }
    // Clean records leave now; dirty ones once the writer has written them.
    std::vector<Entry*> dirty;
    for (Entry* e : entries) {
      if ((MetaOf(reinterpret_cast<float*>(e) + kHeaderFloats + kMetaFloats).flags & RowMeta::kDirty) != 0) {
        dirty.push_back(e);
      } else {
        store->DropEntry(e);
      }
    }
    if (!dirty.empty()) SubmitWriteBack(store, dirty);
  }
  return absl::OkStatus();
}

void DiskTier::Forget(DiskRowStore* store) {
  absl::MutexLock lock(&mu_);
  stores_.erase(std::remove(stores_.begin(), stores_.end(), store), stores_.end());
}

}  // namespace psflow::ps::table
