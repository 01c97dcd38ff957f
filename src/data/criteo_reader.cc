// The Criteo-layout reader (psflow/data/criteo.h): one thread reads ahead (opening files, inflating
// gzip, cutting the text into chunks of whole lines within each slice), a pool of threads parses
// chunks, and Read hands out the parsed examples in chunk order.
//
// Chunks are a fixed pool. A chunk's state (under mu_) says who owns its contents:
//   kFree → (reading thread) kWriting → kFilled → (a parsing thread) kParsing → kParsed →
//   (the Read caller) kConsuming → kFree.
// Chunks get sequence numbers as they are filled, and Read takes them strictly in that order, so
// the examples' order does not depend on which parsing thread finished first.
#include <algorithm>
#include <atomic>
#include <cstring>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "data/criteo_internal.h"

namespace psflow::data {
namespace {

using internal::ParsedChunk;
using internal::TextSource;

enum class ChunkState { kFree, kWriting, kFilled, kParsing, kParsed, kConsuming };

struct Chunk {
  std::vector<char> text;  // [0, size): whole lines, the last ending in '\n'
  size_t size = 0;
  int slice = -1;
  int64_t text_offset = 0;  // of text[0] in its file's text
  // A reading error met after this chunk's lines (the reading thread stops there), and the text
  // offset of the line it struck in (-1: no line, e.g. the file did not open).
  absl::Status error;
  int64_t error_offset = -1;
  ParsedChunk parsed;
};

constexpr int kMaxFieldCount = 4096;

}  // namespace

// The stream a reader left at a line start: `source` has read the file's text up to line_start +
// pending.size(); `pending` is text already read from line_start on. No line begins in
// [covered_from, line_start) that the reader which left it did not read (it read through the line
// crossing its slice's end, covered_from).
struct CriteoOpenFiles::State {
  absl::Mutex mu;
  std::string path ABSL_GUARDED_BY(mu);
  std::unique_ptr<TextSource> source ABSL_GUARDED_BY(mu);
  std::string pending ABSL_GUARDED_BY(mu);
  int64_t line_start ABSL_GUARDED_BY(mu) = 0;
  int64_t covered_from ABSL_GUARDED_BY(mu) = 0;
  std::atomic<int64_t> reused{0};
};

CriteoOpenFiles::CriteoOpenFiles() : state_(std::make_unique<State>()) {}
CriteoOpenFiles::~CriteoOpenFiles() = default;
int64_t CriteoOpenFiles::reused() const { return state_->reused; }

class CriteoReader::Impl {
 public:
  Impl(std::vector<CriteoSlice> slices, CriteoReaderOptions options) : slices_(std::move(slices)), options_(options) {
    const int pool = options_.read_ahead_chunks + options_.parse_threads + 2;
    for (int i = 0; i < pool; ++i) chunks_.push_back(std::make_unique<Chunk>());
    absl::MutexLock lock(&mu_);
    state_.assign(pool, ChunkState::kFree);
    seq_.assign(pool, -1);
  }

  ~Impl() {
    {
      absl::MutexLock lock(&mu_);
      stop_ = true;
      changed_.SignalAll();
    }
    for (std::thread& t : threads_) t.join();
  }

  void Start() {
    threads_.emplace_back([this] { ReadAhead(); });
    for (int i = 0; i < options_.parse_threads; ++i) threads_.emplace_back([this] { ParseLoop(); });
  }

  absl::StatusOr<int64_t> Read(int64_t max_examples, int64_t* ids, float* dense, float* labels);

  int64_t examples_read() const { return examples_read_; }
  int64_t bad_lines() const { return bad_lines_; }
  const CriteoLayout& layout() const { return options_.layout; }

 private:
  // Reading thread.
  void ReadAhead();
  // Reads one slice into chunks; false when the reader stops (or reading failed: then the failure
  // was published as a chunk's error).
  bool ReadSlice(int index);
  // The stream options_.open_files kept, positioned for `slice` (carry_ and *chunk_offset set,
  // *need_line_start cleared when the slice's first line is where the stream stands), or null
  // when the file must be opened anew.
  absl::StatusOr<std::unique_ptr<TextSource>> TakeKept(const CriteoSlice& slice, bool* need_line_start,
                                                       int64_t* chunk_offset);
  // Leaves the stream for the next reader: read through line_start + pending.size(), at a line start.
  void Keep(const CriteoSlice& slice, std::unique_ptr<TextSource> source, std::string_view pending, int64_t line_start);
  Chunk* AcquireFree();  // null when stopping
  int Index(const Chunk* c) const {
    for (size_t i = 0; i < chunks_.size(); ++i) {
      if (chunks_[i].get() == c) return static_cast<int>(i);
    }
    return -1;
  }
  void Publish(Chunk* c);
  // Parsing threads.
  void ParseLoop();
  // Read's helpers.
  // `what` at text offset `offset` (-1: none) of chunk c's file, with the file's name and line number.
  absl::Status ErrorAt(const Chunk& c, const absl::Status& what, int64_t offset) const;

  const std::vector<CriteoSlice> slices_;
  const CriteoReaderOptions options_;
  std::vector<std::unique_ptr<Chunk>> chunks_;  // contents owned as state_ says

  absl::Mutex mu_;
  absl::CondVar changed_;  // any state_ change, stop_ or done_
  std::vector<ChunkState> state_ ABSL_GUARDED_BY(mu_);
  std::vector<int64_t> seq_ ABSL_GUARDED_BY(mu_);
  int64_t published_ ABSL_GUARDED_BY(mu_) = 0;  // chunks filled so far (the next sequence number)
  bool done_ ABSL_GUARDED_BY(mu_) = false;      // the reading thread published its last chunk
  bool stop_ ABSL_GUARDED_BY(mu_) = false;

  std::string carry_;  // reading thread: the partial line after the last chunk's cut

  // The Read caller's.
  int64_t next_seq_ = 0;
  int current_ = -1;    // the chunk being handed out
  int64_t handed_ = 0;  // its examples handed out
  // Line numbers without reading a file twice: the slice of the chunks taken so far, the text offset
  // of its first chunk, and the lines of its chunks before the current one.
  int slice_ = -1;
  int64_t slice_offset_ = 0, slice_lines_ = 0;
  absl::Status error_;
  std::atomic<int64_t> examples_read_{0}, bad_lines_{0};

  std::vector<std::thread> threads_;
};

Chunk* CriteoReader::Impl::AcquireFree() {
  absl::MutexLock lock(&mu_);
  for (;;) {
    if (stop_) return nullptr;
    for (size_t i = 0; i < state_.size(); ++i) {
      if (state_[i] == ChunkState::kFree) {
        state_[i] = ChunkState::kWriting;
        return chunks_[i].get();
      }
    }
    changed_.Wait(&mu_);
  }
}

void CriteoReader::Impl::Publish(Chunk* c) {
  const int i = Index(c);
  absl::MutexLock lock(&mu_);
  seq_[i] = published_++;
  state_[i] = ChunkState::kFilled;
  changed_.SignalAll();
}

void CriteoReader::Impl::ReadAhead() {
  for (size_t i = 0; i < slices_.size(); ++i) {
    if (!ReadSlice(static_cast<int>(i))) break;
  }
  absl::MutexLock lock(&mu_);
  done_ = true;
  changed_.SignalAll();
}

bool CriteoReader::Impl::ReadSlice(int index) {
  const CriteoSlice& slice = slices_[index];
  // Publishes `status` (after the lines of `c`, which may be empty) and stops reading.
  auto fail = [&](Chunk* c, absl::Status status, int64_t offset) {
    if (c == nullptr) {  // a chunk of no lines
      if ((c = AcquireFree()) == nullptr) return false;
      c->size = 0;
      c->text_offset = 0;
    }
    c->error = std::move(status);
    c->error_offset = offset;
    c->slice = index;
    Publish(c);
    return false;
  };
  if (slice.begin >= slice.end) return true;
  carry_.clear();
  // A slice not at the file's start begins after the first '\n' at or after begin - 1.
  bool need_line_start = slice.begin > 0;
  int64_t chunk_offset = 0;  // of the next chunk's first byte (carry_ included)
  absl::StatusOr<std::unique_ptr<TextSource>> opened = TakeKept(slice, &need_line_start, &chunk_offset);
  if (!opened.ok()) return fail(nullptr, opened.status(), -1);
  if (*opened == nullptr) {
    opened = TextSource::Open(slice.path);
    if (!opened.ok()) return fail(nullptr, opened.status(), -1);
    if (need_line_start) {
      if (absl::Status s = (*opened)->Skip(slice.begin - 1); !s.ok()) return fail(nullptr, s, -1);
    }
    chunk_offset = (*opened)->offset();
  }
  TextSource& source = **opened;
  bool eof = false;
  const auto chunk_bytes = static_cast<size_t>(options_.chunk_bytes);
  while (need_line_start || (chunk_offset < slice.end && !(eof && carry_.empty()))) {
    Chunk* c = AcquireFree();
    if (c == nullptr) return false;
    c->slice = index;
    c->error = absl::OkStatus();
    c->error_offset = -1;
    if (c->text.size() < std::max(chunk_bytes, 2 * carry_.size()) + 1) {
      c->text.resize(std::max(chunk_bytes, 2 * carry_.size()) + 1);
    }
    char* text = c->text.data();
    size_t len = carry_.size();
    std::memcpy(text, carry_.data(), len);
    carry_.clear();
    size_t cut = 0;
    bool last = false;
    for (;;) {
      const size_t room = c->text.size() - 1;  // one byte kept for a final '\n'
      bool need_more = false;
      if (need_line_start) {
        const char* q = static_cast<const char*>(std::memchr(text, '\n', len));
        if (q == nullptr) {
          chunk_offset += static_cast<int64_t>(len);
          len = 0;
          need_more = !eof;
          if (eof) last = true;
        } else {
          const size_t skip = static_cast<size_t>(q - text) + 1;
          std::memmove(text, text + skip, len - skip);
          len -= skip;
          chunk_offset += static_cast<int64_t>(skip);
          need_line_start = false;
        }
      }
      if (!need_line_start && !last) {
        if (chunk_offset >= slice.end) {  // the next line begins at or after the end
          last = true;
        } else if (slice.end - chunk_offset <= static_cast<int64_t>(len)) {
          // The end is in view: through the '\n' ending the line that holds byte end - 1.
          const auto rel = static_cast<size_t>(slice.end - 1 - chunk_offset);
          const char* q = static_cast<const char*>(std::memchr(text + rel, '\n', len - rel));
          if (q != nullptr) {
            cut = static_cast<size_t>(q - text) + 1;
            last = true;
          } else if (eof) {
            cut = len;
            last = true;
          } else {
            need_more = true;
          }
        } else if (eof) {
          cut = len;
          last = true;
        } else {
          const char* q = static_cast<const char*>(::memrchr(text, '\n', len));
          if (q != nullptr && len == room) {
            cut = static_cast<size_t>(q - text) + 1;
          } else {
            need_more = true;  // read until the chunk is full, or a line fits
          }
        }
      }
      if (!need_more) break;
      if (len == room) {  // a line longer than the chunk: grow it
        c->text.resize(2 * c->text.size());
        text = c->text.data();
        continue;
      }
      absl::StatusOr<size_t> got = source.Read(text + len, c->text.size() - 1 - len);
      if (!got.ok()) {
        const char* q = need_line_start ? nullptr : static_cast<const char*>(::memrchr(text, '\n', len));
        cut = q == nullptr ? 0 : static_cast<size_t>(q - text) + 1;
        c->size = cut;
        c->text_offset = chunk_offset;
        return fail(c, got.status(), chunk_offset + static_cast<int64_t>(cut));
      }
      if (*got == 0) eof = true;
      len += *got;
    }
    if (last && cut == len && cut > 0 && text[cut - 1] != '\n') {
      text[cut++] = '\n';  // the file's last line, which lacked its '\n'
      len = cut;
    }
    if (!last) carry_.assign(text + cut, len - cut);
    if (last && !need_line_start) {
      Keep(slice, std::move(*opened), std::string_view(text + cut, len - cut),
           chunk_offset + static_cast<int64_t>(cut));
    }
    c->size = cut;
    c->text_offset = chunk_offset;
    chunk_offset += static_cast<int64_t>(cut);
    Publish(c);
    if (last) break;
  }
  return true;
}

absl::StatusOr<std::unique_ptr<TextSource>> CriteoReader::Impl::TakeKept(const CriteoSlice& slice,
                                                                         bool* need_line_start, int64_t* chunk_offset) {
  if (options_.open_files == nullptr || slice.begin == 0) return nullptr;
  CriteoOpenFiles::State& kept = *options_.open_files->state_;
  absl::MutexLock lock(&kept.mu);
  if (kept.source == nullptr || kept.path != slice.path) return nullptr;
  std::unique_ptr<TextSource> source;
  if (slice.begin >= kept.covered_from && slice.begin <= kept.line_start) {
    // The slice's first line is the one at line_start: nothing begins in [begin, line_start).
    *need_line_start = false;
    *chunk_offset = kept.line_start;
    carry_ = std::move(kept.pending);
  } else if (slice.begin - 1 >= kept.line_start) {  // further on: skip forward to begin - 1
    const int64_t skip = slice.begin - 1 - kept.line_start;
    const auto have = static_cast<int64_t>(kept.pending.size());
    if (skip < have) {
      carry_.assign(kept.pending, static_cast<size_t>(skip));
      *chunk_offset = slice.begin - 1;
    } else {
      if (absl::Status s = kept.source->Skip(skip - have); !s.ok()) {
        kept.source.reset();
        return s;
      }
      *chunk_offset = kept.source->offset();
    }
  } else {
    return nullptr;  // before where the stream stands: open the file anew
  }
  kept.pending.clear();
  ++kept.reused;
  return std::move(kept.source);
}

void CriteoReader::Impl::Keep(const CriteoSlice& slice, std::unique_ptr<TextSource> source, std::string_view pending,
                              int64_t line_start) {
  if (options_.open_files == nullptr) return;
  CriteoOpenFiles::State& kept = *options_.open_files->state_;
  absl::MutexLock lock(&kept.mu);
  kept.path = slice.path;
  kept.source = std::move(source);
  kept.pending.assign(pending.data(), pending.size());
  kept.line_start = line_start;
  kept.covered_from = slice.end;
}

void CriteoReader::Impl::ParseLoop() {
  for (;;) {
    int pick = -1;
    {
      absl::MutexLock lock(&mu_);
      for (;;) {
        if (stop_) return;
        for (size_t i = 0; i < state_.size(); ++i) {
          if (state_[i] == ChunkState::kFilled && (pick < 0 || seq_[i] < seq_[pick])) pick = static_cast<int>(i);
        }
        if (pick >= 0) break;
        changed_.Wait(&mu_);
      }
      state_[pick] = ChunkState::kParsing;
    }
    Chunk& c = *chunks_[pick];
    internal::ParseCriteoChunk(c.text.data(), c.size, options_.layout, &c.parsed);
    absl::MutexLock lock(&mu_);
    state_[pick] = ChunkState::kParsed;
    changed_.SignalAll();
  }
}

absl::Status CriteoReader::Impl::ErrorAt(const Chunk& c, const absl::Status& what, int64_t offset) const {
  const std::string& path = slices_[c.slice].path;
  int64_t line = 0;
  if (offset >= 0) {
    // Lines before the slice (counted by reading the file only for a slice not at its start), in the
    // slice's earlier chunks, and in this chunk before `offset`.
    const int64_t before = slice_offset_ == 0 ? 0 : internal::LineNumberAt(path, slice_offset_) - 1;
    const auto within = static_cast<size_t>(std::clamp<int64_t>(offset - c.text_offset, 0, c.size));
    if (before >= 0) line = before + slice_lines_ + std::count(c.text.data(), c.text.data() + within, '\n') + 1;
  }
  const std::string where =
      line > 0 ? absl::StrCat("data file ", path, " line ", line, ": ") : absl::StrCat("data file ", path, ": ");
  return absl::Status(what.code(), absl::StrCat(where, what.message()));
}

absl::StatusOr<int64_t> CriteoReader::Impl::Read(int64_t max_examples, int64_t* ids, float* dense, float* labels) {
  if (!error_.ok()) return error_;
  const int num_fields = options_.layout.num_fields, num_dense = options_.layout.num_dense;
  if (max_examples < 0) {
    return absl::InvalidArgumentError(absl::StrCat("Criteo reader: asked for ", max_examples, " examples"));
  }
  if (max_examples > 0 &&
      (labels == nullptr || (ids == nullptr && num_fields > 0) || (dense == nullptr && num_dense > 0))) {
    return absl::InvalidArgumentError("Criteo reader: an output array (ids, dense or labels) is null; pass all three");
  }
  int64_t n = 0;
  while (n < max_examples) {
    if (current_ < 0) {
      {
        absl::MutexLock lock(&mu_);
        for (;;) {
          for (size_t i = 0; i < state_.size(); ++i) {
            if (seq_[i] == next_seq_ && state_[i] == ChunkState::kParsed) current_ = static_cast<int>(i);
          }
          if (current_ >= 0 || (done_ && published_ == next_seq_)) break;
          changed_.Wait(&mu_);
        }
        if (current_ < 0) break;  // the end of the slices
        state_[current_] = ChunkState::kConsuming;
      }
      handed_ = 0;
      const Chunk& c = *chunks_[current_];
      if (c.slice != slice_) {
        slice_ = c.slice;
        slice_offset_ = c.text_offset;
        slice_lines_ = 0;
      }
      for (const ParsedChunk::BadLine& bad : c.parsed.bad) {
        if (bad_lines_ >= options_.max_bad_lines) {
          const std::string allowance =
              options_.max_bad_lines == 0 ? std::string(" (--max_bad_lines=N skips up to N bad lines)")
                                          : absl::StrCat(" (the ", options_.max_bad_lines + 1,
                                                         "th bad line; --max_bad_lines=", options_.max_bad_lines, ")");
          error_ = ErrorAt(c, absl::InvalidArgumentError(bad.message + allowance), c.text_offset + bad.offset);
          break;
        }
        ++bad_lines_;
      }
    }
    Chunk& c = *chunks_[current_];
    const int64_t k = error_.ok() ? std::min(max_examples - n, c.parsed.examples - handed_) : 0;
    if (k > 0) {
      std::memcpy(ids + n * num_fields, c.parsed.ids.data() + handed_ * num_fields, k * num_fields * sizeof(int64_t));
      std::memcpy(dense + n * num_dense, c.parsed.dense.data() + handed_ * num_dense, k * num_dense * sizeof(float));
      std::memcpy(labels + n, c.parsed.labels.data() + handed_, k * sizeof(float));
      n += k;
      handed_ += k;
    }
    if (handed_ == c.parsed.examples || !error_.ok()) {
      if (error_.ok() && !c.error.ok()) error_ = ErrorAt(c, c.error, c.error_offset);
      slice_lines_ += c.parsed.lines;
      absl::MutexLock lock(&mu_);
      state_[current_] = ChunkState::kFree;
      seq_[current_] = -1;
      changed_.SignalAll();
      current_ = -1;
      ++next_seq_;
      if (!error_.ok()) break;
    }
  }
  examples_read_ += n;
  if (n == 0 && !error_.ok()) return error_;
  return n;
}

CriteoReader::CriteoReader(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
CriteoReader::~CriteoReader() = default;

absl::StatusOr<std::unique_ptr<CriteoReader>> CriteoReader::Open(std::vector<CriteoSlice> slices,
                                                                 CriteoReaderOptions options) {
  const CriteoLayout& layout = options.layout;
  if (layout.num_dense < 0 || layout.num_dense > kMaxFieldCount || layout.num_fields < 0 ||
      layout.num_fields > kMaxFieldCount) {
    return absl::InvalidArgumentError(absl::StrCat("Criteo reader: ", layout.num_dense, " integers and ",
                                                   layout.num_fields, " categoricals; each must be in [0, 4096]"));
  }
  if (options.parse_threads < 1 || options.parse_threads > 256) {
    return absl::InvalidArgumentError(
        absl::StrCat("Criteo reader: parse_threads is ", options.parse_threads, "; it must be in [1, 256]"));
  }
  if (options.chunk_bytes < 4096 || options.chunk_bytes > (int64_t{256} << 20)) {
    return absl::InvalidArgumentError(
        absl::StrCat("Criteo reader: chunk_bytes is ", options.chunk_bytes, "; it must be in [4096, 256 MiB]"));
  }
  if (options.read_ahead_chunks < 1 || options.read_ahead_chunks > 1024) {
    return absl::InvalidArgumentError(
        absl::StrCat("Criteo reader: read_ahead_chunks is ", options.read_ahead_chunks, "; it must be in [1, 1024]"));
  }
  if (options.max_bad_lines < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("Criteo reader: max_bad_lines is ", options.max_bad_lines, "; it must be 0 or more"));
  }
  if (slices.empty()) {
    return absl::InvalidArgumentError("Criteo reader: no data files (the file list is empty)");
  }
  for (const CriteoSlice& s : slices) {
    if (s.path.empty() || s.begin < 0 || s.end < s.begin) {
      return absl::InvalidArgumentError(absl::StrCat("Criteo reader: slice '", s.path, "' [", s.begin, ", ", s.end,
                                                     ") needs a path and 0 <= begin <= end"));
    }
  }
  auto impl = std::make_unique<Impl>(std::move(slices), options);
  impl->Start();
  return std::unique_ptr<CriteoReader>(new CriteoReader(std::move(impl)));
}

absl::StatusOr<int64_t> CriteoReader::Read(int64_t max_examples, int64_t* ids, float* dense, float* labels) {
  return impl_->Read(max_examples, ids, dense, labels);
}
int64_t CriteoReader::examples_read() const { return impl_->examples_read(); }
int64_t CriteoReader::bad_lines() const { return impl_->bad_lines(); }
const CriteoLayout& CriteoReader::layout() const { return impl_->layout(); }

}  // namespace psflow::data
