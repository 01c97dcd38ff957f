// psflow/tboard/event_reader.h — reads TensorBoard event files (as written by EventWriter, or by
// TensorFlow itself): checks both masked CRC-32Cs of every record and decodes each Event. Used by
// tests and by the psflow_events_dump tool. Stateless functions; thread-safe.
#ifndef PSFLOW_TBOARD_EVENT_READER_H_
#define PSFLOW_TBOARD_EVENT_READER_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace psflow::tboard {

// One decoded Event. Summary values other than simple scalars (images, histograms, tensors from
// TensorFlow writers) are not decoded; `other_values` counts them.
struct EventRecord {
  double wall_time = 0;
  int64_t step = 0;
  std::string file_version;                            // set only on a file_version event ("brain.Event:2")
  bool session_start = false;                          // a SessionLog START: the job (re)started at `step`
  std::vector<std::pair<std::string, float>> scalars;  // (tag, simple_value) in file order
  int other_values = 0;
};

// Reads and decodes every record of the event file at `path`. Errors: the file cannot be read; a
// record's length CRC or data CRC does not match (the message names the record index, its byte
// offset and which CRC failed); a record cut short; a payload that is not an Event protobuf.
absl::StatusOr<std::vector<EventRecord>> ReadEventFile(const std::string& path);
// The same from the bytes of a file in memory; `name` stands for the file in messages.
absl::StatusOr<std::vector<EventRecord>> ParseEventFile(std::string_view bytes, const std::string& name);

// The event files under `path`: `path` itself if it is a file, otherwise every regular file whose
// name holds "tfevents" below the directory `path` (recursively, e.g. the ps_0/ subdirectories),
// sorted by path. Errors when `path` does not exist.
absl::StatusOr<std::vector<std::string>> FindEventFiles(const std::string& path);

}  // namespace psflow::tboard

#endif  // PSFLOW_TBOARD_EVENT_READER_H_
