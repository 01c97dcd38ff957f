// psflow/tboard record.h (internal) — TensorFlow's record framing, used by event files:
//   uint64 length (little-endian) | uint32 masked CRC-32C of those 8 bytes
//   | length bytes of data | uint32 masked CRC-32C of the data.
// Pure functions; thread-safe.
#ifndef PSFLOW_TBOARD_RECORD_H_
#define PSFLOW_TBOARD_RECORD_H_

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace psflow::tboard {

// The framed bytes of one record holding `payload`.
std::string EncodeRecord(std::string_view payload);

// Splits `bytes` (a whole record file) into the payloads of its records, checking both CRCs of
// every record. Errors name `name`, the record index and byte offset, and which check failed
// (length CRC, data CRC, or a record cut short). The views point into `bytes`.
absl::StatusOr<std::vector<std::string_view>> SplitRecords(std::string_view bytes, const std::string& name);

}  // namespace psflow::tboard

#endif  // PSFLOW_TBOARD_RECORD_H_
