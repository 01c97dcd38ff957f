// psflow/tboard crc32c.h (internal) — CRC-32C (Castagnoli, reflected polynomial 0x82F63B78) and the
// masking TensorFlow's record files put on it. Pure functions; thread-safe.
#ifndef PSFLOW_TBOARD_CRC32C_H_
#define PSFLOW_TBOARD_CRC32C_H_

#include <cstdint>
#include <string_view>

namespace psflow::tboard {

// The standard CRC-32C of `data` (initial value and final xor 0xFFFFFFFF), so
// Crc32c("123456789") == 0xE3069283.
uint32_t Crc32c(std::string_view data);

// TensorFlow masks stored CRCs (a CRC of data that itself holds CRCs is weak):
// rotate right by 15 bits, add 0xa282ead8.
inline uint32_t MaskCrc(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xa282ead8u; }
inline uint32_t UnmaskCrc(uint32_t masked) {
  const uint32_t rotated = masked - 0xa282ead8u;
  return (rotated >> 17) | (rotated << 15);
}

}  // namespace psflow::tboard

#endif  // PSFLOW_TBOARD_CRC32C_H_
