// The row stores (row_store.h, disk_store.h): the memory and disk stores give the same records
// through the same calls; the disk store's cache, its batched reads and write-backs, its directory
// rules and its refusals.
#include "ps/server/table/row_store.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "ps/server/table/disk_store.h"

namespace psflow::ps::table {
namespace {

namespace fs = std::filesystem;

constexpr int64_t kFloats = 6;  // a row: dim 3 with one slot

// A fresh directory under the test's temporary directory.
std::string FreshDir(const std::string& name) {
  static std::atomic<int> n{0};
  const fs::path p = fs::path(::testing::TempDir()) /
                     ("row_store_" + std::to_string(getpid()) + "_" + std::to_string(n++) + "_" + name);
  fs::remove_all(p);
  fs::create_directories(p);
  return p.string();
}

int64_t EntryBytes() { return 64 + kFloats * 4; }  // header + meta, then the floats (disk_store.h)

// A tier whose runs are sealed at `run_rows` records (1: every eviction's dirty records are written
// behind it as a file, as a write-back round).
std::shared_ptr<DiskTier> OpenTier(const std::string& dir, int64_t cache_rows, int ps = 0, int64_t run_rows = 1) {
  DiskTierOptions options{dir, cache_rows * EntryBytes(), ps};
  options.run_bytes = run_rows * EntryBytes();
  auto tier = DiskTier::Open(options, nullptr);
  EXPECT_TRUE(tier.ok()) << tier.status();
  return tier.ok() ? *tier : nullptr;
}

// The value a row holds after `updates` writes: a function of (id, updates).
void Fill(float* record, int64_t id, int64_t updates) {
  for (int64_t k = 0; k < kFloats; ++k) record[k] = static_cast<float>(id % 1000) * 0.5f + updates + k * 0.25f;
  MetaOf(record) = RowMeta{updates, id, 0, RowMeta::kDirty | (3u << RowMeta::kGenShift)};
}

// Writes `ids` (creating the absent) as one batch, the way a push does: Acquire, Create, Release.
// A disk store's write-backs behind the call are waited for unless `wait` is false (then the rows
// leaving may still be cached, being written, when the next call comes).
void Write(RowStore* store, const std::vector<int64_t>& ids, std::map<int64_t, int64_t>* updates, bool wait = true) {
  std::vector<float*> records(ids.size());
  ASSERT_TRUE(store->Acquire(ids.data(), ids.size(), records.data()).ok());
  for (size_t i = 0; i < ids.size(); ++i) {
    if (records[i] == nullptr) {
      ASSERT_EQ(updates->count(ids[i]), 0u) << ids[i];
      records[i] = store->Create(ids[i]);
    } else {
      ASSERT_EQ(MetaOf(records[i]).last_step, (*updates)[ids[i]]) << ids[i];
    }
    Fill(records[i], ids[i], ++(*updates)[ids[i]]);
  }
  ASSERT_TRUE(store->Release(records.data(), records.size()).ok());
  if (auto* disk = dynamic_cast<DiskRowStore*>(store); disk != nullptr && wait) {
    ASSERT_TRUE(disk->WaitForWrites().ok());
  }
}

// Every row of a scan, as (id, [last_step, count, floats...]).
std::vector<std::pair<int64_t, std::vector<float>>> ScanAll(const RowStore& store, int64_t part) {
  std::vector<std::pair<int64_t, std::vector<float>>> rows;
  auto scan = store.Scan();
  EXPECT_TRUE(scan.ok()) << scan.status();
  for (;;) {
    absl::StatusOr<bool> more = (*scan)->Next(part, [&](int64_t id, const float* record) {
      std::vector<float> r(record, record + kFloats);
      r.push_back(static_cast<float>(MetaOf(record).last_step));
      r.push_back(static_cast<float>(MetaOf(record).count));
      rows.emplace_back(id, std::move(r));
    });
    EXPECT_TRUE(more.ok()) << more.status();
    if (!more.ok() || !*more) break;
  }
  return rows;
}

class StoreTest : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    if (GetParam()) {
      tier_ = OpenTier(FreshDir("store"), /*cache_rows=*/5);
      auto s = tier_->OpenTable("t", kFloats);
      ASSERT_TRUE(s.ok()) << s.status();
      store_ = *std::move(s);
    } else {
      store_ = std::make_unique<MemoryRowStore>(kFloats);
    }
  }
  std::shared_ptr<DiskTier> tier_;
  std::unique_ptr<RowStore> store_;
};

// Random batches over ids of both signs: every row reads back as written; a scan is in signed id
// order; removal forgets rows everywhere. The disk store's cache holds 5 rows of ~200.
TEST_P(StoreTest, RowsSurviveTheCacheAndScanInIdOrder) {
  std::mt19937_64 rng(3);
  std::vector<int64_t> universe;
  for (int i = 0; i < 200; ++i) universe.push_back(static_cast<int64_t>(rng()));
  universe.push_back(0);
  universe.push_back(-1);
  universe.push_back(INT64_MIN);
  universe.push_back(INT64_MAX);
  std::map<int64_t, int64_t> updates;
  for (int round = 0; round < 60; ++round) {
    std::vector<int64_t> batch = universe;
    std::shuffle(batch.begin(), batch.end(), rng);
    batch.resize(1 + rng() % 5);
    // Every other round without waiting: a row may come back while its run is written.
    Write(store_.get(), batch, &updates, /*wait=*/round % 2 == 0);
  }
  EXPECT_EQ(store_->size(), static_cast<int64_t>(updates.size()));
  // Remove a few rows (from cache and disk).
  std::vector<int64_t> removed;
  for (auto it = updates.begin(); it != updates.end();) {
    if (it->first % 3 == 0) {
      removed.push_back(it->first);
      it = updates.erase(it);
    } else {
      ++it;
    }
  }
  ASSERT_TRUE(store_->Erase(removed).ok());
  EXPECT_EQ(store_->size(), static_cast<int64_t>(updates.size()));
  for (size_t start = 0; start < removed.size(); start += 4) {  // batches the cache holds
    const size_t n = std::min<size_t>(4, removed.size() - start);
    std::vector<float*> records(n);
    ASSERT_TRUE(store_->Acquire(removed.data() + start, n, records.data()).ok());
    for (float* r : records) EXPECT_EQ(r, nullptr);
  }
  // Ages and a scan: every row, its value bit for bit, ids ascending.
  std::map<int64_t, int64_t> ages;
  ASSERT_TRUE(store_->ForEachAge([&](int64_t id, int64_t last) { EXPECT_TRUE(ages.emplace(id, last).second); }).ok());
  EXPECT_EQ(ages, updates);
  const auto rows = ScanAll(*store_, 7);
  ASSERT_EQ(rows.size(), updates.size());
  auto want = updates.begin();
  for (const auto& [id, r] : rows) {
    ASSERT_EQ(id, want->first);
    float tmp[kMetaFloats + kFloats];
    Fill(tmp + kMetaFloats, id, want->second);
    EXPECT_EQ(std::memcmp(r.data(), tmp + kMetaFloats, kFloats * sizeof(float)), 0) << id;
    EXPECT_EQ(r[kFloats], static_cast<float>(want->second));
    EXPECT_EQ(r[kFloats + 1], static_cast<float>(id));
    ++want;
  }
  if (GetParam()) {
    const RowStoreStats s = store_->stats();
    EXPECT_GT(s.cache_misses, 0);
    EXPECT_GT(s.disk_rows_read, 0);
    EXPECT_GT(s.disk_rows_written, 0);
    EXPECT_LE(tier_->cache_bytes_used(), 5 * EntryBytes());
  }
}

INSTANTIATE_TEST_SUITE_P(MemoryAndDisk, StoreTest, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "disk" : "memory"; });

TEST(DiskStore, CountsHitsMissesReadsAndWrites) {
  auto tier = OpenTier(FreshDir("counts"), /*cache_rows=*/2);
  auto store = *tier->OpenTable("t", kFloats);
  std::map<int64_t, int64_t> updates;
  Write(store.get(), {1, 2}, &updates);  // 2 misses (absent), 2 created
  Write(store.get(), {3}, &updates);     // 1 miss; row 1 leaves (dirty: written)
  RowStoreStats s = store->stats();
  EXPECT_EQ(s.cache_hits, 0);
  EXPECT_EQ(s.cache_misses, 3);
  EXPECT_EQ(s.disk_rows_read, 0);
  EXPECT_EQ(s.disk_rows_written, 1);
  Write(store.get(), {3, 1}, &updates);  // 3 hits; 1 read back from disk; row 2 leaves
  s = store->stats();
  EXPECT_EQ(s.cache_hits, 1);
  EXPECT_EQ(s.cache_misses, 4);
  EXPECT_EQ(s.disk_rows_read, 1);
  EXPECT_EQ(s.disk_rows_written, 2);
  EXPECT_EQ(s.rows, 3);
  EXPECT_GE(s.memory_bytes, 2 * EntryBytes());
  ASSERT_TRUE(store->Flush().ok());
  EXPECT_EQ(store->stats().disk_rows_written, 4);  // 3 and 1, dirty in the cache
  ASSERT_TRUE(store->Flush().ok());
  EXPECT_EQ(store->stats().disk_rows_written, 4);  // clean now
}

// CompactAll (a bench's step after a fill) writes the dirty records back and rewrites the files:
// every row reads back as written, from the cache and from disk.
TEST(DiskStore, CompactAllKeepsEveryRow) {
  auto tier = OpenTier(FreshDir("compact"), /*cache_rows=*/3);
  auto a = *tier->OpenTable("a", kFloats);
  auto b = *tier->OpenTable("b", kFloats);
  std::map<int64_t, int64_t> ua, ub;
  for (int64_t start = 0; start < 30; start += 3) Write(a.get(), {start, start + 1, start + 2}, &ua);
  Write(b.get(), {-5, 7}, &ub);
  Write(a.get(), {4, 5}, &ua);  // rows 4 and 5 updated twice, now cached and dirty
  ASSERT_TRUE(tier->CompactAll().ok());
  EXPECT_EQ(a->stats().rows, 30);
  for (int64_t start = 0; start < 30; start += 3) Write(a.get(), {start, start + 1, start + 2}, &ua);  // checks each
  const auto rows = ScanAll(*b, 10);
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[0].first, -5);
  EXPECT_EQ(rows[1].first, 7);
  EXPECT_EQ(ScanAll(*a, 7).size(), 30u);
}

TEST(DiskStore, TablesShareOneCache) {
  auto tier = OpenTier(FreshDir("shared"), /*cache_rows=*/4);
  auto a = *tier->OpenTable("a", kFloats);
  auto b = *tier->OpenTable("emb/part_1", kFloats);  // a name with a slash: one directory
  EXPECT_TRUE(fs::is_directory(fs::path(tier->dir()) / "emb%2Fpart_1"));
  std::map<int64_t, int64_t> ua, ub;
  Write(a.get(), {1, 2, 3, 4}, &ua);
  Write(b.get(), {1, 2}, &ub);  // the cache is full of a's rows, missed as often: b's leave
  EXPECT_EQ(tier->cache_bytes_used(), 4 * EntryBytes());
  EXPECT_EQ(a->stats().disk_rows_written, 0);
  EXPECT_EQ(b->stats().disk_rows_written, 2);
  Write(b.get(), {1, 2}, &ub);  // back from disk, as written; missed twice now: a's 1 and 2 leave
  EXPECT_EQ(b->stats().disk_rows_read, 2);
  EXPECT_EQ(a->stats().disk_rows_written, 2);
  Write(a.get(), {3, 4}, &ua);  // still cached
  EXPECT_EQ(a->stats().disk_rows_read, 0);
  EXPECT_EQ(ScanAll(*b, 10).size(), 2u);
  EXPECT_EQ(ScanAll(*a, 10).size(), 4u);
}

// The policy (disk_store.h): a stream of rows seen once passes through without pushing the cached
// rows out (plain CLOCK would have kept the stream's last 4), and a row missed again gets in.
TEST(DiskStore, RowsSeenOnceDoNotPushOutCachedRows) {
  auto tier = OpenTier(FreshDir("policy"), /*cache_rows=*/4);
  auto store = *tier->OpenTable("t", kFloats);
  std::map<int64_t, int64_t> updates;
  Write(store.get(), {1, 2, 3, 4}, &updates);
  for (int64_t id = 100; id < 140; ++id) Write(store.get(), {id}, &updates);  // each created, each leaves
  EXPECT_EQ(store->stats().disk_rows_written, 40);
  Write(store.get(), {200}, &updates);  // seen once: leaves
  Write(store.get(), {200}, &updates);  // missed again: read, and in over row 1
  EXPECT_EQ(store->stats().disk_rows_read, 1);
  Write(store.get(), {200}, &updates);
  Write(store.get(), {2, 3, 4}, &updates);
  EXPECT_EQ(store->stats().disk_rows_read, 1);  // all hits
  Write(store.get(), {1}, &updates);
  EXPECT_EQ(store->stats().disk_rows_read, 2);
  EXPECT_EQ(ScanAll(*store, 16).size(), updates.size());
}

// Rows that always hit are never read from disk again, so a sketch of reads alone ranks them below
// cold rows read a few times; their second chances count too (disk_store.h), so a stream of cold
// rows, each read from disk twice, does not push them out. A cache of 20 rows; 12 hot rows, a third
// of them hit a round (each used every 3 rounds, with 24 other rows between: LRU alone would lose
// them); 4 cold rows read a round, the stream of 200 cold rows twice, so they count as much as a hot
// row read back once.
TEST(DiskStore, RowsThatAlwaysHitKeepTheirWeight) {
  auto tier = OpenTier(FreshDir("hot"), /*cache_rows=*/20);
  auto store = *tier->OpenTable("t", kFloats);
  std::map<int64_t, int64_t> updates;
  std::vector<int64_t> cold;
  for (int64_t id = 1000; id < 1200; ++id) cold.push_back(id);
  for (size_t k = 0; k < cold.size(); k += 4) Write(store.get(), {cold.begin() + k, cold.begin() + k + 4}, &updates);
  const std::vector<std::vector<int64_t>> hot = {{1, 2, 3, 4}, {5, 6, 7, 8}, {9, 10, 11, 12}};
  for (int k = 0; k < 6; ++k) Write(store.get(), hot[k % 3], &updates);
  int64_t hot_reads[2] = {0, 0}, round = 0;
  for (int pass = 0; pass < 2; ++pass) {
    for (size_t k = 0; k < cold.size(); k += 4, ++round) {
      const int64_t before = store->stats().disk_rows_read;
      Write(store.get(), hot[round % 3], &updates);
      hot_reads[pass] += store->stats().disk_rows_read - before;
      Write(store.get(), {cold.begin() + k, cold.begin() + k + 4}, &updates);  // each read from disk
    }
  }
  // The first pass lets the hot rows, created with no count, gain their weight (a few are read back);
  // in the second none is (3 without the second chances counted).
  EXPECT_LE(hot_reads[0], 12);
  EXPECT_EQ(hot_reads[1], 0);
}

// The sketch counts rows read from disk, not lookups of ids not stored: an id looked up many times
// before it exists (a CTR job's new ids, a fill's pulls) is, once created, a row seen once and
// leaves before the cached rows.
TEST(DiskStore, LookupsOfIdsNotStoredDoNotCountForAdmission) {
  auto tier = OpenTier(FreshDir("absent"), /*cache_rows=*/4);
  auto store = *tier->OpenTable("t", kFloats);
  std::map<int64_t, int64_t> updates;
  Write(store.get(), {1, 2, 3, 4}, &updates);
  for (int k = 0; k < 20; ++k) {
    const int64_t absent = 50;
    float* record = nullptr;
    ASSERT_TRUE(store->Acquire(&absent, 1, &record).ok());
    EXPECT_EQ(record, nullptr);
    ASSERT_TRUE(store->Release(&record, 1).ok());
  }
  Write(store.get(), {50}, &updates);  // created; leaves first
  EXPECT_EQ(store->stats().disk_rows_written, 1);
  Write(store.get(), {1, 2, 3, 4}, &updates);
  EXPECT_EQ(store->stats().disk_rows_read, 0);  // all still cached
  Write(store.get(), {50}, &updates);           // read back once: now it beats a cached row
  EXPECT_EQ(store->stats().disk_rows_read, 1);
}

// Write-behind (disk_store.h): rows leave the cache while the writer writes them, and calls go on
// meanwhile. Every row reads back as last written, whether it was still cached, being written or
// on disk, and the tier ends with the same rows, bit for bit, as one that writes in the call.
TEST(DiskStore, WriteBehindGivesTheRowsOfWritingInTheCall) {
  std::map<int64_t, int64_t> behind_updates, inline_updates;
  auto behind = OpenTier(FreshDir("behind"), /*cache_rows=*/3);
  auto inline_tier = DiskTier::Open(
      {FreshDir("inline"), 3 * EntryBytes(), 0, false, 3, /*write_behind=*/false, EntryBytes()}, nullptr);
  ASSERT_TRUE(inline_tier.ok());
  auto a = *behind->OpenTable("t", kFloats);
  auto b = *(*inline_tier)->OpenTable("t", kFloats);
  std::mt19937_64 rng(11);
  for (int round = 0; round < 400; ++round) {
    std::vector<int64_t> batch;
    for (int k = 0, n = 1 + static_cast<int>(rng() % 3); k < n; ++k) {
      const int64_t id = static_cast<int64_t>(rng() % 40) - 20;
      if (std::find(batch.begin(), batch.end(), id) == batch.end()) batch.push_back(id);
    }
    Write(a.get(), batch, &behind_updates, /*wait=*/false);  // checks each row read back
    Write(b.get(), batch, &inline_updates);
  }
  ASSERT_TRUE(a->WaitForWrites().ok());
  // Records used while they were written stay until the next eviction, which waits for its writes.
  Write(a.get(), {-20}, &behind_updates);
  Write(b.get(), {-20}, &inline_updates);
  EXPECT_LE(behind->cache_bytes_used(), 3 * EntryBytes());
  EXPECT_GT(a->stats().disk_rows_written, 0);
  EXPECT_EQ(a->stats().rows, b->stats().rows);
  EXPECT_EQ(ScanAll(*a, 7), ScanAll(*b, 7));
  // A table closed while its rows are being written: the close waits for them.
  Write(a.get(), {100, 101, 102}, &behind_updates, /*wait=*/false);
  Write(a.get(), {103, 104, 105}, &behind_updates, /*wait=*/false);
  a.reset();
  EXPECT_TRUE(behind->WaitForWrites().ok());
  EXPECT_EQ(behind->cache_bytes_used(), 0);
}

// Runs (disk_store.h): dirty records leaving the cache wait in their table's open run, in memory,
// until it is sealed. A row read back from the open run is the record that left (no disk read,
// nothing written yet), dirty again; a flush writes the open run and the dirty cache as one file.
TEST(DiskStore, ARowThatLeftIntoTheOpenRunReadsBackFromIt) {
  auto tier = OpenTier(FreshDir("open_run"), /*cache_rows=*/4, 0, /*run_rows=*/100);
  auto store = *tier->OpenTable("t", kFloats);
  std::map<int64_t, int64_t> updates;
  Write(store.get(), {1, 2, 3, 4}, &updates);
  Write(store.get(), {5, 6}, &updates);  // two rows leave, dirty: into the open run
  RowStoreStats s = store->stats();
  EXPECT_EQ(s.disk_rows_written, 0);
  EXPECT_EQ(tier->cache_bytes_used(), 4 * EntryBytes());
  EXPECT_GE(s.memory_bytes, 6 * EntryBytes());  // the cache's four and the run's two
  Write(store.get(), {1, 2, 3, 4}, &updates);   // as last written (Write checks each), none from disk
  Write(store.get(), {5, 6}, &updates);
  s = store->stats();
  EXPECT_GE(s.cache_misses, 6 + 2);  // 6 created; the rows out of the cache came back from the run
  EXPECT_EQ(s.disk_rows_read, 0);
  EXPECT_EQ(s.disk_rows_written, 0);
  std::map<int64_t, int64_t> ages;
  ASSERT_TRUE(store->ForEachAge([&](int64_t id, int64_t last) { EXPECT_TRUE(ages.emplace(id, last).second); }).ok());
  EXPECT_EQ(ages, updates);
  ASSERT_TRUE(store->Flush().ok());
  EXPECT_EQ(store->stats().disk_rows_written, 6);  // every row: the run's and the dirty cache's
  EXPECT_EQ(ScanAll(*store, 4).size(), 6u);
  Write(store.get(), {1, 2, 3}, &updates);  // the two rows the cache did not hold come from disk
  Write(store.get(), {4, 5, 6}, &updates);
  EXPECT_GE(store->stats().disk_rows_read, 2);
  EXPECT_EQ(store->stats().disk_rows_written, 6);
}

// A sealed run is read-only until its file is in: a row missed meanwhile is a copy of the run's
// record, and a row removed meanwhile (a tombstone in the open run) stays removed after the run's
// file, which still holds it, is ingested. The writer is held before the ingest by the test's hook.
TEST(DiskStore, ARunBeingWrittenServesCopiesAndARowRemovedMeanwhileStaysRemoved) {
  absl::Notification at_ingest, go;
  DiskTierOptions options{FreshDir("sealed"), 2 * EntryBytes(), 0};
  options.run_bytes = 2 * EntryBytes();
  options.before_ingest = [&](const std::string&) {
    if (!at_ingest.HasBeenNotified()) at_ingest.Notify();
    go.WaitForNotification();
  };
  auto tier = DiskTier::Open(options, nullptr);
  ASSERT_TRUE(tier.ok()) << tier.status();
  auto store = *(*tier)->OpenTable("t", kFloats);
  std::map<int64_t, int64_t> updates;
  Write(store.get(), {1, 2}, &updates, /*wait=*/false);
  Write(store.get(), {1, 2}, &updates, /*wait=*/false);  // hit: they stay (second chances)
  Write(store.get(), {3, 4}, &updates, /*wait=*/false);  // seen once, 3 and 4 leave: their run is
  at_ingest.WaitForNotification();                       // sealed, written and held before its ingest
  Write(store.get(), {3}, &updates, /*wait=*/false);     // a copy of the run's record, updated
  EXPECT_EQ(store->stats().disk_rows_read, 0);
  EXPECT_EQ(store->stats().cache_misses, 5);  // 4 created, 3 from the run
  ASSERT_TRUE(store->Erase({4}).ok());
  updates.erase(4);
  auto expect_absent = [&](int64_t id) {
    float* record = nullptr;
    ASSERT_TRUE(store->Acquire(&id, 1, &record).ok());
    EXPECT_EQ(record, nullptr) << id;
    ASSERT_TRUE(store->Release(&record, 1).ok());
  };
  auto ages = [&] {
    std::map<int64_t, int64_t> out;
    EXPECT_TRUE(store->ForEachAge([&](int64_t id, int64_t last) { EXPECT_TRUE(out.emplace(id, last).second); }).ok());
    return out;
  };
  expect_absent(4);
  EXPECT_EQ(ages(), updates);  // 3 newer in the cache than in the run; 4 hidden by its tombstone
  go.Notify();
  ASSERT_TRUE(store->WaitForWrites().ok());
  EXPECT_EQ(store->stats().disk_rows_written, 2);  // the run's 3 and 4, now on disk
  expect_absent(4);
  EXPECT_EQ(ages(), updates);
  ASSERT_TRUE(store->Flush().ok());  // the tombstone, and the dirty rows
  expect_absent(4);
  EXPECT_EQ(ages(), updates);
  const auto rows = ScanAll(*store, 10);
  ASSERT_EQ(rows.size(), 3u);
  EXPECT_EQ(rows[0].first, 1);
  EXPECT_EQ(rows[1].first, 2);
  EXPECT_EQ(rows[2].first, 3);
  Write(store.get(), {1, 3}, &updates);  // as last written
  Write(store.get(), {2}, &updates);
  EXPECT_EQ(store->size(), 3);
}

// A level-0 wait (disk_store.h) holds no lock of the tier: while a flush (a checkpoint scan's first
// step) waits for level 0, held there by the test's hook, a miss of another row of its table is read
// from disk (a pull) and another table's rows are written (a push), and both calls return. Before,
// the flush waited under the tier's lock: both calls waited for it (here until the hook's bound).
TEST(DiskStore, AFlushWaitingForLevelZeroLetsOtherCallsGoOn) {
  absl::Notification waiting, go;
  std::atomic<bool> gave_up{false};
  std::atomic<std::thread::id> flusher{};
  DiskTierOptions options{FreshDir("level0"), 4 * EntryBytes(), 0};
  options.run_bytes = 100 * EntryBytes();  // no run is sealed: only the flushes write files
  options.at_level0_wait = [&](const std::string& table) {
    if (std::this_thread::get_id() != flusher.load()) return;
    EXPECT_EQ(table, "t");
    waiting.Notify();
    // The bound ends a failing test instead of hanging it (the calls below waiting behind the lock).
    if (!go.WaitForNotificationWithTimeout(absl::Seconds(20))) gave_up = true;
  };
  auto tier = DiskTier::Open(options, nullptr);
  ASSERT_TRUE(tier.ok()) << tier.status();
  auto store = *(*tier)->OpenTable("t", kFloats);
  auto other = *(*tier)->OpenTable("u", kFloats);
  std::map<int64_t, int64_t> updates, other_updates;
  Write(other.get(), {11, 12, 13, 14}, &other_updates);
  Write(store.get(), {1, 2, 3, 4}, &updates);  // seen once, they leave the cache first: into the open run
  ASSERT_TRUE(store->Flush().ok());            // and to disk
  Write(store.get(), {5}, &updates);           // something for the held flush to write (else it does not wait)
  const int64_t read_before = store->stats().disk_rows_read;
  std::thread flush([&] {
    flusher = std::this_thread::get_id();
    EXPECT_TRUE(store->Flush().ok());
  });
  if (!waiting.WaitForNotificationWithTimeout(absl::Seconds(20))) {
    flush.join();
    FAIL() << "the flush did not reach its level-0 wait";
  }
  const int64_t id = 2;
  float* record = nullptr;
  EXPECT_TRUE(store->Acquire(&id, 1, &record).ok());  // a pull's miss, read from disk
  EXPECT_NE(record, nullptr);
  if (record != nullptr) {
    EXPECT_EQ(MetaOf(record).last_step, updates[2]);
  }
  EXPECT_TRUE(store->Release(&record, 1).ok());                  // (no ASSERT before the join)
  Write(other.get(), {11, 40}, &other_updates, /*wait=*/false);  // a push of another table
  const bool during_the_wait = !gave_up;
  go.Notify();
  flush.join();
  EXPECT_TRUE(during_the_wait) << "the calls waited for the flush's level-0 wait";
  EXPECT_EQ(store->stats().disk_rows_read, read_before + 1);
  Write(store.get(), {1, 2, 3, 4}, &updates);  // as last written
  EXPECT_EQ(ScanAll(*other, 10).size(), 5u);
}

TEST(DiskStore, AFlushWithNothingToWriteDoesNotWaitForLevelZero) {
  std::atomic<int> waits{0};
  DiskTierOptions options{FreshDir("level0_clean"), 4 * EntryBytes(), 0};
  options.run_bytes = 100 * EntryBytes();
  options.at_level0_wait = [&](const std::string&) { ++waits; };
  auto tier = DiskTier::Open(options, nullptr);
  ASSERT_TRUE(tier.ok()) << tier.status();
  auto store = *(*tier)->OpenTable("t", kFloats);
  std::map<int64_t, int64_t> updates;
  Write(store.get(), {1, 2, 3, 4}, &updates);
  ASSERT_TRUE(store->Flush().ok());  // a file: waits (the hook runs)
  EXPECT_EQ(waits.load(), 1);
  ASSERT_TRUE(store->Flush().ok());  // nothing changed since: no file, no wait
  EXPECT_EQ(waits.load(), 1);
}

TEST(DiskStore, RefusesACacheSmallerThanABatch) {
  auto tier = DiskTier::Open({FreshDir("small"), 3 * EntryBytes(), 2}, nullptr);
  ASSERT_TRUE(tier.ok());
  auto store = *(*tier)->OpenTable("clicks", kFloats);
  const std::vector<int64_t> ids = {1, 2, 3, 4};
  std::vector<float*> records(ids.size());
  const absl::Status s = store->Acquire(ids.data(), ids.size(), records.data());
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(s.message().find("ps task 2, table 'clicks'"), std::string::npos) << s;
  EXPECT_NE(s.message().find("--table_cache_bytes=" + std::to_string(3 * EntryBytes())), std::string::npos) << s;
  EXPECT_NE(s.message().find("has 4 rows"), std::string::npos) << s;
  EXPECT_EQ(s.message().find('\n'), std::string::npos);
}

TEST(DiskTier, RefusesAMissingDirectory) {
  const std::string missing = FreshDir("missing") + "/not_there";
  auto tier = DiskTier::Open({missing, 1 << 20, 0}, nullptr);
  EXPECT_EQ(tier.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(tier.status().message().find("--table_dir=" + missing + " does not exist"), std::string::npos)
      << tier.status();
  EXPECT_FALSE(DiskTier::Open({"", 1 << 20, 0}, nullptr).ok());
  EXPECT_FALSE(DiskTier::Open({FreshDir("zero"), 0, 0}, nullptr).ok());
}

TEST(DiskTier, RefusesADirectoryNotWritable) {
  if (geteuid() == 0) GTEST_SKIP() << "root writes anywhere";
  const std::string dir = FreshDir("readonly");
  fs::permissions(dir, fs::perms::owner_read | fs::perms::owner_exec);
  auto tier = DiskTier::Open({dir, 1 << 20, 0}, nullptr);
  fs::permissions(dir, fs::perms::owner_all);
  EXPECT_EQ(tier.status().code(), absl::StatusCode::kPermissionDenied) << tier.status();
}

TEST(DiskTier, RefusesADirectoryHeldByARunningTask) {
  const std::string dir = FreshDir("held");
  auto first = DiskTier::Open({dir, 1 << 20, 1}, nullptr);
  ASSERT_TRUE(first.ok());
  auto second = DiskTier::Open({dir, 1 << 20, 1}, nullptr);
  EXPECT_EQ(second.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(second.status().message().find("held by a running task (pid " + std::to_string(getpid())),
            std::string::npos)
      << second.status();
  EXPECT_TRUE(DiskTier::Open({dir, 1 << 20, 2}, nullptr).ok());  // another task's directory
  first->reset();
  EXPECT_TRUE(DiskTier::Open({dir, 1 << 20, 1}, nullptr).ok());  // released
}

TEST(DiskTier, WipesWhatAStoppedTaskLeft) {
  const std::string dir = FreshDir("left");
  fs::create_directories(fs::path(dir) / "ps_0" / "emb");
  std::ofstream(fs::path(dir) / "ps_0" / "emb" / "000001.sst") << "old rows";
  std::vector<std::string> said;
  auto tier = DiskTier::Open({dir, 1 << 20, 0}, [&](const std::string& line) { said.push_back(line); });
  ASSERT_TRUE(tier.ok());
  EXPECT_FALSE(fs::exists(fs::path(dir) / "ps_0" / "emb"));
  ASSERT_EQ(said.size(), 1u);
  EXPECT_NE(said[0].find("ps task 0: wiped 1 table directory"), std::string::npos) << said[0];
  // A table's rows are gone once it is closed, and a table opens empty.
  auto store = *(*tier)->OpenTable("emb", kFloats);
  std::map<int64_t, int64_t> u;
  Write(store.get(), {5}, &u);
  ASSERT_TRUE(store->Flush().ok());
  store.reset();
  EXPECT_FALSE(fs::exists(fs::path(dir) / "ps_0" / "emb"));
  store = *(*tier)->OpenTable("emb", kFloats);
  EXPECT_EQ(store->size(), 0);
  auto twice = (*tier)->OpenTable("emb", kFloats);  // open already (a model re-initialized): beside it
  ASSERT_TRUE(twice.ok());
  EXPECT_TRUE(fs::is_directory(fs::path(dir) / "ps_0" / "emb.2"));
}

}  // namespace
}  // namespace psflow::ps::table
