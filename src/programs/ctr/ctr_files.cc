// The ctr model's data from Criteo-layout files (programs/ctr/ctr_files.h).
#include "programs/ctr/ctr_files.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <thread>

#include "absl/strings/str_cat.h"
#include "programs/ctr/ctr_single.h"

namespace psflow::train {
namespace {

// Up to n examples (fewer only at the end of the data).
absl::StatusOr<int64_t> ReadUpTo(CtrSliceReader& reader, int64_t n, int64_t* ids, float* dense, float* labels) {
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

// A file's text size: its size, or for gzip the size its trailer gives (mod 2^32, and the last
// member's only: a guess for cutting it, never for reading it).
absl::StatusOr<int64_t> TextSize(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) {
    return absl::NotFoundError(absl::StrCat("data file ", path, ": cannot open it: ", std::strerror(errno)));
  }
  unsigned char magic[2] = {0, 0};
  const size_t got = std::fread(magic, 1, 2, f);
  std::fseek(f, 0, SEEK_END);
  const int64_t size = std::ftell(f);
  int64_t text = size;
  if (got == 2 && magic[0] == 0x1f && magic[1] == 0x8b && size >= 18) {
    unsigned char trailer[4];
    std::fseek(f, -4, SEEK_END);
    if (std::fread(trailer, 1, 4, f) == 4) {
      const int64_t isize =
          int64_t{trailer[0]} | int64_t{trailer[1]} << 8 | int64_t{trailer[2]} << 16 | int64_t{trailer[3]} << 24;
      text = std::max(isize, size);  // a wrapped or multi-member size is at least the compressed one
    }
  }
  std::fclose(f);
  return text;
}

}  // namespace

CtrSliceReader::CtrSliceReader(SliceSource source, data::CriteoReaderOptions options)
    : source_(std::move(source)), options_(options) {
  // The next slice of the file just read continues its stream (a gzip file is not inflated from its
  // start again for every slice).
  if (options_.open_files == nullptr) options_.open_files = std::make_shared<data::CriteoOpenFiles>();
}

absl::StatusOr<int64_t> CtrSliceReader::Read(int64_t n, int64_t* ids, float* dense, float* labels) {
  while (!end_) {
    if (reader_ != nullptr) {
      absl::StatusOr<int64_t> got = reader_->Read(n, ids, dense, labels);
      if (!got.ok()) return got.status();
      if (*got > 0) return got;
      examples_done_ += reader_->examples_read();
      bad_done_ += reader_->bad_lines();
      reader_.reset();
    }
    const int64_t examples = examples_done_ - examples_reported_, bad = bad_done_ - bad_reported_;
    absl::StatusOr<std::optional<EpochSlice>> next = source_.next(examples, bad);
    if (!next.ok()) return next.status();
    examples_reported_ = examples_done_;
    bad_reported_ = bad_done_;
    if (!next->has_value()) {
      end_ = true;
      break;
    }
    data::CriteoReaderOptions options = options_;
    options.max_bad_lines = std::max<int64_t>(options_.max_bad_lines - bad_done_, 0);
    auto reader = data::CriteoReader::Open({(*next)->slice}, options);
    if (!reader.ok()) return reader.status();
    reader_ = *std::move(reader);
    ++slices_;
    epochs_begun_ = std::max(epochs_begun_, (*next)->epoch + 1);
  }
  return 0;
}

absl::Status CtrSliceReader::Stop() {
  if (end_) return absl::OkStatus();
  end_ = true;
  if (reader_ != nullptr) {
    examples_done_ += reader_->examples_read();
    bad_done_ += reader_->bad_lines();
    reader_.reset();
  }
  if (!source_.give_back) return absl::OkStatus();
  const int64_t examples = examples_done_ - examples_reported_, bad = bad_done_ - bad_reported_;
  examples_reported_ = examples_done_;
  bad_reported_ = bad_done_;
  return source_.give_back(examples, bad);
}

data::CriteoReaderOptions CtrReaderOptions(const TrainOptions& options) {
  data::CriteoReaderOptions reader;
  reader.layout = {options.ctr_dense, options.ctr_fields};
  reader.max_bad_lines = options.max_bad_lines;
  return reader;
}

SliceSource FixedOrderSlices(std::vector<std::string> files, int64_t num_epochs, bool shuffle, uint64_t seed) {
  struct Position {
    int64_t epoch = 0, index = 0;
    std::vector<int> order;
  };
  auto at = std::make_shared<Position>();
  SliceSource source;
  source.next = [files = std::move(files), num_epochs, shuffle, seed, at](
                    int64_t, int64_t) -> absl::StatusOr<std::optional<EpochSlice>> {
    const int n = static_cast<int>(files.size());
    while (at->epoch < num_epochs) {
      if (at->index == 0) at->order = ps::WorkOrder(n, shuffle, seed, at->epoch);
      if (at->index < n) {
        EpochSlice next{{files[at->order[at->index]], 0, data::CriteoSlice::kToEnd}, at->epoch};
        ++at->index;
        return std::optional<EpochSlice>(std::move(next));
      }
      ++at->epoch;
      at->index = 0;
    }
    return std::optional<EpochSlice>();
  };
  return source;
}

absl::StatusOr<ps::WorkPlan> MakeCtrWorkPlan(const std::vector<std::string>& files, int64_t num_slices,
                                             int64_t num_epochs, bool shuffle, uint64_t seed) {
  ps::WorkPlan plan;
  plan.files = files;
  plan.num_epochs = num_epochs;
  plan.shuffle = shuffle;
  plan.seed = seed;
  std::vector<int64_t> sizes;
  int64_t total = 0;
  for (const std::string& f : files) {
    auto size = TextSize(f);
    if (!size.ok()) return size.status();
    sizes.push_back(std::max<int64_t>(*size, 1));
    total += sizes.back();
  }
  // File i gets the slices between the rounded cumulative shares of the files before it and its
  // own (so `num_slices` in all when there are no more files), at least one, none under 4 KiB.
  int64_t before = 0, cumulative = 0;
  for (size_t i = 0; i < files.size(); ++i) {
    cumulative += sizes[i];
    const int64_t upto =
        std::llround(static_cast<double>(num_slices) * static_cast<double>(cumulative) / static_cast<double>(total));
    const int64_t k = std::clamp<int64_t>(upto - before, 1, std::max<int64_t>(sizes[i] >> 12, 1));
    before = std::max(before, upto);
    for (int64_t j = 0; j < k; ++j) {
      const int64_t begin = sizes[i] * j / k;
      const int64_t end = j + 1 == k ? ps::kWorkSliceToEnd : sizes[i] * (j + 1) / k;
      plan.slices.push_back({static_cast<int>(i), begin, end});
    }
  }
  return plan;
}

SliceSource QueueSlices(WorkerSession& session, ps::WorkPlan plan, double wait_secs, double end_wait_secs,
                        std::function<void(const std::string&)> log) {
  struct Position {
    int64_t seq = 0;
    bool configured = false, end = false;
  };
  auto at = std::make_shared<Position>();
  SliceSource source;
  source.give_back = [&session, at](int64_t examples, int64_t bad_lines) -> absl::Status {
    if (at->end || !at->configured) return absl::OkStatus();  // holds no slice
    at->end = true;
    ps::WorkQueueCall release;
    release.op = ps::WorkQueueCall::Op::kRelease;
    release.examples = examples;
    release.bad_lines = bad_lines;
    return session.CallWorkQueue(release).status();
  };
  source.next = [&session, plan = std::move(plan), wait_secs, end_wait_secs, log = std::move(log), at](
                    int64_t examples, int64_t bad_lines) -> absl::StatusOr<std::optional<EpochSlice>> {
    if (at->end) return std::optional<EpochSlice>();
    if (!at->configured && session.is_chief()) {
      auto state = ps::WorkPlanState(plan);
      if (!state.ok()) return state.status();
      ps::WorkQueueCall configure;
      configure.op = ps::WorkQueueCall::Op::kConfigure;
      configure.state_json = *std::move(state);
      configure.replace = false;  // a restored or running queue is kept
      auto configured = session.CallWorkQueue(configure);
      if (!configured.ok()) return configured.status();
      log(absl::StrCat("work queue: ", plan.files.size(), " files in ", plan.slices.size(), " slices, ",
                       plan.num_epochs, " epoch(s)", plan.shuffle ? ", shuffled" : "", "; ", configured->handed, " of ",
                       configured->total, " handed out"));
    }
    ps::WorkQueueCall next;
    next.op = ps::WorkQueueCall::Op::kNext;
    next.seq = at->seq;
    next.fresh = at->seq == 0;
    next.examples = examples;
    next.bad_lines = bad_lines;
    const auto start = std::chrono::steady_clock::now();
    auto waited = [&start] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(); };
    absl::StatusOr<ps::WorkQueueAnswer> answer;
    for (;;) {
      answer = session.CallWorkQueue(next);
      if (!answer.ok()) return answer.status();
      if (answer->configured) break;
      if (waited() > wait_secs) {
        return absl::DeadlineExceededError(absl::StrCat("waited ", wait_secs,
                                                        " s for the chief (worker 0) to configure the work queue on "
                                                        "ps task 0 (--init_timeout_secs)"));
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    at->configured = true;
    ++at->seq;
    if (!answer->end) {
      data::CriteoSlice slice{answer->path, answer->begin,
                              answer->end_offset < 0 ? data::CriteoSlice::kToEnd : answer->end_offset};
      return std::optional<EpochSlice>(EpochSlice{std::move(slice), answer->epoch});
    }
    at->end = true;
    if (session.is_chief()) {
      // The job ends when every slice was read: the chief waits for the workers still reading.
      ps::WorkQueueCall state;
      state.op = ps::WorkQueueCall::Op::kState;
      double logged = -10;  // at once, then every 10 s
      while (answer->held > 0) {
        if (waited() > end_wait_secs) {
          log(absl::StrCat("work queue: ", answer->held, " slice(s) still held by worker(s) ", answer->holders[0],
                           answer->holders.size() > 1 ? " and others" : "", " after ", end_wait_secs,
                           " s (--worker_timeout_secs): ending without them"));
          break;
        }
        if (waited() - logged >= 10) {
          logged = waited();
          log(absl::StrCat("work queue: the chief's data ended; waiting for ", answer->held,
                           " slice(s) other workers are reading"));
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
        answer = session.CallWorkQueue(state);
        if (!answer.ok()) return answer.status();
      }
    }
    return std::optional<EpochSlice>();
  };
  return source;
}

absl::StatusOr<std::unique_ptr<CtrFileBatches>> CtrFileBatches::Open(const TrainOptions& options, int part, int parts) {
  std::unique_ptr<CtrFileBatches> b(new CtrFileBatches());
  auto files = data::ExpandCriteoFiles(options.train_files);
  if (!files.ok()) return files.status();
  b->options_ = options;
  b->files_ = *std::move(files);
  b->batch_ = *options.batch_size;
  b->part_ = part;
  b->parts_ = parts;
  if (parts > 1) {
    b->ids_.resize(parts * b->batch_ * options.ctr_fields);
    b->dense_.resize(parts * b->batch_ * options.ctr_dense);
    b->labels_.resize(parts * b->batch_);
  }
  if (auto s = b->Reopen(); !s.ok()) return s;
  return b;
}

absl::Status CtrFileBatches::Reopen() {
  reader_ = std::make_unique<CtrSliceReader>(
      FixedOrderSlices(files_, options_.num_epochs, options_.shuffle_files, options_.seed), CtrReaderOptions(options_));
  next_step_ = 0;
  return absl::OkStatus();
}

absl::Status CtrFileBatches::Fill(int64_t step, int64_t* ids, float* dense, float* labels) {
  if (step < next_step_) {  // a job rolled back to a checkpoint: the stream again from its start
    if (auto s = Reopen(); !s.ok()) return s;
  }
  const int fields = options_.ctr_fields;
  const int64_t global = parts_ * batch_;
  for (; next_step_ <= step; ++next_step_) {  // the batches skipped, then this one (into the same arrays)
    int64_t* to_ids = parts_ > 1 ? ids_.data() : ids;
    float* to_dense = parts_ > 1 ? dense_.data() : dense;
    float* to_labels = parts_ > 1 ? labels_.data() : labels;
    absl::StatusOr<int64_t> n = ReadUpTo(*reader_, global, to_ids, to_dense, to_labels);
    if (!n.ok()) return n.status();
    if (*n < global) {
      return absl::OutOfRangeError(absl::StrCat("the training files end after ", reader_->examples_read(),
                                                " examples, before batch ", next_step_));
    }
  }
  if (parts_ > 1) {
    const int64_t first = part_ * batch_;
    std::copy_n(ids_.data() + first * fields, batch_ * fields, ids);
    std::copy_n(dense_.data() + first * options_.ctr_dense, batch_ * options_.ctr_dense, dense);
    std::copy_n(labels_.data() + first, batch_, labels);
  }
  return absl::OkStatus();
}

absl::StatusOr<data::CtrExamples> ReadCtrTestFiles(const TrainOptions& options) {
  auto files = data::ExpandCriteoFiles(options.test_files);
  if (!files.ok()) return files.status();
  CtrSliceReader reader(FixedOrderSlices(*files, 1, false, 0), CtrReaderOptions(options));
  data::CtrExamples test;
  test.num_fields = options.ctr_fields;
  test.num_dense = options.ctr_dense;
  const int64_t n = options.ctr_test_examples;
  test.ids.resize(n * test.num_fields);
  test.dense.resize(n * test.num_dense);
  test.labels.resize(n);
  absl::StatusOr<int64_t> got = ReadUpTo(reader, n, test.ids.data(), test.dense.data(), test.labels.data());
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
