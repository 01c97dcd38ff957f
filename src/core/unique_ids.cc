// A batch column's ids deduplicated (psflow/core/unique_ids.h).
#include "psflow/core/unique_ids.h"

#include "core/id_positions.h"

namespace psflow {

IdPositions& IdPositions::ForThisThread() {
  thread_local IdPositions table;
  return table;
}

void DedupIds(const int64_t* ids, int64_t count, int64_t stride, UniqueIds* out) {
  out->ids.clear();
  out->index.resize(count);
  IdPositions& position = IdPositions::ForThisThread();
  position.Reset(count);
  for (int64_t i = 0; i < count; ++i) {
    const int64_t id = ids[i * stride];
    auto [at, inserted] = position.Insert(id, static_cast<int64_t>(out->ids.size()));
    if (inserted) out->ids.push_back(id);
    out->index[i] = at;
  }
}

}  // namespace psflow
