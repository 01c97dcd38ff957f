// ps/server/table/row_copy.h — copying one table row (dim floats) without a call into the C
// library per row: whole 64-byte blocks as fixed-size copies (inlined as vector moves), then the
// remaining floats. Internal to the table shards; pure function.
#ifndef PSFLOW_PS_SERVER_TABLE_ROW_COPY_H_
#define PSFLOW_PS_SERVER_TABLE_ROW_COPY_H_

#include <cstdint>
#include <cstring>

namespace psflow::ps::table {

inline void CopyRow(float* __restrict dst, const float* __restrict src, int64_t dim) {
  int64_t k = 0;
  for (; k + 16 <= dim; k += 16) std::memcpy(dst + k, src + k, 64);
  for (; k + 4 <= dim; k += 4) std::memcpy(dst + k, src + k, 16);
  for (; k < dim; ++k) dst[k] = src[k];
}

}  // namespace psflow::ps::table

#endif  // PSFLOW_PS_SERVER_TABLE_ROW_COPY_H_
