// ps/server/table/scan_snapshot.h — what lets a checkpoint's scan of a table shard read the shard as
// it was when the scan started while pushes go on (docs/checkpoints.md#saves-beside-training).
//
// Copy on first write, by the save generations (table_shard.h ScanOptions): a scan of save n starts
// by moving the shard's generation to g = n + 1 (or past), so a row whose stamp is < g has not
// changed since. Before a change stamps a row with the current generation for the first time, the
// shard calls Capture: every open snapshot that started after the row's last change (its stamp <
// the snapshot's g) and whose cursor has not passed the row yet keeps the row's old record (value,
// slots, last step, count) in its side map. The scan then reads, per row, the kept record if there is
// one, else the live record — and skips a live row stamped >= g without a kept record: it was
// created after the scan started. A row removed during the scan leaves its record too (the shard
// keeps it before the removal), read in its place in id order. The side map holds at most the rows changed during the
// scan, each once, and an entry leaves it when the scan reads it; everything goes with the snapshot (scan read to the
// end, or dropped).
//
// Thread-safety: one mutex guards the set and every snapshot in it; Capture comes from the shard's
// writers (under the shard's exclusive lock), Read/Advance from the scan (under the shard's shared
// lock), so a scan never misses a capture of a row it has not read yet.
#ifndef PSFLOW_PS_SERVER_TABLE_SCAN_SNAPSHOT_H_
#define PSFLOW_PS_SERVER_TABLE_SCAN_SNAPSHOT_H_

#include <atomic>
#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/btree_map.h"
#include "absl/synchronization/mutex.h"

namespace psflow::ps::table {

// A row's record as it was: value and slots ((1 + slots)·dim floats), last step and count.
struct KeptRow {
  std::vector<float> floats;
  int64_t last_step = 0;
  int64_t count = 0;
  uint32_t gen = 0;  // its generation stamp then
};

class Snapshot;

class SnapshotSet : public std::enable_shared_from_this<SnapshotSet> {
 public:
  static std::shared_ptr<SnapshotSet> Make() { return std::shared_ptr<SnapshotSet>(new SnapshotSet()); }

  // A snapshot of the shard as it stands: call it under the shard's exclusive lock, right after the
  // shard's generation moved to `start_gen`.
  std::unique_ptr<Snapshot> Open(uint32_t start_gen);
  // Whether any snapshot is open (a writer's fast path; exact under the shard's exclusive lock).
  bool any() const { return open_.load(std::memory_order_acquire) > 0; }
  // Row `id`, stamped `gen`, is about to change: every open snapshot that started after its last
  // change and has not read it yet keeps `floats[0, n)`, `last_step` and `count`.
  void Capture(int64_t id, uint32_t gen, const float* floats, int64_t n, int64_t last_step, int64_t count);

 private:
  friend class Snapshot;
  SnapshotSet() = default;

  mutable absl::Mutex mu_;
  std::vector<Snapshot*> snapshots_ ABSL_GUARDED_BY(mu_);
  std::atomic<int> open_{0};
};

// One open scan's view. Made by SnapshotSet::Open; closes (leaves the set) when destroyed.
class Snapshot {
 public:
  ~Snapshot();
  Snapshot(const Snapshot&) = delete;
  Snapshot& operator=(const Snapshot&) = delete;

  // The generation the scan started at: rows stamped >= it changed (or were made) since.
  uint32_t start_gen() const { return start_gen_; }
  // What the scan reads for row `id` (the next in its ascending order) whose live record has stamp
  // `live_gen`: the kept record (taken out of the side map into *kept; returns kKept), the live one
  // (kLive), or nothing (kSkip: made after the scan started). Moves the cursor past `id`.
  enum Source { kKept, kLive, kSkip };
  Source Read(int64_t id, uint32_t live_gen, KeptRow* kept);
  // The kept rows of ids below `id` not read yet (rows removed since the scan started, which the
  // store no longer yields), ascending, taken out of the side map; every one left when `id` is
  // nullopt (the store's rows are all read). Moves the cursor past them.
  std::vector<std::pair<int64_t, KeptRow>> TakeKeptBefore(std::optional<int64_t> id);
  // Rows in the side map now (tests, stats).
  int64_t kept_rows() const;

 private:
  friend class SnapshotSet;
  Snapshot(std::shared_ptr<SnapshotSet> set, uint32_t start_gen) : set_(std::move(set)), start_gen_(start_gen) {}

  const std::shared_ptr<SnapshotSet> set_;
  const uint32_t start_gen_;
  bool started_ ABSL_GUARDED_BY(set_->mu_) = false;                                  // the cursor has read a row
  int64_t cursor_ ABSL_GUARDED_BY(set_->mu_) = std::numeric_limits<int64_t>::min();  // the last id read
  absl::btree_map<int64_t, KeptRow> kept_ ABSL_GUARDED_BY(set_->mu_);                // ascending ids
};

}  // namespace psflow::ps::table

#endif  // PSFLOW_PS_SERVER_TABLE_SCAN_SNAPSHOT_H_
