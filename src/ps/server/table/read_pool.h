// ps/server/table/read_pool.h — a few threads that run the disk tier's reads side by side
// (disk_store.h): a batch's misses split in key order into parts, one RocksDB MultiGet a part, so
// the device (or the page cache, on another core) serves several reads at once. RocksDB 7.8 as
// Debian builds it has no coroutines (its MultiGet async_io needs folly) and reads a MultiGet's
// blocks one after the other: one read in flight per batch, where an SSD answers many at once.
// Internal to the disk tier.
//
// Thread-safe. The destructor waits for the parts running and joins the threads.
#ifndef PSFLOW_PS_SERVER_TABLE_READ_POOL_H_
#define PSFLOW_PS_SERVER_TABLE_READ_POOL_H_

#include <cstddef>
#include <deque>
#include <thread>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/synchronization/mutex.h"

namespace psflow::ps::table {

class ReadPool {
 public:
  explicit ReadPool(int threads);  // threads >= 0 (0: RunParts runs every part in the caller)
  ~ReadPool();
  ReadPool(const ReadPool&) = delete;
  ReadPool& operator=(const ReadPool&) = delete;

  int threads() const { return static_cast<int>(threads_.size()); }
  // part(k) for k in [0, parts), parts 1.. on the pool's threads and part 0 in the caller; returns
  // when every part has returned. Parts must not throw.
  void RunParts(size_t parts, absl::FunctionRef<void(size_t)> part);

 private:
  struct Job;
  void Loop();

  absl::Mutex mu_;
  std::deque<std::pair<Job*, size_t>> queue_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;
};

}  // namespace psflow::ps::table

#endif  // PSFLOW_PS_SERVER_TABLE_READ_POOL_H_
