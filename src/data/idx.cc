// The IDX reader (psflow/data/idx.h). The file's bytes come through an io::Env, a gzip file's
// inflated (zlib) as they are read, and the parser checks the header and the size against them.
#include "psflow/data/idx.h"

#include <zlib.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "psflow/io/env.h"

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
  // Reads up to n bytes; fewer only at the end of the data. Errors name the file.
  virtual absl::StatusOr<size_t> Read(uint8_t* buf, size_t n) = 0;
};

// The file's bytes, after the `head` already read from it to tell gzip apart.
class PlainSource final : public ByteSource {
 public:
  PlainSource(std::unique_ptr<io::SequentialFile> file, std::string head)
      : file_(std::move(file)), head_(std::move(head)) {}
  absl::StatusOr<size_t> Read(uint8_t* buf, size_t n) override {
    const size_t from_head = std::min(n, head_.size() - head_used_);
    std::memcpy(buf, head_.data() + head_used_, from_head);
    head_used_ += from_head;
    if (from_head == n) return n;
    absl::StatusOr<size_t> got = file_->Read(reinterpret_cast<char*>(buf) + from_head, n - from_head);
    if (!got.ok()) return got.status();
    return from_head + *got;
  }

 private:
  const std::unique_ptr<io::SequentialFile> file_;
  const std::string head_;
  size_t head_used_ = 0;
};

// The decompressed bytes of a gzip file (zlib's inflate over the file's bytes). As gzip(1) and
// zlib's gzread: members concatenated are read one after the other, and bytes after a member that
// do not start another are ignored.
class GzipSource final : public ByteSource {
 public:
  GzipSource(std::unique_ptr<io::SequentialFile> file, const std::string& head)
      : file_(std::move(file)), in_(kInputBytes) {
    std::memcpy(in_.data(), head.data(), head.size());
    z_.next_in = in_.data();
    z_.avail_in = static_cast<uInt>(head.size());
  }
  ~GzipSource() override {
    if (initialized_) inflateEnd(&z_);
  }

  absl::StatusOr<size_t> Read(uint8_t* buf, size_t n) override {
    if (!initialized_) {
      // 16 + MAX_WBITS: a gzip wrapper around the deflate data, with the largest window.
      if (const int ret = inflateInit2(&z_, 16 + MAX_WBITS); ret != Z_OK) return ZlibError(ret);
      initialized_ = true;
    }
    size_t total = 0;
    while (total < n && !finished_) {
      if (between_members_) {
        if (absl::Status s = Fill(2); !s.ok()) return s;
        if (z_.avail_in < 2 || z_.next_in[0] != 0x1f || z_.next_in[1] != 0x8b) {
          finished_ = true;
          break;
        }
        inflateReset(&z_);
        between_members_ = false;
      }
      if (z_.avail_in == 0) {
        if (absl::Status s = Fill(1); !s.ok()) return s;
      }
      // inflate takes an unsigned count: decompress in pieces below 1 GiB.
      const uInt want = static_cast<uInt>(std::min<size_t>(n - total, size_t{1} << 30));
      z_.next_out = buf + total;
      z_.avail_out = want;
      const int ret = inflate(&z_, Z_NO_FLUSH);
      total += want - z_.avail_out;
      if (ret == Z_STREAM_END) {
        between_members_ = true;
      } else if (ret == Z_BUF_ERROR && z_.avail_in == 0 && at_end_) {
        return absl::DataLossError(absl::StrCat(file_->path(), ": truncated gzip stream (the file ends inside it)"));
      } else if (ret != Z_OK && ret != Z_BUF_ERROR) {
        return ZlibError(ret);
      }
    }
    return total;
  }

 private:
  static constexpr size_t kInputBytes = size_t{1} << 17;

  // Reads from the file until `min_bytes` are available to inflate or the file ended.
  absl::Status Fill(size_t min_bytes) {
    while (z_.avail_in < min_bytes && !at_end_) {
      std::memmove(in_.data(), z_.next_in, z_.avail_in);  // keep what inflate has not used
      z_.next_in = in_.data();
      absl::StatusOr<size_t> got =
          file_->Read(reinterpret_cast<char*>(in_.data()) + z_.avail_in, in_.size() - z_.avail_in);
      if (!got.ok()) return got.status();
      if (*got == 0) at_end_ = true;
      z_.avail_in += static_cast<uInt>(*got);
    }
    return absl::OkStatus();
  }

  absl::Status ZlibError(int ret) const {
    if (ret == Z_MEM_ERROR) {
      return absl::ResourceExhaustedError(absl::StrCat(file_->path(), ": out of memory decompressing it"));
    }
    return absl::DataLossError(
        absl::StrCat(file_->path(), ": corrupt gzip stream (zlib: ", z_.msg != nullptr ? z_.msg : zError(ret), ")"));
  }

  const std::unique_ptr<io::SequentialFile> file_;
  std::vector<Bytef> in_;
  z_stream z_{};
  bool initialized_ = false;
  bool at_end_ = false;           // the file has no more bytes
  bool between_members_ = false;  // a gzip member ended: another one may follow
  bool finished_ = false;
};

absl::StatusOr<std::unique_ptr<ByteSource>> Open(const std::string& path, io::Env* env, bool* gzip) {
  absl::StatusOr<std::unique_ptr<io::SequentialFile>> file = env->NewSequentialFile(path);
  if (!file.ok()) {
    if (absl::IsNotFound(file.status())) return absl::NotFoundError(absl::StrCat(path, ": no such file"));
    return file.status();  // "cannot open PATH: Permission denied"
  }
  std::string head(2, '\0');
  absl::StatusOr<size_t> got = (*file)->Read(head.data(), head.size());
  if (!got.ok()) return got.status();
  head.resize(*got);
  *gzip = head.size() == 2 && static_cast<uint8_t>(head[0]) == 0x1f && static_cast<uint8_t>(head[1]) == 0x8b;
  if (*gzip) return std::make_unique<GzipSource>(*std::move(file), head);
  return std::make_unique<PlainSource>(*std::move(file), std::move(head));
}

}  // namespace

absl::StatusOr<IdxArray> ReadIdxFile(const std::string& path, io::Env* env) {
  bool gzip = false;
  absl::StatusOr<std::unique_ptr<ByteSource>> opened = Open(path, env, &gzip);
  if (!opened.ok()) return opened.status();
  ByteSource& source = **opened;
  const char* what = gzip ? "its uncompressed data has" : "file has";

  uint8_t magic[4];
  absl::StatusOr<size_t> got = source.Read(magic, 4);
  if (!got.ok()) return got.status();
  if (*got < 4) {
    return absl::DataLossError(
        absl::StrCat(path, ": truncated: ", what, " ", *got, " bytes, fewer than the 4-byte IDX magic"));
  }
  if (magic[0] != 0 || magic[1] != 0) {
    return absl::DataLossError(
        absl::StrFormat("%s: not an IDX file: starts with bytes %02x %02x %02x %02x, expected 00 00 08 <ndims>", path,
                        magic[0], magic[1], magic[2], magic[3]));
  }
  if (magic[2] != kUnsignedByteType) {
    return absl::DataLossError(absl::StrFormat(
        "%s: IDX element type 0x%02x is not supported; only unsigned bytes (0x08) are", path, magic[2]));
  }
  const int ndims = magic[3];
  if (ndims == 0) return absl::DataLossError(absl::StrCat(path, ": IDX header has 0 dimensions"));

  std::vector<uint8_t> dim_bytes(4 * ndims);
  got = source.Read(dim_bytes.data(), dim_bytes.size());
  if (!got.ok()) return got.status();
  const size_t header_size = 4 + dim_bytes.size();
  if (*got < dim_bytes.size()) {
    return absl::DataLossError(absl::StrCat(path, ": truncated: header of ", ndims, " dimensions needs ", header_size,
                                            " bytes, ", what, " ", 4 + *got));
  }
  IdxArray array;
  uint64_t elements = 1;
  for (int d = 0; d < ndims; ++d) {
    const uint8_t* b = &dim_bytes[4 * d];
    const uint64_t dim = (uint64_t{b[0]} << 24) | (uint64_t{b[1]} << 16) | (uint64_t{b[2]} << 8) | uint64_t{b[3]};
    array.dims.push_back(static_cast<int64_t>(dim));
    if (dim != 0 && elements > kMaxElements / dim) {
      return absl::DataLossError(
          absl::StrCat(path, ": IDX dimensions are implausibly large (", "dimension ", d, " is ", dim, ")"));
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
    if (!got.ok()) return got.status();
    have += *got;
    if (*got < want) break;
  }
  if (have < elements) {
    return absl::DataLossError(absl::StrCat(path, ": truncated: header says ", header_size + elements, " bytes, ", what,
                                            " ", header_size + have));
  }
  uint8_t extra[4096];
  size_t trailing = 0;
  for (;;) {
    got = source.Read(extra, sizeof(extra));
    if (!got.ok()) return got.status();
    trailing += *got;
    if (*got < sizeof(extra)) break;
  }
  if (trailing > 0) {
    return absl::DataLossError(absl::StrCat(path, ": ", trailing, " trailing bytes: header says ",
                                            header_size + elements, " bytes, ", what, " ",
                                            header_size + elements + trailing));
  }
  return array;
}

}  // namespace psflow::data
