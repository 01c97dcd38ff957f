// Writing Criteo-layout files (psflow/data/criteo.h): CriteoWriter, and the synthetic generator's
// training stream and test set as such files (`psflow data ctr-files`).
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "psflow/data/criteo.h"

namespace psflow::data {
namespace {

constexpr size_t kFlushBytes = size_t{1} << 20;  // text buffered before each write

absl::Status WriteError(const std::string& path, const char* what) {
  return absl::InternalError(absl::StrCat("cannot ", what, " ", path, ": ", std::strerror(errno)));
}

// Writes examples [first, first + count) of a stream given block by block by `fill(first, count,
// ids, dense, labels)` to `writer`.
template <typename Fill>
absl::Status WriteExamples(const CtrGenerator& generator, int64_t first, int64_t count, Fill fill,
                           CriteoWriter* writer) {
  const int num_fields = generator.num_fields(), num_dense = generator.num_dense();
  constexpr int64_t kBlock = 4096;
  std::vector<int64_t> ids(kBlock * num_fields), counts(num_dense);
  std::vector<float> dense(kBlock * num_dense), labels(kBlock);
  std::string text;
  text.reserve(kFlushBytes + 4096);
  for (int64_t done = 0; done < count;) {
    int64_t block = std::min(kBlock, count - done);
    absl::StatusOr<int64_t> got = fill(first + done, block, ids.data(), dense.data(), labels.data());
    if (!got.ok()) return got.status();
    block = *got;
    for (int64_t i = 0; i < block; ++i) {
      for (int d = 0; d < num_dense; ++d) {
        counts[d] = CtrGenerator::DenseCount(dense[i * num_dense + d]);
        if (counts[d] < 0) {
          return absl::InternalError(absl::StrCat("CTR files: dense value ", dense[i * num_dense + d],
                                                  " is not log(1 + c) of an integer count c"));
        }
      }
      AppendCriteoLine(labels[i], counts, absl::Span<const int64_t>(&ids[i * num_fields], num_fields), &text);
      if (text.size() >= kFlushBytes) {
        if (absl::Status s = writer->Write(text); !s.ok()) return s;
        text.clear();
      }
    }
    done += block;
  }
  return writer->Write(text);
}

}  // namespace

CriteoWriter::~CriteoWriter() {
  if (file_ == nullptr) return;
  if (gzip_) {
    gzclose(static_cast<gzFile>(file_));
  } else {
    std::fclose(static_cast<FILE*>(file_));
  }
  std::remove(temp_path_.c_str());
}

absl::StatusOr<std::unique_ptr<CriteoWriter>> CriteoWriter::Create(std::string path, bool gzip) {
  std::unique_ptr<CriteoWriter> w(new CriteoWriter());
  w->path_ = std::move(path);
  w->temp_path_ = absl::StrCat(w->path_, ".tmp-", ::getpid());
  w->gzip_ = gzip;
  if (gzip) {
    w->file_ = gzopen(w->temp_path_.c_str(), "wb1");
    if (w->file_ != nullptr) gzbuffer(static_cast<gzFile>(w->file_), 1 << 18);
  } else {
    w->file_ = std::fopen(w->temp_path_.c_str(), "wb");
  }
  if (w->file_ == nullptr) return WriteError(w->temp_path_, "create");
  return w;
}

absl::Status CriteoWriter::Write(std::string_view lines) {
  if (file_ == nullptr) return absl::FailedPreconditionError(absl::StrCat("writing ", path_, " after Close"));
  if (lines.empty()) return absl::OkStatus();
  if (gzip_) {
    const int n = gzwrite(static_cast<gzFile>(file_), lines.data(), static_cast<unsigned>(lines.size()));
    if (n != static_cast<int>(lines.size())) return WriteError(temp_path_, "write");
  } else if (std::fwrite(lines.data(), 1, lines.size(), static_cast<FILE*>(file_)) != lines.size()) {
    return WriteError(temp_path_, "write");
  }
  return absl::OkStatus();
}

absl::Status CriteoWriter::Close() {
  if (file_ == nullptr) return absl::FailedPreconditionError(absl::StrCat(path_, " is closed already"));
  const bool ok = gzip_ ? gzclose(static_cast<gzFile>(file_)) == Z_OK : std::fclose(static_cast<FILE*>(file_)) == 0;
  file_ = nullptr;
  if (!ok) {
    std::remove(temp_path_.c_str());
    return WriteError(temp_path_, "finish");
  }
  if (std::rename(temp_path_.c_str(), path_.c_str()) != 0) {
    const absl::Status s = WriteError(path_, "rename into");
    std::remove(temp_path_.c_str());
    return s;
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::string>> WriteCtrFiles(const CtrGenerator& generator, const CtrFilesOptions& options) {
  if (options.out_dir.empty()) return absl::InvalidArgumentError("CTR files: --out is empty; give a directory");
  if (options.files < 1 || options.files > 100000) {
    return absl::InvalidArgumentError(
        absl::StrCat("CTR files: --files=", options.files, "; it must be in [1, 100000]"));
  }
  if (options.examples_per_file < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("CTR files: --examples_per_file=", options.examples_per_file, "; it must be at least 1"));
  }
  if (options.batch_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("CTR files: --batch_size=", options.batch_size, "; it must be at least 1"));
  }
  if (options.test_examples < 0) {
    return absl::InvalidArgumentError(absl::StrCat("CTR files: --ctr_test_examples=", options.test_examples,
                                                   "; it must be 0 (no test file) or more"));
  }
  std::error_code ec;
  std::filesystem::create_directories(options.out_dir, ec);
  if (ec) return absl::InternalError(absl::StrCat("CTR files: cannot create ", options.out_dir, ": ", ec.message()));

  const std::string suffix = options.gzip ? ".gz" : "";
  std::vector<std::string> paths;
  for (int64_t f = 0; f < options.files; ++f) {
    paths.push_back(absl::StrFormat("%s/train-%05d%s", options.out_dir, f, suffix));
  }
  if (options.test_examples > 0) paths.push_back(absl::StrCat(options.out_dir, "/test", suffix));

  const int64_t batch = options.batch_size, per_file = options.examples_per_file;
  // Training stream example n = example n % B of FillBatch(0, n / B, B); a block is cut from one batch.
  auto train_fill = [&](int64_t first, int64_t count, int64_t* ids, float* dense,
                        float* labels) -> absl::StatusOr<int64_t> {
    const int64_t step = first / batch, j0 = first % batch;
    const int64_t n = std::min(batch - j0, count);
    if (absl::Status s = generator.FillBatchPart(0, step, j0, n, ids, dense, labels); !s.ok()) return s;
    return n;
  };
  auto test_fill = [&](int64_t first, int64_t count, int64_t* ids, float* dense,
                       float* labels) -> absl::StatusOr<int64_t> {
    if (absl::Status s = generator.FillTest(first, count, ids, dense, labels); !s.ok()) return s;
    return count;
  };

  std::atomic<size_t> next{0};
  absl::Mutex mu;
  absl::Status failure;
  auto work = [&] {
    for (size_t i = next++; i < paths.size(); i = next++) {
      {
        absl::MutexLock lock(&mu);
        if (!failure.ok()) return;
      }
      absl::Status s;
      absl::StatusOr<std::unique_ptr<CriteoWriter>> writer = CriteoWriter::Create(paths[i], options.gzip);
      if (!writer.ok()) {
        s = writer.status();
      } else {
        const bool test = static_cast<int64_t>(i) == options.files;
        s = test ? WriteExamples(generator, 0, options.test_examples, test_fill, writer->get())
                 : WriteExamples(generator, static_cast<int64_t>(i) * per_file, per_file, train_fill, writer->get());
        if (s.ok()) s = (*writer)->Close();
      }
      if (!s.ok()) {
        absl::MutexLock lock(&mu);
        if (failure.ok()) failure = s;
        return;
      }
    }
  };
  int threads = options.threads > 0 ? options.threads : static_cast<int>(std::thread::hardware_concurrency());
  threads = std::clamp<int>(threads, 1, static_cast<int>(paths.size()));
  std::vector<std::thread> pool;
  for (int t = 1; t < threads; ++t) pool.emplace_back(work);
  work();
  for (std::thread& t : pool) t.join();
  if (!failure.ok()) return failure;
  return paths;
}

}  // namespace psflow::data
