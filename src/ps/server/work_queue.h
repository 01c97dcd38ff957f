// ps/server/work_queue.h — the work queue of a job's training files (DeepRec's WorkQueue; the design
// reference's section 12): the files cut into slices (byte ranges of their text, data::CriteoSlice),
// handed to asynchronous workers one at a time as they ask, so a fast worker reads more than a slow
// one. Ps task 0 holds the job's queue; workers reach it through the WorkQueue call
// (PsClient::CallWorkQueue), and the chief puts its state into every checkpoint (metadata key
// "work_queue") and gives it back to ps task 0 on a restore.
//
// Semantics:
//   - A plan: the files, their slices in file order, the number of epochs and whether each epoch's
//     order is shuffled (from the seed and the epoch: WorkOrder). Epoch e hands out every slice once,
//     in WorkOrder(e); then epoch e + 1; after the last epoch the queue is at its end.
//   - Next(worker, seq, fresh): the worker's previous slice is done (it asks when its slice is used
//     up) and it gets the next one: first a slice that went back to the queue; else the slice right
//     after its previous one in the same file, if no one took it yet; else the first slice of the
//     order that does not cut into a file another worker is reading (a file's first slice, or one
//     whose predecessor is done); else the first not right behind another worker's slice (which
//     leaves that worker its run); else the first not taken; or "end". So each
//     worker reads runs of consecutive slices of one file, and a gzip file, which cannot be entered
//     in the middle without inflating what lies before, is inflated about once in all
//     (data::CriteoOpenFiles continues the stream) instead of once per slice. `fresh`: the first call of a new worker
//     process, whose predecessor (killed) may have held a slice unfinished: that slice goes back to the queue first
//     (at-least-once per slice: the examples the dead process read of it are read again). A call repeated with the same
//     `seq` (a retry after a lost answer) gets the same answer again.
//   - Release(worker): a worker that stops before its slice is used up gives it back (first in line).
//   - State() is JSON: the plan and where the queue stands. A held slice is saved as held and goes
//     back to the queue when the state is restored (Restore): a job resumed from a checkpoint reads
//     again the slices its workers held when the checkpoint was taken (at-least-once per slice).
//
// Thread-safe (one mutex). Errors are absl::Status of one line.
#ifndef PSFLOW_PS_SERVER_WORK_QUEUE_H_
#define PSFLOW_PS_SERVER_WORK_QUEUE_H_

#include <cstdint>
#include <deque>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace psflow::ps {

struct WorkSlice {
  int file = 0;       // index into WorkPlan::files
  int64_t begin = 0;  // byte range of the file's text (data::CriteoSlice)
  int64_t end = 0;    // kWorkSliceToEnd: to the end of the file
};
inline constexpr int64_t kWorkSliceToEnd = INT64_MAX;

struct WorkPlan {
  std::vector<std::string> files;
  std::vector<WorkSlice> slices;  // in file order; every file's slices cut it whole
  int64_t num_epochs = 1;
  bool shuffle = false;
  uint64_t seed = 0;
  // 0: the queue (any worker takes the next slice). N > 0: the static split, the usual baseline:
  // worker w of N takes only positions w, w + N, w + 2N, ... of each epoch's order.
  int split_workers = 0;
};

// The slices' indices in the order epoch `epoch` hands them out: 0..n-1, or (shuffle) a permutation
// drawn from (seed, epoch) alone, so every task computes the same order.
std::vector<int> WorkOrder(int num_slices, bool shuffle, uint64_t seed, int64_t epoch);

// `plan`'s slices cut into (file, begin, end), each file's last slice to its end. InvalidArgument
// for a plan without files or slices, a slice naming no file, or a file not cut whole.
absl::Status CheckWorkPlan(const WorkPlan& plan);

// A fresh queue's state for `plan` (what the chief sends to configure ps task 0).
absl::StatusOr<std::string> WorkPlanState(const WorkPlan& plan);

class WorkQueue {
 public:
  struct Taken {
    bool end = false;  // no slice left in any epoch
    int64_t epoch = 0;
    int slice = -1;  // index into the plan's slices
    std::string path;
    int64_t begin = 0, end_offset = 0;
  };
  struct Progress {
    int64_t epoch = 0;                    // the epoch the order is in
    int64_t handed = 0;                   // slices handed out, all epochs (again after a return counts again)
    int64_t held = 0;                     // slices held by workers now
    int64_t total = 0;                    // slices x epochs
    int64_t returned = 0;                 // slices that went back to the queue (a fresh worker, a restore)
    bool end = false;                     // nothing left to hand out
    std::vector<int> holders;             // the workers holding a slice now, ascending
    std::map<int, int64_t> taken_by;      // slices each worker took
    int64_t examples = 0, bad_lines = 0;  // read by the workers, as they reported
  };

  // A new plan (fresh queue), or the state a checkpoint saved (State()'s JSON). With `replace`
  // false, a queue already configured is kept when its plan is the same (a restarted chief of a
  // running job) and refused (FailedPrecondition naming both file lists) when it differs.
  absl::Status Configure(const WorkPlan& plan, bool replace);
  absl::Status Restore(std::string_view state_json, bool replace);
  bool configured() const;

  // FailedPrecondition "not configured" before Configure/Restore.
  // `examples` and `bad_lines`: what the worker read since its last call (summed into progress()).
  absl::StatusOr<Taken> Next(int worker, int64_t seq, bool fresh, int64_t examples = 0, int64_t bad_lines = 0);
  // The worker stops reading before its slice is used up (its training ended by steps while the
  // job's chief may be waiting at the queue's end for the slices still held): the slice goes back to
  // the queue, first in line (read again by a resumed job: at-least-once), and the worker holds none.
  // A worker holding nothing: only its counts are added. Repeating it (a retry) changes nothing more.
  void Release(int worker, int64_t examples = 0, int64_t bad_lines = 0);
  absl::StatusOr<std::string> State() const;
  Progress progress() const;

 private:
  struct Held {
    int64_t epoch = 0;
    int slice = 0;
  };
  struct LastAnswer {
    int64_t seq = -1;
    Taken taken;
  };
  absl::Status ConfigureLocked(const WorkPlan& plan, bool replace) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The next (epoch, slice) to hand out after `previous` (the worker's last slice, if any), or false
  // at the end.
  bool TakeLocked(int worker, const Held* previous, Held* out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The slice of this epoch to hand out (Next's order of preference), or -1 when every one was taken.
  int PickLocked(const Held* previous) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool SameFileLocked(int a, int b) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);  // slices a and b
  bool HeldLocked(int slice) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);         // of epoch_, by a worker
  void NewEpochLocked(int64_t epoch) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  mutable absl::Mutex mu_;
  bool configured_ ABSL_GUARDED_BY(mu_) = false;
  WorkPlan plan_ ABSL_GUARDED_BY(mu_);
  int64_t epoch_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t cursor_ ABSL_GUARDED_BY(mu_) = 0;         // order_'s first position not taken yet
  std::vector<int> order_ ABSL_GUARDED_BY(mu_);     // WorkOrder of epoch_
  std::vector<bool> taken_ ABSL_GUARDED_BY(mu_);    // by slice: handed out in epoch_
  std::deque<Held> returned_ ABSL_GUARDED_BY(mu_);  // handed out first
  std::map<int, Held> held_ ABSL_GUARDED_BY(mu_);   // by worker
  std::map<int, LastAnswer> last_ ABSL_GUARDED_BY(mu_);
  std::map<int, int64_t> taken_by_ ABSL_GUARDED_BY(mu_);
  std::map<int, std::pair<int64_t, int64_t>> split_at_ ABSL_GUARDED_BY(mu_);  // static split: (epoch, position)
  int64_t handed_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t returned_count_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t examples_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t bad_lines_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace psflow::ps

#endif  // PSFLOW_PS_SERVER_WORK_QUEUE_H_
