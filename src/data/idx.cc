#include "psflow/data/idx.h"

#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstring>
#include <memory>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace psflow::data {
namespace {

constexpr uint8_t kUnsignedByteType = 0x08;
// Larger than any real IDX file; a header claiming more is corrupt (and must not make us try to
// allocate it).
constexpr uint64_t kMaxElements = uint64_t{1} << 36;
constexpr size_t kChunk = size_t{16} << 20;

// Sequential reader over a plain or a gzip file, so the parser below handles both alike.
class ByteSource {
 public:
  virtual ~ByteSource() = default;
  // Reads up to n bytes; fewer only at the end of the data. Errors carry no file name (the caller
  // adds it).
  virtual absl::StatusOr<size_t> Read(uint8_t* buf, size_t n) = 0;
};

struct FileCloser {
  void operator()(FILE* f) const { std::fclose(f); }
};
struct GzCloser {
  void operator()(gzFile f) const { gzclose(f); }
};

class PlainSource final : public ByteSource {
 public:
  explicit PlainSource(std::unique_ptr<FILE, FileCloser> file) : file_(std::move(file)) {}
  absl::StatusOr<size_t> Read(uint8_t* buf, size_t n) override {
    const size_t got = std::fread(buf, 1, n, file_.get());
    if (got < n && std::ferror(file_.get())) {
      return absl::DataLossError(absl::StrCat("read error: ", std::strerror(errno)));
    }
    return got;
  }

 private:
  std::unique_ptr<FILE, FileCloser> file_;
};

class GzipSource final : public ByteSource {
 public:
  explicit GzipSource(gzFile file) : file_(file) {}
  absl::StatusOr<size_t> Read(uint8_t* buf, size_t n) override {
    size_t total = 0;
    while (total < n) {
      // gzread takes an unsigned and returns an int: read in pieces below INT_MAX.
      const unsigned want = static_cast<unsigned>(std::min<size_t>(n - total, 1u << 30));
      const int got = gzread(file_.get(), buf + total, want);
      int errnum = Z_OK;
      const char* message = gzerror(file_.get(), &errnum);
      // Z_BUF_ERROR is zlib's "unexpected end of file": the compressed stream was cut short.
      if (got < 0 || (errnum != Z_OK && errnum != Z_STREAM_END)) {
        return absl::DataLossError(absl::StrCat(
            errnum == Z_BUF_ERROR ? "truncated gzip stream" : "corrupt gzip stream",
            " (zlib: ", message, ")"));
      }
      total += static_cast<size_t>(got);
      if (static_cast<unsigned>(got) < want) break;
    }
    return total;
  }

 private:
  std::unique_ptr<gzFile_s, GzCloser> file_;
};

absl::Status FileError(const std::string& path, const absl::Status& cause) {
  return absl::Status(cause.code(), absl::StrCat(path, ": ", cause.message()));
}

absl::StatusOr<std::unique_ptr<ByteSource>> Open(const std::string& path, bool* gzip) {
  std::unique_ptr<FILE, FileCloser> file(std::fopen(path.c_str(), "rb"));
  if (file == nullptr) {
    const int err = errno;
    if (err == ENOENT) return absl::NotFoundError(absl::StrCat(path, ": no such file"));
    return absl::PermissionDeniedError(
        absl::StrCat(path, ": cannot open: ", std::strerror(err)));
  }
  uint8_t magic[2] = {0, 0};
  const size_t got = std::fread(magic, 1, 2, file.get());
  *gzip = got == 2 && magic[0] == 0x1f && magic[1] == 0x8b;
  if (!*gzip) {
    std::rewind(file.get());
    return std::make_unique<PlainSource>(std::move(file));
  }
  file.reset();
  gzFile gz = gzopen(path.c_str(), "rb");
  if (gz == nullptr) {
    return absl::PermissionDeniedError(absl::StrCat(path, ": cannot open as gzip"));
  }
  gzbuffer(gz, 1 << 17);
  return std::make_unique<GzipSource>(gz);
}

}  // namespace

absl::StatusOr<IdxArray> ReadIdxFile(const std::string& path) {
  bool gzip = false;
  absl::StatusOr<std::unique_ptr<ByteSource>> opened = Open(path, &gzip);
  if (!opened.ok()) return opened.status();
  ByteSource& source = **opened;
  const char* what = gzip ? "its uncompressed data has" : "file has";

  uint8_t magic[4];
  absl::StatusOr<size_t> got = source.Read(magic, 4);
  if (!got.ok()) return FileError(path, got.status());
  if (*got < 4) {
    return absl::DataLossError(absl::StrCat(path, ": truncated: ", what, " ", *got,
                                            " bytes, fewer than the 4-byte IDX magic"));
  }
  if (magic[0] != 0 || magic[1] != 0) {
    return absl::DataLossError(absl::StrFormat(
        "%s: not an IDX file: starts with bytes %02x %02x %02x %02x, expected 00 00 08 <ndims>",
        path, magic[0], magic[1], magic[2], magic[3]));
  }
  if (magic[2] != kUnsignedByteType) {
    return absl::DataLossError(absl::StrFormat(
        "%s: IDX element type 0x%02x is not supported; only unsigned bytes (0x08) are", path,
        magic[2]));
  }
  const int ndims = magic[3];
  if (ndims == 0) return absl::DataLossError(absl::StrCat(path, ": IDX header has 0 dimensions"));

  std::vector<uint8_t> dim_bytes(4 * ndims);
  got = source.Read(dim_bytes.data(), dim_bytes.size());
  if (!got.ok()) return FileError(path, got.status());
  const size_t header_size = 4 + dim_bytes.size();
  if (*got < dim_bytes.size()) {
    return absl::DataLossError(absl::StrCat(path, ": truncated: header of ", ndims,
                                            " dimensions needs ", header_size, " bytes, ", what,
                                            " ", 4 + *got));
  }
  IdxArray array;
  uint64_t elements = 1;
  for (int d = 0; d < ndims; ++d) {
    const uint8_t* b = &dim_bytes[4 * d];
    const uint64_t dim = (uint64_t{b[0]} << 24) | (uint64_t{b[1]} << 16) | (uint64_t{b[2]} << 8) |
                         uint64_t{b[3]};
    array.dims.push_back(static_cast<int64_t>(dim));
    if (dim != 0 && elements > kMaxElements / dim) {
      return absl::DataLossError(absl::StrCat(path, ": IDX dimensions are implausibly large (",
                                              "dimension ", d, " is ", dim, ")"));
    }
    elements *= dim;
  }

  // Grow while reading rather than trusting the header with one big allocation up front.
  array.data.reserve(std::min<uint64_t>(elements, kChunk * 4));
  size_t have = 0;
  while (have < elements) {
    const size_t want = std::min<uint64_t>(kChunk, elements - have);
    array.data.resize(have + want);
    got = source.Read(array.data.data() + have, want);
    if (!got.ok()) return FileError(path, got.status());
    have += *got;
    if (*got < want) break;
  }
  if (have < elements) {
    return absl::DataLossError(absl::StrCat(path, ": truncated: header says ",
                                            header_size + elements, " bytes, ", what, " ",
                                            header_size + have));
  }
  uint8_t extra[4096];
  size_t trailing = 0;
  for (;;) {
    got = source.Read(extra, sizeof(extra));
    if (!got.ok()) return FileError(path, got.status());
    trailing += *got;
    if (*got < sizeof(extra)) break;
  }
  if (trailing > 0) {
    return absl::DataLossError(absl::StrCat(path, ": ", trailing,
                                            " trailing bytes: header says ",
                                            header_size + elements, " bytes, ", what, " ",
                                            header_size + elements + trailing));
  }
  return array;
}

}  // namespace psflow::data
