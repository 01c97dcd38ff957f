// Internal pieces of the Criteo-layout reader (psflow/data/criteo.h) shared by criteo_parse.cc,
// criteo_reader.cc and their tests: the chunk parser and the text sources (plain or gzip files).
#ifndef PSFLOW_SRC_DATA_CRITEO_INTERNAL_H_
#define PSFLOW_SRC_DATA_CRITEO_INTERNAL_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "psflow/data/criteo.h"

namespace psflow::data::internal {

// The examples of one chunk of text, in the reader's reused buffers (they only grow).
struct ParsedChunk {
  struct BadLine {
    int64_t offset = 0;   // of the line's first byte in the chunk's text
    std::string message;  // what is wrong, without file or line
  };
  int64_t lines = 0;          // lines of the text, good and bad
  int64_t examples = 0;       // good lines
  std::vector<int64_t> ids;   // [examples, F]
  std::vector<float> dense;   // [examples, D]
  std::vector<float> labels;  // [examples]
  std::vector<BadLine> bad;   // in text order
};

// Parses text[0, size), whole lines whose last byte is '\n' (size may be 0), into *out; bad lines
// are skipped and listed in out->bad.
void ParseCriteoChunk(const char* text, size_t size, const CriteoLayout& layout, ParsedChunk* out);

// "label, 13 integers and 26 categoricals" for messages.
std::string DescribeLayout(const CriteoLayout& layout);

// A file's text in order: the bytes of a plain file, or the decompressed bytes of a gzip file (one
// or more members), chosen by its first two bytes (1f 8b). Errors name the file.
class TextSource {
 public:
  static absl::StatusOr<std::unique_ptr<TextSource>> Open(const std::string& path);
  virtual ~TextSource() = default;
  // Up to n bytes into dst; 0 at the end of the text. DataLoss for a truncated or corrupt gzip
  // stream; the bytes before the damage were returned by earlier calls.
  virtual absl::StatusOr<size_t> Read(char* dst, size_t n) = 0;
  // Discards the next n bytes of text (fewer if the text ends first).
  virtual absl::Status Skip(int64_t n) = 0;
  virtual bool gzip() const = 0;
  int64_t offset() const { return offset_; }  // bytes of text read or skipped so far

 protected:
  int64_t offset_ = 0;
};

// The number (from 1) of the line of `path`'s text holding byte `offset`: 1 + the '\n's before it.
// 0 if the file cannot be read that far.
int64_t LineNumberAt(const std::string& path, int64_t offset);

}  // namespace psflow::data::internal

#endif  // PSFLOW_SRC_DATA_CRITEO_INTERNAL_H_
