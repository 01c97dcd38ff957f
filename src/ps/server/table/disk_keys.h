// ps/server/table/disk_keys.h (internal) — the disk tier's row keys and write options, shared by
// DiskTier (disk_store.cc) and DiskRowStore (disk_row_store.cc).
#ifndef PSFLOW_PS_SERVER_TABLE_DISK_KEYS_H_
#define PSFLOW_PS_SERVER_TABLE_DISK_KEYS_H_

#include <cstddef>
#include <cstdint>

#include "rocksdb/options.h"
#include "rocksdb/slice.h"

namespace psflow::ps::table {

inline constexpr size_t kKeyBytes = 8;

// The id's key: sign bit flipped, big-endian, so byte order is signed id order.
inline void KeyOf(int64_t id, char* out) {
  const uint64_t u = static_cast<uint64_t>(id) ^ (uint64_t{1} << 63);
  for (size_t i = 0; i < kKeyBytes; ++i) out[i] = static_cast<char>(u >> (56 - 8 * i));
}

inline int64_t IdOfKey(const rocksdb::Slice& key) {
  uint64_t u = 0;
  for (size_t i = 0; i < kKeyBytes; ++i) u = (u << 8) | static_cast<unsigned char>(key.data()[i]);
  return static_cast<int64_t>(u ^ (uint64_t{1} << 63));
}

}  // namespace psflow::ps::table

#endif  // PSFLOW_PS_SERVER_TABLE_DISK_KEYS_H_
