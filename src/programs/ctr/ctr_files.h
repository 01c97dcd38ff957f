// programs/ctr/ctr_files.h — the ctr model's data from files in Criteo's layout (--train_files,
// --test_files; psflow/data/criteo.h, docs/data-files.md) instead of the synthetic generator.
//
// Two ways to read them:
//   - one fixed order (one process, sync workers): --num_epochs passes over the files, each pass in
//     file order or (--shuffle_files) in an order of the files drawn from (--seed, epoch); global
//     batch s is examples [s·N·B, (s+1)·N·B) of that stream and worker w of N takes its w-th B
//     (CtrFileBatches), so files that `psflow data ctr-files --batch_size=B` wrote give the
//     generator's batches bit for bit and a sync job of N × B reads what one process of N·B reads.
//     Every sync worker reads the whole stream (it keeps its part): parsing costs N times.
//   - the work queue (async workers): slices of the files handed out by ps task 0 as each worker's
//     slice is used up (CtrQueueSlices, ps/server/work_queue.h), so a slow worker reads less.
// Either way a CtrSliceReader reads the slices one after another, a data::CriteoReader per slice,
// the next slice of the same file continuing the last one's stream (data::CriteoOpenFiles).
//
// Each class here is driven by one thread (the readers' own threads read ahead and parse).
#ifndef PSFLOW_PROGRAMS_CTR_CTR_FILES_H_
#define PSFLOW_PROGRAMS_CTR_CTR_FILES_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "ps/server/work_queue.h"
#include "psflow/data/criteo.h"
#include "psflow/data/ctr.h"
#include "psflow/train/options.h"
#include "psflow/train/session.h"

namespace psflow::train {

// A slice of the data and the epoch (pass over the files) it belongs to.
struct EpochSlice {
  data::CriteoSlice slice;
  int64_t epoch = 0;
};
// Where a reader's slices come from. `examples` and `bad_lines`: what was read since the last call
// (the work queue sums them for the job's summary).
struct SliceSource {
  // The next slice to read, or nullopt at the end of the data.
  std::function<absl::StatusOr<std::optional<EpochSlice>>(int64_t examples, int64_t bad_lines)> next;
  // The reader stops before the end of the data (training ended by steps): the slice it was reading
  // goes back (the work queue's Release). Empty: nothing to give back.
  std::function<absl::Status(int64_t examples, int64_t bad_lines)> give_back;
};

// The examples of the slices a source gives, in order: a data::CriteoReader per slice. Bad lines
// are counted over all slices against one --max_bad_lines.
class CtrSliceReader {
 public:
  CtrSliceReader(SliceSource source, data::CriteoReaderOptions options);
  // Up to n examples into ids [n, F], dense [n, D], labels [n]: fewer only at the end of the data
  // (then 0 on every later call). Errors name the file and line.
  absl::StatusOr<int64_t> Read(int64_t n, int64_t* ids, float* dense, float* labels);
  // Reading ends before the end of the data (training ended by steps): the slice being read goes
  // back to the source, so that a chief waiting at the work queue's end for the slices still held
  // does not wait for this one. Later Reads return 0. Once; the end of the data needs no Stop.
  absl::Status Stop();

  int64_t examples_read() const { return examples_done_ + (reader_ ? reader_->examples_read() : 0); }
  int64_t bad_lines() const { return bad_done_ + (reader_ ? reader_->bad_lines() : 0); }
  int64_t slices_read() const { return slices_; }
  int64_t epochs_begun() const { return epochs_begun_; }  // the highest epoch reached, plus one
  bool at_end() const { return end_; }
  const data::CriteoLayout& layout() const { return options_.layout; }

 private:
  SliceSource source_;
  data::CriteoReaderOptions options_;
  std::unique_ptr<data::CriteoReader> reader_;
  int64_t examples_done_ = 0, bad_done_ = 0;          // of the readers closed
  int64_t examples_reported_ = 0, bad_reported_ = 0;  // told to the source
  int64_t slices_ = 0, epochs_begun_ = 0;
  bool end_ = false;
};

// The reader's options of a job: --ctr_dense integers, --ctr_fields categoricals, --max_bad_lines.
data::CriteoReaderOptions CtrReaderOptions(const TrainOptions& options);

// The fixed order's slices: whole files, epoch by epoch (see the header comment).
SliceSource FixedOrderSlices(std::vector<std::string> files, int64_t num_epochs, bool shuffle, uint64_t seed);

// The work queue's plan for `files`: `num_slices` slices in all, spread over the files by their
// size (at least one each; a gzip file's text size is its trailer's), each file's last slice to
// its end. NotFound naming a file that cannot be read.
absl::StatusOr<ps::WorkPlan> MakeCtrWorkPlan(const std::vector<std::string>& files, int64_t num_slices,
                                             int64_t num_epochs, bool shuffle, uint64_t seed);

// The slices the work queue on ps task 0 hands this worker. The chief (is_chief) configures the
// queue with `plan` first (a queue already configured, by a restore or a running job, is kept);
// the others wait (up to wait_secs) until it is configured. At the end of the queue the chief
// waits (up to end_wait_secs, logging) until no other worker holds a slice, so that the job ends
// after every slice was read.
SliceSource QueueSlices(WorkerSession& session, ps::WorkPlan plan, double wait_secs, double end_wait_secs,
                        std::function<void(const std::string&)> log);

// The fixed order's batches: global batch `step` of parts·B examples, of which this reader hands
// out part `part` (one process: part 0 of 1).
class CtrFileBatches {
 public:
  // --train_files, --num_epochs, --shuffle_files, --seed, --batch_size, --max_bad_lines. NotFound /
  // InvalidArgument naming the pattern for an empty list or a glob that matches nothing.
  static absl::StatusOr<std::unique_ptr<CtrFileBatches>> Open(const TrainOptions& options, int part = 0, int parts = 1);

  // This reader's part of global batch `step` into ids [B, F], dense [B, D], labels [B]. Steps are
  // asked in increasing order; a step beyond the next skips the batches between (a resumed run), an
  // earlier one reads the files again from the start. OutOfRange when the files hold fewer than
  // parts·B more examples (the end of the data: the rest, under a global batch, is unused).
  absl::Status Fill(int64_t step, int64_t* ids, float* dense, float* labels);

  int64_t examples_read() const { return reader_->examples_read(); }
  int64_t bad_lines() const { return reader_->bad_lines(); }
  int64_t epochs_begun() const { return reader_->epochs_begun(); }

 private:
  CtrFileBatches() = default;
  absl::Status Reopen();
  TrainOptions options_;
  std::vector<std::string> files_;
  std::unique_ptr<CtrSliceReader> reader_;
  int64_t batch_ = 0;
  int part_ = 0, parts_ = 1;
  int64_t next_step_ = 0;
  std::vector<int64_t> ids_;  // a global batch, when parts > 1
  std::vector<float> dense_, labels_;
};

// The test set of --test_files: its first --ctr_test_examples examples (all of them if fewer),
// without true probabilities (the Bayes figures of a file are unknown).
absl::StatusOr<data::CtrExamples> ReadCtrTestFiles(const TrainOptions& options);

}  // namespace psflow::train

#endif  // PSFLOW_PROGRAMS_CTR_CTR_FILES_H_
