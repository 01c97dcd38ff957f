// DiskRowStore: one dynamic table's rows in the disk tier (disk_store.h): its RocksDB database, the
// records it holds in the tier's cache, misses read in a batch, write-back, scans. The tier itself
// (DiskTier: the cache's budget, admission, eviction, the write-behind thread) is disk_store.cc.
#include <algorithm>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "core/check.h"
#include "ps/server/table/compaction_signal.h"
#include "ps/server/table/disk_keys.h"
#include "ps/server/table/disk_store.h"
#include "rocksdb/db.h"
#include "rocksdb/iterator.h"
#include "rocksdb/options.h"
#include "rocksdb/sst_file_writer.h"

namespace psflow::ps::table {
namespace {

namespace fs = std::filesystem;

constexpr size_t kHeaderAhead = 8;  // records whose header line is prefetched ahead in a batch
// A batch's misses are read in parts of at least this many keys side by side (a thread hand-off
// costs ~20 µs of CPU: fewer misses are one MultiGet in the caller, as a 97 %-hit step's ~120).
constexpr size_t kReadPart = 64;
// Ingested files land in level 0 (each spans the table's ids). Ingestion does not stall on level 0
// as writes do, so a file waits while level 0 has this many (RocksDB's slowdown trigger) and a
// compaction is under way (AwaitLevel0).
constexpr uint64_t kMaxLevel0Files = 20;
// A level-0 wait looks at the level again at least this often: a compaction's end wakes it (its
// listener), but RocksDB counts a compaction as running until just after its listeners are called.
constexpr absl::Duration kLevel0Recheck = absl::Seconds(1);
// Rows a Peek reads at once (its copies: a few MiB).
constexpr size_t kPeekRun = 4096;

// Why a record read from the database cannot be used (empty: it can): the read failed, or the
// record is not a row of this table (`record_bytes`: meta and floats).
std::string RecordProblem(const rocksdb::Status& read, size_t bytes, size_t record_bytes) {
  if (!read.ok()) return read.ToString();
  if (bytes != record_bytes) return absl::StrCat("a record of ", bytes, " bytes, not ", record_bytes);
  return "";
}

}  // namespace

DiskRowStore::DiskRowStore(std::shared_ptr<DiskTier> tier, std::string table, std::string dir, int64_t floats_per_row,
                           std::unique_ptr<rocksdb::DB> db, const rocksdb::Options& options,
                           std::shared_ptr<CompactionSignal> compactions)
    : tier_(std::move(tier)),
      table_(std::move(table)),
      dir_(std::move(dir)),
      floats_(floats_per_row),
      db_(std::move(db)),
      options_(std::make_unique<rocksdb::Options>(options)),
      compactions_(std::move(compactions)) {}

DiskRowStore::~DiskRowStore() {
  {
    // This table's records leave the tier's list (a walk of the list: no copy of millions of
    // pointers at the end of a job, when the task's memory peaks).
    // Its runs are dropped: the directory goes with the table (the disk tier is a cache of the
    // checkpoint), so writing them would be wasted.
    absl::MutexLock lock(&tier_->mu_);
    tier_->AwaitWrites();  // the writer holds none of this table's runs after it
    for (DiskTier::List* l : {&tier_->clock_, &tier_->window_}) {
      for (DiskTier::Entry* e = l->head; e != nullptr;) {
        DiskTier::Entry* const next = e->next;
        if (e->owner == this) DropEntry(e);
        e = next;
      }
    }
    if (open_ != nullptr) FreeRun(*open_);
    for (auto& run : sealed_) FreeRun(*run);  // kept by a failed write
    open_.reset();
    sealed_.clear();
    tier_->ReserveRunBytes(tier_->run_bytes_);
  }
  tier_->Forget(this);
  db_.reset();
  std::error_code ec;
  fs::remove_all(dir_, ec);  // a cache of the checkpoint: nothing in it outlives the table
}

absl::Status DiskRowStore::Failed(const char* what, const std::string& why) const {
  // Not Unavailable: clients retry that, and a failed disk does not come back. A full disk is
  // ResourceExhausted, any other failure Internal (both end the ps task: ps_tables.cc).
  const std::string text = absl::StrCat("ps task ", tier_->options_.ps_task, ", table '", table_, "': ", what, " in ",
                                        dir_, " failed: ", why);
  return absl::StrContains(why, "No space left") ? absl::ResourceExhaustedError(text) : absl::InternalError(text);
}

int64_t DiskRowStore::size() const {
  absl::MutexLock lock(&tier_->mu_);
  return rows_;
}

float* DiskRowStore::NewEntry(int64_t id) {
  auto* e = static_cast<DiskTier::Entry*>(tier_->pool_.Allocate(entry_bytes()));
  e->owner = this;
  e->id = id;
  return CacheEntry(e);
}

float* DiskRowStore::CacheEntry(DiskTier::Entry* e) {
  e->pins = 0;
  e->touched = 0;
  e->list = DiskTier::kWindow;
  tier_->PushFront(e);
  tier_->window_bytes_ += entry_bytes();
  tier_->bytes_ += entry_bytes();
  cached_bytes_ += entry_bytes();
  float* record = reinterpret_cast<float*>(e) + DiskTier::kHeaderFloats + kMetaFloats;
  index_.Insert(e->id, record);
  return record;
}

void DiskRowStore::UncacheEntry(DiskTier::Entry* e) {
  tier_->Unlink(e);
  if (e->list == DiskTier::kWindow) tier_->window_bytes_ -= entry_bytes();
  tier_->bytes_ -= entry_bytes();
  cached_bytes_ -= entry_bytes();
  index_.Erase(e->id);
}

void DiskRowStore::DropEntry(DiskTier::Entry* e) {
  UncacheEntry(e);
  tier_->pool_.Free(e);
}

void DiskRowStore::AddToRun(DiskTier::Run& run, int64_t bytes) {
  run.bytes += bytes;
  tier_->run_bytes_ += bytes;
}

DiskTier::Run& DiskRowStore::OpenRun() {
  if (open_ == nullptr) open_ = std::make_unique<DiskTier::Run>();
  return *open_;
}

void DiskRowStore::MoveToRun(DiskTier::Entry* e) {
  UncacheEntry(e);
  e->list = DiskTier::kRun;
  e->prev = e->next = nullptr;
  DiskTier::MetaOfEntry(e).flags &= ~RowMeta::kDirty;  // as it will lie on disk
  DiskTier::Run& run = OpenRun();
  auto [it, added] = run.rows.try_emplace(e->id, e);
  if (!added) {  // a tombstone (a cached record is never in the open run as well)
    if (it->second != nullptr) {
      tier_->pool_.Free(it->second);
      AddToRun(run, -entry_bytes());
      --run.records;
    }
    it->second = e;
  } else {
    AddToRun(run, DiskTier::kRunEntryBytes);
  }
  AddToRun(run, entry_bytes());
  ++run.records;
}

void DiskRowStore::AddTombstone(int64_t id) {
  DiskTier::Run& run = OpenRun();
  auto [it, added] = run.rows.try_emplace(id, nullptr);
  if (added) {
    AddToRun(run, DiskTier::kRunEntryBytes);
  } else if (it->second != nullptr) {
    tier_->pool_.Free(it->second);
    AddToRun(run, -entry_bytes());
    --run.records;
    it->second = nullptr;
  }
}

bool DiskRowStore::TakeFromRuns(int64_t id, float** record) {
  *record = nullptr;
  DiskTier::Entry* e = nullptr;
  DiskTier::Run* const run = FindInRuns(id, &e);
  if (run == nullptr) return false;
  if (e == nullptr) return true;  // removed
  if (run == open_.get()) {
    // Back into the cache as it left it: dirty again (the run no longer holds it).
    open_->rows.erase(id);
    AddToRun(*open_, -(entry_bytes() + DiskTier::kRunEntryBytes));
    --open_->records;
    DiskTier::MetaOfEntry(e).flags |= RowMeta::kDirty;
    *record = CacheEntry(e);
    return true;
  }
  // A copy: the writer reads the run's block. Clean: the run puts these bytes on disk.
  *record = NewEntry(id);
  const size_t value_bytes = sizeof(RowMeta) + static_cast<size_t>(floats_) * sizeof(float);
  std::memcpy(*record - kMetaFloats, &DiskTier::MetaOfEntry(e), value_bytes);
  return true;
}

void DiskRowStore::FreeRun(DiskTier::Run& run) {
  for (auto& [id, e] : run.rows) {
    if (e != nullptr) tier_->pool_.Free(e);
  }
  tier_->run_bytes_ -= run.bytes;
  run.rows.clear();
  run.bytes = 0;
  run.records = 0;
}

std::vector<DiskRowStore::FileRow> DiskRowStore::SortedRows(const DiskTier::Run& run) {
  std::vector<FileRow> rows;
  rows.reserve(run.rows.size());
  for (const auto& [id, e] : run.rows) {
    rows.emplace_back(id, e == nullptr ? nullptr : &DiskTier::MetaOfEntry(e));
  }
  std::sort(rows.begin(), rows.end(), [](const FileRow& a, const FileRow& b) { return a.first < b.first; });
  return rows;
}

absl::Status DiskRowStore::WriteFile(const std::vector<FileRow>& rows, int64_t file_number) const {
  const std::string path = (fs::path(dir_) / absl::StrCat("run-", file_number, ".sst")).string();
  // Pages written stay in the page cache (invalidate_page_cache off), as a flush's do: the next
  // misses may read them.
  rocksdb::SstFileWriter writer(rocksdb::EnvOptions(), *options_, nullptr, /*invalidate_page_cache=*/false);
  rocksdb::Status s = writer.Open(path);
  const size_t value_bytes = sizeof(RowMeta) + static_cast<size_t>(floats_) * sizeof(float);
  char key[kKeyBytes];
  for (size_t i = 0; i < rows.size() && s.ok(); ++i) {
    KeyOf(rows[i].first, key);
    s = rows[i].second != nullptr
            ? writer.Put(rocksdb::Slice(key, kKeyBytes),
                         rocksdb::Slice(reinterpret_cast<const char*>(rows[i].second), value_bytes))
            : writer.Delete(rocksdb::Slice(key, kKeyBytes));
  }
  if (s.ok()) s = writer.Finish();
  if (s.ok() && tier_->options_.before_ingest) tier_->options_.before_ingest(path);
  if (s.ok()) {
    // Level 0 was waited for by the caller (AwaitLevel0), never here: a flush calls this under the
    // tier's lock.
    rocksdb::IngestExternalFileOptions ingest;
    ingest.move_files = true;           // a link into the database, not a copy
    ingest.write_global_seqno = false;  // the sequence number in the manifest only: the file is not rewritten
    s = db_->IngestExternalFile({path}, ingest);
  }
  if (!s.ok()) {
    std::error_code ec;
    fs::remove(path, ec);
    return Failed("writing rows back to disk", s.ToString());
  }
  return absl::OkStatus();
}

void DiskRowStore::AwaitLevel0(const std::string& what) const {
  if (tier_->options_.at_level0_wait) tier_->options_.at_level0_wait(table_);
  // Level 0's files: each ingest adds one; reads probe them all until a compaction merges them.
  const absl::Time start = absl::Now();
  const absl::Time deadline = start + tier_->options_.level0_wait;
  uint64_t level0 = 0, compacting = 0;
  for (;;) {
    // Counted before the level is looked at: a compaction ending in between is not missed.
    const int64_t seen = compactions_->completed();
    if (!db_->GetIntProperty("rocksdb.num-files-at-level0", &level0) || level0 < kMaxLevel0Files ||
        !db_->GetIntProperty("rocksdb.num-running-compactions", &compacting) || compacting == 0) {
      return;
    }
    const absl::Time now = absl::Now();
    if (now >= deadline) break;
    compactions_->AwaitMoreThan(seen, std::min(deadline, now + kLevel0Recheck));
  }
  const std::string line = absl::StrCat("ps task ", tier_->options_.ps_task, ": table '", table_, "': waited ",
                                        absl::FormatDuration(absl::Now() - start), " for level 0 of ", dir_,
                                        " to come below ", kMaxLevel0Files, " files before ingesting ", what, " (",
                                        level0, " files, ", compacting, " compactions running); ingesting it now");
  if (tier_->log_) {
    tier_->log_(line);
  } else {
    std::cerr << line << std::endl;
  }
}

void DiskRowStore::ReadFromDisk(const int64_t* ids, std::vector<size_t>& missed,
                                std::vector<rocksdb::PinnableSlice>* values,
                                std::vector<rocksdb::Status>* statuses) const {
  // In key order, in parts of at least kReadPart keys read side by side (ReadPool).
  std::sort(missed.begin(), missed.end(), [&](size_t a, size_t b) { return ids[a] < ids[b]; });
  const size_t m = missed.size();
  std::vector<char> keys(m * kKeyBytes);
  std::vector<rocksdb::Slice> slices(m);
  for (size_t k = 0; k < m; ++k) {
    KeyOf(ids[missed[k]], keys.data() + k * kKeyBytes);
    slices[k] = rocksdb::Slice(keys.data() + k * kKeyBytes, kKeyBytes);
  }
  *values = std::vector<rocksdb::PinnableSlice>(m);
  statuses->assign(m, rocksdb::Status());
  // fill_cache stays on: the index and filter partitions a read needs must stay in the block cache
  // (fill_cache off keeps every block out, and each miss read its partitions again). The data
  // blocks go in too, at low priority, and leave first.
  const rocksdb::ReadOptions read;
  const size_t parts =
      std::max<size_t>(1, std::min<size_t>(m / kReadPart, static_cast<size_t>(tier_->readers_.threads()) + 1));
  tier_->readers_.RunParts(parts, [&](size_t part) {
    const size_t begin = m * part / parts, end = m * (part + 1) / parts;
    db_->MultiGet(read, db_->DefaultColumnFamily(), end - begin, slices.data() + begin, values->data() + begin,
                  statuses->data() + begin, /*sorted_input=*/true);
  });
}

absl::Status DiskRowStore::Acquire(const int64_t* ids, size_t n, float** records) {
  // 1. Hits, pinned, under the tier's lock; the misses listed.
  std::vector<size_t> missed;
  {
    absl::MutexLock lock(&tier_->mu_);
    if (!tier_->write_error_.ok()) return tier_->write_error_;
    const int64_t need = static_cast<int64_t>(n) * entry_bytes();
    if (need > tier_->options_.cache_bytes) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "ps task ", tier_->options_.ps_task, ", table '", table_,
          "': --table_cache_bytes=", tier_->options_.cache_bytes, " holds ",
          tier_->options_.cache_bytes / entry_bytes(), " rows of ", entry_bytes(), " bytes but one batch here has ", n,
          " rows (", need, " bytes); raise --table_cache_bytes above that"));
    }
    index_.FindMany(ids, n, records);
    int64_t not_cached = 0;
    for (size_t i = 0; i < n; ++i) {
      // Each hit writes its record's header line: fetched a few ahead, the cache misses overlap.
      if (i + kHeaderAhead < n && records[i + kHeaderAhead] != nullptr) {
        __builtin_prefetch(DiskTier::EntryOf(records[i + kHeaderAhead]), 1);
      }
      if (records[i] == nullptr) {
        ++not_cached;
        // Not cached: a run may hold it (its newest version, or a tombstone), in memory until its file
        // is in. Looked up again in the index first: an id listed twice may have come back already.
        if (open_ == nullptr && sealed_.empty()) {
          missed.push_back(i);
          continue;
        }
        records[i] = index_.Find(ids[i]);
        if (records[i] == nullptr) {
          if (!TakeFromRuns(ids[i], &records[i])) {
            missed.push_back(i);
            continue;
          }
          if (records[i] == nullptr) continue;  // removed: as an id not stored
          tier_->CountUse(this, ids[i]);        // back from a run: a use, as a read from disk
        }
      }
      DiskTier::Entry* e = DiskTier::EntryOf(records[i]);
      e->touched = 1;
      ++e->pins;
    }
    // A row found in a run is a miss (of the cache) without a disk read, as one found in RocksDB's
    // memtable was before runs.
    counters_.cache_misses += not_cached;
    counters_.cache_hits += static_cast<int64_t>(n) - not_cached;
  }
  if (missed.empty()) return absl::OkStatus();

  // 2. The misses read without the tier's lock (other tables' calls go on meanwhile). Nothing changes
  // this table's rows meanwhile: the shard holds its lock (shared by reads, alone by writes) around
  // Acquire and Release, and a concurrent reader can only cache a clean copy of a row (taken once
  // below).
  std::vector<rocksdb::PinnableSlice> values;
  std::vector<rocksdb::Status> statuses;
  ReadFromDisk(ids, missed, &values, &statuses);

  // 3. The rows read become cached records, pinned, under the lock.
  const size_t m = missed.size();
  absl::MutexLock lock(&tier_->mu_);
  const size_t value_bytes = sizeof(RowMeta) + static_cast<size_t>(floats_) * sizeof(float);
  for (size_t k = 0; k < m; ++k) {
    if (statuses[k].IsNotFound()) continue;
    if (const std::string why = RecordProblem(statuses[k], values[k].size(), value_bytes);
        !why.empty()) {  // hold nothing: the rows read so far stay cached, unpinned
      for (size_t i = 0; i < n; ++i) {
        if (records[i] != nullptr) --DiskTier::EntryOf(records[i])->pins;
        records[i] = nullptr;
      }
      return Failed("reading rows from disk", why);
    }
    // Listed twice, or cached meanwhile by another reader of this table: one record.
    if (float* again = index_.Find(ids[missed[k]]); again != nullptr) {
      DiskTier::Entry* e = DiskTier::EntryOf(again);
      e->touched = 1;
      ++e->pins;
      records[missed[k]] = again;
      continue;
    }
    // The sketch counts rows read from disk, not lookups of ids not stored (a fill's, or a CTR job's
    // new ids: twice each, pull and push), which would fill its counters with noise.
    tier_->CountUse(this, ids[missed[k]]);
    float* record = NewEntry(ids[missed[k]]);
    std::memcpy(record - kMetaFloats, values[k].data(), value_bytes);
    DiskTier::EntryOf(record)->pins = 1;
    records[missed[k]] = record;
    ++counters_.disk_rows_read;
  }
  return absl::OkStatus();
}

DiskTier::Run* DiskRowStore::FindInRuns(int64_t id, DiskTier::Entry** e) const {
  const auto holds = [&](DiskTier::Run* run) {
    auto it = run->rows.find(id);
    if (it == run->rows.end()) return false;
    *e = it->second;
    return true;
  };
  if (open_ != nullptr && holds(open_.get())) return open_.get();
  for (auto run = sealed_.rbegin(); run != sealed_.rend(); ++run) {
    if (holds(run->get())) return run->get();
  }
  return nullptr;
}

absl::Status DiskRowStore::Peek(const int64_t* ids, size_t n, absl::FunctionRef<void(size_t, const float*)> f) const {
  // Copies [meta | floats]: a cached record may change or leave once the tier's lock is released.
  // Nothing is pinned, counted or admitted: the cache and its policy stay as they were.
  const size_t stride = static_cast<size_t>(kMetaFloats + floats_);
  const size_t value_bytes = stride * sizeof(float);
  std::vector<float> copies;
  std::vector<uint8_t> stored;
  std::vector<size_t> missed;
  for (size_t begin = 0; begin < n; begin += kPeekRun) {
    const size_t count = std::min(kPeekRun, n - begin);
    const int64_t* part = ids + begin;
    copies.resize(count * stride);
    stored.assign(count, 0);
    missed.clear();
    {
      // 1. Cached rows, then rows in a run (newest first), copied under the lock; the rest listed.
      absl::MutexLock lock(&tier_->mu_);
      if (!tier_->write_error_.ok()) return tier_->write_error_;
      for (size_t i = 0; i < count; ++i) {
        const RowMeta* meta = nullptr;
        if (const float* cached = index_.Find(part[i]); cached != nullptr) {
          meta = &MetaOf(cached);
        } else if (DiskTier::Entry* e = nullptr; FindInRuns(part[i], &e) != nullptr) {
          if (e == nullptr) continue;  // removed
          meta = &DiskTier::MetaOfEntry(e);
        } else {
          missed.push_back(i);
          continue;
        }
        std::memcpy(copies.data() + i * stride, meta, value_bytes);
        stored[i] = 1;
      }
    }
    // 2. The rest from the database, without the lock: their newest version is there (the shard's
    // lock keeps this table's rows still; a concurrent reader only caches clean copies).
    if (!missed.empty()) {
      std::vector<rocksdb::PinnableSlice> values;
      std::vector<rocksdb::Status> statuses;
      ReadFromDisk(part, missed, &values, &statuses);
      for (size_t k = 0; k < missed.size(); ++k) {
        if (statuses[k].IsNotFound()) continue;
        if (const std::string why = RecordProblem(statuses[k], values[k].size(), value_bytes); !why.empty()) {
          return Failed("reading rows from disk", why);
        }
        std::memcpy(copies.data() + missed[k] * stride, values[k].data(), value_bytes);
        stored[missed[k]] = 1;
      }
    }
    for (size_t i = 0; i < count; ++i) {
      f(begin + i, stored[i] != 0 ? copies.data() + i * stride + kMetaFloats : nullptr);
    }
  }
  return absl::OkStatus();
}

void DiskRowStore::Reserve(int64_t n) {
  absl::MutexLock lock(&tier_->mu_);
  index_.Reserve(index_.size() + n);
}

float* DiskRowStore::Create(int64_t id) {
  absl::MutexLock lock(&tier_->mu_);
  if (open_ != nullptr) {
    // A tombstone of it in the open run (removed, now created again): the new record is the newest
    // version and leaves into this run later. (One in a sealed run is older: it stays.)
    if (auto it = open_->rows.find(id); it != open_->rows.end()) {
      CHECK(it->second == nullptr) << "table '" << table_ << "': row " << id << " created while stored";
      open_->rows.erase(it);
      AddToRun(*open_, -DiskTier::kRunEntryBytes);
    }
  }
  float* record = NewEntry(id);
  DiskTier::EntryOf(record)->pins = 1;
  ++rows_;
  return record;
}

absl::Status DiskRowStore::Release(float* const* records, size_t n) {
  absl::MutexLock lock(&tier_->mu_);
  for (size_t i = 0; i < n; ++i) {
    if (i + kHeaderAhead < n && records[i + kHeaderAhead] != nullptr) {
      __builtin_prefetch(DiskTier::EntryOf(records[i + kHeaderAhead]), 1);
    }
    if (records[i] != nullptr) --DiskTier::EntryOf(records[i])->pins;
  }
  return tier_->EvictToBudget();
}

absl::Status DiskRowStore::Erase(const std::vector<int64_t>& ids) {
  absl::MutexLock lock(&tier_->mu_);
  if (!tier_->write_error_.ok()) return tier_->write_error_;
  // A tombstone each in the open run: ingested after every run sealed before, it hides the rows
  // they and the database hold; meanwhile a miss finds it first.
  for (int64_t id : ids) {
    if (float* record = index_.Find(id); record != nullptr) DropEntry(DiskTier::EntryOf(record));
    AddTombstone(id);
  }
  rows_ -= static_cast<int64_t>(ids.size());
  return tier_->SealRuns();
}

absl::Status DiskRowStore::ForEachAge(absl::FunctionRef<void(int64_t, int64_t)> f) const {
  absl::MutexLock lock(&tier_->mu_);
  // Newest first: the cache, the open run, the sealed runs (newest first), the database.
  index_.ForEach([&](int64_t id, float* record) { f(id, MetaOf(record).last_step); });
  absl::flat_hash_set<int64_t> seen;  // ids a run holds (a record or a tombstone)
  std::vector<const DiskTier::Run*> runs;
  if (open_ != nullptr) runs.push_back(open_.get());
  for (auto run = sealed_.rbegin(); run != sealed_.rend(); ++run) runs.push_back(run->get());
  for (const DiskTier::Run* run : runs) {
    for (const auto& [id, e] : run->rows) {
      if (index_.Find(id) != nullptr || !seen.insert(id).second || e == nullptr) continue;
      f(id, DiskTier::MetaOfEntry(e).last_step);
    }
  }
  rocksdb::ReadOptions r;
  r.fill_cache = false;
  std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(r));
  for (it->SeekToFirst(); it->Valid(); it->Next()) {
    const int64_t id = IdOfKey(it->key());
    if (index_.Find(id) != nullptr || seen.contains(id)) continue;  // cached or in a run: newer
    RowMeta meta;
    if (it->value().size() < sizeof(RowMeta)) return Failed("reading rows from disk", "a short record");
    std::memcpy(&meta, it->value().data(), sizeof(RowMeta));
    f(id, meta.last_step);
  }
  return it->status().ok() ? absl::OkStatus() : Failed("reading rows from disk", it->status().ToString());
}

absl::StatusOr<bool> DiskRowStore::HasRowsToWrite() const {
  absl::MutexLock lock(&tier_->mu_);
  if (!tier_->write_error_.ok()) return tier_->write_error_;
  if (open_ != nullptr && open_->records > 0) return true;
  return index_.Any([](int64_t, float* record) { return (MetaOf(record).flags & RowMeta::kDirty) != 0; });
}

absl::Status DiskRowStore::Flush() {
  // Level 0 waited for before the lock is taken (the file is written and ingested under it: its
  // dirty records may change once it is released), and only when there is a file to write.
  absl::StatusOr<bool> any = HasRowsToWrite();
  if (!any.ok()) return any.status();
  if (*any) AwaitLevel0("a flush's file");
  absl::MutexLock lock(&tier_->mu_);
  tier_->AwaitWrites();  // the sealed runs first: this file is newer
  if (!tier_->write_error_.ok()) return tier_->write_error_;
  // The open run and the dirty cached records (they stay cached, clean): one version of an id each.
  std::vector<FileRow> rows = open_ != nullptr ? SortedRows(*open_) : std::vector<FileRow>();
  const size_t from_run = rows.size();
  std::vector<DiskTier::Entry*> dirty;
  index_.ForEach([&](int64_t id, float* record) {
    if ((MetaOf(record).flags & RowMeta::kDirty) != 0) {
      dirty.push_back(DiskTier::EntryOf(record));
      rows.emplace_back(id, &MetaOf(record));
    }
  });
  if (rows.empty()) return absl::OkStatus();
  for (DiskTier::Entry* e : dirty) DiskTier::MetaOfEntry(e).flags &= ~RowMeta::kDirty;  // as it will lie on disk
  const auto by_id = [](const FileRow& a, const FileRow& b) { return a.first < b.first; };
  std::sort(rows.begin() + static_cast<std::ptrdiff_t>(from_run), rows.end(), by_id);
  std::inplace_merge(rows.begin(), rows.begin() + static_cast<std::ptrdiff_t>(from_run), rows.end(), by_id);
  const absl::Status written = WriteFile(rows, next_file_++);
  if (!written.ok()) {
    for (DiskTier::Entry* e : dirty) DiskTier::MetaOfEntry(e).flags |= RowMeta::kDirty;  // still only here
    return written;
  }
  counters_.disk_rows_written += static_cast<int64_t>(dirty.size()) + (open_ != nullptr ? open_->records : 0);
  if (open_ != nullptr) FreeRun(*open_);
  open_.reset();
  tier_->ReserveRunBytes(tier_->run_bytes_);
  return absl::OkStatus();
}

// Every row is on disk once the cache is flushed at the scan's start; the iterator reads the
// database as it was then, and a row cached now is read from the cache.
class DiskRowStore::Scanner final : public RecordScan {
 public:
  Scanner(const DiskRowStore* store, std::unique_ptr<rocksdb::Iterator> it)
      : store_(store), it_(std::move(it)), buffer_(static_cast<size_t>(kMetaFloats + store->floats_)) {
    it_->SeekToFirst();
  }

  absl::StatusOr<bool> Next(int64_t max_rows, absl::FunctionRef<void(int64_t, const float*)> f) override {
    absl::MutexLock lock(&store_->tier_->mu_);
    const size_t value_bytes = buffer_.size() * sizeof(float);
    int64_t read = 0;
    for (; it_->Valid() && read < max_rows; it_->Next()) {
      const int64_t id = IdOfKey(it_->key());
      if (const float* cached = store_->index_.Find(id); cached != nullptr) {
        f(id, cached);
      } else {
        if (const std::string why = RecordProblem(rocksdb::Status::OK(), it_->value().size(), value_bytes);
            !why.empty()) {
          return store_->Failed("reading rows from disk", why);
        }
        std::memcpy(buffer_.data(), it_->value().data(), value_bytes);
        f(id, buffer_.data() + kMetaFloats);
      }
      ++read;
    }
    if (!it_->status().ok()) return store_->Failed("reading rows from disk", it_->status().ToString());
    return read > 0;
  }

 private:
  const DiskRowStore* store_;  // borrowed
  std::unique_ptr<rocksdb::Iterator> it_;
  std::vector<float> buffer_;  // a record read from disk: [meta | floats]
};

absl::StatusOr<std::unique_ptr<RecordScan>> DiskRowStore::Scan() const {
  if (absl::Status s = const_cast<DiskRowStore*>(this)->Flush(); !s.ok()) return s;
  rocksdb::ReadOptions r;
  r.fill_cache = false;
  r.readahead_size = size_t{2} << 20;
  return std::make_unique<Scanner>(this, std::unique_ptr<rocksdb::Iterator>(db_->NewIterator(r)));
}

RowStoreStats DiskRowStore::stats() const {
  RowStoreStats s;
  {
    absl::MutexLock lock(&tier_->mu_);
    s = counters_;
    s.rows = rows_;
    s.memory_bytes = cached_bytes_ + index_.bytes() + (open_ != nullptr ? open_->bytes : 0);
    for (const auto& run : sealed_) s.memory_bytes += run->bytes;  // until its file is in
  }
  uint64_t sst = 0;
  db_->GetIntProperty("rocksdb.total-sst-files-size", &sst);
  s.disk_bytes = static_cast<int64_t>(sst);
  return s;
}

}  // namespace psflow::ps::table
