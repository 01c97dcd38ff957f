// A file's text for the Criteo reader (data/criteo_internal.h): plain bytes through read(2), or a
// gzip file's decompressed bytes through zlib's inflate (members one after another, as gzip -d).
#include <fcntl.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "data/criteo_internal.h"

namespace psflow::data::internal {
namespace {

constexpr size_t kInputBytes = size_t{1} << 18;  // compressed bytes read at a time

// Errors leave the file's name to the reader, which adds it (and the line number when known).
absl::Status ErrnoError(const std::string& what) {
  return absl::NotFoundError(absl::StrCat("cannot ", what, " it: ", std::strerror(errno)));
}

// Reads up to n bytes, retrying on EINTR.
ssize_t ReadSome(int fd, char* dst, size_t n) {
  for (;;) {
    const ssize_t r = ::read(fd, dst, n);
    if (r >= 0 || errno != EINTR) return r;
  }
}

class FileHandle {
 public:
  explicit FileHandle(int fd) : fd_(fd) {}
  ~FileHandle() {
    if (fd_ >= 0) ::close(fd_);
  }
  FileHandle(const FileHandle&) = delete;
  FileHandle& operator=(const FileHandle&) = delete;
  int get() const { return fd_; }

 private:
  int fd_;
};

class PlainSource final : public TextSource {
 public:
  PlainSource(std::string path, int fd, std::vector<char> head)
      : path_(std::move(path)), fd_(fd), head_(std::move(head)) {}

  absl::StatusOr<size_t> Read(char* dst, size_t n) override {
    size_t done = 0;
    if (head_used_ < head_.size()) {  // the bytes read to tell plain from gzip
      done = std::min(n, head_.size() - head_used_);
      std::memcpy(dst, head_.data() + head_used_, done);
      head_used_ += done;
      if (done == n) {
        offset_ += static_cast<int64_t>(done);
        return done;
      }
    }
    const ssize_t r = ReadSome(fd_.get(), dst + done, n - done);
    if (r < 0) return ErrnoError("read");
    done += static_cast<size_t>(r);
    offset_ += static_cast<int64_t>(done);
    return done;
  }

  absl::Status Skip(int64_t n) override {
    const int64_t from_head = std::min<int64_t>(n, static_cast<int64_t>(head_.size() - head_used_));
    head_used_ += static_cast<size_t>(from_head);
    offset_ += from_head;
    n -= from_head;
    if (n == 0) return absl::OkStatus();
    const off_t at = ::lseek(fd_.get(), static_cast<off_t>(n), SEEK_CUR);
    if (at < 0) return ErrnoError("seek in");
    offset_ += n;
    return absl::OkStatus();
  }

  bool gzip() const override { return false; }

 private:
  std::string path_;
  FileHandle fd_;
  std::vector<char> head_;
  size_t head_used_ = 0;
};

class GzipSource final : public TextSource {
 public:
  GzipSource(std::string path, int fd, std::vector<char> head) : path_(std::move(path)), fd_(fd), input_(kInputBytes) {
    std::memcpy(input_.data(), head.data(), head.size());
    stream_.next_in = reinterpret_cast<Bytef*>(input_.data());
    stream_.avail_in = static_cast<uInt>(head.size());
  }
  ~GzipSource() override {
    if (initialized_) inflateEnd(&stream_);
  }

  absl::Status Init() {
    if (inflateInit2(&stream_, 16 + MAX_WBITS) != Z_OK) {
      return absl::ResourceExhaustedError("zlib could not start inflating it");
    }
    initialized_ = true;
    return absl::OkStatus();
  }

  absl::StatusOr<size_t> Read(char* dst, size_t n) override {
    if (!pending_.ok()) return pending_;
    stream_.next_out = reinterpret_cast<Bytef*>(dst);
    stream_.avail_out = static_cast<uInt>(std::min<size_t>(n, uInt{1} << 30));
    const uInt want = stream_.avail_out;
    absl::Status error;
    while (stream_.avail_out > 0 && !done_) {
      if (stream_.avail_in == 0) {
        const ssize_t r = ReadSome(fd_.get(), input_.data(), input_.size());
        if (r < 0) {
          error = ErrnoError("read");
          break;
        }
        if (r == 0) {
          if (at_member_start_) {  // the end of the last member: the end of the text
            done_ = true;
            break;
          }
          error = absl::DataLossError(absl::StrCat(
              "truncated gzip stream (the file ends inside compressed data, after ",
              offset_ + (want - stream_.avail_out), " bytes of text); the file is incomplete: copy or write it again"));
          break;
        }
        stream_.next_in = reinterpret_cast<Bytef*>(input_.data());
        stream_.avail_in = static_cast<uInt>(r);
      }
      at_member_start_ = false;
      const int rc = inflate(&stream_, Z_NO_FLUSH);
      if (rc == Z_STREAM_END) {  // a member ends; another may follow
        inflateReset(&stream_);
        at_member_start_ = true;
        continue;
      }
      if (rc != Z_OK && rc != Z_BUF_ERROR) {
        error = absl::DataLossError(absl::StrCat(
            "corrupt gzip stream after ", offset_ + (want - stream_.avail_out), " bytes of text (",
            stream_.msg != nullptr ? stream_.msg : "zlib error", "); the file is damaged: copy or write it again"));
        break;
      }
    }
    const size_t got = want - stream_.avail_out;
    offset_ += static_cast<int64_t>(got);
    if (!error.ok()) {
      if (got == 0) return error;
      pending_ = error;  // the bytes before the damage first
    }
    return got;
  }

  absl::Status Skip(int64_t n) override {
    std::vector<char> scratch(std::min<int64_t>(n, int64_t{1} << 20));
    while (n > 0) {
      absl::StatusOr<size_t> got = Read(scratch.data(), std::min<size_t>(scratch.size(), static_cast<size_t>(n)));
      if (!got.ok()) return got.status();
      if (*got == 0) return absl::OkStatus();
      n -= static_cast<int64_t>(*got);
    }
    return absl::OkStatus();
  }

  bool gzip() const override { return true; }

 private:
  std::string path_;
  FileHandle fd_;
  std::vector<char> input_;
  z_stream stream_{};
  bool initialized_ = false;
  bool at_member_start_ = true;  // no member begun since the last one ended
  bool done_ = false;
  absl::Status pending_;  // an error met after bytes that were returned first
};

}  // namespace

absl::StatusOr<std::unique_ptr<TextSource>> TextSource::Open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoError("open");
  std::vector<char> head(2);
  size_t got = 0;
  while (got < head.size()) {
    const ssize_t r = ReadSome(fd, head.data() + got, head.size() - got);
    if (r < 0) {
      const absl::Status s = ErrnoError("read");
      ::close(fd);
      return s;
    }
    if (r == 0) break;
    got += static_cast<size_t>(r);
  }
  head.resize(got);
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
  if (got == 2 && static_cast<unsigned char>(head[0]) == 0x1f && static_cast<unsigned char>(head[1]) == 0x8b) {
    auto source = std::make_unique<GzipSource>(path, fd, std::move(head));
    if (absl::Status s = source->Init(); !s.ok()) return s;
    return source;
  }
  return std::make_unique<PlainSource>(path, fd, std::move(head));
}

int64_t LineNumberAt(const std::string& path, int64_t offset) {
  absl::StatusOr<std::unique_ptr<TextSource>> source = TextSource::Open(path);
  if (!source.ok()) return 0;
  std::vector<char> buf(1 << 20);
  int64_t newlines = 0, left = offset;
  while (left > 0) {
    absl::StatusOr<size_t> got = (*source)->Read(buf.data(), std::min<size_t>(buf.size(), static_cast<size_t>(left)));
    if (!got.ok() || *got == 0) return 0;
    newlines += std::count(buf.data(), buf.data() + *got, '\n');
    left -= static_cast<int64_t>(*got);
  }
  return newlines + 1;
}

}  // namespace psflow::data::internal
