// ps/server/table/row_store.h — where a dynamic table's rows live (docs/table-storage.md; DESIGN §11:
// table -> accessor and rule -> storage). The table shard (dynamic_table.h) decides what happens to
// a row (admission, its update, removal) and calls a RowStore for the row's record only; the store
// is the one layer that knows memory from disk.
//
// A record is one unit: RowMeta (last step, push count, flags) followed by
// [w | slot 0 | slot 1 ...], (1 + slots)·dim floats. Stores hand out pointers to w; the meta sits
// just before it (MetaOf). Two stores:
//   MemoryRowStore  today's slabs of records (about 2 MiB each, huge pages) and the id -> record
//                   index (row_index.h); a removed row's record is reused. Nothing is ever evicted.
//   DiskRowStore    (disk_store.h) RocksDB under --table_dir behind a hot-row cache shared by a ps
//                   task's disk tables, bounded in bytes.
// A caller holds records between Acquire/Create and Release (a push, a gather, a load): the store
// keeps them in memory meanwhile (the disk store pins them in its cache); after Release a record
// pointer must not be used.
//
// Flags: kDirty — the record differs from the store's copy below the cache (disk: written back when
// it leaves the cache). The flags word's upper 24 bits hold the row's save generation (GenOf): the
// shard's current generation when the row last changed (a push, its admission, a load), kept on disk
// with the record; an incremental save lists the rows changed since a save by it (dynamic_table.h,
// docs/checkpoints.md#increments). The table shard sets both when it changes a record.
//
// Thread-safety: the owning shard serializes changes (Create, Erase, Load) against
// everything else; Acquire/Release/Scan may run concurrently from several readers (the memory
// store's are read-only, the disk store locks its cache).
#ifndef PSFLOW_PS_SERVER_TABLE_ROW_STORE_H_
#define PSFLOW_PS_SERVER_TABLE_ROW_STORE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "ps/server/table/row_index.h"
#include "ps/server/table/row_memory.h"

namespace psflow::ps::table {

// At the start of each record, just before the row's floats.
struct RowMeta {
  int64_t last_step;
  int64_t count;      // pushes that held the id, the admitting one and those before it included
  uint32_t reserved;  // 0 (the record's layout on disk keeps its room)
  uint32_t flags;     // kDirty | generation << kGenShift
  static constexpr uint32_t kDirty = 1;
  static constexpr int kGenShift = 8;
  static constexpr uint32_t kMaxGen = (uint32_t{1} << (32 - kGenShift)) - 1;  // generations are 24 bits
};
// A record's save generation, and the flags with it replaced (gen <= RowMeta::kMaxGen).
inline uint32_t GenOf(const RowMeta& meta) { return meta.flags >> RowMeta::kGenShift; }
inline void SetGen(RowMeta& meta, uint32_t gen) {
  meta.flags = (meta.flags & ((uint32_t{1} << RowMeta::kGenShift) - 1)) | (gen << RowMeta::kGenShift);
}
static_assert(sizeof(RowMeta) == 24 && sizeof(RowMeta) % sizeof(float) == 0);
inline constexpr int64_t kMetaFloats = sizeof(RowMeta) / sizeof(float);
// A record's metadata, from its floats.
inline RowMeta& MetaOf(float* row) { return *reinterpret_cast<RowMeta*>(row - kMetaFloats); }
inline const RowMeta& MetaOf(const float* row) { return *reinterpret_cast<const RowMeta*>(row - kMetaFloats); }

// Counters of a store (cumulative ones since it was made). A memory store has no cache: its
// cache and disk counters stay 0.
struct RowStoreStats {
  int64_t rows = 0;               // rows stored (in memory or on disk)
  int64_t memory_bytes = 0;       // records in memory (a disk store: its cache share, its runs) and index
  int64_t disk_bytes = 0;         // RocksDB's table files (rows still in runs, up to 16 MiB a table, not
                                  // counted)
  int64_t cache_hits = 0;         // rows found in memory by Acquire
  int64_t cache_misses = 0;       // rows Acquire looked up on disk (found or not)
  int64_t disk_rows_read = 0;     // rows read from disk into the cache
  int64_t disk_rows_written = 0;  // dirty rows written back to disk
};

// Reads a store's records in ascending id order, a run at a time (a checkpoint). Borrows the store.
class RecordScan {
 public:
  virtual ~RecordScan() = default;
  // Calls f(id, record) for up to max_rows (>= 1) next rows; false once every row has been read.
  // `record` points at w (MetaOf(record) is valid) and only during the call.
  virtual absl::StatusOr<bool> Next(int64_t max_rows, absl::FunctionRef<void(int64_t, const float*)> f) = 0;
};

class RowStore {
 public:
  virtual ~RowStore() = default;

  // "memory" or "disk".
  virtual const char* kind() const = 0;
  // Rows stored.
  virtual int64_t size() const = 0;
  // The most records one hold may take (the disk store: what its cache holds).
  virtual int64_t max_rows_held() const = 0;

  // records[i] = the record of ids[i] (held until Release), or nullptr when the id is not stored.
  // ids unique. A disk store reads its cache misses in one batch; errors (a cache smaller than the
  // batch, a disk read failure) name the table and hold nothing.
  virtual absl::Status Acquire(const int64_t* ids, size_t n, float** records) = 0;
  // Room for `n` more rows without growing (a hint before Creates).
  virtual void Reserve(int64_t n) = 0;
  // A new record for `id`, which must not be stored; meta and floats uninitialized. Held until
  // Release, as Acquire's.
  virtual float* Create(int64_t id) = 0;
  // Ends the hold on records[0, n) (nullptrs skipped) from Acquire and Create. A disk store then
  // brings its cache back within its bytes, dirty records leaving into the table's run (written to
  // disk as one file when it is full); a write failure (a full disk) names the table.
  virtual absl::Status Release(float* const* records, size_t n) = 0;
  // Reads the records of ids[0, n) without holding them or bringing them into a cache (a
  // checkpoint's increment reads rows it does not use: a disk store reads a row from its cache
  // where cached, else from its runs or the database, and its cache, its policy and its counters
  // stay as they were). f(i, record) for i ascending, record nullptr when ids[i] is not stored;
  // `record` points at w (MetaOf valid) and only during the call. ids unique. Errors (a disk read
  // failure) name the table.
  virtual absl::Status Peek(const int64_t* ids, size_t n, absl::FunctionRef<void(size_t, const float*)> f) const = 0;
  // Removes stored rows `ids` (each stored, not held), from memory and disk.
  virtual absl::Status Erase(const std::vector<int64_t>& ids) = 0;

  // f(id, last_step) for every stored row, in no particular order (a removal pass).
  virtual absl::Status ForEachAge(absl::FunctionRef<void(int64_t, int64_t)> f) const = 0;
  // Rows in ascending id order. Rows created after the call are not read; rows removed meanwhile
  // are skipped (a disk store: those in its cache; rows only on disk are read as they were at the
  // call).
  virtual absl::StatusOr<std::unique_ptr<RecordScan>> Scan() const = 0;

  virtual RowStoreStats stats() const = 0;
};

// Today's memory tier: slabs of records and an open-addressing index.
class MemoryRowStore final : public RowStore {
 public:
  // floats_per_row: (1 + slots)·dim.
  explicit MemoryRowStore(int64_t floats_per_row);

  const char* kind() const override { return "memory"; }
  int64_t size() const override { return index_.size(); }
  int64_t max_rows_held() const override { return INT64_MAX; }
  absl::Status Acquire(const int64_t* ids, size_t n, float** records) override {
    index_.FindMany(ids, n, records);
    return absl::OkStatus();
  }
  void Reserve(int64_t n) override { index_.Reserve(index_.size() + n); }
  float* Create(int64_t id) override;
  absl::Status Release(float* const*, size_t) override { return absl::OkStatus(); }
  absl::Status Erase(const std::vector<int64_t>& ids) override;
  absl::Status Peek(const int64_t* ids, size_t n, absl::FunctionRef<void(size_t, const float*)> f) const override {
    std::vector<float*> records(n);
    index_.FindMany(ids, n, records.data());
    for (size_t i = 0; i < n; ++i) f(i, records[i]);
    return absl::OkStatus();
  }
  absl::Status ForEachAge(absl::FunctionRef<void(int64_t, int64_t)> f) const override;
  absl::StatusOr<std::unique_ptr<RecordScan>> Scan() const override;
  RowStoreStats stats() const override;

  // The record of `id`, or nullptr.
  float* Find(int64_t id) const { return index_.Find(id); }

 private:
  class Scanner;
  const int64_t stride_;     // floats per record [meta | w | slots] (a multiple of 8 bytes)
  const int64_t slab_rows_;  // records per slab (a slab: about 2 MiB, one huge page)
  RowIndex index_;           // id -> the row's floats in its record
  std::vector<RowArray<float>> slabs_;
  int64_t last_slab_used_ = 0;  // records handed out of slabs_.back()
  std::vector<float*> free_records_;
};

}  // namespace psflow::ps::table

#endif  // PSFLOW_PS_SERVER_TABLE_ROW_STORE_H_
