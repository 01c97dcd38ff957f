// psflow/data/idx.h — reader for IDX files (the format MNIST ships in), plain or gzip-compressed.
//
// An IDX file is a 4-byte magic (0x00 0x00 type ndims), ndims big-endian uint32 dimensions, then
// the elements in row-major order. Only unsigned-byte elements (type 0x08) are supported, which is
// what MNIST uses. The reader returns values it owns; it keeps no state and is thread-safe.
#ifndef PSFLOW_DATA_IDX_H_
#define PSFLOW_DATA_IDX_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "psflow/io/env.h"

namespace psflow::data {

struct IdxArray {
  std::vector<int64_t> dims;  // e.g. {60000, 28, 28}
  std::vector<uint8_t> data;  // product(dims) bytes, row-major
};

// Reads `path` through `env`, gzip-compressed or not (told apart by the gzip magic 1f 8b, not by
// the name). Errors are one line naming the file and the problem: NotFound when it does not exist
// ("PATH: no such file"); DataLoss when the magic, element type or dimensions are wrong, the gzip
// stream is cut short or corrupt, or the data is shorter or longer than the header says (the size
// is checked exactly, so a truncated download is never read as a smaller data set); the Env's
// error when the file cannot be opened or read ("cannot read PATH: Input/output error").
absl::StatusOr<IdxArray> ReadIdxFile(const std::string& path, io::Env* env = io::Env::Default());

}  // namespace psflow::data

#endif  // PSFLOW_DATA_IDX_H_
