// The ctr model's data from Criteo-layout files (programs/ctr/ctr_files.h).
#include "programs/ctr/ctr_files.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "programs/ctr/ctr_single.h"

namespace psflow::train {
namespace {

absl::StatusOr<std::unique_ptr<data::CriteoReader>> OpenFiles(const std::string& patterns,
                                                              const TrainOptions& options) {
  absl::StatusOr<std::vector<std::string>> files = data::ExpandCriteoFiles(patterns);
  if (!files.ok()) return files.status();
  data::CriteoReaderOptions reader;
  reader.layout = {kCtrNumDense, options.ctr_fields};
  reader.max_bad_lines = options.max_bad_lines;
  return data::CriteoReader::Open(data::WholeFiles(*files), reader);
}

// Up to n examples (fewer only at the end of the files).
absl::StatusOr<int64_t> ReadUpTo(data::CriteoReader& reader, int64_t n, int64_t* ids, float* dense, float* labels) {
  const int fields = reader.layout().num_fields, num_dense = reader.layout().num_dense;
  int64_t have = 0;
  while (have < n) {
    absl::StatusOr<int64_t> got = reader.Read(n - have, ids + have * fields, dense + have * num_dense, labels + have);
    if (!got.ok()) return got.status();
    if (*got == 0) break;
    have += *got;
  }
  return have;
}

}  // namespace

absl::StatusOr<std::unique_ptr<CtrFileBatches>> CtrFileBatches::Open(const TrainOptions& options) {
  std::unique_ptr<CtrFileBatches> b(new CtrFileBatches());
  auto reader = OpenFiles(options.train_files, options);
  if (!reader.ok()) return reader.status();
  b->reader_ = *std::move(reader);
  b->batch_ = *options.batch_size;
  return b;
}

absl::Status CtrFileBatches::Fill(int64_t step, int64_t* ids, float* dense, float* labels) {
  if (step < next_step_) {
    return absl::InternalError(absl::StrCat("training files: batch ", step, " asked after batch ", next_step_ - 1));
  }
  for (; next_step_ <= step; ++next_step_) {  // the batches skipped, then this one (into the same arrays)
    absl::StatusOr<int64_t> n = ReadUpTo(*reader_, batch_, ids, dense, labels);
    if (!n.ok()) return n.status();
    if (*n < batch_) {
      return absl::OutOfRangeError(absl::StrCat("the training files end after ", reader_->examples_read(),
                                                " examples, before batch ", next_step_));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<data::CtrExamples> ReadCtrTestFiles(const TrainOptions& options) {
  auto reader = OpenFiles(options.test_files, options);
  if (!reader.ok()) return reader.status();
  data::CtrExamples test;
  test.num_fields = options.ctr_fields;
  test.num_dense = kCtrNumDense;
  const int64_t n = options.ctr_test_examples;
  test.ids.resize(n * test.num_fields);
  test.dense.resize(n * test.num_dense);
  test.labels.resize(n);
  absl::StatusOr<int64_t> got = ReadUpTo(**reader, n, test.ids.data(), test.dense.data(), test.labels.data());
  if (!got.ok()) return got.status();
  if (*got == 0) {
    return absl::InvalidArgumentError(absl::StrCat("--test_files='", options.test_files, "' hold no example"));
  }
  test.num_examples = *got;
  test.ids.resize(*got * test.num_fields);
  test.dense.resize(*got * test.num_dense);
  test.labels.resize(*got);
  return test;
}

}  // namespace psflow::train
