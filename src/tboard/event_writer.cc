#include "psflow/tboard/event_writer.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "tboard/event.pb.h"
#include "tboard/record.h"

namespace psflow::tboard {
namespace {

constexpr char kFileVersion[] = "brain.Event:2";

double WallTimeNow() { return absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch()); }

std::string Hostname() {
  char name[256] = {};
  if (gethostname(name, sizeof(name) - 1) != 0 || name[0] == '\0') return "localhost";
  return name;
}

std::string ErrnoText(int err) { return std::error_code(err, std::generic_category()).message(); }

}  // namespace

absl::StatusOr<std::unique_ptr<EventWriter>> EventWriter::Create(const std::string& logdir) {
  std::error_code ec;
  std::filesystem::create_directories(logdir, ec);
  if (ec) {
    return absl::Status(absl::ErrnoToStatusCode(ec.value()),
                        absl::StrCat("cannot create the event directory ", logdir, ": ", ec.message(),
                                     "; pick a writable --logdir"));
  }
  const double wall_time = WallTimeNow();
  const std::string base = std::filesystem::path(logdir) /
                           absl::StrCat("events.out.tfevents.", static_cast<int64_t>(wall_time), ".", Hostname());
  std::string path = base;
  int fd = -1;
  for (int suffix = 1; suffix <= 1000; ++suffix) {
    fd = open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd >= 0 || errno != EEXIST) break;
    path = absl::StrCat(base, ".", suffix);
  }
  if (fd < 0) {
    return absl::ErrnoToStatus(errno, absl::StrCat("cannot create the event file ", path));
  }
  std::FILE* file = fdopen(fd, "wb");
  if (file == nullptr) {
    const int err = errno;
    close(fd);
    return absl::InternalError(absl::StrCat("cannot open a stream on the event file ", path, ": ", ErrnoText(err)));
  }
  std::unique_ptr<EventWriter> writer(new EventWriter(path, file));

  Event event;
  event.set_wall_time(wall_time);
  event.set_file_version(kFileVersion);
  {
    absl::MutexLock lock(&writer->mu_);
    if (absl::Status status = writer->WriteRecord(event.SerializeAsString()); !status.ok()) return status;
  }
  return writer;
}

EventWriter::~EventWriter() {
  absl::MutexLock lock(&mu_);
  CloseLocked().IgnoreError();  // nowhere to report it; call Close() to see the outcome
}

absl::Status EventWriter::AddScalar(const std::string& tag, float value, int64_t step) {
  return AddScalars({{tag, value}}, step);
}

absl::Status EventWriter::AddScalars(const std::vector<std::pair<std::string, float>>& scalars, int64_t step) {
  if (scalars.empty()) return absl::OkStatus();
  Event event;
  event.set_wall_time(WallTimeNow());
  event.set_step(step);
  Summary* summary = event.mutable_summary();
  for (const auto& [tag, value] : scalars) {
    Summary::Value* v = summary->add_value();
    v->set_tag(tag);
    v->set_simple_value(value);
  }
  const std::string payload = event.SerializeAsString();
  absl::MutexLock lock(&mu_);
  return WriteRecord(payload);
}

absl::Status EventWriter::AddSessionStart(int64_t step) {
  Event event;
  event.set_wall_time(WallTimeNow());
  event.set_step(step);
  event.mutable_session_log()->set_status(SessionLog::START);
  const std::string payload = event.SerializeAsString();
  absl::MutexLock lock(&mu_);
  return WriteRecord(payload);
}

absl::Status EventWriter::WriteRecord(const std::string& payload) {
  if (file_ == nullptr) return absl::FailedPreconditionError(absl::StrCat("event file ", path_, " is already closed"));
  const std::string record = EncodeRecord(payload);
  if (std::fwrite(record.data(), 1, record.size(), file_) != record.size() || std::fflush(file_) != 0) {
    return absl::DataLossError(absl::StrCat("cannot write to the event file ", path_, ": ", ErrnoText(errno)));
  }
  return absl::OkStatus();
}

absl::Status EventWriter::Flush() {
  absl::MutexLock lock(&mu_);
  if (file_ == nullptr) return absl::FailedPreconditionError(absl::StrCat("event file ", path_, " is already closed"));
  if (std::fflush(file_) != 0 || fsync(fileno(file_)) != 0) {
    return absl::DataLossError(absl::StrCat("cannot flush the event file ", path_, ": ", ErrnoText(errno)));
  }
  return absl::OkStatus();
}

absl::Status EventWriter::Close() {
  absl::MutexLock lock(&mu_);
  return CloseLocked();
}

absl::Status EventWriter::CloseLocked() {
  if (file_ == nullptr) return absl::OkStatus();
  const bool flushed = std::fflush(file_) == 0 && fsync(fileno(file_)) == 0;
  const int flush_errno = errno;
  const bool closed = std::fclose(file_) == 0;
  file_ = nullptr;
  if (!flushed || !closed) {
    return absl::DataLossError(
        absl::StrCat("cannot flush and close the event file ", path_, ": ", ErrnoText(flushed ? errno : flush_errno)));
  }
  return absl::OkStatus();
}

}  // namespace psflow::tboard
