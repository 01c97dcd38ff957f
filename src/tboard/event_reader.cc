#include "tboard/event_reader.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <system_error>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "tboard/event.pb.h"
#include "tboard/record.h"

namespace psflow::tboard {

absl::StatusOr<std::vector<EventRecord>> ParseEventFile(std::string_view bytes, const std::string& name) {
  absl::StatusOr<std::vector<std::string_view>> payloads = SplitRecords(bytes, name);
  if (!payloads.ok()) return payloads.status();
  std::vector<EventRecord> records;
  records.reserve(payloads->size());
  Event event;
  for (size_t i = 0; i < payloads->size(); ++i) {
    const std::string_view payload = (*payloads)[i];
    if (!event.ParseFromArray(payload.data(), static_cast<int>(payload.size()))) {
      return absl::DataLossError(absl::StrCat(name, ": record ", i, " passes its CRCs but is not an Event protobuf (",
                                              payload.size(), " bytes); is this a TensorBoard event file?"));
    }
    EventRecord record;
    record.wall_time = event.wall_time();
    record.step = event.step();
    switch (event.what_case()) {
      case Event::kFileVersion:
        record.file_version = event.file_version();
        break;
      case Event::kSessionLog:
        record.session_start = event.session_log().status() == SessionLog::START;
        break;
      case Event::kSummary:
        for (const Summary::Value& value : event.summary().value()) {
          if (value.value_case() == Summary::Value::kSimpleValue) {
            record.scalars.emplace_back(value.tag(), value.simple_value());
          } else {
            ++record.other_values;
          }
        }
        break;
      case Event::WHAT_NOT_SET:
        break;
    }
    records.push_back(std::move(record));
  }
  return records;
}

absl::StatusOr<std::vector<EventRecord>> ReadEventFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open the event file ", path));
  std::ostringstream bytes;
  bytes << in.rdbuf();
  if (in.bad()) return absl::DataLossError(absl::StrCat("cannot read the event file ", path));
  return ParseEventFile(bytes.view(), path);
}

absl::StatusOr<std::vector<std::string>> FindEventFiles(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::file_status status = fs::status(path, ec);
  if (ec || !fs::exists(status)) {
    return absl::NotFoundError(absl::StrCat("no event file or log directory at ", path));
  }
  if (!fs::is_directory(status)) return std::vector<std::string>{path};
  std::vector<std::string> files;
  for (auto it = fs::recursive_directory_iterator(path, ec); !ec && it != fs::recursive_directory_iterator();
       it.increment(ec)) {
    if (it->is_regular_file() && absl::StrContains(it->path().filename().string(), "tfevents")) {
      files.push_back(it->path().string());
    }
  }
  if (ec) return absl::DataLossError(absl::StrCat("cannot list the log directory ", path, ": ", ec.message()));
  std::sort(files.begin(), files.end());
  return files;
}

}  // namespace psflow::tboard
