// psflow/tboard/event_writer.h — writes TensorBoard event files: <logdir>/events.out.tfevents.
// <unix seconds>.<hostname>, TensorFlow's record framing (length, masked CRC-32C of the length,
// an Event protobuf, masked CRC-32C of the data) around Events whose field numbers match
// tensorflow/core/util/event.proto, so `tensorboard --logdir` shows the scalars as curves.
// The first event of a file is {wall_time, file_version: "brain.Event:2"}.
//
// Ownership: the writer owns its open file; it is flushed and closed by Close() or on destruction.
// Every Add* hands its record to the OS before returning, so a killed process loses nothing
// already added and a running TensorBoard sees it at once; Flush() also fsyncs it to disk.
// The file is reached through an io::Env (borrowed; the POSIX one unless a test passes another),
// and every failure (a full disk) is a one-line status naming the file and the cause.
// Thread-safe: all methods may be called from any thread (one mutex).
#ifndef PSFLOW_TBOARD_EVENT_WRITER_H_
#define PSFLOW_TBOARD_EVENT_WRITER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "psflow/io/env.h"

namespace psflow::tboard {

class EventWriter {
 public:
  // Creates `logdir` (and its parents) if missing and opens a new event file in it. When a file of
  // that name already exists (two writers in one second), ".1", ".2", ... is appended: TensorBoard
  // reads every file whose name holds "tfevents". Errors name the directory or file and the cause.
  static absl::StatusOr<std::unique_ptr<EventWriter>> Create(const std::string& logdir,
                                                             io::Env* env = io::Env::Default());

  ~EventWriter();
  EventWriter(const EventWriter&) = delete;
  EventWriter& operator=(const EventWriter&) = delete;

  // One Event at `step` with one scalar summary value (TensorBoard's "simple_value").
  absl::Status AddScalar(const std::string& tag, float value, int64_t step);
  // One Event at `step` holding all (tag, value) pairs; nothing is written for an empty list.
  absl::Status AddScalars(const std::vector<std::pair<std::string, float>>& scalars, int64_t step);
  // Records that the job (re)started at `step` — a SessionLog START event. Call it once when a
  // restarted chief resumes from a checkpoint: TensorBoard then drops the events of the earlier
  // run with step >= `step` instead of drawing overlapping curves.
  absl::Status AddSessionStart(int64_t step);

  // Forces the written records to disk (fflush + fsync).
  absl::Status Flush();
  // Flushes and closes the file; later Add* and Flush calls fail. Idempotent.
  absl::Status Close();

  // The path of the event file.
  const std::string& path() const { return path_; }

 private:
  EventWriter(std::string path, std::unique_ptr<io::WritableFile> file)
      : path_(std::move(path)), file_(std::move(file)) {}
  // Appends one framed record and hands it to the OS.
  absl::Status WriteRecord(const std::string& payload) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status CloseLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string path_;
  absl::Mutex mu_;
  std::unique_ptr<io::WritableFile> file_ ABSL_GUARDED_BY(mu_);  // null once closed
};

}  // namespace psflow::tboard

#endif  // PSFLOW_TBOARD_EVENT_WRITER_H_
