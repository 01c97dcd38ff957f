// programs/ctr/ctr_files.h — the ctr model's data from files in Criteo's layout (--train_files,
// --test_files; psflow/data/criteo.h, docs/data-files.md) instead of the synthetic generator, for
// one process: global batch s is lines [s·B, (s+1)·B) of the training files read in order, so files
// that `psflow data ctr-files --batch_size=B` wrote give the generator's batches bit for bit.
//
// A CtrFileBatches is driven by one thread (its reader's own threads read ahead and parse).
#ifndef PSFLOW_PROGRAMS_CTR_CTR_FILES_H_
#define PSFLOW_PROGRAMS_CTR_CTR_FILES_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "psflow/data/criteo.h"
#include "psflow/data/ctr.h"
#include "psflow/train/options.h"

namespace psflow::train {

class CtrFileBatches {
 public:
  // --train_files (13 integers, --ctr_fields categoricals per line), --batch_size, --max_bad_lines.
  // NotFound / InvalidArgument naming the pattern for an empty list or a glob that matches nothing.
  static absl::StatusOr<std::unique_ptr<CtrFileBatches>> Open(const TrainOptions& options);

  // Global batch `step` into ids [B, F], dense [B, 13], labels [B]. Steps are asked in increasing
  // order; a step beyond the next skips the batches between (a resumed run). OutOfRange when the
  // files hold fewer than B more examples (the end of the data: the rest, under a batch, is unused).
  absl::Status Fill(int64_t step, int64_t* ids, float* dense, float* labels);

  int64_t examples_read() const { return reader_->examples_read(); }
  int64_t bad_lines() const { return reader_->bad_lines(); }

 private:
  CtrFileBatches() = default;
  std::unique_ptr<data::CriteoReader> reader_;
  int64_t batch_ = 0;
  int64_t next_step_ = 0;
};

// The test set of --test_files: its first --ctr_test_examples examples (all of them if fewer),
// without true probabilities (the Bayes figures of a file are unknown).
absl::StatusOr<data::CtrExamples> ReadCtrTestFiles(const TrainOptions& options);

}  // namespace psflow::train

#endif  // PSFLOW_PROGRAMS_CTR_CTR_FILES_H_
