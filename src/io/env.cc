// psflow/io env.cc — what every Env shares: reading a whole file, the atomic write (temporary file,
// sync, close, rename, directory sync) used by checkpoints and --metrics_json, and path helpers.
#include "psflow/io/env.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"

namespace psflow::io {

absl::StatusOr<std::string> Env::ReadFileToString(const std::string& path) {
  absl::StatusOr<std::unique_ptr<SequentialFile>> file = NewSequentialFile(path);
  if (!file.ok()) return file.status();
  std::string out;
  // Read straight into the string, in pieces growing from 64 KiB to 16 MiB.
  size_t piece = size_t{64} << 10;
  for (;;) {
    const size_t have = out.size();
    out.resize(have + piece);
    absl::StatusOr<size_t> got = (*file)->Read(out.data() + have, piece);
    if (!got.ok()) return got.status();
    out.resize(have + *got);
    if (*got < piece) return out;
    piece = std::min(piece * 2, size_t{16} << 20);
  }
}

absl::Status SequentialFile::Skip(uint64_t n) {
  std::vector<char> buf(std::min<uint64_t>(n, uint64_t{1} << 20));
  while (n > 0) {
    absl::StatusOr<size_t> got = Read(buf.data(), std::min<uint64_t>(n, buf.size()));
    if (!got.ok()) return got.status();
    if (*got == 0) return absl::OutOfRangeError(absl::StrCat("cannot skip in ", path(), ": the file ends first"));
    n -= *got;
  }
  return absl::OkStatus();
}

std::string DirName(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

absl::Status WriteFileAtomically(Env* env, const std::string& path, absl::Span<const std::string_view> pieces) {
  const std::string tmp = path + ".tmp";
  auto file = env->NewWritableFile(tmp);
  if (!file.ok()) return file.status();
  absl::Status status;
  for (std::string_view piece : pieces) {
    status = (*file)->Append(piece);
    if (!status.ok()) break;
  }
  if (status.ok()) status = (*file)->Sync();
  // Close even after a failure (it releases the descriptor); report the first error.
  if (absl::Status closed = (*file)->Close(); status.ok()) status = closed;
  file->reset();
  if (status.ok()) status = env->RenameFile(tmp, path);
  if (!status.ok()) {
    (void)env->RemoveFile(tmp);  // best effort: a leftover .tmp is never read, and is overwritten next time
    return status;
  }
  return env->SyncDir(DirName(path));
}

}  // namespace psflow::io
