// psflow/core/unique_ids.h — a batch column's ids deduplicated: the unique ids in order of first
// appearance and, per example, its id's position among them. What an embedding lookup sends to a
// table (each row once) and what it gathers the examples' rows back with. A pure function over
// plain values; the caller's UniqueIds is reused across batches so its buffers are not reallocated.
#ifndef PSFLOW_CORE_UNIQUE_IDS_H_
#define PSFLOW_CORE_UNIQUE_IDS_H_

#include <cstdint>
#include <vector>

namespace psflow {

// `ids` in order of first appearance, `index[i]` the position of example i's id in `ids`.
struct UniqueIds {
  std::vector<int64_t> ids;
  std::vector<int64_t> index;
};

// Dedups ids[i * stride] for i in [0, count) (one field's column of a row-major [count, stride]
// batch) into `out` (its buffers are reused).
void DedupIds(const int64_t* ids, int64_t count, int64_t stride, UniqueIds* out);

}  // namespace psflow

#endif  // PSFLOW_CORE_UNIQUE_IDS_H_
