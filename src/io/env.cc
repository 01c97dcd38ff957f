// psflow/io env.cc — what every Env shares: the atomic write (temporary file, sync, close, rename,
// directory sync) used by checkpoints and --metrics_json, and path helpers.
#include "psflow/io/env.h"

#include "absl/strings/str_cat.h"

namespace psflow::io {

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
