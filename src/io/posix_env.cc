// psflow/io posix_env.cc — Env::Default(): the POSIX file system. Files are written through a
// 64 KiB buffer (large appends go straight to write(2)) and read with read(2); Sync is fsync;
// directories are synced by opening them O_DIRECTORY. Stateless apart from each file's descriptor and buffer; the Env
// is thread-safe, each file is used by one thread at a time.
#include <dirent.h>
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <filesystem>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "io/io_error.h"
#include "psflow/io/env.h"

namespace psflow::io {
namespace {

constexpr size_t kBufferSize = 64 * 1024;

class PosixWritableFile final : public WritableFile {
 public:
  PosixWritableFile(std::string path, int fd) : path_(std::move(path)), fd_(fd) { buffer_.reserve(kBufferSize); }
  ~PosixWritableFile() override {
    if (fd_ >= 0) ::close(fd_);  // not closed: unflushed data is dropped (see env.h)
  }

  absl::Status Append(std::string_view data) override {
    if (fd_ < 0) return Closed();
    if (buffer_.size() + data.size() <= kBufferSize) {
      buffer_.append(data);
      return absl::OkStatus();
    }
    if (absl::Status s = FlushBuffer(); !s.ok()) return s;
    if (data.size() <= kBufferSize) {
      buffer_.append(data);
      return absl::OkStatus();
    }
    return WriteUnbuffered(data);
  }

  absl::Status Flush() override {
    if (fd_ < 0) return Closed();
    return FlushBuffer();
  }

  absl::Status Sync() override {
    if (fd_ < 0) return Closed();
    if (absl::Status s = FlushBuffer(); !s.ok()) return s;
    if (::fsync(fd_) != 0) return IoError("sync", path_, errno);
    return absl::OkStatus();
  }

  absl::Status Close() override {
    if (fd_ < 0) return absl::OkStatus();
    absl::Status status = FlushBuffer();
    if (::close(fd_) != 0 && status.ok()) status = IoError("close", path_, errno);
    fd_ = -1;
    return status;
  }

  const std::string& path() const override { return path_; }

 private:
  absl::Status Closed() const {
    return absl::FailedPreconditionError(absl::StrCat("cannot write ", path_, ": the file is already closed"));
  }

  absl::Status FlushBuffer() {
    absl::Status s = WriteUnbuffered(buffer_);
    buffer_.clear();  // after a failure too: what is left is lost either way, as on a full disk
    return s;
  }

  absl::Status WriteUnbuffered(std::string_view data) {
    while (!data.empty()) {
      const ssize_t n = ::write(fd_, data.data(), data.size());
      if (n < 0) {
        if (errno == EINTR) continue;
        return IoError("write", path_, errno);
      }
      data.remove_prefix(static_cast<size_t>(n));
    }
    return absl::OkStatus();
  }

  const std::string path_;
  int fd_;
  std::string buffer_;
};

class PosixSequentialFile final : public SequentialFile {
 public:
  PosixSequentialFile(std::string path, int fd) : path_(std::move(path)), fd_(fd) {}
  ~PosixSequentialFile() override { ::close(fd_); }

  absl::StatusOr<size_t> Read(char* buf, size_t n) override {
    size_t total = 0;
    while (total < n) {  // read(2) may return less than asked before the end
      const ssize_t got = ::read(fd_, buf + total, n - total);
      if (got < 0) {
        if (errno == EINTR) continue;
        return IoError("read", path_, errno);
      }
      if (got == 0) break;
      total += static_cast<size_t>(got);
    }
    return total;
  }

  absl::Status Skip(uint64_t n) override {
    // lseek past the end succeeds; the end is found by the next Read (as a short read).
    if (::lseek(fd_, static_cast<off_t>(n), SEEK_CUR) < 0) return IoError("seek in", path_, errno);
    return absl::OkStatus();
  }

  const std::string& path() const override { return path_; }

 private:
  const std::string path_;
  const int fd_;
};

class PosixEnv final : public Env {
 public:
  absl::StatusOr<std::unique_ptr<WritableFile>> NewWritableFile(const std::string& path, CreateMode mode) override {
    const int flags = O_WRONLY | O_CREAT | O_CLOEXEC | (mode == CreateMode::kExclusive ? O_EXCL : O_TRUNC);
    int fd;
    do {
      fd = ::open(path.c_str(), flags, 0644);
    } while (fd < 0 && errno == EINTR);
    if (fd < 0) return IoError("create", path, errno);
    return std::unique_ptr<WritableFile>(new PosixWritableFile(path, fd));
  }

  absl::StatusOr<std::unique_ptr<SequentialFile>> NewSequentialFile(const std::string& path) override {
    int fd;
    do {
      fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    } while (fd < 0 && errno == EINTR);
    if (fd < 0) return IoError("open", path, errno);
    return std::unique_ptr<SequentialFile>(new PosixSequentialFile(path, fd));
  }

  absl::Status RenameFile(const std::string& from, const std::string& to) override {
    if (std::rename(from.c_str(), to.c_str()) != 0) return IoError("rename", absl::StrCat(from, " to ", to), errno);
    return absl::OkStatus();
  }

  absl::Status RemoveFile(const std::string& path) override {
    if (::unlink(path.c_str()) != 0) return IoError("remove", path, errno);
    return absl::OkStatus();
  }

  absl::Status CreateDir(const std::string& dir) override {
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    if (ec) return IoError("create the directory", dir, ec.value());
    if (!std::filesystem::is_directory(dir, ec)) return IoError("create the directory", dir, ENOTDIR);
    return absl::OkStatus();
  }

  absl::StatusOr<std::vector<std::string>> GetChildren(const std::string& dir) override {
    DIR* d = ::opendir(dir.c_str());
    if (d == nullptr) return IoError("list the directory", dir, errno);
    std::vector<std::string> names;
    while (const dirent* entry = ::readdir(d)) {
      const std::string_view name = entry->d_name;
      if (name != "." && name != "..") names.emplace_back(name);
    }
    ::closedir(d);
    return names;
  }

  bool FileExists(const std::string& path) override { return ::access(path.c_str(), F_OK) == 0; }

  absl::Status SyncDir(const std::string& dir) override {
    const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return IoError("open the directory", dir, errno);
    const int rc = ::fsync(fd);
    const int err = errno;
    ::close(fd);
    if (rc != 0) return IoError("sync the directory", dir, err);
    return absl::OkStatus();
  }
};

}  // namespace

Env* Env::Default() {
  static Env* const env = new PosixEnv();  // never destroyed: usable from static destructors too
  return env;
}

}  // namespace psflow::io
