// psflow/data/criteo.h — training data in Criteo's text layout (Kaggle Display Advertising, the
// Terabyte click logs, and any log written the same way): parsing one line, a reader of whole files
// and of byte ranges of files ("slices") that assembles batches on a thread pool, a writer of lines,
// and the synthetic CTR generator's stream written as such files (docs/data-files.md).
//
// The layout: one example per line, fields separated by one tab:
//   label \t I1 … I_D \t C1 … C_F        (Criteo: D = 13 integers, F = 26 categoricals)
// The label is 0 or 1. An integer is a decimal int64, maybe negative, maybe empty (missing). A
// categorical is a hex string of 1 to 16 digits (either case; Criteo's are 8) or empty. A line ends
// at '\n' (a '\r' before it is dropped); the last line of a file may lack it. Files are plain text or
// gzip (one or more members), told apart by their first two bytes, never by their name.
// Model inputs: dense = log(1 + max(x, 0)) as float (DLRM's preprocessing; missing → 0), id = the
// categorical's 64 bits as int64 (missing → 0), label = 0.0f or 1.0f.
//
// Bad input is an absl::Status of one line naming the file and the line number (counted from 1 in
// the file's text, also inside a slice): a line with the wrong number of fields, a label that is not
// 0 or 1, an integer that is not a decimal int64, a categorical that is not 1..16 hex digits, a
// truncated or corrupt gzip stream, a file that cannot be read, a pattern that matches no file.
// `max_bad_lines` lets a reader skip up to that many bad lines (counted) before failing.
//
// Thread-safety: the free functions are thread-safe. A CriteoReader is driven by one thread (its
// own threads read ahead and parse); different readers are independent. A CriteoWriter is used by
// one thread.
#ifndef PSFLOW_DATA_CRITEO_H_
#define PSFLOW_DATA_CRITEO_H_

#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "psflow/data/ctr.h"

namespace psflow::data {

// Field counts of a line: 1 + num_dense + num_fields fields.
struct CriteoLayout {
  int num_dense = 13;   // D, in [0, 4096]
  int num_fields = 26;  // F, in [0, 4096]
};

// log(1 + max(x, 0)) rounded to float: the model's input for an integer feature x. The synthetic
// generator's dense features are this of integer counts, so files and memory give the same bits.
float CriteoDenseValue(int64_t x);

// Parses one line (without its '\n') into ids[F], dense[D] and *label. InvalidArgument saying what
// is wrong with the line (without file or line number); nothing is guaranteed written then.
absl::Status ParseCriteoLine(std::string_view line, const CriteoLayout& layout, int64_t* ids, float* dense,
                             float* label);

// Appends one line (with its '\n'): label (0 or 1), `counts` as decimal integers and `ids` as
// lowercase hex without leading zeros (id 0 is written "0", which reads back as 0).
void AppendCriteoLine(float label, absl::Span<const int64_t> counts, absl::Span<const int64_t> ids, std::string* out);

// The files of a comma-separated list of glob patterns (glob(3): *, ?, [..]), each pattern's
// matches sorted, in the order of the patterns. InvalidArgument for an empty list; NotFound
// naming the pattern that matches no file.
absl::StatusOr<std::vector<std::string>> ExpandCriteoFiles(std::string_view patterns);

// A byte range [begin, end) of one file's text (for gzip: of its decompressed bytes), read as the
// lines that begin in it: the first line beginning at or after `begin`, through the line that
// crosses `end` (a line beginning exactly at `end` is the next slice's). So slices cutting a file
// at any points read each of its lines exactly once. A gzip slice decompresses from the file's
// start and discards what lies before `begin`.
struct CriteoSlice {
  static constexpr int64_t kToEnd = std::numeric_limits<int64_t>::max();
  std::string path;
  int64_t begin = 0;
  int64_t end = kToEnd;
};
// Whole-file slices of `paths`.
std::vector<CriteoSlice> WholeFiles(const std::vector<std::string>& paths);

// A file a reader leaves open for the next reader of it (CriteoReaderOptions::open_files). A gzip
// file cannot be entered in the middle: a slice that does not begin at the file's start inflates
// all the text before it, so a worker reading slices 0, 1, 2, ... of a file one reader per slice
// would inflate the file's start again for every slice. A reader given this continues the stream
// where the previous reader of the same file stopped when its slice begins at or after that point
// (skipping forward from there), and opens the file anew otherwise. It keeps the last file only.
// The lines read are the same either way. Thread-safe; the readers sharing one use it in turn.
class CriteoOpenFiles {
 public:
  CriteoOpenFiles();
  ~CriteoOpenFiles();
  CriteoOpenFiles(const CriteoOpenFiles&) = delete;
  CriteoOpenFiles& operator=(const CriteoOpenFiles&) = delete;
  int64_t reused() const;  // slices that continued a kept stream instead of opening the file

 private:
  friend class CriteoReader;
  struct State;
  std::unique_ptr<State> state_;
};

struct CriteoReaderOptions {
  CriteoLayout layout;
  // Threads parsing chunks (>= 1). The reader adds one thread reading (and inflating) ahead.
  int parse_threads = 2;
  // Text per chunk: a parsing task's unit and the read-ahead's granularity (a chunk grows to hold a
  // longer line). In [4 KiB, 256 MiB].
  int64_t chunk_bytes = int64_t{1} << 20;
  // Chunks read ahead of the consumer (>= 1): memory is about (this + parse_threads + 1) chunks.
  int read_ahead_chunks = 4;
  // Bad lines skipped (and counted in bad_lines()) before the next one fails the read.
  int64_t max_bad_lines = 0;
  // Where the reader leaves its last file open for the next reader (null: it closes it).
  std::shared_ptr<CriteoOpenFiles> open_files;
};

// Reads the lines of a list of slices in order, as batches of examples. Its reading thread runs
// ahead (opening the next slice's file before the current one is used up) and its parsing threads
// parse chunks of lines into per-chunk arrays that Read copies out, in file order whatever the
// thread count: the examples and their order depend only on the slices. After warm-up no
// allocation happens per example or per batch.
class CriteoReader {
 public:
  // InvalidArgument for options out of range or an empty slice list. Files are opened as the
  // reading thread reaches them: a missing file is an error of the Read that reaches it.
  static absl::StatusOr<std::unique_ptr<CriteoReader>> Open(std::vector<CriteoSlice> slices,
                                                            CriteoReaderOptions options);
  ~CriteoReader();  // stops and joins the threads
  CriteoReader(const CriteoReader&) = delete;
  CriteoReader& operator=(const CriteoReader&) = delete;

  // The next up to `max_examples` examples into ids [n, F], dense [n, D] and labels [n] (row-major,
  // owned by the caller); returns n: below max_examples at the end of the slices (then 0 on every
  // later call), or just before an error. An error (bad input past max_bad_lines, an unreadable or
  // damaged file) is returned by the first call that meets it with nothing else to hand out, and by
  // every later call. The examples handed out before it all come from lines before it, though not
  // every such line: the chunk (about chunk_bytes of text) holding a bad line is not handed out.
  absl::StatusOr<int64_t> Read(int64_t max_examples, int64_t* ids, float* dense, float* labels);

  int64_t examples_read() const;  // examples handed out by Read so far (any thread may ask)
  int64_t bad_lines() const;      // bad lines skipped so far (any thread may ask)
  const CriteoLayout& layout() const;

 private:
  class Impl;
  explicit CriteoReader(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Writes lines to a file, plain or gzip (zlib level 1), through a temporary name renamed into place
// by Close: a file of that name exists only complete.
class CriteoWriter {
 public:
  static absl::StatusOr<std::unique_ptr<CriteoWriter>> Create(std::string path, bool gzip);
  ~CriteoWriter();  // without Close: the temporary file is removed
  CriteoWriter(const CriteoWriter&) = delete;
  CriteoWriter& operator=(const CriteoWriter&) = delete;

  // Appends whole lines (AppendCriteoLine's output).
  absl::Status Write(std::string_view lines);
  absl::Status Close();

 private:
  CriteoWriter() = default;
  std::string path_, temp_path_;
  void* file_ = nullptr;  // FILE* or gzFile
  bool gzip_ = false;
};

// `psflow data ctr-files`: the generator's training stream and test set as files in this layout.
struct CtrFilesOptions {
  std::string out_dir;            // created if absent
  int64_t files = 1;              // train-00000 … train-(files-1)
  int64_t examples_per_file = 0;  // M >= 1
  int64_t batch_size = 1024;      // B: the stream's example n is example n % B of FillBatch(0, n / B, B)
  int64_t test_examples = 65536;  // the test set's size: the first n of the test stream, in `test`
  bool gzip = false;              // ".gz" names, gzip content
  int threads = 0;                // files written at once; 0: the machine's cores
};
// Writes DIR/train-00000[.gz] … and DIR/test[.gz]. Training from the files in order with batch
// size B (one process) sees exactly the batches FillBatch(0, s, B) gives, bit for bit. Returns the
// paths written, the training files first.
absl::StatusOr<std::vector<std::string>> WriteCtrFiles(const CtrGenerator& generator, const CtrFilesOptions& options);

}  // namespace psflow::data

#endif  // PSFLOW_DATA_CRITEO_H_
