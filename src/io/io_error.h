// psflow io_error.h (internal) — the one way psflow/io words a failed file operation, shared by the
// POSIX Env and the fault-injecting Env so an injected fault reads exactly like a real one:
// "cannot <what> <path>: <strerror(err)>", with the status code absl::ErrnoToStatusCode(err).
#ifndef PSFLOW_IO_IO_ERROR_H_
#define PSFLOW_IO_IO_ERROR_H_

#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace psflow::io {

inline absl::Status IoError(absl::string_view what, absl::string_view path, int err) {
  return absl::ErrnoToStatus(err, absl::StrCat("cannot ", what, " ", path));
}

}  // namespace psflow::io

#endif  // PSFLOW_IO_IO_ERROR_H_
