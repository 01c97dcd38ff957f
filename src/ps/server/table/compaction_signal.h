// ps/server/table/compaction_signal.h (internal) — a RocksDB EventListener on one disk table's
// database (disk_store.h) that counts its finished compactions and lets a thread wait for the next
// one, up to a deadline: DiskRowStore's level-0 wait is woken by RocksDB instead of polling the
// database's properties. Made by DiskTier::OpenTable (in the database's options before it opens),
// shared by the database and the store. Thread-safe (its own mutex: never the tier's).
#ifndef PSFLOW_PS_SERVER_TABLE_COMPACTION_SIGNAL_H_
#define PSFLOW_PS_SERVER_TABLE_COMPACTION_SIGNAL_H_

#include <cstdint>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "rocksdb/listener.h"

namespace psflow::ps::table {

class CompactionSignal final : public rocksdb::EventListener {
 public:
  // RocksDB's compaction thread, once a compaction's files are installed (level 0 counted anew).
  void OnCompactionCompleted(rocksdb::DB* /*db*/, const rocksdb::CompactionJobInfo& /*info*/) override {
    absl::MutexLock lock(&mu_);
    ++completed_;
  }

  // Compactions finished so far.
  int64_t completed() const ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    return completed_;
  }

  // Until more than `seen` compactions have finished, or `deadline`: true if they have.
  bool AwaitMoreThan(int64_t seen, absl::Time deadline) const ABSL_LOCKS_EXCLUDED(mu_) {
    const Waiter waiter{this, seen};
    absl::MutexLock lock(&mu_);
    return mu_.AwaitWithDeadline(absl::Condition(&Waiter::Done, &waiter), deadline);
  }

 private:
  struct Waiter {
    const CompactionSignal* signal;
    int64_t seen;
    static bool Done(const Waiter* w) ABSL_EXCLUSIVE_LOCKS_REQUIRED(w->signal->mu_) {
      return w->signal->completed_ > w->seen;
    }
  };

  mutable absl::Mutex mu_;
  int64_t completed_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace psflow::ps::table

#endif  // PSFLOW_PS_SERVER_TABLE_COMPACTION_SIGNAL_H_
