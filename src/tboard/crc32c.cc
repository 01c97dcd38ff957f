#include "tboard/crc32c.h"

#include <array>

namespace psflow::tboard {
namespace {

// Written by hand because Debian 12 packages no C/C++ CRC-32C library in the project's dependency
// set: there is no libcrc32c, abseil 20220623 predates absl/crc, and gRPC/protobuf keep theirs
// private. Records are a few hundred bytes every --save_summaries_steps, so the plain byte-wise
// table is fast enough; crc32c_test checks it against published check values.
constexpr uint32_t kReflectedPolynomial = 0x82F63B78u;

constexpr std::array<uint32_t, 256> MakeTable() {
  std::array<uint32_t, 256> table{};
  for (uint32_t byte = 0; byte < 256; ++byte) {
    uint32_t crc = byte;
    for (int bit = 0; bit < 8; ++bit) crc = (crc & 1u) ? (crc >> 1) ^ kReflectedPolynomial : crc >> 1;
    table[byte] = crc;
  }
  return table;
}

constexpr std::array<uint32_t, 256> kTable = MakeTable();

}  // namespace

uint32_t Crc32c(std::string_view data) {
  uint32_t crc = 0xFFFFFFFFu;
  for (const char c : data) crc = kTable[(crc ^ static_cast<uint8_t>(c)) & 0xFFu] ^ (crc >> 8);
  return crc ^ 0xFFFFFFFFu;
}

}  // namespace psflow::tboard
