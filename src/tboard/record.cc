#include "tboard/record.h"

#include <bit>
#include <cstdint>
#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "tboard/crc32c.h"

namespace psflow::tboard {
namespace {

constexpr size_t kHeaderBytes = sizeof(uint64_t) + sizeof(uint32_t);
constexpr size_t kFooterBytes = sizeof(uint32_t);

// The format is little-endian whatever the host; psflow builds for x86-64 and aarch64 Linux, both
// little-endian, so the bytes are copied as they are.
static_assert(std::endian::native == std::endian::little, "record files are little-endian");

void AppendU32(std::string& out, uint32_t v) { out.append(reinterpret_cast<const char*>(&v), sizeof(v)); }
void AppendU64(std::string& out, uint64_t v) { out.append(reinterpret_cast<const char*>(&v), sizeof(v)); }

template <typename T>
T Load(const char* p) {
  T v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

}  // namespace

std::string EncodeRecord(std::string_view payload) {
  std::string out;
  out.reserve(kHeaderBytes + payload.size() + kFooterBytes);
  AppendU64(out, payload.size());
  AppendU32(out, MaskCrc(Crc32c(std::string_view(out.data(), sizeof(uint64_t)))));
  out.append(payload);
  AppendU32(out, MaskCrc(Crc32c(payload)));
  return out;
}

absl::StatusOr<std::vector<std::string_view>> SplitRecords(std::string_view bytes, const std::string& name) {
  std::vector<std::string_view> records;
  size_t offset = 0;
  while (offset < bytes.size()) {
    const size_t index = records.size();
    const size_t left = bytes.size() - offset;
    if (left < kHeaderBytes) {
      return absl::DataLossError(absl::StrFormat(
          "%s: record %d at byte %d is cut short: %d bytes left, a record header needs %d (file truncated?)", name,
          index, offset, left, kHeaderBytes));
    }
    const char* header = bytes.data() + offset;
    const uint32_t stored_length_crc = Load<uint32_t>(header + sizeof(uint64_t));
    const uint32_t length_crc = MaskCrc(Crc32c(std::string_view(header, sizeof(uint64_t))));
    if (stored_length_crc != length_crc) {
      return absl::DataLossError(absl::StrFormat(
          "%s: record %d at byte %d: length CRC mismatch (stored 0x%08x, computed 0x%08x): the file is corrupt", name,
          index, offset, stored_length_crc, length_crc));
    }
    const uint64_t length = Load<uint64_t>(header);
    if (length > left - kHeaderBytes || left - kHeaderBytes - length < kFooterBytes) {
      return absl::DataLossError(absl::StrFormat(
          "%s: record %d at byte %d is cut short: it declares %d data bytes, only %d bytes follow its header "
          "(file truncated?)",
          name, index, offset, length, left - kHeaderBytes));
    }
    const std::string_view data(header + kHeaderBytes, length);
    const uint32_t stored_data_crc = Load<uint32_t>(header + kHeaderBytes + length);
    const uint32_t data_crc = MaskCrc(Crc32c(data));
    if (stored_data_crc != data_crc) {
      return absl::DataLossError(absl::StrFormat(
          "%s: record %d at byte %d: data CRC mismatch (stored 0x%08x, computed 0x%08x): the file is corrupt", name,
          index, offset, stored_data_crc, data_crc));
    }
    records.push_back(data);
    offset += kHeaderBytes + length + kFooterBytes;
  }
  return records;
}

}  // namespace psflow::tboard
