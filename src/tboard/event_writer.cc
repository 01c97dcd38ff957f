#include "psflow/tboard/event_writer.h"

#include <unistd.h>

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

}  // namespace

absl::StatusOr<std::unique_ptr<EventWriter>> EventWriter::Create(const std::string& logdir, io::Env* env) {
  if (absl::Status s = env->CreateDir(logdir); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat(s.message(), "; pick a writable --logdir"));
  }
  const double wall_time = WallTimeNow();
  const std::string base =
      absl::StrCat(logdir, "/events.out.tfevents.", static_cast<int64_t>(wall_time), ".", Hostname());
  std::string path = base;
  absl::StatusOr<std::unique_ptr<io::WritableFile>> file;
  for (int suffix = 1; suffix <= 1000; ++suffix) {
    file = env->NewWritableFile(path, io::Env::CreateMode::kExclusive);
    if (file.ok() || !absl::IsAlreadyExists(file.status())) break;
    path = absl::StrCat(base, ".", suffix);
  }
  if (!file.ok()) return file.status();
  std::unique_ptr<EventWriter> writer(new EventWriter(path, std::move(file).value()));

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
  if (absl::Status s = file_->Append(EncodeRecord(payload)); !s.ok()) return s;
  return file_->Flush();
}

absl::Status EventWriter::Flush() {
  absl::MutexLock lock(&mu_);
  if (file_ == nullptr) return absl::FailedPreconditionError(absl::StrCat("event file ", path_, " is already closed"));
  return file_->Sync();
}

absl::Status EventWriter::Close() {
  absl::MutexLock lock(&mu_);
  return CloseLocked();
}

absl::Status EventWriter::CloseLocked() {
  if (file_ == nullptr) return absl::OkStatus();
  absl::Status status = file_->Sync();
  if (absl::Status closed = file_->Close(); status.ok()) status = closed;
  file_.reset();
  return status;
}

}  // namespace psflow::tboard
